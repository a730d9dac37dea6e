"""Ray's import path `ray.tune.schedulers.async_hyperband` (AsyncHyperBandScheduler, ASHAScheduler): the same classes as `minitrain.tune.schedulers`."""

from minitrain.tune.schedulers import AsyncHyperBandScheduler, ASHAScheduler

__all__ = ["AsyncHyperBandScheduler", "ASHAScheduler"]
