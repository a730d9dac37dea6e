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

Defaults: factor 1.5, window 10, min_samples 5, data_share 0.5; the environment variables
MINITRAIN_STRAGGLER_FACTOR, MINITRAIN_STRAGGLER_WINDOW and MINITRAIN_STRAGGLER_MIN_SAMPLES (read by
the driver) change the first three.
"""

from __future__ import annotations

import os
import statistics
from collections import deque
from dataclasses import dataclass
from typing import Mapping, Optional

from minitrain.errors import ConfigError

FACTOR_ENV = "MINITRAIN_STRAGGLER_FACTOR"
WINDOW_ENV = "MINITRAIN_STRAGGLER_WINDOW"
MIN_SAMPLES_ENV = "MINITRAIN_STRAGGLER_MIN_SAMPLES"
MIN_WORK_S = 1e-3  # the others' median work time is taken as at least this (no division by ~0)


@dataclass(frozen=True)
class StragglerRule:
    """When a rank counts as a straggler (see the module doc)."""

    factor: float = 1.5
    window: int = 10
    min_samples: int = 5
    data_share: float = 0.5

    def __post_init__(self) -> None:
        if not self.factor > 1.0:
            raise ConfigError(f"{FACTOR_ENV}={self.factor!r}: the straggler factor must be a number above 1 "
                              "(1.5 flags a rank 50% slower than the others).")
        if self.window < 1:
            raise ConfigError(f"{WINDOW_ENV}={self.window!r}: the window must be a positive number of samples.")
        if not 1 <= self.min_samples <= self.window:
            raise ConfigError(f"{MIN_SAMPLES_ENV}={self.min_samples!r}: the minimum number of samples must be "
                              f"between 1 and the window ({self.window}).")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> "StragglerRule":
        """The defaults, changed by the MINITRAIN_STRAGGLER_* variables; ConfigError naming a bad one."""
        values: dict = {}
        for name, field, kind in ((FACTOR_ENV, "factor", float), (WINDOW_ENV, "window", int),
                                  (MIN_SAMPLES_ENV, "min_samples", int)):
            text = environ.get(name)
            if text is None or not text.strip():
                continue
            try:
                values[field] = kind(text)
            except ValueError:
                raise ConfigError(f"{name}={text!r} is not a {'number' if kind is float else 'whole number'}; "
                                  f"unset it for the default ({getattr(cls, field)}).") from None
        window = values.get("window", cls.window)
        values.setdefault("min_samples", min(cls.min_samples, window))
        return cls(**values)


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


class StragglerDetector:
    """Keeps each rank's recent work times and data waits of one attempt and applies the rule."""

    def __init__(self, rule: StragglerRule = StragglerRule()):
        self.rule = rule
        self._steps: dict[int, deque] = {}
        self._data: dict[int, deque] = {}
        self._hosts: dict[int, str] = {}
        self._flagged: dict[int, Straggler] = {}

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
        self._steps.setdefault(rank, deque(maxlen=window)).append(work)
        self._data.setdefault(rank, deque(maxlen=window)).append(data_wait_s)
        self._hosts[rank] = host

    @property
    def flagged(self) -> dict[int, Straggler]:
        """The ranks flagged by the last `evaluate`."""
        return dict(self._flagged)

    def evaluate(self, now: float) -> tuple[list[Straggler], list[Straggler]]:
        """Apply the rule: (stragglers that started, stragglers that cleared) since the last call.
        `flagged` holds the current ones afterwards, with their latest figures."""
        ready = {r: statistics.median(s) for r, s in self._steps.items() if len(s) >= self.rule.min_samples}
        current: dict[int, Straggler] = {}
        if len(ready) >= 2:
            for rank, median in ready.items():
                # The floor: peers that only waited (work ~0) still leave the slow rank comparable.
                others = max(statistics.median(m for r, m in ready.items() if r != rank), MIN_WORK_S)
                if median < self.rule.factor * others:
                    continue
                previous = self._flagged.get(rank)
                current[rank] = Straggler(
                    rank=rank, host=self._hosts.get(rank, ""), slower_by=median / others, step_time_s=median,
                    median_step_time_s=others, cause=self._cause(rank, ready, median - others),
                    since=previous.since if previous is not None else now)
        started = [s for r, s in sorted(current.items()) if r not in self._flagged]
        cleared = [s for r, s in sorted(self._flagged.items()) if r not in current]
        self._flagged = current
        return started, cleared

    def _cause(self, rank: int, ready: Mapping[int, float], excess_s: float) -> str:
        own = _median_known(self._data.get(rank, ()))
        if own is None:
            return "compute"
        others = [w for w in (_median_known(self._data.get(r, ())) for r in ready if r != rank) if w is not None]
        baseline = statistics.median(others) if others else 0.0
        return "data wait" if own - baseline >= self.rule.data_share * excess_s else "compute"


def _median_known(values) -> Optional[float]:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None
