"""`ResultGrid`: the trials of a sweep as `Result`s (L3), as Ray's `ray.tune.ResultGrid`."""

from __future__ import annotations

import base64
import importlib
import math
import os
import pickle
import sys
from dataclasses import dataclass
from typing import Any, Iterator, Optional

from minitrain.checkpoint import Checkpoint
from minitrain.errors import RemoteWorkerError
from minitrain.result import Result
from minitrain.storage import sweep_state as tr
from minitrain.storage.retention import flatten_metrics

_SCOPES = ("all", "last", "avg", "last-5-avg", "last-10-avg")


@dataclass
class TrialResult(Result):
    """A trial's `Result`: `metrics` is its last result (with `training_iteration`, `time_total_s`,
    ...), `checkpoint` its latest checkpoint, `path` its directory, `error` its failure (the
    exception the trial raised, of its own type; a `RemoteWorkerError` naming the type when it cannot
    be rebuilt, see `trial_error`) or None. Unlike `fit()`'s Result, `config` is the
    trial's config (as in Ray Tune); `status` is TERMINATED or ERROR and `stop_reason` says when a
    scheduler stopped it early."""

    trial_id: str = ""
    trial_name: str = ""
    status: Optional[tr.TrialStatus] = None
    stop_reason: Optional[str] = None
    _config: Any = None

    @property
    def config(self) -> Any:
        """The trial's resolved config (the sampled param_space)."""
        return self._config


def trial_error(error: tr.TrialError, pickled: Optional[str] = None) -> BaseException:
    """A trial's failure as the exception it raised, as fit() gives a run's: unpickled from what the
    trial process sent (`pickled`; live sweeps only, never read from storage), else rebuilt from its
    type name when that type is in a module this process has already imported and takes the message,
    else a `RemoteWorkerError` naming the type."""
    if pickled:
        try:
            # Our own child process's bytes, over its pipe: the trust of fit()'s worker channel.
            rebuilt = pickle.loads(base64.b64decode(pickled))
            if isinstance(rebuilt, BaseException):
                return rebuilt
        except Exception:  # noqa: BLE001 - the type does not exist here: rebuild below
            pass
    rebuilt = _by_name(error.exc_type, error.message)
    return rebuilt if rebuilt is not None else RemoteWorkerError(error.exc_type, error.message, error.traceback)


def _by_name(exc_type: str, message: str) -> Optional[BaseException]:
    """`exc_type(message)` for an exception type of an already imported module (nothing is imported:
    the name may come from a state file), or None."""
    module_name, _, qualname = exc_type.rpartition(".")
    module = sys.modules.get(module_name) if module_name else None
    if module is None and module_name == "builtins":
        module = importlib.import_module("builtins")
    cls: Any = module
    for part in qualname.split(".") if module is not None else ():
        cls = getattr(cls, part, None)
    if not (isinstance(cls, type) and issubclass(cls, BaseException)):
        return None
    try:
        rebuilt = cls(message)
    except Exception:  # noqa: BLE001 - a constructor that wants other arguments
        return None
    return rebuilt if str(rebuilt) == message else None


def trial_result(experiment_path: str, trial: tr.Trial, pickled_error: Optional[str] = None) -> TrialResult:
    """The `TrialResult` of a trial, its history read from the tuning run's files; `pickled_error`
    the live sweep's copy of its exception (see `trial_error`)."""
    error = None
    if trial.status == tr.TrialStatus.ERROR and trial.error:
        error = trial_error(trial.error, pickled_error)
    checkpoints = [(Checkpoint(path), metrics) for path, metrics in trial.checkpoints if os.path.exists(path)]
    latest = Checkpoint(trial.checkpoint) if trial.checkpoint and os.path.exists(trial.checkpoint) else None
    return TrialResult(metrics=trial.last_result, checkpoint=latest, error=error,
                       path=os.path.join(experiment_path, trial.dirname), best_checkpoints=checkpoints,
                       _metrics_history=tr.read_history(experiment_path, trial) or None,
                       trial_id=trial.trial_id, trial_name=trial.name, status=trial.status,
                       stop_reason=trial.stop_reason, _config=trial.config)


