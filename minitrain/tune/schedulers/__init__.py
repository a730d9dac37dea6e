"""Trial schedulers: which running trials go on and which stop early (L3; pure, no processes).

A scheduler sees every result of every trial (`on_trial_result` -> CONTINUE, STOP or PAUSE) and each
trial's end. PAUSE (Ray's) stops the trial's process after this result; the trial keeps its id and
waits until the scheduler unpauses it through its controller (`SchedulerController`, what the sweep
loop hands it with `set_controller`), then starts again from its latest checkpoint.
`PopulationBasedTraining` (minitrain.tune.schedulers.pbt) and the synchronous `HyperBandScheduler`
(minitrain.tune.schedulers.hyperband) pause trials. `FIFOScheduler` never stops a trial.
`AsyncHyperBandScheduler` (`ASHAScheduler`) is Ray's asynchronous successive halving: rungs at grace_period * reduction_factor**k up to max_t; a trial
reaching a rung is stopped when its score is below the (1 - 1/reduction_factor) quantile of the
scores recorded at that rung so far. `MedianStoppingRule` stops a trial whose best result is worse
than the median of the other trials' running means at the same time.
"""

from __future__ import annotations

import logging
import math
from typing import Optional

import numpy as np

from minitrain.errors import ConfigError
from minitrain.tune.schedulers.trial_scheduler import (  # noqa: F401 - the package's names, as Ray's
    CONTINUE, NOOP, PAUSE, STOP, FIFOScheduler, SchedulerController, TrialScheduler, _check_mode,
)

logger = logging.getLogger("minitrain")


