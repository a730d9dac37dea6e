"""`LightGBMTrainer`: data-parallel LightGBM on minitrain's workers, with Ray Train v2's signature (L3)."""

from __future__ import annotations

from typing import Any, Callable, Optional

from minitrain._gbdt import refuse_legacy_arguments
from minitrain.config import DataConfig, RunConfig, ScalingConfig
from minitrain.driver.trainer import DataParallelTrainer
from minitrain.lightgbm.config import LightGBMConfig
from minitrain.worker.backend import Backend
from minitrain.worker.lightgbm_backend import LightGBMBackend


class LightGBMTrainer(DataParallelTrainer):
    """Runs `train_loop_per_worker` on `scaling_config.num_workers` workers whose LightGBM network is
    agreed for each attempt: pass `minitrain.lightgbm.get_network_params()` in the params of
    `lightgbm.train(...)` and it trains one model data-parallel over every rank's shard. Report with
    `minitrain.lightgbm.RayTrainReportCallback` (rank 0 checkpoints `model.txt`).

    Arguments as Ray's: `lightgbm_config` is a `LightGBMConfig`; the others are `DataParallelTrainer`'s
    (`metadata` and `resume_from_checkpoint` raise Ray v2's DeprecationWarning). Ray's legacy arguments
    `label_column`, `params` and `num_boost_round` raise its DeprecationWarning.
    """

    _BACKEND_CONFIG = LightGBMConfig
    _BACKEND_FIELD = "lightgbm_config"

    def __init__(self, train_loop_per_worker: Optional[Callable] = None, *,
                 train_loop_config: Optional[dict] = None, lightgbm_config: Optional[LightGBMConfig] = None,
                 scaling_config: Optional[ScalingConfig] = None, run_config: Optional[RunConfig] = None,
                 datasets: Optional[dict] = None, dataset_config: Optional[DataConfig] = None,
                 metadata: Any = None, resume_from_checkpoint: Any = None,
                 label_column: Optional[str] = None, params: Optional[dict] = None,
                 num_boost_round: Optional[int] = None):
        refuse_legacy_arguments("LightGBMTrainer", label_column, params, num_boost_round)
        super().__init__(train_loop_per_worker, train_loop_config=train_loop_config, backend_config=lightgbm_config,
                         scaling_config=scaling_config, run_config=run_config, datasets=datasets,
                         dataset_config=dataset_config, metadata=metadata,
                         resume_from_checkpoint=resume_from_checkpoint)

    @property
    def lightgbm_config(self) -> LightGBMConfig:
        """The `LightGBMConfig` (the trainer's `backend_config`)."""
        return self.backend_config

    def _backend(self) -> Backend:
        return LightGBMBackend(timeout_s=float(self.lightgbm_config.timeout_s))

    @classmethod
    def get_model(cls, checkpoint: Any) -> Any:
        """Removed in Ray: raises its DeprecationWarning. Use `RayTrainReportCallback.get_model`."""
        raise DeprecationWarning("`LightGBMTrainer.get_model` is deprecated. Use "
                                 "`minitrain.lightgbm.RayTrainReportCallback.get_model` instead.")