class ResultGrid:
    """The sweep's results, one `TrialResult` per trial in creation order: `len`, indexing and
    iteration; `get_best_result`, `get_dataframe`, `errors`, `num_errors`, `num_terminated`."""

    def __init__(self, results: list[TrialResult], experiment_path: str, metric: Optional[str] = None,
                 mode: Optional[str] = None):
        self._results = results
        self.experiment_path = experiment_path
        self._metric, self._mode = metric, mode

    def __len__(self) -> int:
        return len(self._results)

    def __getitem__(self, index: int) -> TrialResult:
        return self._results[index]

    def __iter__(self) -> Iterator[TrialResult]:
        return iter(self._results)

    def __repr__(self) -> str:
        return f"ResultGrid<{len(self)} trials, {self.num_terminated} terminated, {self.num_errors} errors>"

    @property
    def errors(self) -> list[BaseException]:
        """The errors of the trials that failed (past their retries)."""
        return [r.error for r in self._results if r.error is not None]

    @property
    def num_errors(self) -> int:
        """How many trials ended in ERROR."""
        return len(self.errors)

    @property
    def num_terminated(self) -> int:
        """Trials that ended without error (finished, or stopped early by a scheduler)."""
        return sum(1 for r in self._results if r.status == tr.TrialStatus.TERMINATED)

    def get_best_result(self, metric: Optional[str] = None, mode: Optional[str] = None, scope: str = "last",
                        filter_nan_and_inf: bool = True) -> TrialResult:
        """The trial whose `metric` is best under `mode` ('min'/'max'), both defaulting to TuneConfig's.

        `scope` is Ray's: 'last' (each trial's last result), 'avg' (mean of all its results),
        'last-5-avg', 'last-10-avg', or 'all' (its best result). NaN and infinite values are skipped
        unless `filter_nan_and_inf=False`. RuntimeError when no trial reported the metric.
        """
        metric, mode = metric or self._metric, mode or self._mode
        if not metric or not mode:
            raise ValueError("No metric is provided. Either pass get_best_result(metric=..., mode=...) or set "
                             "TuneConfig(metric=..., mode=...).")
        if mode not in ("min", "max"):
            raise ValueError(f"get_best_result(mode={mode!r}): mode must be 'min' or 'max'.")
        if scope not in _SCOPES:
            raise ValueError(f"get_best_result(scope={scope!r}): scope must be one of {list(_SCOPES)}.")
        scored = []
        for result in self._results:
            value = _score(result, metric, mode, scope)
            if value is None or (filter_nan_and_inf and not math.isfinite(value)):
                continue
            scored.append((value, result))
        if not scored:
            raise RuntimeError(f"No best trial found for the given metric: {metric}. This means that no trial has "
                               "reported this metric, or all values reported for this metric are NaN. To not "
                               "ignore NaN values, you can set the `filter_nan_and_inf` arg to False.")
        pick = max if mode == "max" else min
        return pick(scored, key=lambda item: item[0])[1]

    def get_dataframe(self, filter_metric: Optional[str] = None, filter_mode: Optional[str] = None) -> Any:
        """A pandas DataFrame, one row per trial: its last result (or, with `filter_metric` and
        `filter_mode`, its best result for that metric), `config/<key>` columns, `trial_id`, `status`
        and `logdir` (the trial directory). Nested values are flattened with '/'."""
        import pandas

        if (filter_metric is None) != (filter_mode is None):
            raise ValueError("get_dataframe: pass both filter_metric and filter_mode, or neither.")
        rows = []
        for result in self._results:
            chosen = result.metrics or {}
            if filter_metric:
                history = [r for r in (result._metrics_history or []) if _number(_lookup(r, filter_metric))]
                if history:
                    pick = max if filter_mode == "max" else min
                    chosen = pick(history, key=lambda r: _lookup(r, filter_metric))
            row = flatten_metrics(chosen)
            row.update({f"config/{key}": value for key, value in flatten_metrics(
                result.config if isinstance(result.config, dict) else {}).items()})
            row.update(trial_id=result.trial_id, status=result.status, logdir=result.path)
            rows.append(row)
        return pandas.DataFrame(rows)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _lookup(result: Optional[dict], metric: str) -> Any:
    """`metric` in `result`: the key itself, else a flattened "a/b" key read in the nested dicts (Ray's
    `unflattened_lookup`: a trial that reports {"eval": {"loss": x}} is ranked by metric="eval/loss")."""
    if not result:
        return None
    if metric in result:
        return result[metric]
    return flatten_metrics(result).get(metric)


def _score(result: TrialResult, metric: str, mode: str, scope: str) -> Optional[float]:
    history = [_lookup(r, metric) for r in (result._metrics_history or []) if _number(_lookup(r, metric))]
    if scope == "last":
        last = _lookup(result.metrics, metric)
        return float(last) if _number(last) else None
    if not history:
        return None
    if scope == "all":
        return float(max(history) if mode == "max" else min(history))
    window = {"avg": len(history), "last-5-avg": 5, "last-10-avg": 10}[scope]
    values = history[-window:]
    return float(sum(values) / len(values))
