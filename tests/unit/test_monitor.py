"""The run monitor and the straggler rule, fed synthetic observer calls: what it shows, what it writes
to the run directory, how it rebuilds a finished run from those files, and that a storage failure
never reaches the run (issue 16 items 1 and 5)."""

from __future__ import annotations

import json
import logging

import pytest

from minitrain.coordinator.monitor import RunMonitor, step_time_summary
from minitrain.coordinator.observers import (
    AttemptEnd, AttemptInfo, GpuSample, RoundInfo, RunInfo, TelemetrySample,
)
from minitrain.coordinator.stragglers import StragglerDetector, StragglerRule
from minitrain.errors import ConfigError
from minitrain.records import FailureKind, Phase, ReportRecord, RunOutcome, WorkerFailure
from minitrain.storage.filesystem import Storage
from minitrain.storage.layout import EVENTS_NAME, RESERVED_NAMES, TELEMETRY_NAME
from minitrain.storage.retention import CheckpointRecord

RULE = StragglerRule(factor=1.5, window=5, min_samples=3)


def feed(detector, steps, data=None, rounds=1):
    """`rounds` samples of every rank: steps[r] step time, data[r] data wait."""
    for _ in range(rounds):
        for rank, step in enumerate(steps):
            detector.add(rank, f"h{rank}", step, None if data is None else data[rank])
    return detector.evaluate(0.0)


def test_a_rank_persistently_slower_than_the_others_median_is_flagged_then_cleared():
    detector = StragglerDetector(RULE)
    assert feed(detector, [0.1, 0.1, 0.1, 0.3], rounds=2) == ([], [])  # fewer than min_samples: no verdict
    started, cleared = feed(detector, [0.1, 0.1, 0.1, 0.3])
    assert [s.rank for s in started] == [3] and not cleared
    [straggler] = started
    assert straggler.slower_by == pytest.approx(3.0) and straggler.cause == "compute"
    assert straggler.host == "h3" and straggler.median_step_time_s == pytest.approx(0.1)
    # Back to normal: the window's median needs a majority of fast samples before it clears.
    assert feed(detector, [0.1, 0.1, 0.1, 0.1], rounds=2) == ([], [])
    started, cleared = feed(detector, [0.1, 0.1, 0.1, 0.1])
    assert not started and [s.rank for s in cleared] == [3]


def test_one_slow_step_and_a_rank_below_the_factor_are_not_stragglers():
    detector = StragglerDetector(RULE)
    feed(detector, [0.1, 0.1], rounds=4)
    assert feed(detector, [0.1, 0.9]) == ([], [])  # one slow sample out of five
    detector = StragglerDetector(RULE)
    assert feed(detector, [0.1, 0.14], rounds=5) == ([], [])  # 1.4x < 1.5x
    # Two ranks: each is compared with the other (leave-one-out), so 2x is caught.
    assert [s.rank for s in feed(StragglerDetector(RULE), [0.1, 0.2], rounds=3)[0]] == [1]


def test_the_cause_is_data_wait_when_the_extra_data_wait_explains_the_excess():
    started, _ = feed(StragglerDetector(RULE), [0.1, 0.1, 0.4], data=[0.01, 0.01, 0.25], rounds=3)
    assert started[0].cause == "data wait"  # 0.24 s extra data wait of 0.3 s extra step time
    started, _ = feed(StragglerDetector(RULE), [0.1, 0.1, 0.4], data=[0.01, 0.01, 0.05], rounds=3)
    assert started[0].cause == "compute"


