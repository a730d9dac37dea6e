"""`RayTrainReportCallback` for LightGBM: report each round's evaluation, rank 0 checkpoints the model (L3)."""

from __future__ import annotations

import os
from typing import Any, Callable, Optional

from lightgbm import Booster

from minitrain import train_api
from minitrain._gbdt import MetricsArg, ReportSettings, flatten_last
from minitrain.checkpoint import Checkpoint


def evaluation_results(entries: Any) -> dict:
    """LightGBM's `evaluation_result_list` as {data: {metric: value}}; a cross-validation entry (with a
    standard deviation) gives "<metric>-mean" and "<metric>-stdv", as Ray's callback does."""
    results: dict = {}
    for entry in entries or ():
        data_name, metric, value = entry[0], entry[1], entry[2]
        into = results.setdefault(data_name, {})
        if len(entry) > 4:
            into[f"{metric}-mean"] = value
            into[f"{metric}-stdv"] = entry[4]
        else:
            into[metric] = value
    return results


class RayTrainReportCallback:
    """A LightGBM callback (`lightgbm.train(..., callbacks=[...])`) that calls `minitrain.report` after
    every boosting round with the round's evaluation metrics ("<data>-<metric>", e.g. "eval-l2").

    `metrics`: report only these keys (a key, a list, or a dict of reported name -> key); `frequency`:
    also checkpoint every that many rounds (0: never during training); `checkpoint_at_end`: checkpoint
    at the last round; `filename`: the model's file in the checkpoint (`model.txt`, LightGBM's text
    format); `results_postprocessing_fn`: applied to the metrics before they are reported. Only rank 0
    writes the model; the other ranks report the same round without a checkpoint.
    """

    CHECKPOINT_NAME = "model.txt"

    def __init__(self, metrics: MetricsArg = None, filename: str = CHECKPOINT_NAME, frequency: int = 0,
                 checkpoint_at_end: bool = True,
                 results_postprocessing_fn: Optional[Callable[[dict], dict]] = None):
        self._settings = ReportSettings.of(metrics, filename, frequency, checkpoint_at_end,
                                           results_postprocessing_fn)

    @classmethod
    def get_model(cls, checkpoint: Checkpoint, filename: str = CHECKPOINT_NAME) -> Booster:
        """The `lightgbm.Booster` saved in `checkpoint` by this callback (under `filename`)."""
        with checkpoint.as_directory() as directory:
            return Booster(model_file=os.path.join(directory, filename))

    def __call__(self, env: Any) -> None:
        """Report this round; with a checkpoint every `frequency` rounds and at the last one."""
        flat = flatten_last(evaluation_results(env.evaluation_result_list))
        metrics = self._settings.metrics(flat)
        last = env.iteration == env.end_iteration - 1
        if (last and self._settings.checkpoint_at_end) or self._settings.due(env.iteration):
            with self._settings.checkpoint(env.model) as checkpoint:
                train_api.report(metrics, checkpoint=checkpoint)
        else:
            train_api.report(metrics)
