"""Stopping a trial or the whole sweep from its results (L3), as Ray's `ray.tune.stopper`.

`RunConfig(stop=...)` takes a dict (`{"training_iteration": 10, "mean_accuracy": 0.9}`: a trial stops
once any key's value is >= its bound), a function `f(trial_id, result) -> bool`, or a `Stopper`.
`as_stopper` turns each into a `Stopper`; the sweep loop asks it after every result (`stopper(trial_id,
result)` stops that trial, `stopper.stop_all()` stops every trial and starts no new one). Pure Python:
the classes keep their state in memory, and `Tuner.restore` replays a sweep's kept results into a fresh
one, as it does for the scheduler.
"""

from __future__ import annotations

import datetime
import math
import statistics
import time
from collections import defaultdict, deque
from typing import Any, Callable, Optional

from minitrain.errors import ConfigError
from minitrain.storage.retention import flatten_metrics


class Stopper:
    """Base class of a stopper (Ray's `tune.Stopper`): `__call__(trial_id, result)` True stops that
    trial; `stop_all()` True ends the sweep (running trials are stopped, no new trial starts)."""

    def __call__(self, trial_id: str, result: dict) -> bool:
        """True when the trial should stop given this result."""
        raise NotImplementedError

    def stop_all(self) -> bool:
        """True when the whole sweep should stop."""
        raise NotImplementedError


class NoopStopper(Stopper):
    """Stops nothing (what `stop=None` means)."""

    def __call__(self, trial_id: str, result: dict) -> bool:
        return False

    def stop_all(self) -> bool:
        return False


class CombinedStopper(Stopper):
    """Several stoppers joined with OR: a trial (or the sweep) stops when any of them says so."""

    def __init__(self, *stoppers: Stopper):
        self._stoppers = stoppers

    def __call__(self, trial_id: str, result: dict) -> bool:
        # Every stopper sees every result (a plateau stopper counts them), so no short-circuit.
        return any([stopper(trial_id, result) for stopper in self._stoppers])

    def stop_all(self) -> bool:
        return any([stopper.stop_all() for stopper in self._stoppers])


class FunctionStopper(Stopper):
    """Stops a trial when `function(trial_id, result)` returns True."""

    def __init__(self, function: Callable[[str, dict], bool]):
        self._fn = function

    def __call__(self, trial_id: str, result: dict) -> bool:
        return bool(self._fn(trial_id, result))

    def stop_all(self) -> bool:
        return False

    @classmethod
    def is_valid_function(cls, fn: Any) -> bool:
        """True for a plain callable (not a Stopper); ValueError for a callable with `stop_all` that
        does not subclass Stopper (Ray's check)."""
        is_function = callable(fn) and not isinstance(fn, Stopper)
        if is_function and hasattr(fn, "stop_all"):
            raise ValueError("Stop object must be ray.tune.Stopper subclass to be detected correctly.")
        return is_function


class MaximumIterationStopper(Stopper):
    """Stops a trial after `max_iter` results (counted from this sweep's start or restore)."""

    def __init__(self, max_iter: int):
        self._max_iter = max_iter
        self._iter: dict = defaultdict(int)

    def __call__(self, trial_id: str, result: dict) -> bool:
        self._iter[trial_id] += 1
        return self._iter[trial_id] >= self._max_iter

    def stop_all(self) -> bool:
        return False


class TrialPlateauStopper(Stopper):
    """Stops a trial whose `metric` plateaued: the (population) standard deviation of its last
    `num_results` values is below `std`, after `grace_period` results, and (with `metric_threshold`)
    once the value is beyond the threshold in `mode`'s direction."""

    def __init__(self, metric: str, std: float = 0.01, num_results: int = 4, grace_period: int = 4,
                 metric_threshold: Optional[float] = None, mode: Optional[str] = None):
        if metric_threshold is not None and mode not in ("min", "max"):
            raise ValueError(f"When specifying a `metric_threshold`, the `mode` argument has to be one of "
                             f"[min, max]. Got: {mode}")
        self._metric, self._mode, self._std = metric, mode, std
        self._num_results, self._grace_period, self._metric_threshold = num_results, grace_period, metric_threshold
        self._iter: dict = defaultdict(int)
        self._trial_results: dict = defaultdict(lambda: deque(maxlen=self._num_results))

    def __call__(self, trial_id: str, result: dict) -> bool:
        value = result.get(self._metric)
        self._trial_results[trial_id].append(value)
        self._iter[trial_id] += 1
        if self._iter[trial_id] < self._grace_period or len(self._trial_results[trial_id]) < self._num_results:
            return False
        if self._metric_threshold is not None and value is not None:
            if (self._mode == "min" and value > self._metric_threshold) or \
                    (self._mode == "max" and value < self._metric_threshold):
                return False
        try:
            current_std = statistics.pstdev(self._trial_results[trial_id])  # numpy's np.std
        except (TypeError, ValueError):
            current_std = math.inf
        return current_std < self._std

    def stop_all(self) -> bool:
        return False


