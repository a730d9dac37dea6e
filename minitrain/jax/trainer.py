"""`JaxTrainer`: multi-process JAX (`jax.distributed`) on minitrain's workers, with Ray Train v2's signature (L3)."""

from __future__ import annotations

from typing import Any, Callable, Optional

from minitrain.config import DataConfig, RunConfig, ScalingConfig
from minitrain.driver.trainer import DataParallelTrainer
from minitrain.errors import ConfigError
from minitrain.jax.config import JaxConfig
from minitrain.worker.backend import Backend
from minitrain.worker.jax_backend import JaxBackend


class JaxTrainer(DataParallelTrainer):
    """Runs `train_loop_per_worker` on `scaling_config.num_workers` worker processes with
    `jax.distributed` initialised on every one before the function is called: one JAX process per
    worker, `jax.process_index()` is the worker's rank and `jax.devices()` lists every process's
    devices, so a `jax.jit` over a mesh of them (or `jax.experimental.multihost_utils`) computes across
    the processes. On CPU the processes' collectives run over gloo; with `ScalingConfig(use_gpu=True)`
    each process drives its own GPU(s).

    Arguments as Ray Train v2's: `jax_config` is a `JaxConfig` (None: `JaxConfig(use_gpu=
    scaling_config.use_gpu)`; a given one's `use_gpu` must agree with the scaling config's); the others
    are `DataParallelTrainer`'s. Report and checkpoint with `minitrain.report` as with any trainer.
    """

    _BACKEND_CONFIG = JaxConfig
    _BACKEND_FIELD = "jax_config"

    def __init__(self, train_loop_per_worker: Callable, *, train_loop_config: Optional[dict] = None,
                 jax_config: Optional[JaxConfig] = None, scaling_config: Optional[ScalingConfig] = None,
                 dataset_config: Optional[DataConfig] = None, run_config: Optional[RunConfig] = None,
                 datasets: Optional[dict] = None, validation_config: Any = None):
        super().__init__(train_loop_per_worker, train_loop_config=train_loop_config, backend_config=jax_config,
                         scaling_config=scaling_config, run_config=run_config, datasets=datasets,
                         dataset_config=dataset_config, validation_config=validation_config)
        use_gpu = self.scaling_config.use_gpu
        if jax_config is None:
            self.backend_config = JaxConfig(use_gpu=use_gpu)
        elif jax_config.use_gpu != use_gpu:
            # ScalingConfig places the GPUs; a JaxConfig that disagrees would be silently overruled.
            raise ConfigError(
                f"JaxTrainer(jax_config=JaxConfig(use_gpu={jax_config.use_gpu!r})) disagrees with "
                f"ScalingConfig(use_gpu={use_gpu!r}), which decides whether the workers get GPUs. Set both to "
                "the same value, or leave jax_config=None to follow the scaling config.")

    @property
    def jax_config(self) -> JaxConfig:
        """The `JaxConfig` (the trainer's `backend_config`)."""
        return self.backend_config

    def _backend(self) -> Backend:
        return JaxBackend(timeout_s=float(self.jax_config.timeout_s))
