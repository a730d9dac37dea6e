"""Search algorithms: where each new trial's config comes from (L3; pure, no processes).

A `Searcher` is asked `suggest(trial_id)` for each new trial and told every result and each end. It
returns a config, None ("not now": a concurrency limit is reached) or `Searcher.FINISHED`.
`BasicVariantGenerator` is Ray's default: random sampling and grid search over the param space
(minitrain.tune.search_space). `ConcurrencyLimiter` caps how many of a searcher's trials run at once.
`OptunaSearch` lives in minitrain.tune.search.optuna, as in Ray (it needs the optional optuna package).
"""

from __future__ import annotations

import copy
from typing import Any, Iterator, Optional

from minitrain.errors import ConfigError
from minitrain.tune import search_space


class Searcher:
    """Base of the search algorithms (Ray's `ray.tune.search.Searcher` contract)."""

    FINISHED = "FINISHED"

    def __init__(self, metric: Optional[str] = None, mode: Optional[str] = None):
        if mode not in (None, "min", "max"):
            raise ConfigError(f"{type(self).__name__}(mode={mode!r}): mode must be 'min' or 'max'.")
        self.metric, self.mode = metric, mode

    def set_search_properties(self, metric: Optional[str], mode: Optional[str], config: dict) -> bool:
        """Take TuneConfig's metric/mode where this searcher has none, and the Tuner's param space.
        False when they conflict with what the searcher was given."""
        if (self.metric and metric and self.metric != metric) or (self.mode and mode and self.mode != mode):
            return False
        self.metric = self.metric or metric
        self.mode = self.mode or mode
        return True

    def total_trials(self, num_samples: int) -> int:
        """How many trials this search makes when TuneConfig says `num_samples` (Ray: num_samples is the
        number of trials for a searcher, and the number of repeats of the grid for the basic one)."""
        return num_samples

    def suggest(self, trial_id: str) -> Any:
        """A config for the new trial `trial_id`, None to wait, or `Searcher.FINISHED`."""
        raise NotImplementedError

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        """An intermediate result of a trial this searcher suggested."""

    def on_trial_complete(self, trial_id: str, result: Optional[dict] = None, error: bool = False) -> None:
        """The trial ended with `result` (its last one), or failed when `error`."""

    def restore_finished(self, trial_id: str, config: dict, result: Optional[dict], error: bool) -> None:
        """Tell a fresh searcher of a trial finished before `Tuner.restore` (default: nothing)."""


