"""`/metrics`: the run monitor in Prometheus' text format, through prometheus_client.

A `RunCollector` reads the monitor at each scrape (nothing is copied between scrapes), and each
dashboard has a `CollectorRegistry` of its own, never the process-wide default one: two runs in one
process (or a test and a run) never register the same names twice.

Names: Ray Train's where Ray has the metric, with its label names (`ray_train_run_name`,
`ray_train_run_id`, `ray_train_worker_world_rank`); everything Ray does not export is
`minitrain_train_*` in base units, following Prometheus' naming conventions.
"""

from __future__ import annotations

import math
from typing import Iterator, Optional

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from minitrain.dashboard.api import RunView, goodput_of, numeric_metrics
from minitrain.run_state import RunState, ray_status

# Every run state, as the monitor words it (`ray_status`); ray_train_controller_state has one series
# per state, 1 for the current one (Ray's enum gauge).
RUN_STATES = tuple(ray_status(state) for state in RunState)
RUN_LABELS = ["ray_train_run_name", "ray_train_run_id"]
RANK_LABELS = RUN_LABELS + ["ray_train_worker_world_rank", "host"]

# (field of a rank, metric name, help) for the per-rank gauges.
_RANK_GAUGES = (
    # Step time is the rank's own work per step, its waits for the others excluded (as the console
    # and the straggler rule judge it): a rank held up by a slow peer must not look slowest.
    ("work_time_s", "minitrain_train_step_time_seconds",
     "Seconds per step of the rank's own work: the interval between report() calls minus its waits in "
     "report() and in minitrain's collectives (those are the *_wait_seconds series)."),
    ("report_wait_s", "minitrain_train_report_wait_seconds", "Seconds the rank's last step spent blocked in report()."),
    ("collective_wait_s", "minitrain_train_collective_wait_seconds",
     "Seconds the rank's last step spent in minitrain's collectives."),
    ("data_wait_s", "minitrain_train_data_wait_seconds",
     "Seconds the rank's last step waited on prepare_data_loader / get_dataset_shard data."),
    ("cpu_percent", "minitrain_train_worker_cpu_percent", "CPU use of the rank's process, percent of one core."),
    ("rss_bytes", "minitrain_train_worker_rss_bytes", "Resident memory of the rank's process."),
    ("last_report_age_s", "minitrain_train_last_report_age_seconds", "Seconds since the rank's last report."),
)


def _text(value: object) -> str:
    """`value` as a label value the UTF-8 exposition can hold: a lone surrogate (a metric name from a
    run of an older version, which accepted them) is written as its escape, never a 500 for the run."""
    text = str(value)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def _finite(value) -> Optional[float]:
    if value is None or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


