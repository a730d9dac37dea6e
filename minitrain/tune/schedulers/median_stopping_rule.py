"""Ray's import path `ray.tune.schedulers.median_stopping_rule` (MedianStoppingRule): the same classes as `minitrain.tune.schedulers`."""

from minitrain.tune.schedulers import MedianStoppingRule

__all__ = ["MedianStoppingRule"]