class AsyncHyperBandScheduler(TrialScheduler):
    """Ray's ASHA: `time_attr` must grow with each report (`training_iteration` is filled in for you).

    A result at or beyond `max_t` stops the trial (`stop_last_trials=True`). With several `brackets`,
    each new trial joins one at random (weighted toward brackets with more rungs, as Ray).
    """

    def __init__(self, time_attr: str = "training_iteration", metric: Optional[str] = None,
                 mode: Optional[str] = None, max_t: float = 100, grace_period: float = 1,
                 reduction_factor: float = 4, brackets: int = 1, stop_last_trials: bool = True):
        super().__init__(metric, mode)
        name = type(self).__name__
        for field, value, low in (("max_t", max_t, 0), ("grace_period", grace_period, 0),
                                  ("reduction_factor", reduction_factor, 1)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > low:
                raise ConfigError(f"{name}({field}={value!r}): {field} must be a number > {low}.")
        if isinstance(brackets, bool) or not isinstance(brackets, int) or brackets < 1:
            raise ConfigError(f"{name}(brackets={brackets!r}): brackets must be an int >= 1.")
        if grace_period > max_t:
            raise ConfigError(f"{name}(grace_period={grace_period}, max_t={max_t}): grace_period must not exceed "
                              "max_t.")
        if not isinstance(time_attr, str) or not time_attr:
            raise ConfigError(f"{name}(time_attr={time_attr!r}): name the result field that measures progress, "
                              "e.g. 'training_iteration'.")
        self.time_attr, self.max_t, self.stop_last_trials = time_attr, max_t, bool(stop_last_trials)
        self._brackets = [_Bracket(grace_period, max_t, reduction_factor, s) for s in range(brackets)]
        self._bracket_of: dict[str, _Bracket] = {}
        self.num_stopped = 0

    def describe(self) -> str:
        return "ASHAScheduler"

    def on_trial_add(self, trial_id: str) -> None:
        sizes = np.array([len(b.rungs) for b in self._brackets])
        weights = np.e ** (sizes - sizes.max())
        index = int(np.random.choice(len(self._brackets), p=weights / weights.sum())) if len(sizes) > 1 else 0
        self._bracket_of[trial_id] = self._brackets[index]

    def _score(self, result: dict) -> Optional[float]:
        value = result.get(self.metric)
        if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
            return None
        return float(value) if self.mode == "max" else -float(value)

    def on_trial_result(self, trial_id: str, result: dict) -> str:
        if self.time_attr not in result or self._score(result) is None:
            return CONTINUE
        if result[self.time_attr] >= self.max_t and self.stop_last_trials:
            action = STOP
        else:
            bracket = self._bracket_of.setdefault(trial_id, self._brackets[0])
            action = bracket.on_result(trial_id, result[self.time_attr], self._score(result))
        if action == STOP:
            self.num_stopped += 1
        return action

    def on_trial_complete(self, trial_id: str, result: Optional[dict]) -> None:
        bracket = self._bracket_of.pop(trial_id, None)
        if bracket is not None and result and self.time_attr in result and self._score(result) is not None:
            bracket.on_result(trial_id, result[self.time_attr], self._score(result))

    def on_trial_remove(self, trial_id: str) -> None:
        self._bracket_of.pop(trial_id, None)

    def rungs(self) -> list[list[tuple[float, dict]]]:
        """Each bracket's rungs, highest milestone first, as (milestone, {trial_id: score})."""
        return [[(m, dict(r)) for m, r in b.rungs] for b in self._brackets]


ASHAScheduler = AsyncHyperBandScheduler


class _Bracket:
    """One bracket of ASHA: rungs (milestone, {trial_id: score}), highest milestone first."""

    def __init__(self, min_t: float, max_t: float, reduction_factor: float, s: int):
        self.rf = reduction_factor
        count = int(math.log(max_t / min_t) / math.log(reduction_factor) - s + 1)
        self.rungs = [(min_t * reduction_factor ** (k + s), {}) for k in reversed(range(count))]

    def cutoff(self, recorded: dict) -> Optional[float]:
        if not recorded:
            return None
        return float(np.nanpercentile(list(recorded.values()), (1 - 1 / self.rf) * 100))

    def on_result(self, trial_id: str, now: float, score: float) -> str:
        action = CONTINUE
        for milestone, recorded in self.rungs:
            if now < milestone or trial_id in recorded:
                continue
            cutoff = self.cutoff(recorded)
            if cutoff is not None and score < cutoff:
                action = STOP
            recorded[trial_id] = score
            break
        return action


class MedianStoppingRule(TrialScheduler):
    """Ray's median stopping rule: past `grace_period` (in `time_attr` units), a trial whose best
    result is worse than the median of the running means of the other trials that reached the same
    time (at least `min_samples_required` of them) is stopped."""

    def __init__(self, time_attr: str = "time_total_s", metric: Optional[str] = None, mode: Optional[str] = None,
                 grace_period: float = 60.0, min_samples_required: int = 3, min_time_slice: float = 0,
                 hard_stop: bool = True):
        super().__init__(metric, mode)
        if hard_stop is not True:
            raise ConfigError("MedianStoppingRule(hard_stop=False) would pause trials; minitrain.tune does not "
                              "pause trials. Leave hard_stop=True.")
        if min_time_slice != 0:
            raise ConfigError(f"MedianStoppingRule(min_time_slice={min_time_slice!r}) only matters for paused "
                              "trials, which minitrain.tune does not have. Leave it 0.")
        if isinstance(min_samples_required, bool) or not isinstance(min_samples_required, int) \
                or min_samples_required < 1:
            raise ConfigError(f"MedianStoppingRule(min_samples_required={min_samples_required!r}) must be an "
                              "int >= 1.")
        self.time_attr, self.grace_period, self.min_samples_required = time_attr, grace_period, min_samples_required
        self._results: dict[str, list[dict]] = {}
        self._stopped: set[str] = set()

    def describe(self) -> str:
        return "MedianStoppingRule"

    def on_trial_result(self, trial_id: str, result: dict) -> str:
        if trial_id in self._stopped:
            return STOP
        if self.time_attr not in result or not isinstance(result.get(self.metric), (int, float)):
            return CONTINUE
        self._results.setdefault(trial_id, []).append(result)
        now = result[self.time_attr]
        if now < self.grace_period:
            return CONTINUE
        others = [t for t, results in self._results.items() if t != trial_id and results[-1][self.time_attr] >= now]
        if len(others) < self.min_samples_required:
            return CONTINUE
        median = float(np.median([self._running_mean(t, now) for t in others]))
        values = [r[self.metric] for r in self._results[trial_id]]
        best = max(values) if self.mode == "max" else min(values)
        worse = best < median if self.mode == "max" else best > median
        if worse:
            self._stopped.add(trial_id)
            return STOP
        return CONTINUE

    def on_trial_complete(self, trial_id: str, result: Optional[dict]) -> None:
        if result and self.time_attr in result and isinstance(result.get(self.metric), (int, float)):
            results = self._results.setdefault(trial_id, [])
            if not results or results[-1] is not result:
                results.append(result)

    def _running_mean(self, trial_id: str, now: float) -> float:
        scoped = [r[self.metric] for r in self._results[trial_id] if self.grace_period <= r[self.time_attr] <= now]
        return float(np.mean(scoped)) if scoped else float("nan")


from minitrain.tune.schedulers.hyperband import HyperBandScheduler  # noqa: E402 - they need numpy, as this module
from minitrain.tune.schedulers.pbt import PopulationBasedTraining  # noqa: E402
