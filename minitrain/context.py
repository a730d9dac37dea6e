"""`TrainContext`: what a training function can ask about its place in the run (L0).

Mirrors `ray.train.get_context()`: the same getter names and meanings. A context is immutable for the
life of one attempt; a restart builds a new one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class TrainContext:
    """This worker's rank and world, as returned by `minitrain.get_context()`.

    `device_indices` are this worker's GPUs as indices into its `CUDA_VISIBLE_DEVICES` (empty on CPU
    workers); `minitrain.torch.get_devices()` turns them into `cuda:<i>` devices.
    """

    experiment_name: str
    world_size: int = 1
    world_rank: int = 0
    local_rank: int = 0
    local_world_size: int = 1
    node_rank: int = 0
    device_indices: tuple[int, ...] = ()
    storage_path: str = ""
    local_mode: bool = False
    storage: Any = field(default=None, repr=False, compare=False)  # a minitrain.worker.session.StorageContext

    def get_experiment_name(self) -> str:
        """`RunConfig.name` of this run."""
        return self.experiment_name

    def get_world_size(self) -> int:
        """Number of workers in the current attempt."""
        return self.world_size

    def get_world_rank(self) -> int:
        """This worker's rank, 0..world_size-1, ordered by node then local rank."""
        return self.world_rank

    def get_local_rank(self) -> int:
        """This worker's index among the workers of its node."""
        return self.local_rank

    def get_local_world_size(self) -> int:
        """Number of workers on this worker's node."""
        return self.local_world_size

    def get_node_rank(self) -> int:
        """Index of this worker's node among the run's nodes, in rank order."""
        return self.node_rank

    def get_storage(self) -> Any:
        """The run's `minitrain.worker.session.StorageContext` (Ray's `get_context().get_storage()`): where a `NO_UPLOAD` writer
        or a `checkpoint_upload_fn` puts a checkpoint directory. RuntimeError in local mode
        (`num_workers=0`), where there is no run directory, as in Ray's local mode."""
        if self.storage is None:
            raise RuntimeError("minitrain.get_context().get_storage() is not available in local mode "
                               "(ScalingConfig(num_workers=0)): there is no run directory. Report "
                               "checkpoints with the default SYNC upload mode there.")
        return self.storage

    def get_metadata(self):
        """Removed in Ray Train v2; raises `DeprecationWarning` as Ray does."""
        raise DeprecationWarning(_TRIAL_GETTER_MESSAGE.format(name="get_metadata"))

    def get_trial_name(self):
        """Removed in Ray Train v2; raises `DeprecationWarning` as Ray does."""
        raise DeprecationWarning(_TRIAL_GETTER_MESSAGE.format(name="get_trial_name"))

    def get_trial_id(self):
        """Removed in Ray Train v2; raises `DeprecationWarning` as Ray does."""
        raise DeprecationWarning(_TRIAL_GETTER_MESSAGE.format(name="get_trial_id"))

    def get_trial_resources(self):
        """Removed in Ray Train v2; raises `DeprecationWarning` as Ray does."""
        raise DeprecationWarning(_TRIAL_GETTER_MESSAGE.format(name="get_trial_resources"))

    def get_trial_dir(self):
        """Removed in Ray Train v2; raises `DeprecationWarning` as Ray does."""
        raise DeprecationWarning(_TRIAL_GETTER_MESSAGE.format(name="get_trial_dir"))


_TRIAL_GETTER_MESSAGE = (
    "TrainContext.{name}() belongs to Ray Tune trials and was removed from Ray Train v2, which minitrain "
    "mirrors. Pass what you need through train_loop_config instead."
)

