"""A worker's telemetry: one sample a second on its stream to the coordinator, no user code needed.

`Sampler.sample()` turns `minitrain.waits`' totals, the process' CPU time and RSS (psutil) and its
GPUs' utilisation and memory (NVML, only when the worker was given GPUs and NVML answers) into one
`Telemetry` message. Waits are per step: the seconds blocked since the previous sample divided by
the steps (report() calls) that ended since then, or the window's seconds when none ended. Step
time is the mean interval between those report() calls; when none ended, the time since the last
one if that is already longer than the last step time (a rank in a long step shows it), else the
last step time.

`TelemetryThread` sends a sample every INTERVAL_S (at most 1 Hz) while the training function runs;
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
from minitrain.rpc._gen import minitrain_pb2 as pb

logger = logging.getLogger("minitrain")

INTERVAL_S = 1.0  # at most one sample a second: the budget for the control channel


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

    def read(self) -> list[pb.GpuSample]:
        """One GpuSample per GPU that answered."""
        samples = []
        for index, handle in self._handles:
            try:
                rates = self._nvml.nvmlDeviceGetUtilizationRates(handle)
                memory = self._nvml.nvmlDeviceGetMemoryInfo(handle)
            except Exception:
                continue
            samples.append(pb.GpuSample(index=index, util_percent=float(rates.gpu),
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
    """Builds the telemetry samples of one rank (see the module doc); not thread-safe."""

    def __init__(self, gpus: GpuProbe, clock: Callable[[], float] = time.monotonic,
                 totals: Callable[[], waits.Totals] = waits.totals):
        self._gpus = gpus
        self._clock = clock
        self._totals = totals
        self._process = _Process()
        self._previous = totals()
        self._previous_at = clock()
        self._step_time_s: Optional[float] = None

    def sample(self) -> pb.Telemetry:
        """The sample of the window since the previous call."""
        now, totals, previous = self._clock(), self._totals(), self._previous
        steps = totals.reports - previous.reports
        if steps > 0:
            since = previous.last_report_at if previous.last_report_at is not None else self._previous_at
            self._step_time_s = max(totals.last_report_at - since, 0.0) / steps
        elif totals.last_report_at is not None and self._step_time_s is not None:
            self._step_time_s = max(self._step_time_s, now - totals.last_report_at)
        divisor = steps if steps > 0 else 1
        message = pb.Telemetry(sampled_at=time.time(), reports=totals.reports, total=waits.declared_total() or 0)
        if self._step_time_s is not None:
            message.step_time_s = self._step_time_s
        message.report_wait_s = (totals.report_s - previous.report_s) / divisor
        message.collective_wait_s = (totals.collective_s - previous.collective_s) / divisor
        if totals.data_s is not None:
            message.data_wait_s = (totals.data_s - (previous.data_s or 0.0)) / divisor
        cpu, rss = self._process.read()
        if cpu is not None:
            message.cpu_percent = cpu
            message.rss_bytes = rss
        message.gpus.extend(self._gpus.read())
        self._previous, self._previous_at = totals, now
        return message


class TelemetryThread:
    """Sends `sampler.sample()` through `send(telemetry=...)` every `interval_s` until `stop()`."""

    def __init__(self, sampler: Sampler, send: Callable[..., None], interval_s: float = INTERVAL_S):
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
                self._send(telemetry=self._sampler.sample())
        except Exception as exc:  # noqa: BLE001 - telemetry never fails the worker
            logger.debug("telemetry stopped: %s", exc)

    def stop(self) -> None:
        """Stop sampling (returns at once; the thread ends within one interval)."""
        self._stopped.set()


def start(device_indices: Sequence[int], send: Callable[..., None]) -> Optional[TelemetryThread]:
    """Start this rank's telemetry, or return None when MINITRAIN_TELEMETRY=0."""
    if not waits.ENABLED:
        return None
    thread = TelemetryThread(Sampler(GpuProbe(device_indices)), send)
    thread.start()
    return thread

