"""`TensorflowTrainer`: multi-worker TensorFlow on minitrain's workers, with Ray Train v2's signature (L3)."""

from __future__ import annotations

from typing import Any, Callable, Optional

from minitrain.config import DataConfig, RunConfig, ScalingConfig
from minitrain.driver.trainer import DataParallelTrainer
from minitrain.errors import ConfigError
from minitrain.tensorflow.config import TensorflowConfig
from minitrain.worker.backend import Backend
from minitrain.worker.tensorflow_backend import TF_CONFIG, TensorflowBackend


class TensorflowTrainer(DataParallelTrainer):
    """Runs `train_loop_per_worker` on `scaling_config.num_workers` workers with `TF_CONFIG` set for each
    attempt's ranks, so a `tf.distribute.MultiWorkerMirroredStrategy()` built in the function spans
    every worker (TensorFlow's worker r is minitrain's rank r; rank 0 is its chief). Report with
    `minitrain.report` or `minitrain.tensorflow.keras.ReportCheckpointCallback`; feed it with
    `minitrain.get_dataset_shard(name).to_tf(...)`.

    Arguments as Ray Train v2's: `tensorflow_config` is a `TensorflowConfig`; the others are
    `DataParallelTrainer`'s (`metadata` and `resume_from_checkpoint` raise Ray v2's DeprecationWarning).
    `TF_CONFIG` in `RunConfig(worker_runtime_env={"env_vars": ...})` is refused: each attempt sets it.
    """

    _BACKEND_CONFIG = TensorflowConfig
    _BACKEND_FIELD = "tensorflow_config"

    def __init__(self, train_loop_per_worker: Callable, *, train_loop_config: Optional[dict] = None,
                 tensorflow_config: Optional[TensorflowConfig] = None,
                 scaling_config: Optional[ScalingConfig] = None, dataset_config: Optional[DataConfig] = None,
                 run_config: Optional[RunConfig] = None, datasets: Optional[dict] = None,
                 validation_config: Any = None, metadata: Any = None, resume_from_checkpoint: Any = None):
        super().__init__(train_loop_per_worker, train_loop_config=train_loop_config,
                         backend_config=tensorflow_config, scaling_config=scaling_config, run_config=run_config,
                         datasets=datasets, dataset_config=dataset_config, validation_config=validation_config,
                         metadata=metadata, resume_from_checkpoint=resume_from_checkpoint)
        if TF_CONFIG in self.run_config.worker_runtime_env.get("env_vars", {}):
            raise ConfigError(
                f"TensorflowTrainer: RunConfig(worker_runtime_env={{'env_vars': {{'{TF_CONFIG}': ...}}}}) would be "
                f"replaced: every attempt sets {TF_CONFIG} in each worker from that attempt's ranks and addresses. "
                f"Remove {TF_CONFIG} from env_vars.")

    @property
    def tensorflow_config(self) -> TensorflowConfig:
        """The `TensorflowConfig` (the trainer's `backend_config`)."""
        return self.backend_config

    def _backend(self) -> Backend:
        return TensorflowBackend(timeout_s=float(self.tensorflow_config.timeout_s))