class RunCollector(Collector):
    """Collects the monitor's current state as metric families at each scrape."""

    def __init__(self, view: RunView):
        self._view = view

    def collect(self) -> Iterator[Metric]:
        run = self._view.run()
        base = [_text(run.get("name") or ""), _text(run.get("run_id") or "")]
        yield from self._run_metrics(run, base)
        yield from self._rank_metrics(base)

    def _run_metrics(self, run: dict, base: list[str]) -> Iterator[Metric]:
        state = GaugeMetricFamily("ray_train_controller_state", "Current state of the run (1 for the current one).",
                                  labels=RUN_LABELS + ["ray_train_controller_state"])
        for name in RUN_STATES:
            state.add_metric(base + [name], 1.0 if run.get("state") == name else 0.0)
        yield state
        attempts = self._view.attempts()
        yield _gauge("minitrain_train_attempts", "Attempts started (1 + restarts).", base, float(len(attempts)))
        failures = CounterMetricFamily("minitrain_train_worker_failures", "Worker failures, by kind; "
                                       "consequence=true for ranks that failed because another one did.",
                                       labels=RUN_LABELS + ["kind", "consequence"])
        counts: dict[tuple[str, str], int] = {}
        for attempt in attempts:
            for failure in attempt.get("failures", ()):
                key = (_text(failure.get("kind", "")), "true" if failure.get("consequence") else "false")
                counts[key] = counts.get(key, 0) + 1
        for (kind, consequence), count in sorted(counts.items()):
            failures.add_metric(base + [kind, consequence], float(count))
        yield failures
        checkpoints = self._view.checkpoints()
        yield _counter("minitrain_train_checkpoints_committed", "Checkpoints committed, kept or since deleted.",
                       base, float(len(checkpoints)))
        reports = self._view.reports()
        yield _counter("minitrain_train_reports", "Report rounds of rank 0.", base, float(len(reports)))
        for field, name, help_text in (("steps_per_s", "minitrain_train_steps_per_second",
                                        "Steps per second of the run (report rounds)."),
                                       ("progress", "minitrain_train_progress_ratio",
                                        "Fraction of the declared total done (absent without a total)."),
                                       ("eta_s", "minitrain_train_eta_seconds", "Estimated seconds left.")):
            value = _finite(run.get(field))
            if value is not None:
                yield _gauge(name, help_text, base, value)
        if reports:
            last = GaugeMetricFamily("minitrain_train_reported_metric",
                                     "Rank 0's latest value of each numeric metric passed to report().",
                                     labels=RUN_LABELS + ["metric"])
            latest: dict[str, float] = {}
            for report in reports:
                for key in numeric_metrics([report]):
                    value = _finite(report["metrics"][key])
                    if value is not None:
                        latest[key] = value
            for key, value in latest.items():
                last.add_metric(base + [_text(key)], value)
            yield last
        yield from _goodput_metrics(goodput_of(self._view), base)

    def _rank_metrics(self, base: list[str]) -> Iterator[Metric]:
        ranks = self._view.ranks()
        families = {field: GaugeMetricFamily(name, help_text, labels=RANK_LABELS)
                    for field, name, help_text in _RANK_GAUGES}
        throughput = GaugeMetricFamily("minitrain_train_worker_steps_per_second",
                                       "Steps per second of the rank (1 / step time).", labels=RANK_LABELS)
        straggler = GaugeMetricFamily("minitrain_train_straggler", "1 while the rank is named a straggler.",
                                      labels=RANK_LABELS)
        gpu_labels = RANK_LABELS + ["gpu"]
        gpu_util = GaugeMetricFamily("minitrain_train_gpu_utilization_percent", "GPU utilisation (NVML).",
                                     labels=gpu_labels)
        gpu_used = GaugeMetricFamily("minitrain_train_gpu_memory_used_bytes", "GPU memory used (NVML).",
                                     labels=gpu_labels)
        gpu_total = GaugeMetricFamily("minitrain_train_gpu_memory_total_bytes", "GPU memory (NVML).",
                                      labels=gpu_labels)
        for rank in ranks:
            labels = base + [str(rank.get("rank")), _text(rank.get("host") or "")]
            for field, family in families.items():
                value = _finite(rank.get(field))
                if value is not None:
                    family.add_metric(labels, value)
            step = _finite(rank.get("step_time_s"))
            if step:
                throughput.add_metric(labels, 1.0 / step)
            straggler.add_metric(labels, 1.0 if rank.get("straggler") else 0.0)
            for gpu in rank.get("gpus") or ():
                gpu_labels_values = labels + [str(gpu.get("index"))]
                for family, key in ((gpu_util, "util_percent"), (gpu_used, "memory_used_bytes"),
                                    (gpu_total, "memory_total_bytes")):
                    value = _finite(gpu.get(key))
                    if value is not None:
                        family.add_metric(gpu_labels_values, value)
        yield from families.values()
        yield from (throughput, straggler, gpu_util, gpu_used, gpu_total)


def _goodput_metrics(goodput: Optional[dict], base: list[str]) -> Iterator[Metric]:
    """The goodput ledger's worker-seconds by cause (every cause, 0 included, so a series never
    vanishes) and its share, for the run so far; nothing without a ledger."""
    if not goodput:
        return
    seconds = GaugeMetricFamily("minitrain_train_goodput_seconds",
                                "Worker-seconds of the run so far by cause (the goodput ledger; they sum to "
                                "wall time x ranks).", labels=RUN_LABELS + ["cause"])
    for cause, value in (goodput.get("total") or {}).items():
        number = _finite(value)
        if number is not None:
            seconds.add_metric(base + [_text(cause)], number)
    yield seconds
    share = _finite(goodput.get("share"))
    if share is not None:
        yield _gauge("minitrain_train_goodput_ratio", "Goodput: the compute share of the worker-seconds so far.",
                     base, share)


def _gauge(name: str, help_text: str, base: list[str], value: float) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, help_text, labels=RUN_LABELS)
    family.add_metric(base, value)
    return family


def _counter(name: str, help_text: str, base: list[str], value: float) -> CounterMetricFamily:
    family = CounterMetricFamily(name, help_text, labels=RUN_LABELS)
    family.add_metric(base, value)
    return family


def registry_for(view: RunView) -> CollectorRegistry:
    """A registry of its own holding one `RunCollector` over `view` (auto_describe off: describing
    would read the monitor at registration for nothing)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RunCollector(view))
    return registry


def exposition(registry: CollectorRegistry) -> bytes:
    """The registry in Prometheus' text exposition format."""
    return generate_latest(registry)
