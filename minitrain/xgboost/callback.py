"""`RayTrainReportCallback` for XGBoost: report each round's evaluation, rank 0 checkpoints the model (L3)."""

from __future__ import annotations

import os
from typing import Any, Callable, Optional

from xgboost import Booster
from xgboost.callback import TrainingCallback

from minitrain import train_api
from minitrain._gbdt import MetricsArg, ReportSettings, flatten_last
from minitrain.checkpoint import Checkpoint


class RayTrainReportCallback(TrainingCallback):
    """An `xgboost.callback.TrainingCallback` that calls `minitrain.report` after every boosting round
    with the round's evaluation metrics ("<data>-<metric>": the latest value, e.g. "validation-rmse").

    `metrics`: report only these keys (a key, a list, or a dict of reported name -> key); `frequency`:
    also checkpoint every that many rounds (0: never during training); `checkpoint_at_end`: checkpoint
    after the last round unless that round was just checkpointed; `filename`: the model's file in the
    checkpoint (`model.ubj`, XGBoost's binary JSON); `results_postprocessing_fn`: applied to the metrics
    before they are reported. Only rank 0 writes the model (every rank holds the same one); the other
    ranks report the same round without a checkpoint, so the round commits when every rank made it.
    """

    CHECKPOINT_NAME = "model.ubj"

    def __init__(self, metrics: MetricsArg = None, filename: str = CHECKPOINT_NAME, frequency: int = 0,
                 checkpoint_at_end: bool = True,
                 results_postprocessing_fn: Optional[Callable[[dict], dict]] = None):
        self._settings = ReportSettings.of(metrics, filename, frequency, checkpoint_at_end,
                                           results_postprocessing_fn)
        self._evals_log: Any = None
        self._last_checkpoint_iteration: Optional[int] = None

    @classmethod
    def get_model(cls, checkpoint: Checkpoint, filename: str = CHECKPOINT_NAME) -> Booster:
        """The `xgboost.Booster` saved in `checkpoint` by this callback (under `filename`)."""
        with checkpoint.as_directory() as directory:
            booster = Booster()
            booster.load_model(os.path.join(directory, filename))
            return booster

    def _report_dict(self) -> dict:
        flat = flatten_last(self._evals_log) if self._evals_log else {}
        return self._settings.metrics(flat)

    def _report_with_checkpoint(self, model: Booster) -> None:
        with self._settings.checkpoint(model) as checkpoint:
            train_api.report(self._report_dict(), checkpoint=checkpoint)

    def after_iteration(self, model: Booster, epoch: int, evals_log: Any) -> bool:
        """Report this round (with a checkpoint every `frequency` rounds); never stops training."""
        self._evals_log = evals_log
        if self._settings.due(epoch):
            self._last_checkpoint_iteration = epoch
            self._report_with_checkpoint(model)
        else:
            train_api.report(self._report_dict())
        return False

    def after_training(self, model: Booster) -> Booster:
        """Checkpoint the final model (`checkpoint_at_end`), unless its last round was just checkpointed."""
        if self._settings.checkpoint_at_end and model.num_boosted_rounds() - 1 != self._last_checkpoint_iteration:
            self._report_with_checkpoint(model)
        return model
