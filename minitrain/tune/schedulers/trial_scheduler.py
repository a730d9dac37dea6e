"""The scheduler interface (Ray's `ray.tune.schedulers.trial_scheduler`): `TrialScheduler`, `FIFOScheduler`,
the decisions (CONTINUE, STOP, PAUSE, NOOP) and `SchedulerController`, what the sweep loop lets a scheduler
see and do (L3; pure)."""

from __future__ import annotations

from typing import Any, Optional

from minitrain.errors import ConfigError

CONTINUE = "CONTINUE"
STOP = "STOP"
PAUSE = "PAUSE"
NOOP = "NOOP"  # Ray's: the scheduler already acted on the trial (PBT's exploit pauses it itself)


class SchedulerController:
    """What the sweep loop lets a scheduler see and do (Ray's `tune_controller` argument): the loop's
    `_Controller` implements it; while a restored sweep's results are replayed there is none, and a
    scheduler only rebuilds its state. Trials are named by id."""

    experiment_path: str

    def trial_ids(self) -> list:
        """Every trial of the sweep, in creation order."""
        raise NotImplementedError

    def config(self, trial_id: str) -> dict:
        """The trial's config (what it runs with now)."""
        raise NotImplementedError

    def status(self, trial_id: str) -> str:
        """PENDING, RUNNING, PAUSED (its process stopped by a PAUSE), TERMINATED or ERROR."""
        raise NotImplementedError

    def checkpoint(self, trial_id: str) -> Optional[tuple]:
        """The trial's latest checkpoint as (path, training_iteration, result of that iteration), or None."""
        raise NotImplementedError

    def has_waiting_trials(self) -> bool:
        """True when a trial waits to start (PENDING and not running) or is PAUSED."""
        raise NotImplementedError

    def exploit(self, trial_id: str, config: dict, checkpoint: tuple) -> None:
        """Give the trial `config` and, at its next start, the checkpoint `checkpoint` (as `checkpoint()`
        returned it for another trial; copied into this trial's directory); the trial then reports from
        that checkpoint's training_iteration on (as Ray's restore)."""
        raise NotImplementedError

    def unpause(self, trial_id: str) -> None:
        """Let a PAUSED trial start again (from its latest checkpoint) when there is room."""
        raise NotImplementedError

    def stop_paused(self, trial_id: str) -> None:
        """End a PAUSED trial as TERMINATED (its process has already stopped)."""
        raise NotImplementedError


def _check_mode(owner: str, mode: Optional[str]) -> None:
    if mode not in (None, "min", "max"):
        raise ConfigError(f"{owner}(mode={mode!r}): mode must be 'min' or 'max'.")


class TrialScheduler:
    """Base of the schedulers. `metric`/`mode` may be left None and filled from TuneConfig."""

    CONTINUE = CONTINUE
    STOP = STOP
    PAUSE = PAUSE
    NOOP = NOOP
    holds_paused_trials = False  # True: a PAUSEd trial waits for `controller.unpause`; else it is requeued

    def __init__(self, metric: Optional[str] = None, mode: Optional[str] = None):
        _check_mode(type(self).__name__, mode)
        self.metric, self.mode = metric, mode
        self.controller: Optional[SchedulerController] = None

    def set_controller(self, controller: Optional[SchedulerController]) -> None:
        """The sweep loop's view of the trials (None while a restored sweep's results are replayed)."""
        self.controller = controller

    def check_sweep(self, trainable: Any) -> None:
        """Raise ConfigError when this scheduler cannot run a sweep of `trainable` (called by Tuner.fit)."""

    def choose_trial_to_run(self, pending: list) -> Optional[str]:
        """Which of the waiting trial ids (in creation order) starts next; the first by default."""
        return pending[0] if pending else None

    def set_search_properties(self, metric: Optional[str], mode: Optional[str]) -> bool:
        """Take TuneConfig's metric and mode where this scheduler has none; False when they conflict."""
        if (self.metric and metric and self.metric != metric) or (self.mode and mode and self.mode != mode):
            return False
        self.metric = self.metric or metric
        self.mode = self.mode or mode
        return True

    def describe(self) -> str:
        """A short name for the stop reason of a trial this scheduler stopped."""
        return type(self).__name__

    def on_trial_add(self, trial_id: str) -> None:
        """A new trial will start."""

    def on_trial_result(self, trial_id: str, result: dict) -> str:
        """CONTINUE or STOP after `result` (each report, with `training_iteration` etc. filled in)."""
        return CONTINUE

    def on_trial_complete(self, trial_id: str, result: Optional[dict]) -> None:
        """The trial finished (or was stopped); `result` is its last one."""

    def on_trial_remove(self, trial_id: str) -> None:
        """The trial failed and will not report again."""


class FIFOScheduler(TrialScheduler):
    """Runs every trial to its end, in the order they were created (Ray's default)."""
