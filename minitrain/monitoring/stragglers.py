"""Stragglers: ranks whose step time stays well above the others', and why (pure logic, no I/O).

A rank is judged on its own work per step (`work_time`): its step time minus the time it waited
for the others, i.e. blocked inside report() (a checkpoint report waits for the round's commit,
which waits for the slowest rank) and in minitrain's collectives. Waiting for a slow peer therefore
never makes a rank a straggler, and the slow peer it waited for is the one named. (Time inside
torch.distributed's own collectives, e.g. DDP's all-reduce, is not seen: there all ranks step at
the slowest one's pace.)

The rule (`StragglerRule`): each rank's work time is the median of its last `window` telemetry
samples (about one a second). A rank with at least `min_samples` of them is a straggler while that
median is at least `factor` times the median of the other ranks' medians (leave-one-out, so with two
ranks each is compared with the other). At least two ranks must have enough samples. Medians make
it persistent: a single slow step (a checkpoint, a GC pause) does not count; it takes about half the
window of slow samples to flag a rank, and as many fast ones to clear it.

The cause: the rank's excess work time over the others' median, compared with its excess data wait
(seconds per step waiting on a `prepare_data_loader` / `get_dataset_shard` iterator, same medians).
When the data wait explains at least `data_share` of the excess the cause is "data wait", otherwise
"compute" (time spent elsewhere, including other data loaders, counts as compute).

Defaults: factor 1.5, window 10, min_samples 5, data_share 0.5; a run's
`RunConfig(monitoring_config=MonitoringConfig(...))` sets the first three, and its unset fields take the
environment variables MINITRAIN_STRAGGLER_FACTOR, MINITRAIN_STRAGGLER_WINDOW and
MINITRAIN_STRAGGLER_MIN_SAMPLES (`minitrain.knobs`).
"""

from __future__ import annotations

import bisect
import statistics
from collections import deque
from dataclasses import dataclass
from typing import Optional

from minitrain import knobs
from minitrain.config import MonitoringConfig
from minitrain.errors import ConfigError

MIN_WORK_S = 1e-3  # the others' median work time is taken as at least this (no division by ~0)


@dataclass(frozen=True)
class StragglerRule:
    """When a rank counts as a straggler (see the module doc)."""

    factor: float = knobs.STRAGGLER_FACTOR.default
    window: int = knobs.STRAGGLER_WINDOW.default
    min_samples: int = knobs.STRAGGLER_MIN_SAMPLES.default
    data_share: float = 0.5

    def __post_init__(self) -> None:
        if not self.factor > 1.0:
            raise ConfigError(f"MonitoringConfig.straggler_factor={self.factor!r}: the straggler factor must be a "
                              "number above 1 (1.5 flags a rank 50% slower than the others).")
        if self.window < 1:
            raise ConfigError(f"MonitoringConfig.straggler_window={self.window!r}: the window must be a positive "
                              "number of samples.")
        if not 1 <= self.min_samples <= self.window:
            raise ConfigError(f"MonitoringConfig.straggler_min_samples={self.min_samples!r}: the minimum number "
                              f"of samples must be between 1 and the window ({self.window}).")

    @classmethod
    def of(cls, monitoring: MonitoringConfig) -> "StragglerRule":
        """The rule `monitoring` (a run's `RunConfig.monitoring_config`) sets."""
        return cls(factor=monitoring.straggler_factor, window=monitoring.straggler_window,
                   min_samples=monitoring.straggler_min_samples)

    @classmethod
    def from_env(cls) -> "StragglerRule":
        """The rule of a default `MonitoringConfig`: the defaults, changed by the MINITRAIN_STRAGGLER_FACTOR,
        _WINDOW and _MIN_SAMPLES variables; ConfigError naming a bad one."""
        return cls.of(MonitoringConfig())


def work_time(step_time_s: Optional[float], report_wait_s: Optional[float] = None,
              collective_wait_s: Optional[float] = None) -> Optional[float]:
    """A rank's own work per step: step time minus its report and collective waits (an unmeasured
    wait counts as 0), never negative; None without a step time."""
    if step_time_s is None:
        return None
    return max(step_time_s - (report_wait_s or 0.0) - (collective_wait_s or 0.0), 0.0)


@dataclass(frozen=True)
class Straggler:
    """A rank flagged by the rule: its median work time per step (`step_time_s`, waits for the
    others excluded) is `slower_by` times the others' (`median_step_time_s`)."""

    rank: int
    host: str
    slower_by: float
    step_time_s: float
    median_step_time_s: float
    cause: str  # "data wait" | "compute"
    since: float

    def as_dict(self) -> dict:
        """The JSON-able form (RunMonitor.stragglers)."""
        return {"rank": self.rank, "host": self.host, "slower_by": round(self.slower_by, 3),
                "step_time_s": self.step_time_s, "median_step_time_s": self.median_step_time_s,
                "cause": self.cause, "since": self.since}


