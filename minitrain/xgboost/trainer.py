"""`XGBoostTrainer`: data-parallel XGBoost on minitrain's workers, with Ray Train v2's signature (L3)."""

from __future__ import annotations

from typing import Any, Callable, Optional

from minitrain._gbdt import refuse_legacy_arguments
from minitrain.config import DataConfig, RunConfig, ScalingConfig
from minitrain.driver.trainer import DataParallelTrainer
from minitrain.worker.backend import Backend
from minitrain.worker.xgboost_backend import XGBoostBackend
from minitrain.xgboost.config import XGBoostConfig


class XGBoostTrainer(DataParallelTrainer):
    """Runs `train_loop_per_worker` on `scaling_config.num_workers` workers, each inside XGBoost's
    communicator, so `xgboost.train(...)` in it trains one model data-parallel over every rank's shard
    (`minitrain.get_dataset_shard(name)`). Report with `minitrain.xgboost.RayTrainReportCallback`
    (rank 0 checkpoints `model.ubj`); to resume after a restart, load `minitrain.get_checkpoint()` with
    `RayTrainReportCallback.get_model` and pass it as `xgb_model=` with the rounds left.

    Arguments as Ray Train v2's: `xgboost_config` is an `XGBoostConfig`; the others are
    `DataParallelTrainer`'s (`metadata` and `resume_from_checkpoint` raise Ray v2's DeprecationWarning).
    Ray's legacy arguments `label_column`, `params` and `num_boost_round` raise its DeprecationWarning.
    """

    _BACKEND_CONFIG = XGBoostConfig
    _BACKEND_FIELD = "xgboost_config"

    def __init__(self, train_loop_per_worker: Optional[Callable] = None, *,
                 train_loop_config: Optional[dict] = None, xgboost_config: Optional[XGBoostConfig] = None,
                 scaling_config: Optional[ScalingConfig] = None, run_config: Optional[RunConfig] = None,
                 datasets: Optional[dict] = None, dataset_config: Optional[DataConfig] = None,
                 validation_config: Any = None, metadata: Any = None, resume_from_checkpoint: Any = None,
                 label_column: Optional[str] = None, params: Optional[dict] = None,
                 num_boost_round: Optional[int] = None):
        refuse_legacy_arguments("XGBoostTrainer", label_column, params, num_boost_round)
        super().__init__(train_loop_per_worker, train_loop_config=train_loop_config, backend_config=xgboost_config,
                         scaling_config=scaling_config, run_config=run_config, datasets=datasets,
                         dataset_config=dataset_config, validation_config=validation_config, metadata=metadata,
                         resume_from_checkpoint=resume_from_checkpoint)

    @property
    def xgboost_config(self) -> XGBoostConfig:
        """The `XGBoostConfig` (the trainer's `backend_config`)."""
        return self.backend_config

    def _backend(self) -> Backend:
        config = self.xgboost_config
        return XGBoostBackend(timeout_s=float(config.timeout_s), communicator=config.xgboost_communicator)

    @classmethod
    def get_model(cls, checkpoint: Any) -> Any:
        """Removed in Ray: raises its DeprecationWarning. Use `RayTrainReportCallback.get_model`."""
        raise DeprecationWarning("`XGBoostTrainer.get_model` is deprecated. Use "
                                 "`minitrain.xgboost.RayTrainReportCallback.get_model` instead.")