class ExperimentPlateauStopper(Stopper):
    """Stops the sweep when the `top` best values of `metric` over all results have a standard
    deviation <= `std` for more than `patience` results in a row."""

    def __init__(self, metric: str, std: float = 0.001, top: int = 10, mode: str = "min", patience: int = 0):
        if mode not in ("min", "max"):
            raise ValueError("The mode parameter can only be either min or max.")
        if not isinstance(top, int) or isinstance(top, bool) or top <= 1:
            raise ValueError("Top results to consider must be a positive integer greater than one.")
        if not isinstance(patience, int) or isinstance(patience, bool) or patience < 0:
            raise ValueError("Patience must be a strictly positive integer.")
        if not isinstance(std, float) or std <= 0:
            raise ValueError("The standard deviation must be a strictly positive float number.")
        self._metric, self._std, self._top, self._mode, self._patience = metric, std, top, mode, patience
        self._iterations = 0
        self._top_values: list = []

    def __call__(self, trial_id: str, result: dict) -> bool:
        self._top_values.append(result[self._metric])
        ordered = sorted(self._top_values)
        self._top_values = ordered[:self._top] if self._mode == "min" else ordered[-self._top:]
        self._iterations = self._iterations + 1 if self.has_plateaued() else 0
        return self.stop_all()

    def has_plateaued(self) -> bool:
        """True when the top values are `top` many and within `std` of each other."""
        return len(self._top_values) == self._top and statistics.pstdev(self._top_values) <= self._std

    def stop_all(self) -> bool:
        return self.has_plateaued() and self._iterations >= self._patience


class TimeoutStopper(Stopper):
    """Stops the sweep `timeout` seconds (a number or a `datetime.timedelta`) after its first check
    (Ray's: the clock starts when the sweep first asks, so set-up time does not count)."""

    def __init__(self, timeout: "float | datetime.timedelta"):
        if isinstance(timeout, datetime.timedelta):
            self._timeout_seconds = timeout.total_seconds()
        elif isinstance(timeout, (int, float)) and not isinstance(timeout, bool):
            self._timeout_seconds = float(timeout)
        else:
            raise ValueError(f"`timeout` parameter has to be either a number or a `datetime.timedelta` object. "
                             f"Found: {type(timeout)}")
        self._budget = self._timeout_seconds
        self._last_check: Optional[float] = None

    def __call__(self, trial_id: str, result: dict) -> bool:
        return False

    def stop_all(self) -> bool:
        now = time.time()
        if self._last_check:
            self._budget -= now - self._last_check
        self._last_check = now
        return self._budget <= 0

    def __setstate__(self, state: dict) -> None:
        state["_last_check"] = None  # a restored sweep's budget goes on from where it was
        self.__dict__.update(state)


class MissingStopKey(ConfigError):
    """A `stop` dict names a key the trial's result does not have (Ray's TuneError): the trial fails."""


class DictStopper(Stopper):
    """`stop={key: bound}` (Ray's stopping criteria): a trial stops once `result[key] >= bound` for any
    key; nested keys are written "a/b". A result without a key raises `MissingStopKey`."""

    def __init__(self, criteria: dict):
        for key, bound in criteria.items():
            if not isinstance(key, str):
                raise ConfigError(f"RunConfig(stop={criteria!r}): keys must be result keys (str), got {key!r}.")
            if isinstance(bound, dict):
                raise ConfigError("Stopping criteria is now flattened by default. Use forward slashes to nest "
                                  "values `key1/key2/key3`.")
        self.criteria = dict(criteria)

    def __call__(self, trial_id: str, result: dict) -> bool:
        flat = flatten_metrics(result)
        for key, bound in self.criteria.items():
            if key not in flat:
                raise MissingStopKey(f"Stopping criteria {key} not provided in result dict. Keys are "
                                     f"{list(flat)}.")
            if flat[key] >= bound:
                return True
        return False

    def stop_all(self) -> bool:
        return False


def as_stopper(stop: Any) -> Stopper:
    """`RunConfig.stop` as a Stopper: None, a dict, a Stopper or a function `(trial_id, result) -> bool`;
    ConfigError for anything else."""
    if stop is None:
        return NoopStopper()
    if isinstance(stop, dict):
        return DictStopper(stop)
    if isinstance(stop, Stopper):
        return stop
    try:
        if FunctionStopper.is_valid_function(stop):
            return FunctionStopper(stop)
    except ValueError as exc:
        raise ConfigError(f"RunConfig(stop={stop!r}): {exc}") from None
    raise ConfigError(f"RunConfig(stop={stop!r}) must be None, a dict of result bounds, a function "
                      "(trial_id, result) -> bool, or a minitrain.tune.stopper.Stopper.")
