"""`RayLightningEnvironment`: Lightning's view of the cluster, read from the minitrain run."""

from __future__ import annotations

import minitrain
from minitrain.lightning._compat import LightningEnvironment


class RayLightningEnvironment(LightningEnvironment):
    """The cluster environment for a Lightning `Trainer` inside a minitrain training function.

    `world_size()`, `global_rank()`, `local_rank()` and `node_rank()` come from
    `minitrain.get_context()`; `set_world_size`, `set_global_rank` and `teardown` do nothing, so
    Lightning neither recomputes the ranks from its device count nor deletes `WORLD_SIZE` from the
    environment. Processes are always created externally (by minitrain), so Lightning never launches
    any; the process group already exists, so Lightning does not initialise one.
    `main_address`/`main_port` are the run's `MASTER_ADDR`/`MASTER_PORT`.
    Same name and behaviour as `ray.train.lightning.RayLightningEnvironment`.
    """

    @property
    def creates_processes_externally(self) -> bool:
        """Always True: minitrain started every rank."""
        return True

    def world_size(self) -> int:
        """Number of workers in the run (`get_context().get_world_size()`)."""
        return minitrain.get_context().get_world_size()

    def global_rank(self) -> int:
        """This worker's rank (`get_context().get_world_rank()`)."""
        return minitrain.get_context().get_world_rank()

    def local_rank(self) -> int:
        """This worker's rank on its node (`get_context().get_local_rank()`)."""
        return minitrain.get_context().get_local_rank()

    def node_rank(self) -> int:
        """This worker's node index (`get_context().get_node_rank()`)."""
        return minitrain.get_context().get_node_rank()

    def set_world_size(self, size: int) -> None:
        """Ignored: the world size is the run's."""

    def set_global_rank(self, rank: int) -> None:
        """Ignored: the rank is the run's."""

    def teardown(self) -> None:
        """Nothing to undo (Lightning's default would delete `WORLD_SIZE` from the environment)."""


MinitrainLightningEnvironment = RayLightningEnvironment
