"""Lightning strategies for a process group that minitrain has already set up.

Each is Lightning's own strategy with two properties replaced: the device is this worker's
(`minitrain.torch.get_device()`, not Lightning's guess from its `devices=` count), and the
distributed sampler shards over the whole run (`num_replicas` = world size, `rank` = world rank).
Lightning finds the process group initialised and joins it; set the backend and timeout with
`TorchConfig`, not on the strategy. Same names and behaviour as `ray.train.lightning`.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.nn import Module

from minitrain.lightning._compat import DDPStrategy, DeepSpeedStrategy, FSDPStrategy
from minitrain.torch import get_device


class _RunPlacement:
    """The two overrides every minitrain strategy shares (put first in the bases)."""

    @property
    def root_device(self) -> torch.device:
        """This worker's device: `minitrain.torch.get_device()`."""
        return get_device()

    @property
    def distributed_sampler_kwargs(self) -> dict[str, Any]:
        """`DistributedSampler` arguments over the whole run: `num_replicas`, `rank`."""
        return {"num_replicas": self.world_size, "rank": self.global_rank}


class RayDDPStrategy(_RunPlacement, DDPStrategy):
    """Lightning's `DDPStrategy` on minitrain's process group and device (see the module docstring).

    Takes `DDPStrategy`'s arguments (e.g. `find_unused_parameters=True`).
    """


class RayFSDPStrategy(_RunPlacement, FSDPStrategy):
    """Lightning's `FSDPStrategy` on minitrain's process group and device (see the module docstring).

    Takes `FSDPStrategy`'s arguments. With `state_dict_type="sharded"`, every rank writes its shard of
    each checkpoint, and `RayTrainReportCallback` uploads all of them into one checkpoint directory.
    Unlike Lightning's own (and Ray's), it also shards on CPU workers over gloo: Lightning passes no
    device to FSDP there, and FSDP then refuses to run without an accelerator.
    """

    def _setup_model(self, model: Module) -> Module:
        if self.root_device.type != "cpu" or _is_fsdp_wrapped(model):
            return super()._setup_model(model)
        from torch.distributed.fsdp import FullyShardedDataParallel

        model = FullyShardedDataParallel(
            module=model, cpu_offload=self.cpu_offload, mixed_precision=self.mixed_precision_config,
            sharding_strategy=self.sharding_strategy, device_id=torch.device("cpu"), **self.kwargs)
        # Lightning's own set-up of an already wrapped model (metrics, activation checkpointing) would
        # warn that the auto-wrap policy it finds is ignored: it was applied just above.
        kwargs = self.kwargs
        self.kwargs = {key: value for key, value in kwargs.items() if key != "auto_wrap_policy"}
        try:
            return super()._setup_model(model)
        finally:
            self.kwargs = kwargs


class RayDeepSpeedStrategy(_RunPlacement, DeepSpeedStrategy):
    """Lightning's `DeepSpeedStrategy` on minitrain's process group and device (see the module
    docstring). Takes `DeepSpeedStrategy`'s arguments; needs `deepspeed` installed.

    Unlike Lightning's own (and Ray's), it also runs on CPU workers over gloo, with DeepSpeed's CPU
    accelerator: Lightning refuses every accelerator but CUDA, though DeepSpeed itself trains on CPU.
    There DeepSpeed must have picked its CPU accelerator (it does when no GPU is visible; set
    `DS_ACCELERATOR=cpu` to force it), else `RuntimeError` says so.
    """

    @property
    def root_device(self) -> torch.device:
        """This worker's device; on CPU `cpu:<local rank>`, because Lightning hands DeepSpeed
        `device_rank=root_device.index` and DeepSpeed reads it as this process's rank (a bare CPU device
        has no index). Tensors moved to `cpu:N` land on the CPU as usual."""
        device = get_device()
        return torch.device("cpu", self.local_rank) if device.type == "cpu" else device

    def setup_environment(self) -> None:
        if self.root_device.type != "cpu":
            return super().setup_environment()
        from deepspeed.accelerator import get_accelerator

        chosen = get_accelerator().device_name()
        if chosen != "cpu":
            raise RuntimeError(f"RayDeepSpeedStrategy on a CPU worker, but DeepSpeed chose its {chosen!r} "
                               "accelerator: set DS_ACCELERATOR=cpu in the environment of the run "
                               "(or use_gpu=True in the ScalingConfig).")
        # Lightning's DeepSpeedStrategy.setup_environment is only its CUDA check, then DDPStrategy's.
        return super(DeepSpeedStrategy, self).setup_environment()

    def setup_distributed(self) -> None:
        if self.root_device.type != "cpu":
            return super().setup_distributed()
        # Lightning's, less its check that the devices' CUDA indices are 0..n-1 (CPU devices have none).
        from lightning.fabric.utilities.seed import reset_seed

        reset_seed()
        self.set_world_ranks()
        self._init_deepspeed_distributed()
        return None


def _is_fsdp_wrapped(model: Module) -> bool:
    from torch.distributed.fsdp import FullyShardedDataParallel

    return any(isinstance(module, FullyShardedDataParallel) for module in model.modules())


MinitrainDDPStrategy = RayDDPStrategy
MinitrainFSDPStrategy = RayFSDPStrategy
MinitrainDeepSpeedStrategy = RayDeepSpeedStrategy

SUPPORTED_STRATEGIES = (RayDDPStrategy, RayFSDPStrategy, RayDeepSpeedStrategy)
