"""`minitrain.jax`: Ray Train's `ray.train.v2.jax` without Ray (multi-process JAX on CPU and GPU hosts).

Port a Ray Train JAX script by changing its imports:

    from minitrain.jax import JaxTrainer

    def train_func(config):
        import jax
        mesh = jax.make_mesh((jax.device_count(),), ("data",))  # every process's devices
        ...  # jax.jit over the mesh; minitrain.report(metrics, checkpoint=...)

    JaxTrainer(train_func, scaling_config=minitrain.ScalingConfig(num_workers=2)).fit()

Every attempt initialises `jax.distributed` in every worker before the function runs, with the
coordinator on rank 0 (`minitrain.worker.jax_backend`), so `jax.process_index()` is the rank. TPUs are
refused (`JaxConfig(use_tpu=True)`, `ScalingConfig(use_tpu=True)`). Names load lazily and import no
jax: the driver builds a trainer without it. Install with `pip install 'minitrain[jax]'`.
"""

from __future__ import annotations

from minitrain._lazy import lazy_exports

_LAZY = {
    "JaxTrainer": "minitrain.jax.trainer",
    "JaxConfig": "minitrain.jax.config",
}

__all__ = sorted(_LAZY)


__getattr__, __dir__ = lazy_exports("minitrain.jax", _LAZY, __all__)