class BasicVariantGenerator(Searcher):
    """Random and grid search over the Tuner's param space, as Ray's default searcher.

    `random_state` (an int seed or numpy Generator) makes the configs reproducible;
    `constant_grid_search=True` samples the random values once per sample and keeps them across the
    grid; `max_concurrent` > 0 caps running trials; `points_to_evaluate` are configs (partial ones are
    completed from the param space) tried first.
    """

    def __init__(self, points_to_evaluate: Optional[list] = None, max_concurrent: int = 0,
                 constant_grid_search: bool = False, random_state: Any = None):
        super().__init__()
        if isinstance(max_concurrent, bool) or not isinstance(max_concurrent, int) or max_concurrent < 0:
            raise ConfigError(f"BasicVariantGenerator(max_concurrent={max_concurrent!r}) must be an int >= 0 "
                              "(0: no limit).")
        if points_to_evaluate is not None and (not isinstance(points_to_evaluate, list)
                                               or not all(isinstance(p, dict) for p in points_to_evaluate)):
            raise ConfigError("BasicVariantGenerator(points_to_evaluate=...) must be a list of config dicts.")
        self._points = [copy.deepcopy(p) for p in points_to_evaluate or []]
        self.max_concurrent = max_concurrent
        self.constant_grid_search = bool(constant_grid_search)
        self._rng = search_space.make_rng(random_state)
        # An int seed is kept in the tuning run's state, so Tuner.restore draws the same remaining configs.
        self.seed = int(random_state) if isinstance(random_state, int) and not isinstance(random_state, bool) else None
        self._space: dict = {}
        self._variants: Optional[Iterator[dict]] = None
        self._num_samples = 1
        self._live: set[str] = set()

    def set_search_properties(self, metric, mode, config) -> bool:
        self._space = config
        return super().set_search_properties(metric, mode, config)

    def total_trials(self, num_samples: int) -> int:
        self._num_samples = num_samples
        # Ray: each point replaces one sample and is itself grid-searched over the grids it leaves unset.
        return sum(search_space.count_variants(_merged(self._space, point), 1) for point in self._points) + \
            search_space.count_variants(self._space, max(num_samples - len(self._points), 0))

    def _iterator(self) -> Iterator[dict]:
        for point in self._points:
            yield from search_space.generate_variants(_merged(self._space, point), 1, self._rng,
                                                      self.constant_grid_search)
        yield from search_space.generate_variants(self._space, max(self._num_samples - len(self._points), 0),
                                                  self._rng, self.constant_grid_search)

    def skip(self, count: int) -> None:
        """Draw and drop the first `count` configs (a restored sweep: those trials exist already)."""
        for _ in range(count):
            self.suggest("")
            self._live.discard("")

    def suggest(self, trial_id: str) -> Any:
        if self.max_concurrent and len(self._live) >= self.max_concurrent:
            return None
        if self._variants is None:
            self._variants = self._iterator()
        config = next(self._variants, None)
        if config is None:
            return Searcher.FINISHED
        self._live.add(trial_id)
        return config

    def on_trial_complete(self, trial_id, result=None, error=False) -> None:
        self._live.discard(trial_id)


def _merged(space: dict, point: dict) -> dict:
    merged = copy.deepcopy(space)
    for key, value in point.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict) and "grid_search" not in merged[key]:
            merged[key] = _merged(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


class ConcurrencyLimiter(Searcher):
    """Lets at most `max_concurrent` of `searcher`'s trials run at once (Ray's ConcurrencyLimiter)."""

    def __init__(self, searcher: Searcher, max_concurrent: int, batch: bool = False):
        if not isinstance(searcher, Searcher):
            raise ConfigError(f"ConcurrencyLimiter(searcher={searcher!r}) must wrap a minitrain.tune Searcher.")
        if isinstance(max_concurrent, bool) or not isinstance(max_concurrent, int) or max_concurrent < 1:
            raise ConfigError(f"ConcurrencyLimiter(max_concurrent={max_concurrent!r}) must be an int >= 1.")
        if batch:
            raise ConfigError("ConcurrencyLimiter(batch=True) is not supported by minitrain.tune; leave it False.")
        super().__init__(searcher.metric, searcher.mode)
        self.searcher, self.max_concurrent = searcher, max_concurrent
        self._live: set[str] = set()

    def set_search_properties(self, metric, mode, config) -> bool:
        ok = self.searcher.set_search_properties(metric, mode, config)
        self.metric, self.mode = self.searcher.metric, self.searcher.mode
        return ok

    def total_trials(self, num_samples: int) -> int:
        return self.searcher.total_trials(num_samples)

    def suggest(self, trial_id: str) -> Any:
        if len(self._live) >= self.max_concurrent:
            return None
        config = self.searcher.suggest(trial_id)
        if isinstance(config, dict):
            self._live.add(trial_id)
        return config

    def on_trial_result(self, trial_id, result) -> None:
        self.searcher.on_trial_result(trial_id, result)

    def on_trial_complete(self, trial_id, result=None, error=False) -> None:
        self._live.discard(trial_id)
        self.searcher.on_trial_complete(trial_id, result, error)

    def restore_finished(self, trial_id, config, result, error) -> None:
        self.searcher.restore_finished(trial_id, config, result, error)

    def skip(self, count: int) -> None:
        """Pass a restored sweep's skip on to the wrapped searcher, when it has one."""
        if hasattr(self.searcher, "skip"):
            self.searcher.skip(count)
