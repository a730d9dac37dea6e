"""What `XGBoostTrainer` and `LightGBMTrainer` share on the driver and in the callbacks (L3, no xgboost or
lightgbm import): the legacy-argument check of Ray's trainers and the report callbacks' metric dict."""

from __future__ import annotations

import contextlib
import os
import tempfile
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, Optional, Union

from minitrain import train_api
from minitrain.checkpoint import Checkpoint

# Ray's issue that explains why the legacy (params/label_column/num_boost_round) trainer API was removed.
LEGACY_API_ISSUE = "https://github.com/ray-project/ray/issues/50042"

MetricsArg = Optional[Union[str, list, tuple, Mapping[str, str]]]


def refuse_legacy_arguments(trainer: str, label_column: Any, params: Any, num_boost_round: Any) -> None:
    """Ray's DeprecationWarning (raised, not warned) when any of the legacy arguments is given: they
    would otherwise be accepted and ignored, and the run would train something else."""
    given = [name for name, value in (("label_column", label_column), ("params", params),
                                      ("num_boost_round", num_boost_round)) if value is not None]
    if given:
        raise DeprecationWarning(
            f"The legacy {trainer} API is deprecated ({', '.join(given)} given). Please switch to passing in a "
            f"custom `train_loop_per_worker` function instead, which builds the dataset from "
            f"minitrain.get_dataset_shard(...) and calls train() itself with your params and rounds. See this "
            f"issue for more context: {LEGACY_API_ISSUE}")


def metric_names(metrics: MetricsArg) -> Optional[Union[list, dict]]:
    """The callbacks' `metrics` argument normalised: None (report everything), a list of the library's
    metric keys, or a dict of reported name -> the library's key."""
    if metrics is None:
        return None
    if isinstance(metrics, str):
        return [metrics]
    if isinstance(metrics, Mapping):
        return dict(metrics)
    if isinstance(metrics, (list, tuple)) and all(isinstance(name, str) for name in metrics):
        return list(metrics)
    raise TypeError(f"RayTrainReportCallback(metrics={metrics!r}): give a metric key ('validation-rmse'), a list "
                    "of them, or a dict of reported name -> key ({'loss': 'validation-logloss'}).")


@dataclass(frozen=True)
class ReportSettings:
    """What both RayTrainReportCallbacks are told (Ray's arguments, checked): `names` from
    `metric_names`, the model's `filename`, checkpoint every `frequency` rounds (0: never during
    training), `checkpoint_at_end`, and `postprocess` (Ray's `results_postprocessing_fn`)."""

    names: Optional[Union[list, dict]]
    filename: str
    frequency: int
    checkpoint_at_end: bool
    postprocess: Optional[Callable[[dict], dict]]

    @classmethod
    def of(cls, metrics: MetricsArg, filename: str, frequency: int, checkpoint_at_end: bool,
           results_postprocessing_fn: Optional[Callable[[dict], dict]]) -> "ReportSettings":
        """The settings of a callback built with Ray's arguments; ValueError/TypeError naming the bad one."""
        if isinstance(frequency, bool) or not isinstance(frequency, int) or frequency < 0:
            raise ValueError(f"RayTrainReportCallback(frequency={frequency!r}) must be an int >= 0 (0: no "
                             "checkpoints during training).")
        return cls(metric_names(metrics), filename, frequency, checkpoint_at_end, results_postprocessing_fn)

    def due(self, iteration: int) -> bool:
        """True when the round of 0-based `iteration` is checkpointed by `frequency`."""
        return bool(self.frequency) and (iteration + 1) % self.frequency == 0

    def metrics(self, flat: dict) -> dict:
        """The metrics to report from a round's flattened evaluation (see `report_dict`)."""
        return report_dict(flat, self.names, self.postprocess)

    @contextlib.contextmanager
    def checkpoint(self, model: Any) -> Iterator[Optional[Checkpoint]]:
        """On rank 0 (or outside a run), a checkpoint holding `model.save_model(filename)`, valid inside
        the block; None on the other ranks, which report the same round without one."""
        if train_api.get_context().get_world_rank() not in (0, None):
            yield None
            return
        with tempfile.TemporaryDirectory() as directory:
            model.save_model(os.path.join(directory, self.filename))
            yield Checkpoint.from_directory(directory)


def flatten_last(evals: Mapping[str, Mapping[str, Any]]) -> dict:
    """{"<data>-<metric>": value} from {data: {metric: value or list of values}}, a list's last value
    (the latest iteration), as Ray's callbacks flatten XGBoost's and LightGBM's evaluation logs."""
    flat = {}
    for data_name, metrics in evals.items():
        for metric, value in metrics.items():
            flat[f"{data_name}-{metric}"] = value[-1] if isinstance(value, (list, tuple)) else value
    return flat


def report_dict(flat: dict, names: Optional[Union[list, dict]],
                postprocess: Optional[Callable[[dict], dict]]) -> dict:
    """The metrics to report: `flat` (from `flatten_last`), only `names` when given (KeyError naming the
    keys there are when one is missing), then `postprocess` applied."""
    if names is None:
        chosen = dict(flat)
    else:
        pairs = names.items() if isinstance(names, dict) else ((name, name) for name in names)
        chosen = {}
        for reported, key in pairs:
            if key not in flat:
                raise KeyError(f"RayTrainReportCallback(metrics=...) names {key!r}, which this round's evaluation "
                               f"does not have; it has {sorted(flat)}.")
            chosen[reported] = flat[key]
    return postprocess(chosen) if postprocess is not None else chosen
