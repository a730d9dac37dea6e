"""`TuneConfig`, `with_resources` and `with_parameters` (L3), as Ray's `ray.tune.TuneConfig`,
`ray.tune.with_resources` and `ray.tune.with_parameters`."""

from __future__ import annotations

import datetime
import math
from dataclasses import dataclass
from typing import Any, Callable, Optional, Union

from minitrain.config import ScalingConfig
from minitrain.errors import ConfigError
from minitrain.tune.schedulers import TrialScheduler
from minitrain.tune.search import Searcher


def _fail(field: str, value: Any, expected: str) -> ConfigError:
    return ConfigError(f"TuneConfig({field}={value!r}): {field} must be {expected}.")


@dataclass(frozen=True)
class TuneConfig:
    """How to tune. `metric`/`mode` ('min' or 'max') are the defaults of the scheduler, the searcher and
    `ResultGrid.get_best_result`. `num_samples` repeats the param space's grid (with the default
    searcher) or is the number of trials (with another searcher); -1 means "sample until time_budget_s is
    spent". `time_budget_s` (seconds, or a `datetime.timedelta`, kept as seconds) ends the sweep: no
    trial starts after it, and running trials are stopped at once (their processes get Ctrl-C) and end
    TERMINATED, as Ray's. `max_concurrent_trials` caps trials running at once (None or 0: as many as
    the hosts hold). `search_alg` defaults to `BasicVariantGenerator()` (random + grid), `scheduler` to
    `FIFOScheduler()`. `trial_name_creator(trial)` and `trial_dirname_creator(trial)` name a trial
    from its `trial_id` and `config`. `reuse_actors` must stay False (each trial is its own process).
    """

    mode: Optional[str] = None
    metric: Optional[str] = None
    search_alg: Optional[Searcher] = None
    scheduler: Optional[TrialScheduler] = None
    num_samples: int = 1
    max_concurrent_trials: Optional[int] = None
    time_budget_s: Union[float, datetime.timedelta, None] = None
    reuse_actors: bool = False
    trial_name_creator: Optional[Callable[[Any], str]] = None
    trial_dirname_creator: Optional[Callable[[Any], str]] = None

    def __post_init__(self) -> None:
        if self.mode not in (None, "min", "max"):
            raise _fail("mode", self.mode, "'min', 'max' or None")
        if self.metric is not None and (not isinstance(self.metric, str) or not self.metric):
            raise _fail("metric", self.metric, "a result key (str) or None")
        if self.search_alg is not None and not isinstance(self.search_alg, Searcher):
            raise _fail("search_alg", self.search_alg, "a minitrain.tune Searcher (BasicVariantGenerator, "
                        "OptunaSearch, ConcurrencyLimiter) or None; a ray.tune object does not work here")
        if self.scheduler is not None and not isinstance(self.scheduler, TrialScheduler):
            raise _fail("scheduler", self.scheduler, "a minitrain.tune scheduler (FIFOScheduler, ASHAScheduler, "
                        "MedianStoppingRule) or None")
        if isinstance(self.time_budget_s, datetime.timedelta):  # Ray takes a timedelta too; one unit here
            object.__setattr__(self, "time_budget_s", self.time_budget_s.total_seconds())
        n = self.num_samples
        if isinstance(n, bool) or not isinstance(n, int) or (n < 1 and n != -1):
            raise _fail("num_samples", n, "an int >= 1, or -1 with time_budget_s")
        if n == -1 and self.time_budget_s is None:
            raise ConfigError("TuneConfig(num_samples=-1) samples until the sweep is stopped, and without "
                              "time_budget_s nothing here bounds it (a RunConfig stopper is not known to TuneConfig). "
                              "Set time_budget_s (seconds or a datetime.timedelta), or a number of samples.")
        c = self.max_concurrent_trials
        if c is not None and (isinstance(c, bool) or not isinstance(c, int) or c < 0):
            raise _fail("max_concurrent_trials", c, "an int >= 0 or None (0 and None: no limit)")
        t = self.time_budget_s
        if t is not None and (isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t <= 0):
            raise _fail("time_budget_s", t, "a number of seconds > 0, a datetime.timedelta > 0, or None")
        if self.reuse_actors:
            raise _fail("reuse_actors", self.reuse_actors, "False: every trial runs in a process of its own")
        for field in ("trial_name_creator", "trial_dirname_creator"):
            value = getattr(self, field)
            if value is not None and not callable(value):
                raise _fail(field, value, "a function of the trial, or None")


