"""Inside a trial: `tune.report`, `tune.get_checkpoint`, `tune.get_context` (L3).

Each trial runs in its own process (minitrain.tune.trial_process). Its `TrialSession` sends every
result to the tuner over a pipe and waits for the scheduler's answer: CONTINUE, or STOP, which ends
the trial early. A function trainable calling `tune.report` sees STOP as `TrialStopped` raised from
`report` (a BaseException, so `except Exception` in user code does not swallow it). A `fit()` running
in the trial is stopped the way Ctrl-C stops it: its workers get the grace period, its committed
checkpoints stay.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
from dataclasses import dataclass
from typing import Any, Optional, Sequence

from minitrain.checkpoint import Checkpoint
from minitrain.metrics import encode_metrics
from minitrain.monitoring.diagnoses import startup_phase
from minitrain.tune import messages
from minitrain.tune.messages import Decision, TrialMessage, TrialReported, TrialStarting


class TrialStopped(BaseException):
    """Raised by `tune.report` in a trial the scheduler stopped; the trial ends as TERMINATED."""


@dataclass(frozen=True)
class TuneContext:
    """What a trial knows about itself (Ray's `ray.tune.get_context()`); outside a trial every id,
    name and path is None (as Ray's) and the resources are empty."""

    trial_id: Optional[str] = None
    trial_name: Optional[str] = None
    trial_dir: Optional[str] = None
    experiment_name: Optional[str] = None
    experiment_path: Optional[str] = None
    trial_resources: Optional[dict] = None

    def get_trial_id(self) -> str:
        """The trial's id, e.g. '3f2a1_00004' (stable across retries and restores)."""
        return self.trial_id

    def get_trial_name(self) -> str:
        """The trial's name (TuneConfig.trial_name_creator, else '<trainable>_<trial_id>')."""
        return self.trial_name

    def get_trial_dir(self) -> str:
        """The trial's directory `<storage_path>/<name>/<trial dirname>/`."""
        return self.trial_dir

    def get_experiment_name(self) -> str:
        """The tuning run's name (RunConfig.name)."""
        return self.experiment_name

    def get_trial_resources(self) -> dict:
        """What the trial reserved: {'CPU': n, 'GPU': m} ({} outside a trial)."""
        return dict(self.trial_resources or {})


class TrialSession:
    """The running trial's link to the tuner: `report` sends a result and returns the decision. It is
    also the process's `minitrain._session.TrialLink`: each fit() in the trial gets a `run_observer()`."""

    def __init__(self, context: TuneContext, channel_out: Any, channel_in: Any,
                 checkpoint: Optional[str], iteration: int):
        self.context = context
        self._out, self._in = channel_out, channel_in
        self._lock = threading.Lock()
        self._checkpoint = checkpoint
        self._iteration = iteration  # reports so far, over the trial's life (restores included)
        self.stop_requested = False

    def send(self, message: TrialMessage) -> None:
        """One message to the tuner (a line of the report pipe, see minitrain.tune.messages)."""
        line = messages.encode(message)
        with self._lock:
            self._out.write(line)
            self._out.flush()

    def report(self, metrics: dict, checkpoint_path: Optional[str]) -> Decision:
        """Send one result; returns the tuner's decision (STOP also when the tuner is gone: a trial
        never outlives its sweep)."""
        line = messages.encode(TrialReported(metrics, checkpoint_path))
        with self._lock:
            self._iteration += 1
            if checkpoint_path:
                self._checkpoint = checkpoint_path
            try:
                self._out.write(line)
                self._out.flush()
                decision = messages.decode_decision(self._in.readline())
            except (BrokenPipeError, OSError, ValueError):
                decision = Decision.STOP
        if decision is Decision.STOP:
            self.stop_requested = True
        return decision

    def run_observer(self, callbacks: Sequence[Any] = ()) -> "ForwardingObserver":
        """A new observer for one fit() run in this trial (the `minitrain._session.TrialLink` seam);
        `callbacks` are that fit()'s RunConfig.callbacks: a `TuneReportCallback` among them adds
        `checkpoint_path` to the forwarded metrics, as Ray's does."""
        from minitrain.tune.integration.ray_train import TuneReportCallback

        return ForwardingObserver(self, checkpoint_path=any(isinstance(c, TuneReportCallback) for c in callbacks))

    @property
    def iteration(self) -> int:
        """The number of results this trial has reported (across its restarts)."""
        return self._iteration

    def latest_checkpoint(self) -> Optional[Checkpoint]:
        """The trial's latest checkpoint (what `tune.get_checkpoint()` returns), or None."""
        return Checkpoint(self._checkpoint) if self._checkpoint else None


_current: Optional[TrialSession] = None


def set_session(session: Optional[TrialSession]) -> None:
    """Make `session` the trial of this process (the trial process does it once)."""
    global _current
    _current = session


def _session(function: str) -> TrialSession:
    if _current is None:
        raise RuntimeError(f"tune.{function}() can only be called inside a trial of minitrain.tune.Tuner (the "
                           "function you pass to Tuner). Inside TorchTrainer workers use minitrain.report().")
    return _current


def report(metrics: dict, *, checkpoint: Optional[Checkpoint] = None, checkpoint_dir_name: Optional[str] = None) -> None:
    """Report one result of the trial (Ray's `ray.tune.report`). A `checkpoint` is copied into the
    trial directory as `checkpoint_<iteration>` (or `checkpoint_dir_name`) before the tuner hears of
    it. Raises `TrialStopped` when the scheduler stops the trial."""
    session = _session("report")
    if not isinstance(metrics, dict):
        raise TypeError(f"tune.report(metrics=...) must be a dict, got {type(metrics).__name__}.")
    encoded = json.loads(encode_metrics(metrics))  # ValueError naming a value that is not JSON-safe
    saved = None
    if checkpoint is not None:
        if not isinstance(checkpoint, Checkpoint):
            raise TypeError(f"tune.report(checkpoint=...) must be a minitrain.Checkpoint, got "
                            f"{type(checkpoint).__name__}.")
        name = checkpoint_dir_name or f"checkpoint_{session.iteration:06d}"
        saved = os.path.join(session.context.trial_dir, name)
        if os.path.exists(saved):
            shutil.rmtree(saved)
        checkpoint.to_directory(saved)
    if session.report(encoded, saved) is Decision.STOP:
        raise TrialStopped(f"trial {session.context.trial_id} was stopped by the scheduler")


def get_checkpoint() -> Optional[Checkpoint]:
    """The trial's latest checkpoint (after a retry or `Tuner.restore`), or None."""
    return _session("get_checkpoint").latest_checkpoint()


def get_context() -> TuneContext:
    """The running trial's `TuneContext`; outside a trial one whose ids are None (as Ray's)."""
    return _current.context if _current is not None else TuneContext()


class ForwardingObserver:
    """Forwards each report round of a `fit()` run in this trial to the tuner, rank 0's metrics and the
    committed checkpoint (what Ray's TuneReportCallback forwards; with `checkpoint_path`, the metrics also
    name the checkpoint's directory under Ray's key); a STOP answer stops the fit() as Ctrl-C would.
    Until the first round it also forwards each change of the fit()'s start-up phase (`TrialStarting`)."""

    def __init__(self, session: TrialSession, checkpoint_path: bool = False):
        self._session = session
        self._checkpoint_path = checkpoint_path
        self._run_path = ""
        # Start-up, until the first round: the run's state, its ranks' phases, the phase last sent.
        self._starting = True
        self._state = ""
        self._rank_phases: dict[int, str] = {}
        self._attempt = -1
        self._sent_phase = ""

    def on_run_start(self, run: Any) -> None:
        self._run_path = str(run.run_path).removeprefix("file://")

    def on_state(self, previous: Any, next_state: Any, reason: str, attempt: int) -> None:
        self._state = getattr(next_state, "name", str(next_state))
        self._forward_phase()

    def on_attempt_start(self, attempt: Any) -> None:
        self._attempt = attempt.attempt
        self._rank_phases = {rank: "" for rank in range(attempt.world_size)}
        self._forward_phase()

    def on_worker_phase(self, attempt: int, rank: int, phase: str) -> None:
        if attempt == self._attempt:
            self._rank_phases[rank] = phase
            self._forward_phase()

    def _forward_phase(self) -> None:
        """Tell the tuner what the fit() is doing while it starts (each change once), for the
        "starting for ..." cell; from the first round on, the results say it."""
        if not self._starting:
            return
        phase, _ = startup_phase(self._state, list(self._rank_phases.values()))
        if phase != self._sent_phase:
            self._sent_phase = phase
            try:
                self._session.send(TrialStarting(phase))
            except (BrokenPipeError, OSError, ValueError):
                pass  # the tuner is gone: the next report finds out and stops the trial

    def on_round(self, round_: Any) -> None:
        self._starting = False
        metrics = round_.metrics_by_rank[0] if round_.metrics_by_rank else None
        if metrics is None:
            return
        checkpoint = None
        if round_.checkpoint is not None:
            checkpoint = f"{self._run_path.rstrip('/')}/{round_.checkpoint.dir_name}"
            if self._checkpoint_path:
                metrics = {**metrics, "checkpoint_path": checkpoint}  # Ray's CHECKPOINT_PATH_KEY
        if self._session.report(metrics, checkpoint) is Decision.STOP:
            # Ctrl-C's path: the controller notes the signal and stops the workers with their grace period.
            os.kill(os.getpid(), signal.SIGINT)
