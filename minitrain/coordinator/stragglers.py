"""Stragglers: ranks whose step time stays well above the others', and why (pure logic, no I/O).

The rule (`StragglerRule`): each rank's step time is the median of its last `window` telemetry
samples (about one a second). A rank with at least `min_samples` of them is a straggler while that
median is at least `factor` times the median of the other ranks' medians (leave-one-out, so with two
ranks each is compared with the other). At least two ranks must have enough samples. Medians make
it persistent: a single slow step (a checkpoint, a GC pause) does not count; it takes about half the
window of slow samples to flag a rank, and as many fast ones to clear it.

The cause: the rank's excess step time over the others' median, compared with its excess data wait
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


@dataclass(frozen=True)
class Straggler:
    """A rank flagged by the rule: its median step time is `slower_by` times the others'."""

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
    """Keeps each rank's recent step times and data waits of one attempt and applies the rule."""

    def __init__(self, rule: StragglerRule = StragglerRule()):
        self.rule = rule
        self._steps: dict[int, deque] = {}
        self._data: dict[int, deque] = {}
        self._hosts: dict[int, str] = {}
        self._flagged: dict[int, Straggler] = {}

    def reset(self) -> None:
        """A new attempt: forget every rank."""
        self.__init__(self.rule)

    def add(self, rank: int, host: str, step_time_s: Optional[float], data_wait_s: Optional[float]) -> None:
        """One sample of `rank` (a sample without a step time is ignored)."""
        if step_time_s is None:
            return
        window = self.rule.window
        self._steps.setdefault(rank, deque(maxlen=window)).append(step_time_s)
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
                others = statistics.median(m for r, m in ready.items() if r != rank)
                if others <= 0 or median < self.rule.factor * others:
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