def test_the_rule_comes_from_the_environment_and_bad_values_name_the_variable():
    rule = StragglerRule.from_env({"MINITRAIN_STRAGGLER_FACTOR": "1.2", "MINITRAIN_STRAGGLER_WINDOW": "3"})
    assert (rule.factor, rule.window, rule.min_samples) == (1.2, 3, 3)
    assert StragglerRule.from_env({}) == StragglerRule()
    with pytest.raises(ConfigError, match="MINITRAIN_STRAGGLER_FACTOR='fast'"):
        StragglerRule.from_env({"MINITRAIN_STRAGGLER_FACTOR": "fast"})
    with pytest.raises(ConfigError, match="MINITRAIN_STRAGGLER_FACTOR=0.9"):
        StragglerRule.from_env({"MINITRAIN_STRAGGLER_FACTOR": "0.9"})
    with pytest.raises(ConfigError, match="MINITRAIN_STRAGGLER_MIN_SAMPLES=11"):
        StragglerRule.from_env({"MINITRAIN_STRAGGLER_MIN_SAMPLES": "11"})


def sample(rank, t, step, attempt=1, total=None, data=None):
    return TelemetrySample(attempt=attempt, rank=rank, time=t, reports=int(t), step_time_s=step,
                           report_wait_s=0.0, collective_wait_s=0.0, data_wait_s=data, cpu_percent=95.0,
                           rss_bytes=1 << 28, gpus=(GpuSample(0, 80.0, 1, 2),) if rank == 0 else (),
                           total=total, host=f"host{rank}", pid=100 + rank, phase="TRAINING")


def drive(monitor, slow_rank=1, samples=6):
    """A run: attempt 0 fails, attempt 1 trains with rank `slow_rank` 3x slower and commits a checkpoint."""
    monitor.on_run_start(RunInfo("rid", "exp", "/runs/exp", 2, 10.0))
    monitor.on_attempt_start(AttemptInfo(0, ("host0", "host1"), 11.0))
    failure = WorkerFailure(rank=1, node="host1", pid=7, phase=Phase.TRAINING, time=12.0, exc_type="ValueError",
                            message="boom", kind=FailureKind.EXCEPTION)
    monitor.on_attempt_end(AttemptEnd(0, (failure,), "rank 1 ValueError: boom", True, 12.5))
    monitor.on_attempt_start(AttemptInfo(1, ("host0", "host1"), 13.0))
    for i in range(samples):
        for rank in (0, 1):
            monitor.on_telemetry(sample(rank, 20.0 + i, 0.3 if rank == slow_rank else 0.1, total=20))
    for index in range(4):
        monitor.on_report(ReportRecord(attempt=1, rank=0, round=index, metrics={"loss": 1.0 / (index + 1)},
                                       reported_at=30.0 + index))
        checkpoint = CheckpointRecord("checkpoint_000003", {"loss": 0.25}, 3, 1, 33.5) if index == 3 else None
        monitor.on_round(RoundInfo(1, index, ({"loss": 1.0 / (index + 1)}, None), checkpoint, 30.0 + index))


