"""Tune callbacks (`tune.Callback`, Ray's `ray.tune.Callback`): hooks the sweep loop calls (L3).

Pass them as `tune.RunConfig(callbacks=[...])`. The sweep loop (minitrain.tune.sweep_loop) calls each
hook on the tuner's thread, in Ray's order: `setup` once before any trial starts; per loop step
`on_step_begin` ... `on_step_end`; per trial `on_trial_start` (each time its process starts) and
`on_trial_restore` (right after, when that start resumes from a checkpoint); for a result that carries a
checkpoint `on_checkpoint` then `on_trial_save`, then `on_trial_result`; at its end `on_trial_complete`
(TERMINATED) or `on_trial_error` (ERROR), and `on_trial_recover` for each failure that is retried;
`on_experiment_end` once when the sweep ends (also when it ends on Ctrl-C or an error).

`iteration` is the loop's step count, `trials` the sweep's trials and `trial` one of them: minitrain's
`sweep_state.Trial` records (`trial_id`, `config`, `status`, `last_result`, `checkpoint`, `name`, ...),
not Ray's `Trial` objects, since trials run as processes of their own and the loop keeps only records.
An exception raised by a hook ends the sweep as in Ray: the running trials are stopped, the state file
is written (`Tuner.restore` goes on from it), and `Tuner.fit()` raises that exception.
"""

from __future__ import annotations

import logging
from typing import Any, Optional, Sequence

from minitrain.errors import ConfigError

logger = logging.getLogger("minitrain")


class Callback:
    """Base class of a Tune callback: override the hooks you need (each takes `**info` for forward
    compatibility, as Ray's). Every hook is a no-op here."""

    def setup(self, stop: Any = None, num_samples: Optional[int] = None, total_num_samples: Optional[int] = None,
              **info: Any) -> None:
        """Called once before the first trial starts: `stop` is RunConfig.stop as a Stopper (with
        time_budget_s, combined with a TimeoutStopper as Ray's), `num_samples` TuneConfig's,
        `total_num_samples` the trials the sweep creates in all (grid entries counted)."""

    def on_step_begin(self, iteration: int, trials: list, **info: Any) -> None:
        """Called at the start of each step of the tuning loop (`iteration` counts the steps)."""

    def on_step_end(self, iteration: int, trials: list, **info: Any) -> None:
        """Called at the end of each step of the tuning loop."""

    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        """Called after a trial's process started (also each time a paused or failed trial starts again)."""

    def on_trial_restore(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        """Called after a trial started from a checkpoint (its trainable reads it with tune.get_checkpoint())."""

    def on_trial_save(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        """Called after a trial reported a checkpoint (after `on_checkpoint`)."""

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
        """Called after a trial reported a result (after the scheduler and searcher saw it); `result`
        is a copy with Tune's auto-filled fields (training_iteration, time_total_s, trial_id, ...)."""

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        """Called after a trial ended TERMINATED (finished, or stopped by a scheduler or stopper)."""

    def on_trial_recover(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        """Called after a trial failed and will be retried (FailureConfig.max_failures)."""

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        """Called after a trial failed for good (it ends ERROR; `trial.error` says why)."""

    def on_checkpoint(self, iteration: int, trials: list, trial: Any, checkpoint: Any, **info: Any) -> None:
        """Called after a trial saved a checkpoint: `checkpoint` is a `minitrain.Checkpoint`."""

    def on_experiment_end(self, trials: list, **info: Any) -> None:
        """Called once after the sweep ended and every trial concluded (or was stopped)."""

    def get_state(self) -> Optional[dict]:
        """The callback's state (Ray's stateful-callback hook). minitrain does not save it with the sweep:
        a restored sweep's callbacks start afresh."""
        return None

    def set_state(self, state: dict) -> None:
        """Set the state `get_state` returned (not called by minitrain, see `get_state`)."""


def check_callbacks(callbacks: Any, where: str = "tune.RunConfig(callbacks=...)") -> list:
    """`callbacks` as a list of `Callback`s; ConfigError naming the field and the entry otherwise
    (a list or tuple of tune.Callback instances, or None)."""
    if callbacks is None:
        return []
    if not isinstance(callbacks, (list, tuple)):
        raise ConfigError(f"{where} must be a list of minitrain.tune.Callback, got {type(callbacks).__name__}.")
    for index, callback in enumerate(callbacks):
        if not isinstance(callback, Callback):
            hint = " (it is a class: pass an instance)" if isinstance(callback, type) else ""
            raise ConfigError(f"{where}: entry {index} ({callback!r}) is not a minitrain.tune.Callback{hint}. "
                              "Subclass tune.Callback and override the hooks you need; minitrain.Callback (Train's) "
                              "goes in a TorchTrainer's own RunConfig.")
    return list(callbacks)


class CallbackList:
    """Calls one hook on every callback, in the order given; an exception propagates at once (Ray's)."""

    def __init__(self, callbacks: Sequence[Callback] = ()):
        self.callbacks = list(callbacks)

    def __bool__(self) -> bool:
        return bool(self.callbacks)

    def call(self, hook: str, **kwargs: Any) -> None:
        """`hook(**kwargs)` on each callback."""
        for callback in self.callbacks:
            getattr(callback, hook)(**kwargs)
