"""Ray's synchronous `HyperBandScheduler` (`ray.tune.schedulers.hyperband`): brackets of successive halving (L3).

Trials fill brackets in the order they are added: a band holds s_max+1 brackets (s_max+1 =
round(log(max_t)/log(reduction_factor)) + 1), bracket s takes n0 = ceil((s_max+1)/(s+1) * eta**s) trials
that each run r0 = int(max_t * eta**-s) units of `time_attr` before the bracket's first halving. A trial
that reaches its bracket's milestone is PAUSED (its process stops after that result: pausing in minitrain
is ending the trial's process, since a trial is a process, and it resumes by starting again from its own
latest checkpoint with the same trial id). When every live trial of the bracket reached the milestone, the
best 1/eta go on (paused ones are unpaused) with an eta-times longer milestone, the others are stopped;
the bracket's last round runs to max_t. The decisions are Ray's, ported from its `_Bracket`.
"""

from __future__ import annotations

import logging
from typing import Optional

import numpy as np

from minitrain.errors import ConfigError
from minitrain.tune.schedulers.trial_scheduler import CONTINUE, PAUSE, STOP, FIFOScheduler

logger = logging.getLogger("minitrain")


class HyperBandScheduler(FIFOScheduler):
    """HyperBand as Ray's: `time_attr` must grow with each report, `max_t` bounds each trial,
    `reduction_factor` is eta. A trial that reports no checkpoint before it is paused starts again from
    the beginning when it is unpaused (as a Ray function trainable without checkpoints would)."""

    holds_paused_trials = True

    def __init__(self, time_attr: str = "training_iteration", metric: Optional[str] = None,
                 mode: Optional[str] = None, max_t: int = 81, reduction_factor: float = 3,
                 stop_last_trials: bool = True):
        super().__init__(metric, mode)
        for field, value, low in (("max_t", max_t, 0), ("reduction_factor", reduction_factor, 1)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > low:
                raise ConfigError(f"HyperBandScheduler({field}={value!r}): {field} must be a number > {low}.")
        if not isinstance(time_attr, str) or not time_attr:
            raise ConfigError(f"HyperBandScheduler(time_attr={time_attr!r}): name the result field that measures "
                              "progress, e.g. 'training_iteration'.")
        self.time_attr, self.max_t, self.eta = time_attr, max_t, reduction_factor
        self.stop_last_trials = bool(stop_last_trials)
        self.s_max_1 = int(np.round(np.log(max_t) / np.log(reduction_factor))) + 1
        self.hyperbands: list[list[Optional[_Bracket]]] = [[]]
        self._bracket_of: dict[str, _Bracket] = {}
        self._current: Optional[_Bracket] = None
        self.num_stopped = 0

    def describe(self) -> str:
        return "HyperBandScheduler"

    def n0(self, s: int) -> int:
        """Bracket s's number of trials."""
        return int(np.ceil(self.s_max_1 / (s + 1) * self.eta ** s))

    def r0(self, s: int) -> int:
        """Bracket s's first milestone (in `time_attr` units)."""
        return int(self.max_t * self.eta ** (-s))

    def on_trial_add(self, trial_id: str) -> None:
        if self._current is None or self._current.filled():
            while True:
                if len(self.hyperbands[-1]) == self.s_max_1:  # the band is full: a new band
                    self.hyperbands.append([])
                band = self.hyperbands[-1]
                s = len(band)
                if self.r0(s) == 0:  # too small a bracket: skipped, as Ray's
                    band.append(None)
                    continue
                self._current = _Bracket(self.time_attr, self.n0(s), self.r0(s), self.max_t, self.eta, s,
                                         self.stop_last_trials)
                band.append(self._current)
                break
        self._current.add_trial(trial_id)
        self._bracket_of[trial_id] = self._current

    def _status(self, trial_id: str, current: Optional[str]) -> str:
        if trial_id == current:
            return "RUNNING"
        return self.controller.status(trial_id) if self.controller is not None else "PAUSED"

    def on_trial_result(self, trial_id: str, result: dict) -> str:
        bracket = self._bracket_of.get(trial_id)
        if bracket is None or self.time_attr not in result:
            return CONTINUE
        bracket.update(trial_id, result)
        if bracket.continue_trial(trial_id):
            return CONTINUE
        return self._process_bracket(bracket, trial_id)

    def _process_bracket(self, bracket: "_Bracket", current: Optional[str]) -> str:
        """Halve the bracket once every live trial reached its milestone: the bad ones stop, the good
        ones go on (a paused one is unpaused). The decision for `current` (the trial whose result this is)."""
        action = PAUSE
        if not bracket.iteration_done():
            return action
        if bracket.finished():
            for trial_id in bracket.live():
                if trial_id != current and self._status(trial_id, current) == "PAUSED" and self.controller:
                    self.controller.stop_paused(trial_id)
            return STOP
        good, bad = bracket.successive_halving(self.metric, 1.0 if self.mode == "max" else -1.0)
        self.num_stopped += len(bad)
        for trial_id in bad:
            if trial_id == current:
                bracket.remove(trial_id)
                action = STOP
            elif self.controller is not None:
                bracket.remove(trial_id)
                self.controller.stop_paused(trial_id)
        for trial_id in good:
            if bracket.continue_trial(trial_id):
                if trial_id == current:
                    action = CONTINUE
                elif self.controller is not None:
                    self.controller.unpause(trial_id)
        return action

    def on_trial_complete(self, trial_id: str, result: Optional[dict]) -> None:
        self.on_trial_remove(trial_id)

    def on_trial_remove(self, trial_id: str) -> None:
        bracket = self._bracket_of.get(trial_id)
        if bracket is None or trial_id not in bracket.results:
            return
        bracket.remove(trial_id)
        if not bracket.finished():  # the others may all be waiting on this one
            self._process_bracket(bracket, None)

    def choose_trial_to_run(self, pending: list) -> Optional[str]:
        """Ray's fair order: the waiting trial of the least complete bracket first."""
        waiting = set(pending)
        for band in self.hyperbands:
            for bracket in sorted((b for b in band if b is not None), key=lambda b: b.completion()):
                for trial_id in bracket.live():
                    if trial_id in waiting:
                        return trial_id
        return pending[0] if pending else None

    def brackets(self) -> list:
        """Each band's brackets as (trials at most, current milestone, live trial ids); None for a skipped one."""
        return [[None if b is None else (b.n, b.cumul_r, b.live()) for b in band] for band in self.hyperbands]


class _Bracket:
    """One bracket: its live trials' latest results, its size `n` and milestone `cumul_r` (Ray's)."""

    def __init__(self, time_attr: str, max_trials: int, init_t: int, max_t: float, eta: float, s: int,
                 stop_last_trials: bool):
        self.time_attr = time_attr
        self.results: dict[str, Optional[dict]] = {}
        self.n = max_trials
        self.r = self.cumul_r = init_t
        self.max_t, self.eta, self.halves = max_t, eta, s
        self.stop_last_trials = stop_last_trials
        self.total_work = self._total_work(max_trials, init_t, s)
        self.progress = 0.0

    def add_trial(self, trial_id: str) -> None:
        self.results[trial_id] = None

    def live(self) -> list:
        return list(self.results)

    def _time(self, result: Optional[dict]) -> float:
        return 0 if result is None else result[self.time_attr]

    def iteration_done(self) -> bool:
        return all(self._time(r) >= self.cumul_r for r in self.results.values())

    def finished(self) -> bool:
        return self.stop_last_trials and self.halves == 0 and self.iteration_done()

    def continue_trial(self, trial_id: str) -> bool:
        if not self.stop_last_trials and self.halves == 0:
            return True
        return self._time(self.results[trial_id]) < self.cumul_r

    def filled(self) -> bool:
        return len(self.results) == self.n

    def update(self, trial_id: str, result: dict) -> None:
        delta = self._time(result) - self._time(self.results.get(trial_id))
        if delta <= 0:
            logger.debug("HyperBand: trial %s restored from an earlier point (%s)", trial_id, self._time(result))
        self.progress += delta
        self.results[trial_id] = result

    def remove(self, trial_id: str) -> None:
        self.results.pop(trial_id, None)

    def successive_halving(self, metric: str, sign: float) -> tuple[list, list]:
        if self.halves == 0 and not self.stop_last_trials:
            return self.live(), []
        self.halves -= 1
        self.n = int(np.ceil(self.n / self.eta))
        self.r = int(min(self.r * self.eta, self.max_t - self.cumul_r))
        self.cumul_r = self.r  # Ray's bookkeeping, kept as is
        ordered = sorted(self.results, key=lambda t: sign * _value(self.results[t], metric))
        return ordered[-self.n:], ordered[:-self.n]

    def completion(self) -> float:
        if self.finished():
            return 1.0
        return min(self.progress / self.total_work, 1.0) if self.total_work else 1.0

    def _total_work(self, n: int, r: float, s: int) -> int:
        work, cumulative = 0, r
        for _ in range(s + 1):
            work += int(n) * int(r)
            n = int(np.ceil(n / self.eta))
            r = int(min(r * self.eta, self.max_t - cumulative))
        return work


def _value(result: Optional[dict], metric: str) -> float:
    value = None if result is None else result.get(metric)
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"HyperBandScheduler(metric={metric!r}): a trial's result has no number under "
                          f"{metric!r} ({value!r}); report it with every result.")
    return float(value)
