"""Where a training process counts its steps and the time it spends blocked (L0, stdlib only).

minitrain's own blocking calls record here: `minitrain.report()` (each call is one step, and its
duration is report wait), `minitrain.collective` (collective wait), and the iterators of
`prepare_data_loader` and `get_dataset_shard` (data wait: the time inside their `next()`). The
worker's telemetry thread (`minitrain.worker.telemetry`) reads the totals once a second; nothing here
talks to anything. Totals only grow, so a reader takes differences.

A wait is counted as it accrues, not only when it ends: `totals()` includes the elapsed part of every
block still open (a rank blocked for seconds in a checkpoint report(), waiting for the round's
commit, shows that wait in every sample meanwhile). Each report() that ends also takes a snapshot of
the wait totals (`Totals.at_last_report`), so a reader can give each step exactly the waits that
fell between its two report() ends, whichever sample windows they straddled. One clock for
everything: time.monotonic().

`MINITRAIN_TELEMETRY=0` in the environment (`minitrain.knobs.TELEMETRY`, read once at import) turns
recording off (`ENABLED` is False): every call below returns at once and the telemetry thread never
starts. `ENABLED` is read at each call on purpose, so setting it while a rank runs switches recording
(and the telemetry thread's samples) off and on; the ddp benchmark does so to time telemetry in
alternating blocks of one job.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, Optional

from minitrain import knobs


def telemetry_enabled(environ: Optional[Mapping[str, str]] = None) -> bool:
    """False when `MINITRAIN_TELEMETRY` in `environ` (default: os.environ) is "0", "false", "no" or "off"
    (any case); ConfigError for a value that is neither on nor off."""
    return knobs.TELEMETRY.get(environ)


ENABLED = telemetry_enabled()

REPORT, COLLECTIVE, DATA = "report", "collective", "data"


@dataclass(frozen=True)
class Waits:
    """Seconds blocked by kind; `data_s` is None while no instrumented data iterator was used."""

    report_s: float = 0.0
    collective_s: float = 0.0
    data_s: Optional[float] = None

    def minus(self, earlier: "Waits") -> "Waits":
        """The waits between `earlier` and these (never negative)."""
        return Waits(max(self.report_s - earlier.report_s, 0.0),
                     max(self.collective_s - earlier.collective_s, 0.0),
                     None if self.data_s is None else max(self.data_s - (earlier.data_s or 0.0), 0.0))

    def per(self, steps: int) -> "Waits":
        """These waits divided by `steps` (> 0)."""
        return Waits(self.report_s / steps, self.collective_s / steps,
                     None if self.data_s is None else self.data_s / steps)


@dataclass(frozen=True)
class Totals:
    """What was recorded so far, at time.monotonic() `at`: `reports` report() calls, the last one
    ending at `last_report_at` (None before the first); `waits`: seconds blocked by kind, the open
    blocks' elapsed part included; `at_last_report`: the waits when the last report() ended (all zero
    before the first)."""

    reports: int
    last_report_at: Optional[float]
    waits: Waits
    at_last_report: Waits
    at: float = 0.0

    # The totals by kind, as before the snapshot was added.
    @property
    def report_s(self) -> float:
        """Seconds blocked in report()."""
        return self.waits.report_s

    @property
    def collective_s(self) -> float:
        """Seconds blocked in minitrain.collective."""
        return self.waits.collective_s

    @property
    def data_s(self) -> Optional[float]:
        """Seconds waiting on the data iterators (None when none was used)."""
        return self.waits.data_s


class _Recorder:
    def __init__(self, clock=time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._reports = 0
        self._last_report_at: Optional[float] = None
        self._seconds = {REPORT: 0.0, COLLECTIVE: 0.0, DATA: 0.0}
        # Blocks still open, by kind: how many, and the sum of their start times (so their elapsed
        # total is open * now - starts, whatever the number of threads blocked at once).
        self._open = {REPORT: 0, COLLECTIVE: 0, DATA: 0}
        self._starts = {REPORT: 0.0, COLLECTIVE: 0.0, DATA: 0.0}
        self._data_used = False
        # The seconds by kind when the last report() ended (raw: the hot path builds no object).
        self._at_last_report: Optional[tuple[float, float, float]] = None
        self.total: Optional[int] = None  # report() calls the training function declared

    def add(self, kind: str, seconds: float) -> None:
        with self._lock:
            self._seconds[kind] += seconds
            if kind == DATA:
                self._data_used = True

    def begin(self, kind: str) -> float:
        with self._lock:
            started = self._clock()
            self._open[kind] += 1
            self._starts[kind] += started
            if kind == DATA:
                self._data_used = True
            return started

    def end(self, kind: str, started: float, step: bool = False) -> None:
        with self._lock:
            now = self._clock()
            seconds = self._seconds
            seconds[kind] += max(now - started, 0.0)
            left = self._open[kind] - 1
            if left > 0:
                self._open[kind] = left
                self._starts[kind] -= started
            else:  # (also a block open across reset(), which is dropped)
                self._open[kind] = 0
                self._starts[kind] = 0.0
            if step:
                self._reports += 1
                self._last_report_at = now
                # Other blocks open at this instant (another thread's) count up to now.
                self._at_last_report = self._raw(now) if self._open_any() else (
                    seconds[REPORT], seconds[COLLECTIVE], seconds[DATA])

    def _open_any(self) -> bool:
        return any(self._open.values())

    def _raw(self, now: float) -> tuple[float, float, float]:
        open_, starts, seconds = self._open, self._starts, self._seconds
        return tuple(seconds[kind] + (max(open_[kind] * now - starts[kind], 0.0) if open_[kind] else 0.0)
                     for kind in (REPORT, COLLECTIVE, DATA))

    def _as_waits(self, raw: Optional[tuple[float, float, float]]) -> Waits:
        if raw is None:
            return Waits(0.0, 0.0, 0.0 if self._data_used else None)
        return Waits(raw[0], raw[1], raw[2] if self._data_used else None)

    def totals(self) -> Totals:
        with self._lock:
            now = self._clock()
            return Totals(self._reports, self._last_report_at, self._as_waits(self._raw(now)),
                          self._as_waits(self._at_last_report), now)

    def reset(self) -> None:
        with self._lock:
            self.__init__(self._clock)


_recorder = _Recorder()


def add(kind: str, seconds: float) -> None:
    """Count `seconds` blocked in `kind` (COLLECTIVE or DATA)."""
    if ENABLED:
        _recorder.add(kind, seconds)


@contextmanager
def blocked(kind: str) -> Iterator[None]:
    """Count the time inside the `with` block as blocked in `kind` (also when it raises); it counts
    while it lasts (see the module doc)."""
    if not ENABLED:
        yield
        return
    started = _recorder.begin(kind)
    try:
        yield
    finally:
        _recorder.end(kind, started)


class _Reporting:
    """The context manager of `reporting()` (a class, not a generator: report() is a hot path)."""

    __slots__ = ("_started",)

    def __enter__(self) -> None:
        self._started = _recorder.begin(REPORT)

    def __exit__(self, exc_type, exc, tb) -> None:
        _recorder.end(REPORT, self._started, step=exc_type is None)


class _Nothing:
    __slots__ = ()

    def __enter__(self) -> None:
        pass

    def __exit__(self, exc_type, exc, tb) -> None:
        pass


_NOTHING = _Nothing()


def reporting():
    """A context manager around one report() call: its time is report wait (counted while it lasts),
    and when it returns (not when it raises) one step ends."""
    return _Reporting() if ENABLED else _NOTHING


def timed_iterator(iterator: Iterator) -> Iterator:
    """`iterator` whose every `next()` counts as data wait."""
    if not ENABLED:
        yield from iterator
        return
    begin, end = _recorder.begin, _recorder.end
    while True:
        started = begin(DATA)
        try:
            item = next(iterator)
        except StopIteration:
            return
        finally:
            end(DATA, started)
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