def test_the_monitor_shows_the_run_its_ranks_and_its_straggler(tmp_path, caplog):
    storage = Storage.for_run(str(tmp_path), "exp")
    storage.makedirs()
    monitor = RunMonitor(storage, kept_dir_names=lambda: {"checkpoint_000003"}, rule=RULE, clock=lambda: 34.0)
    with caplog.at_level(logging.WARNING, logger="minitrain"):
        drive(monitor)
    run = monitor.run()
    assert (run["state"], run["attempt"], run["num_workers"], run["total"]) == ("RUNNING", 1, 2, 20)
    assert run["steps_per_s"] == pytest.approx(1.0) and run["progress"] == pytest.approx(4 / 20)
    assert run["eta_s"] == pytest.approx(16.0)
    [failed, current] = monitor.attempts()
    assert failed["failures"][0]["exc_type"] == "ValueError" and failed["restarting"] is True
    assert current["ended_at"] is None and current["hosts"] == ["host0", "host1"]
    assert monitor.checkpoints() == [{"dir": "checkpoint_000003", "index": 3, "attempt": 1,
                                      "metrics": {"loss": 0.25}, "committed_at": 33.5, "kept": True}]
    assert [r["index"] for r in monitor.reports()] == [0, 1, 2, 3]
    rank0, rank1 = monitor.ranks()
    assert rank0["gpus"] == [{"index": 0, "util_percent": 80.0, "memory_used_bytes": 1, "memory_total_bytes": 2}]
    assert rank1["gpus"] == [] and rank1["pid"] == 101 and rank1["straggler"] and not rank0["straggler"]
    assert rank0["reports"] == 4 and rank0["last_report_age_s"] == pytest.approx(0.0)
    assert rank1["last_report_age_s"] is None and rank1["data_wait_s"] is None
    [straggler] = monitor.stragglers()
    assert (straggler["rank"], straggler["host"], straggler["cause"]) == (1, "host1", "compute")
    assert straggler["slower_by"] == pytest.approx(3.0)
    assert "rank 1 on host1 is a straggler" in caplog.text and caplog.text.count("straggler") == 1
    assert len(monitor.samples()) == 12 and len(monitor.samples(rank=1, since=23.0)) == 2
    assert step_time_summary(monitor.ranks()) == {"min": 0.1, "median": pytest.approx(0.2), "max": 0.3,
                                                  "slowest_rank": 1}
    # Copies: changing what was returned changes nothing inside.
    monitor.ranks()[0]["gpus"].clear()
    assert monitor.ranks()[0]["gpus"]

    monitor.on_attempt_end(AttemptEnd(1, (), "", False, 40.0))
    monitor.on_run_end(RunOutcome(state="SUCCEEDED", attempt=1, last_metrics={"loss": 0.25}))
    assert monitor.run()["state"] == "FINISHED"
    [episode] = monitor.straggler_history()
    assert (episode["rank"], episode["attempt"], episode["until"]) == (1, 1, 40.0)

    # The files, and a monitor rebuilt from them (the post-hoc dashboard's view).
    events = [json.loads(line) for line in (tmp_path / "exp" / EVENTS_NAME).read_text().splitlines()]
    assert [e["kind"] for e in events] == ["run_started", "attempt_started", "attempt_ended", "attempt_started",
                                           "straggler", "checkpoint_committed", "attempt_ended", "run_ended"]
    lines = (tmp_path / "exp" / TELEMETRY_NAME).read_text().splitlines()
    assert len(lines) == 12 and json.loads(lines[0])["host"] == "host0"
    (tmp_path / "exp" / "metrics.jsonl").write_text("".join(
        json.dumps({"metrics": r["metrics"], "report_index": r["index"], "attempt": 1, "time": r["time"]}) + "\n"
        for r in monitor.reports()))
    with open(tmp_path / "exp" / TELEMETRY_NAME, "a") as torn:
        torn.write('{"rank": 0, "ti')  # a crash in the middle of an append
    rebuilt = RunMonitor.from_run_dir(storage)
    assert rebuilt.attempts() == monitor.attempts()
    assert rebuilt.checkpoints()[0]["dir"] == "checkpoint_000003"
    assert rebuilt.reports() == monitor.reports() and rebuilt.samples() == monitor.samples()
    assert rebuilt.ranks()[1]["step_time_s"] == 0.3
    expected = {k: v for k, v in monitor.run().items()}
    assert rebuilt.run() == expected
    assert [e["rank"] for e in rebuilt.straggler_history()] == [1]
    assert {TELEMETRY_NAME, EVENTS_NAME} <= RESERVED_NAMES


class FailingStorage:
    def __init__(self):
        self.calls = 0

    def append_text(self, name, text):
        self.calls += 1
        raise OSError(28, "No space left on device")

    def url(self, name=""):
        return f"/full/{name}"


def test_a_storage_failure_is_logged_once_and_the_monitor_goes_on(caplog):
    storage = FailingStorage()
    monitor = RunMonitor(storage, rule=RULE)
    with caplog.at_level(logging.WARNING, logger="minitrain"):
        drive(monitor)
        monitor.on_run_end(RunOutcome(state="FAILED", attempt=1, last_metrics=None))
    assert caplog.text.count("could not write") == 1 and "No space left" in caplog.text
    assert monitor.run()["state"] == "ERRORED" and len(monitor.samples()) == 12
