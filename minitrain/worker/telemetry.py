"""A worker's telemetry: one sample a second on its stream to the coordinator, no user code needed.

`Sampler.sample()` turns `minitrain.waits`' totals, the process' CPU time and RSS (psutil) and its
GPUs' utilisation and memory (NVML, only when the worker was given GPUs and NVML answers) into one
`minitrain.records.TelemetrySample` (the worker's stream, `minitrain.worker.transport.client`, converts it). Step time and waits describe the same steps, so that step time minus the
waits is the rank's own work:
- when steps (report() calls) ended since the previous sample: step time is their mean interval,
  and each wait the seconds blocked between the previous sample's last report() end and this one's,
  divided by those steps (a wait that straddles a sample boundary belongs to the step it was in);
- when none ended and the step in progress is already longer than the last one (a rank blocked for
  seconds in a checkpoint report() waiting for the round's commit, or in a long step): that step as
  it stands, its elapsed time and the waits so far, the open wait included;
- otherwise the last steps' figures again (None before the first report() ends).

`TelemetryThread` sends a sample every `interval_s(world_size)` while the training function runs: once a
second (INTERVAL_S), and less often in a run of more than RUN_SAMPLES_PER_S ranks, so that the whole
run's samples stay within what the coordinator is given for them (at 16,384 ranks one every 4 s);
`MINITRAIN_TELEMETRY=0` turns it off (see `minitrain.waits`). Telemetry never fails a worker: a
measurement that raises is left out of the sample, and an error in the thread ends only the thread.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any, Callable, Optional, Sequence

from minitrain import waits
from minitrain.records import GpuSample, TelemetrySample

logger = logging.getLogger("minitrain")

INTERVAL_S = 1.0  # at most one sample a second from a rank
# At most this many samples a second from the whole run. Each costs the coordinator about what a report
# costs (its Python, its share of a message); at one a second from 16,384 ranks the samples were half of
# everything it took in, and as costly as the reports (docs/benchmarks/scale.md). Up to this many ranks
# nothing changes; beyond, each rank samples less often (the straggler rule's window of samples spans
# that much longer).
RUN_SAMPLES_PER_S = 4096


def interval_s(world_size: int) -> float:
    """How often each rank of a `world_size`-rank run sends a sample: INTERVAL_S, or more seconds in a
    run of more than RUN_SAMPLES_PER_S ranks."""
    return max(INTERVAL_S, world_size / RUN_SAMPLES_PER_S)


class GpuProbe:
    """Utilisation and memory of some GPUs through NVML (`pynvml`, from nvidia-ml-py).

    `device_indices` are the worker's GPUs as CUDA numbers them (indices into CUDA_VISIBLE_DEVICES);
    they are mapped to NVML devices through CUDA_VISIBLE_DEVICES (numbers or GPU-UUIDs). With no
    GPUs, or when NVML cannot be loaded or initialised (no driver), `read()` returns [] and never
    raises. `nvml` is the pynvml module (a parameter for tests)."""

    def __init__(self, device_indices: Sequence[int], nvml: Any = None,
                 visible_devices: Optional[str] = None):
        self._handles: list[tuple[int, Any]] = []
        self._nvml = None
        if not device_indices:
            return
        try:
            if nvml is None:
                import pynvml as nvml
            nvml.nvmlInit()
        except Exception as exc:  # no NVML library or no driver: no GPU telemetry
            logger.debug("NVML unavailable, no GPU telemetry: %s", exc)
            return
        self._nvml = nvml
        if visible_devices is None:
            visible_devices = os.environ.get("CUDA_VISIBLE_DEVICES")
        visible = [v.strip() for v in visible_devices.split(",")] if visible_devices else None
        for cuda_index in device_indices:
            try:
                self._handles.append(self._handle(cuda_index, visible))
            except Exception as exc:
                logger.debug("no NVML handle for GPU %s: %s", cuda_index, exc)

    def _handle(self, cuda_index: int, visible: Optional[list[str]]) -> tuple[int, Any]:
        nvml = self._nvml
        name = visible[cuda_index] if visible is not None else str(cuda_index)
        if name.isdigit():
            handle = nvml.nvmlDeviceGetHandleByIndex(int(name))
        else:
            handle = nvml.nvmlDeviceGetHandleByUUID(name)
        return int(nvml.nvmlDeviceGetIndex(handle)), handle

    def read(self) -> list[GpuSample]:
        """One GpuSample per GPU that answered."""
        samples = []
        for index, handle in self._handles:
            try:
                rates = self._nvml.nvmlDeviceGetUtilizationRates(handle)
                memory = self._nvml.nvmlDeviceGetMemoryInfo(handle)
            except Exception:
                continue
            samples.append(GpuSample(index=index, util_percent=float(rates.gpu),
                                     memory_used_bytes=int(memory.used), memory_total_bytes=int(memory.total)))
        return samples


class _Process:
    """CPU % (100 = one core) since the previous read, and RSS, of this process."""

    def __init__(self) -> None:
        try:
            import psutil

            self._process = psutil.Process()
            self._process.cpu_percent(None)  # primes the interval
        except Exception:
            self._process = None

    def read(self) -> tuple[Optional[float], Optional[int]]:
        if self._process is None:
            return None, None
        try:
            return float(self._process.cpu_percent(None)), int(self._process.memory_info().rss)
        except Exception:
            return None, None


class Sampler:
    """Builds the telemetry samples of one rank, `rank` of `attempt` (0 and 0 serve a measurement
    outside a run; see the module doc); not thread-safe. `clock` must be the clock of `totals` (time.monotonic for `minitrain.waits`)."""

    def __init__(self, gpus: GpuProbe, clock: Callable[[], float] = time.monotonic,
                 totals: Callable[[], waits.Totals] = waits.totals, attempt: int = 0, rank: int = 0):
        self._gpus = gpus
        self._attempt = attempt
        self._rank = rank
        self._clock = clock
        self._totals = totals
        self._process = _Process()
        self._previous = totals()
        self._previous_at = clock()
        self._last: Optional[tuple[float, waits.Waits]] = None  # step time and waits per step, last steps

    def _figures(self, now: float, totals: waits.Totals) -> Optional[tuple[float, waits.Waits]]:
        """(step time, waits per step) for this sample (see the module doc)."""
        previous = self._previous
        steps = totals.reports - previous.reports
        if steps > 0:
            if previous.last_report_at is not None:
                since, before = previous.last_report_at, previous.at_last_report
            else:  # the first step: measured from the previous sample, as its waits
                since, before = self._previous_at, previous.waits
            step_time = max(totals.last_report_at - since, 0.0) / steps
            self._last = step_time, totals.at_last_report.minus(before).per(steps)
            return self._last
        if totals.last_report_at is not None and self._last is not None:
            elapsed = max(now - totals.last_report_at, 0.0)
            if elapsed > self._last[0]:
                return elapsed, totals.waits.minus(totals.at_last_report)
        return self._last

    def sample(self) -> TelemetrySample:
        """The sample of the window since the previous call (a figure not measured is None)."""
        totals = self._totals()
        now = self._clock()
        sampled_at = time.time()
        step_time = report_wait = collective_wait = data_wait = None
        figures = self._figures(now, totals)
        if figures is not None:
            step_time, per_step = figures
            report_wait = min(per_step.report_s, step_time)
            collective_wait = min(per_step.collective_s, step_time)
            if per_step.data_s is not None:
                data_wait = min(per_step.data_s, step_time)
        cpu, rss = self._process.read()
        sample = TelemetrySample(
            attempt=self._attempt, rank=self._rank, time=sampled_at, reports=totals.reports,
            step_time_s=step_time, report_wait_s=report_wait, collective_wait_s=collective_wait,
            data_wait_s=data_wait, cpu_percent=cpu, rss_bytes=rss,
            gpus=tuple(self._gpus.read()), total=waits.declared_total() or None)
        self._previous, self._previous_at = totals, now
        return sample


class TelemetryThread:
    """Sends `sampler.sample()` through `send(sample)` every `interval_s` until `stop()`, except
    while `minitrain.waits.ENABLED` is False."""

    def __init__(self, sampler: Sampler, send: Callable[[TelemetrySample], None], interval_s: float = INTERVAL_S):
        self._sampler = sampler
        self._send = send
        self._interval_s = max(interval_s, INTERVAL_S)
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="minitrain-telemetry", daemon=True)

    def start(self) -> None:
        """Start sampling."""
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stopped.wait(self._interval_s):
                # Recording can be switched off while the rank runs (`waits.ENABLED`, read at each tick:
                # the ddp benchmark alternates blocks with telemetry on and off in one job): no sample then.
                if waits.ENABLED:
                    self._send(self._sampler.sample())
        except Exception as exc:  # noqa: BLE001 - telemetry never fails the worker
            logger.debug("telemetry stopped: %s", exc)

    def stop(self) -> None:
        """Stop sampling (returns at once; the thread ends within one interval)."""
        self._stopped.set()


def start(device_indices: Sequence[int], send: Callable[[TelemetrySample], None], *, attempt: int,
          rank: int, world_size: int) -> Optional[TelemetryThread]:
    """Start the telemetry of `rank` of `attempt` of `world_size` ranks (its GPUs: `device_indices`),
    sampling every `interval_s(world_size)`, or return None when MINITRAIN_TELEMETRY=0."""
    if not waits.ENABLED:
        return None
    thread = TelemetryThread(Sampler(GpuProbe(device_indices), attempt=attempt, rank=rank), send,
                             interval_s(world_size))
    thread.start()
    return thread