class _Ranked:
    """(value, rank) pairs kept sorted: any member's value replaced in O(log n) (plus a memmove), and
    the median of all the values but one member's in O(log n). That makes the leave-one-out medians of
    the rule cost O(log n) per rank instead of O(n log n), so that judging thousands of ranks on every
    sample stays cheap (see docs/benchmarks/scale.md, "Monitored runs")."""

    def __init__(self) -> None:
        self.items: list[tuple[float, int]] = []
        self._value: dict[int, float] = {}

    def set(self, rank: int, value: Optional[float]) -> None:
        """Give `rank` this value (None: take it out)."""
        if self._value.get(rank) == value:  # None stands for absent: no value is stored as None
            return  # unchanged (a steady rank's median mostly is): no two memmoves of the whole list
        old = self._value.pop(rank, None)
        if old is not None:
            del self.items[bisect.bisect_left(self.items, (old, rank))]
        if value is not None:
            self._value[rank] = value
            bisect.insort(self.items, (value, rank))

    def get(self, rank: int) -> Optional[float]:
        """`rank`'s value, or None."""
        return self._value.get(rank)

    def median_without(self, rank: int) -> Optional[float]:
        """The median of every value but `rank`'s (as statistics.median computes it), None when no
        other value is known. `rank` must hold a value."""
        return self.median_skipping(bisect.bisect_left(self.items, (self._value[rank], rank)))

    def median_skipping(self, skip: int) -> Optional[float]:
        """The median of every value but the one at position `skip` of `items` (`median_without`).
        It is the same for every `skip` above `upper_half()`: the median is taken below it."""
        items = self.items
        n = len(items) - 1
        if n == 0:
            return None

        def at(j: int) -> float:
            return items[j if j < skip else j + 1][0]

        if n % 2:
            return at(n // 2)
        return (at(n // 2 - 1) + at(n // 2)) / 2

    def upper_half(self) -> int:
        """The position above which `median_skipping` does not depend on the position skipped."""
        return (len(self.items) - 1) // 2


class StragglerDetector:
    """Keeps each rank's recent work times and data waits of one attempt and applies the rule.

    Each rank's medians are kept up to date as its samples come (`add`), sorted across the ranks, so
    `evaluate` costs O(log n) per straggler, not O(n^2 log n): the ranks flagged are the slowest ones
    (a rank's median rises with its rank in the order while the median of the others falls), so it
    walks down from the slowest and stops at the first rank that is not a straggler. The others'
    median is one value for every rank in the upper half (leaving one of them out leaves the median
    where it was), so it is taken once; a straggler whose figures did not change keeps its object."""

    def __init__(self, rule: StragglerRule = StragglerRule()):
        self.rule = rule
        self._steps: dict[int, deque] = {}
        self._data: dict[int, deque] = {}
        self._hosts: dict[int, str] = {}
        self._flagged: dict[int, Straggler] = {}
        self._work = _Ranked()  # median work time of each rank with min_samples samples
        self._waits = _Ranked()  # ... and its median data wait, where measured

    def reset(self) -> None:
        """A new attempt: forget every rank."""
        self.__init__(self.rule)

    def add(self, rank: int, host: str, step_time_s: Optional[float], data_wait_s: Optional[float],
            report_wait_s: Optional[float] = None, collective_wait_s: Optional[float] = None) -> None:
        """One sample of `rank`: judged on `work_time` of its step time and waits (a sample without a
        step time is ignored)."""
        work = work_time(step_time_s, report_wait_s, collective_wait_s)
        if work is None:
            return
        window = self.rule.window
        steps = self._steps.setdefault(rank, deque(maxlen=window))
        steps.append(work)
        data = self._data.setdefault(rank, deque(maxlen=window))
        data.append(data_wait_s)
        self._hosts[rank] = host
        if len(steps) >= self.rule.min_samples:
            self._work.set(rank, statistics.median(steps))
            self._waits.set(rank, _median_known(data))

    @property
    def flagged(self) -> dict[int, Straggler]:
        """The ranks flagged by the last `evaluate`."""
        return dict(self._flagged)

    def evaluate(self, now: float) -> tuple[list[Straggler], list[Straggler]]:
        """Apply the rule: (stragglers that started, stragglers that cleared) since the last call.
        `flagged` holds the current ones afterwards, with their latest figures."""
        current: dict[int, Straggler] = {}
        work, flagged = self._work, self._flagged
        ranked = work.items
        if len(ranked) >= 2:
            factor = self.rule.factor
            upper = work.upper_half()
            top_others = None  # the others' median of every rank above `upper`: one value for all of them
            for index in range(len(ranked) - 1, -1, -1):
                median, rank = ranked[index]
                if index > upper:
                    if top_others is None:
                        top_others = max(work.median_skipping(index), MIN_WORK_S)
                    others = top_others
                else:
                    others = max(work.median_skipping(index), MIN_WORK_S)
                # The floor: peers that only waited (work ~0) still leave the slow rank comparable.
                if median < factor * others:
                    break  # every faster rank is below the factor too
                previous = flagged.get(rank)
                host, cause = self._hosts.get(rank, ""), self._cause(rank, median - others)
                if previous is not None and (previous.step_time_s, previous.median_step_time_s, previous.cause,
                                             previous.host) == (median, others, cause, host):
                    current[rank] = previous  # the same figures: no new object per sample
                    continue
                current[rank] = Straggler(
                    rank=rank, host=host, slower_by=median / others, step_time_s=median,
                    median_step_time_s=others, cause=cause, since=previous.since if previous is not None else now)
        self._flagged = current
        if current.keys() == flagged.keys():  # the usual case: nothing started or cleared
            return [], []
        started = [s for r, s in sorted(current.items()) if r not in flagged]
        cleared = [s for r, s in sorted(flagged.items()) if r not in current]
        return started, cleared

    def _cause(self, rank: int, excess_s: float) -> str:
        own = self._waits.get(rank)
        if own is None:
            return "compute"
        baseline = self._waits.median_without(rank)
        return "data wait" if own - (baseline or 0.0) >= self.rule.data_share * excess_s else "compute"


def _median_known(values) -> Optional[float]:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None
