"""`prepare_trainer`: check that a Lightning `Trainer` is set up to run inside minitrain."""

from __future__ import annotations

from minitrain.lightning._compat import pl
from minitrain.lightning.environment import RayLightningEnvironment
from minitrain.lightning.strategies import SUPPORTED_STRATEGIES


def prepare_trainer(trainer: "pl.Trainer") -> "pl.Trainer":
    """Return `trainer` unchanged after checking it, as `ray.train.lightning.prepare_trainer` does.

    Raises `RuntimeError` when its strategy is not one of `RayDDPStrategy`, `RayFSDPStrategy`,
    `RayDeepSpeedStrategy`, or when the strategy's cluster environment is not a
    `RayLightningEnvironment` (pass `plugins=[RayLightningEnvironment()]` to the Trainer).
    """
    strategy = trainer.strategy
    if not isinstance(strategy, SUPPORTED_STRATEGIES):
        raise RuntimeError(
            f"The Lightning Trainer's strategy is {type(strategy).__name__}; inside minitrain it must be "
            "one of RayDDPStrategy, RayFSDPStrategy or RayDeepSpeedStrategy (from minitrain.lightning), "
            "e.g. pl.Trainer(strategy=RayDDPStrategy(), plugins=[RayLightningEnvironment()], ...)."
        )
    environment = getattr(strategy, "cluster_environment", None)
    if environment is not None and not isinstance(environment, RayLightningEnvironment):
        raise RuntimeError(
            f"The Lightning Trainer's cluster environment is {type(environment).__name__}; inside minitrain "
            "it must be a RayLightningEnvironment: pass plugins=[RayLightningEnvironment()] to pl.Trainer."
        )
    return trainer
