"""Ray's import path `ray.tune.schedulers.trial_scheduler` (TrialScheduler, FIFOScheduler): the same classes as `minitrain.tune.schedulers`."""

from minitrain.tune.schedulers import TrialScheduler, FIFOScheduler

__all__ = ["TrialScheduler", "FIFOScheduler"]
