"""Where a training process counts its steps and the time it spends blocked (L0, stdlib only).

minitrain's own blocking calls record here: `minitrain.report()` (each call is one step, and its
duration is report wait), `minitrain.collective` (collective wait), and the iterators of
`prepare_data_loader` and `get_dataset_shard` (data wait: the time inside their `next()`). The
worker's telemetry thread (`minitrain.worker.telemetry`) reads the totals once a second; nothing here
talks to anything. Totals only grow, so a reader takes differences.

`MINITRAIN_TELEMETRY=0` in the environment turns recording off (`ENABLED` is False): every call
below returns at once and the telemetry thread never starts.
"""

from __future__ import annotations

import os
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, Optional

ENV_SWITCH = "MINITRAIN_TELEMETRY"


def telemetry_enabled(environ=os.environ) -> bool:
    """False when `MINITRAIN_TELEMETRY` is "0", "false", "no" or "off" (any case)."""
    return environ.get(ENV_SWITCH, "1").strip().lower() not in ("0", "false", "no", "off")


ENABLED = telemetry_enabled()

REPORT, COLLECTIVE, DATA = "report", "collective", "data"


@dataclass(frozen=True)
class Totals:
    """What was recorded so far: `reports` report() calls, the last one ending at `last_report_at`
    (time.monotonic(), None before the first), and seconds blocked by kind; `data_s` is None while no
    instrumented data iterator was used."""

    reports: int
    last_report_at: Optional[float]
    report_s: float
    collective_s: float
    data_s: Optional[float]


class _Recorder:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._reports = 0
        self._last_report_at: Optional[float] = None
        self._seconds = {REPORT: 0.0, COLLECTIVE: 0.0, DATA: 0.0}
        self._data_used = False
        self.total: Optional[int] = None  # report() calls the training function declared

    def add(self, kind: str, seconds: float) -> None:
        with self._lock:
            self._seconds[kind] += seconds
            if kind == DATA:
                self._data_used = True

    def step(self, ended_at: float, blocked_s: float) -> None:
        with self._lock:
            self._reports += 1
            self._last_report_at = ended_at
            self._seconds[REPORT] += blocked_s

    def totals(self) -> Totals:
        with self._lock:
            return Totals(self._reports, self._last_report_at, self._seconds[REPORT],
                          self._seconds[COLLECTIVE], self._seconds[DATA] if self._data_used else None)

    def reset(self) -> None:
        with self._lock:
            self.__init__()


_recorder = _Recorder()


def add(kind: str, seconds: float) -> None:
    """Count `seconds` blocked in `kind` (COLLECTIVE or DATA)."""
    if ENABLED:
        _recorder.add(kind, seconds)


@contextmanager
def blocked(kind: str) -> Iterator[None]:
    """Count the time inside the `with` block as blocked in `kind` (also when it raises)."""
    if not ENABLED:
        yield
        return
    started = time.perf_counter()
    try:
        yield
    finally:
        _recorder.add(kind, time.perf_counter() - started)


def report_done(started: float) -> None:
    """A report() call that began at time.perf_counter() `started` returned: one step ended."""
    if ENABLED:
        now = time.perf_counter()
        _recorder.step(time.monotonic(), now - started)


def timed_iterator(iterator: Iterator) -> Iterator:
    """`iterator` whose every `next()` counts as data wait."""
    if not ENABLED:
        yield from iterator
        return
    add_data = _recorder.add
    clock = time.perf_counter
    while True:
        started = clock()
        try:
            item = next(iterator)
        except StopIteration:
            add_data(DATA, clock() - started)
            return
        add_data(DATA, clock() - started)
        yield item


def set_total(total: Optional[int]) -> None:
    """Remember the declared number of report() calls (None forgets it)."""
    _recorder.total = total


def declared_total() -> Optional[int]:
    """The declared number of report() calls, or None."""
    return _recorder.total


def totals() -> Totals:
    """The totals so far (a consistent snapshot)."""
    return _recorder.totals()


def reset() -> None:
    """Forget everything (a new worker session; tests)."""
    _recorder.reset()
