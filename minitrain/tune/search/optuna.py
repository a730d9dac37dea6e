"""`OptunaSearch` (Ray: ray.tune.search.optuna): Optuna's samplers (TPE by default) as a minitrain.tune searcher (L3).

Needs the optional `optuna` package (`pip install minitrain[tune]`). The Tuner's param space is
converted to Optuna distributions as Ray does: uniform/loguniform/quniform -> FloatDistribution,
randint/lograndint/qrandint -> IntDistribution (randint's exclusive upper bound becomes upper - 1),
choice -> CategoricalDistribution; constants stay constants. grid_search, randn and sample_from have no
Optuna equivalent and are refused. Uses Optuna's ask-and-tell interface: one Optuna trial per Tune
trial, told the trial's last value of `metric` when it ends (a failed trial is told FAIL).
"""

from __future__ import annotations

import copy
from typing import Any, Optional

from minitrain.errors import ConfigError
from minitrain.storage.retention import flatten_metrics
from minitrain.tune.search import Searcher
from minitrain.tune.search_space import Domain, _is_grid, _unresolved_paths


def _optuna():
    try:
        import optuna
    except ImportError as exc:  # the optional extra
        raise ImportError("OptunaSearch needs optuna: pip install 'minitrain[tune]' (or pip install optuna)") from exc
    return optuna


def _distribution(optuna: Any, path: str, domain: Any) -> Any:
    dist = optuna.distributions
    if _is_grid(domain):
        raise ConfigError(f"OptunaSearch: {path} is a grid_search, which Optuna cannot sample. Use "
                          f"tune.choice({domain['grid_search']!r}) instead.")
    kind, q = domain.kind, domain.q
    if kind in ("uniform", "loguniform"):
        if kind == "loguniform" and q:
            raise ConfigError(f"OptunaSearch: {path} ({domain!r}): Optuna does not support both quantization "
                              "and sampling from LogUniform. Use loguniform or quniform.")
        return dist.FloatDistribution(domain.lower, domain.upper, log=kind == "loguniform", step=q)
    if kind in ("randint", "lograndint"):
        step = int(q) if q else 1
        upper = domain.upper if q and q != 1 else domain.upper - 1  # Ray: randint's upper bound is exclusive
        if kind == "lograndint":
            if step != 1:
                raise ConfigError(f"OptunaSearch: {path} ({domain!r}): Optuna cannot quantize a log int.")
            return dist.IntDistribution(domain.lower, upper, log=True)
        return dist.IntDistribution(domain.lower, upper, step=step)
    if kind == "choice":
        return dist.CategoricalDistribution(domain.categories)
    raise ConfigError(f"OptunaSearch: {path} ({domain!r}) has no Optuna equivalent (randn and sample_from "
                      "cannot be converted). Use uniform, loguniform, randint or choice.")


class OptunaSearch(Searcher):
    """Optuna-driven search (Ray's `ray.tune.search.optuna.OptunaSearch`).

    `space` may be given here as a Tune param space, else the Tuner's param_space is used. `sampler`
    is an Optuna sampler (default `TPESampler(seed=seed)`); `points_to_evaluate` are configs tried
    first (flat "a/b" keys or nested dicts), with `evaluated_rewards` their known values (then they are
    not run). `study_name` names the in-memory study.
    """

    def __init__(self, space: Optional[dict] = None, metric: Optional[str] = None, mode: Optional[str] = None,
                 points_to_evaluate: Optional[list] = None, sampler: Any = None, seed: Optional[int] = None,
                 evaluated_rewards: Optional[list] = None, study_name: Optional[str] = None):
        super().__init__(metric, mode)
        if isinstance(metric, list) or isinstance(mode, list):
            raise ConfigError("OptunaSearch: multi-objective search is not supported by minitrain.tune; give one "
                              "metric and mode.")
        optuna = _optuna()
        if sampler is not None and seed is not None:
            raise ConfigError("OptunaSearch(sampler=..., seed=...): set the seed on your sampler instead.")
        self._optuna = optuna
        self._sampler = sampler if sampler is not None else optuna.samplers.TPESampler(seed=seed)
        self._study_name = study_name or "optuna"
        self._points = list(points_to_evaluate or [])
        self._rewards = list(evaluated_rewards or [])
        if self._rewards and len(self._rewards) != len(self._points):
            raise ConfigError("OptunaSearch(evaluated_rewards=...) must have one value per points_to_evaluate entry.")
        self._space: Optional[dict] = None
        self._study = None
        self._trials: dict[str, Any] = {}
        if space is not None:
            self._setup(space)

    def set_search_properties(self, metric, mode, config) -> bool:
        if not super().set_search_properties(metric, mode, config):
            return False
        if self._space is None:
            self._setup(config)
        return True

    def _setup(self, space: dict) -> None:
        self._template = copy.deepcopy(space)
        self._distributions = {"/".join(map(str, p)): _distribution(self._optuna, "/".join(map(str, p)), d)
                               for p, d in _unresolved_paths(space)
                               if isinstance(d, Domain) or _is_grid(d)}
        self._paths = {"/".join(map(str, p)): p for p, _ in _unresolved_paths(space)}
        self._space = space

    def _ensure_study(self) -> None:
        if self._study is not None:
            return
        if not self.metric or not self.mode:
            raise ConfigError("OptunaSearch needs a metric and a mode: pass them to OptunaSearch or to "
                              "TuneConfig(metric=..., mode=...).")
        optuna = self._optuna
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        direction = "maximize" if self.mode == "max" else "minimize"
        self._study = optuna.create_study(sampler=self._sampler, study_name=self._study_name, direction=direction)
        for index, point in enumerate(self._points):
            params = flatten_metrics(point)
            if self._rewards:
                self._study.add_trial(optuna.trial.create_trial(
                    params=params, distributions={k: self._distributions[k] for k in params},
                    value=self._rewards[index]))
            else:
                self._study.enqueue_trial(params)

    def suggest(self, trial_id: str) -> Any:
        if self._space is None:
            raise ConfigError("OptunaSearch has no search space: pass param_space to the Tuner or space= here.")
        self._ensure_study()
        trial = self._study.ask(fixed_distributions=self._distributions)
        self._trials[trial_id] = trial
        config = copy.deepcopy(self._template)
        for key, value in trial.params.items():
            node = config
            path = self._paths[key]
            for part in path[:-1]:
                node = node[part]
            node[path[-1]] = value
        return config

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        trial = self._trials.get(trial_id)
        value = result.get(self.metric)
        if trial is not None and isinstance(value, (int, float)) and "training_iteration" in result:
            trial.report(float(value), int(result["training_iteration"]))

    def on_trial_complete(self, trial_id: str, result: Optional[dict] = None, error: bool = False) -> None:
        trial = self._trials.pop(trial_id, None)
        if trial is None:
            return
        value = (result or {}).get(self.metric)
        if error or not isinstance(value, (int, float)):
            self._study.tell(trial, state=self._optuna.trial.TrialState.FAIL)
        else:
            self._study.tell(trial, float(value))

    def restore_finished(self, trial_id: str, config: dict, result: Optional[dict], error: bool) -> None:
        """A restored sweep's finished trial becomes a finished Optuna trial (so TPE learns from it)."""
        self._ensure_study()
        value = (result or {}).get(self.metric)
        flat = {k: v for k, v in flatten_metrics(config).items() if k in self._distributions}
        if error or not isinstance(value, (int, float)) or set(flat) != set(self._distributions):
            return
        self._study.add_trial(self._optuna.trial.create_trial(params=flat, distributions=self._distributions,
                                                              value=float(value)))