class _WithResources:
    """A function trainable with the resources each of its trials reserves."""

    def __init__(self, trainable: Callable, resources: dict, scaling_config: Optional[ScalingConfig] = None):
        self.trainable, self.resources = trainable, resources
        self.scaling_config = scaling_config  # when given: the trial is placed worker by worker, as fit() places
        self.__name__ = getattr(trainable, "__name__", "trainable")

    def __call__(self, config: dict) -> Any:
        return self.trainable(config)


class _WithParameters:
    """A function trainable called as `trainable(config, **parameters)` (Ray's `tune.with_parameters`).
    The parameters travel pickled with the trainable to each trial process (Ray puts them in its object
    store once; minitrain pickles them into each trial's payload)."""

    def __init__(self, trainable: Callable, parameters: dict):
        self.trainable, self.parameters = trainable, parameters
        self.__name__ = getattr(trainable, "__name__", "trainable")

    def __call__(self, config: dict) -> Any:
        return self.trainable(config, **self.parameters)


def with_parameters(trainable: Callable, **kwargs: Any) -> _WithParameters:
    """`trainable` with large or unpicklable-by-config objects (data sets, models) passed as keyword
    arguments: each trial calls `trainable(config, **kwargs)`. Composes with `with_resources`."""
    if not callable(trainable) or isinstance(trainable, type):
        raise ConfigError(f"tune.with_parameters(trainable={trainable!r}): pass a function trainable "
                          "`def train(config, **kwargs)` (class trainables are not supported).")
    if isinstance(trainable, _WithResources):
        raise ConfigError("tune.with_parameters(tune.with_resources(fn, ...)): wrap the other way round, "
                          "tune.with_resources(tune.with_parameters(fn, ...), resources), as Ray asks.")
    import inspect

    try:
        inspect.signature(trainable).bind({}, **kwargs)
    except TypeError as exc:
        raise ConfigError(f"tune.with_parameters({getattr(trainable, '__name__', trainable)!r}, "
                          f"{', '.join(kwargs)}): the trainable cannot be called as trainable(config, **kwargs): "
                          f"{exc}") from None
    return _WithParameters(trainable, dict(kwargs))


def with_resources(trainable: Callable, resources: Any) -> _WithResources:
    """Reserve `resources` for each trial of a function trainable: {"cpu": n, "gpu": m} (any case), or a
    ScalingConfig (for a function that runs fit() with it: the trial reserves its workers x per-worker
    resources on hosts chosen by its placement_strategy, and that fit() is given only those hosts). A
    function of the config (Ray's third form) raises ConfigError: hosts are reserved before a trial's
    config is drawn, so every trial of a sweep reserves the same amounts."""
    if not callable(trainable):
        raise ConfigError(f"tune.with_resources(trainable={trainable!r}): pass the trial function.")
    if callable(resources) and not isinstance(resources, (dict, ScalingConfig)):
        # Why not Ray's function of the config: the sweep reserves a trial's hosts before it draws the
        # trial's config from the searcher (so a trial exists only once it can start, and a queued sweep
        # holds no drawn configs), so every trial of a sweep reserves the same amounts.
        raise ConfigError(f"tune.with_resources(resources={getattr(resources, '__name__', resources)!r}): a function "
                          "of the config is not accepted, because minitrain.tune reserves a trial's hosts before it "
                          "draws the trial's config, so every trial reserves the same amounts. Pass fixed amounts "
                          "sized for the largest config ({'cpu': n, 'gpu': m} or a ScalingConfig), or run one Tuner "
                          "per resource shape.")
    if isinstance(resources, ScalingConfig):
        amounts = dict(resources.total_resources)
    elif isinstance(resources, dict):
        amounts = {}
        for key, value in resources.items():
            name = str(key).upper()
            if name not in ("CPU", "GPU"):
                raise ConfigError(f"tune.with_resources: resource {key!r} is not known; minitrain.tune counts 'cpu' "
                                  "and 'gpu'.")
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise ConfigError(f"tune.with_resources: {key}={value!r} must be a number >= 0.")
            amounts[name] = float(value)
    else:
        raise ConfigError(f"tune.with_resources(resources={resources!r}) must be a dict such as {{'cpu': 1}} or a "
                          "ScalingConfig.")
    return _WithResources(trainable, {"CPU": amounts.get("CPU", 0.0), "GPU": amounts.get("GPU", 0.0)},
                          resources if isinstance(resources, ScalingConfig) else None)
