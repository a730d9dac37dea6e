"""The sweep loop: start trials while the hosts have room, route their results, end them (L3).

One loop on the caller's thread. Each trial is a process (minitrain.tune.trial_process); a reader
thread per trial turns its report pipe into events on one queue, and the loop is the only code that
changes a trial. A trial starts only once `ClusterRoom` reserved hosts for it (the rest queue); its
process is handed those hosts alone, and they are released when it ends. Each result goes to the
scheduler (CONTINUE/STOP, answered to the waiting trial) and the searcher; the state file is replaced
after every change, so a killed tuner resumes from it. What the sweep is (`SweepSpec`) is fixed
before the loop starts; the loop owns only what changes: the trials, the running processes, why it
stops. Its messages with the trial processes are records of minitrain.tune.messages.

A scheduler's PAUSE stops the trial's process after that result (a trial is a process: pausing ends
it, at its latest checkpoint); the trial keeps its id and starts again, from that checkpoint, once the
scheduler lets it (`_Controller.unpause`; at once for schedulers that do not hold paused trials, after
the trials that wait). PBT's exploit hands the trial another trial's checkpoint and a new config before
it starts again. The loop calls the sweep's `tune.Callback`s (minitrain.tune.callback) at Ray's points.
`_spawn` is the one place a trial process is started (tests drive the loop with in-process fakes).
"""

from __future__ import annotations

import logging
import os
import queue
import shutil
import signal
import struct
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

import cloudpickle

from minitrain import knobs
from minitrain.checkpoint import Checkpoint
from minitrain.dashboard.settings import ENV_VAR as DASHBOARD_ENV
from minitrain.dashboard.sweep import trials_address_value
from minitrain.errors import ConfigError
from minitrain.hosts.cluster import HOSTFILE_ENV_VAR, HOSTS_ENV_VAR
from minitrain.procs import decode_returncode
from minitrain.storage import sweep_state as tr
from minitrain.storage.filesystem import StorageError
from minitrain.storage.retention import CheckpointRecord, retain
from minitrain.tune import messages, restore_spec
from minitrain.tune.messages import (Decision, TrialFailed, TrialFinished, TrialInterrupted, TrialMessage,
                                     TrialReported, TrialStarting)
from minitrain.tune.placement import Demand
from minitrain.tune.resources import ClusterRoom, Reservation
from minitrain.tune.callback import CallbackList
from minitrain.tune.schedulers import NOOP, PAUSE, STOP, AsyncHyperBandScheduler, SchedulerController, TrialScheduler
from minitrain.tune.search import Searcher
from minitrain.tune.session import TuneContext
from minitrain.tune.stopper import CombinedStopper, MissingStopKey, NoopStopper, Stopper, TimeoutStopper
from minitrain.tune.trial_process import TrialPayload

logger = logging.getLogger("minitrain")

INTERRUPT_WAIT_S = 60.0  # how long Ctrl-C waits for the trials' fit()s to stop their workers
EXIT_WAIT_S = 30.0
MAX_PENDING_TRIALS = 16  # trials created ahead of room for a scheduler that pauses trials (Ray's pending trials)  # a trial process that closed its pipe exits within this


class _PipeClosed:
    """The loop's own event after a trial's last message: its report pipe reached EOF (the process
    exits now, or did). Never on the wire."""


_PIPE_CLOSED = _PipeClosed()


class _Running:
    """A trial process and what the loop has heard from it."""

    def __init__(self, trial: tr.Trial, proc: subprocess.Popen, reservation: Reservation):
        self.trial, self.proc, self.reservation = trial, proc, reservation
        self.ended: Optional[TrialMessage] = None  # the last message: TrialFinished, TrialFailed or TrialInterrupted
        self.last_report = time.monotonic()
        self.stop_sent = False
        self.since_restore = 0
        self.forced_error: Optional[tr.TrialError] = None  # the loop failed the trial (a `stop` key it lacks)
        self.budget_stopped = False  # interrupted because time_budget_s was spent: it ends TERMINATED
        self.pausing = False  # answered STOP for a scheduler's PAUSE (or PBT's exploit): it starts again later

    def answer(self, decision: Decision) -> None:
        try:
            self.proc.stdin.write(messages.encode_decision(decision))
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            pass  # the trial is gone; its end arrives as an event


@dataclass(frozen=True)
class SweepLimits:
    """How far a sweep goes: trials in all, at once, retries of each, and its time."""

    max_concurrent: int = 0  # trials running at once (TuneConfig.max_concurrent_trials); 0: as the hosts allow
    max_failures: int = 0  # retries of a failing trial (FailureConfig.max_failures); -1: forever
    time_budget_s: Optional[float] = None  # then no trial starts and running ones are stopped (TuneConfig's)
    fail_fast: Any = False  # FailureConfig.fail_fast: the first trial in ERROR ends the sweep (True, "raise")


@dataclass(frozen=True)
class Retention:
    """Which checkpoints a function trial keeps (tune.CheckpointConfig): the best `num_to_keep` by
    `attribute` in `order` (None: the most recent), and always the latest."""

    num_to_keep: Optional[int] = None  # None: every checkpoint
    attribute: Optional[str] = None
    order: str = "max"


@dataclass(frozen=True)
class SweepSpec:
    """What a sweep is, fixed for its whole run; `Tuner.fit()` builds it once (a restore from the
    state file's header), `SweepLoop` only reads it."""

    experiment_path: str  # <storage_path>/<name>: the state file, the .tune/ files, the trials' directories
    experiment_name: str  # RunConfig.name, what TuneContext.experiment_name says
    header: dict  # the state file's header (name, trainable, metric, mode, id_prefix, total_trials, ...)
    trainable: Any  # what each trial runs (pickled into its payload)
    trial_resources: dict  # what one trial reserves in all: {'CPU': n, 'GPU': m} (TuneContext's)
    demand: Demand  # how one trial's resources spread over hosts (what ClusterRoom reserves)
    name_trial: Callable[[tr.Trial], None]  # sets a new trial's name and dirname (TuneConfig's creators)
    pythonpath: tuple[str, ...]  # the trial processes' PYTHONPATH: the driver's (so the trainable unpickles)
    limits: SweepLimits = SweepLimits()
    retention: Retention = Retention()  # applied to checkpoints that `tune.report` saved in the trial directory

    @property
    def total_trials(self) -> int:
        """How many trials the sweep creates in all (the searcher's count, kept in the header)."""
        return self.header["total_trials"]

    @property
    def id_prefix(self) -> str:
        """The sweep's random prefix of trial ids (kept in the header, so a restore goes on with it)."""
        return self.header["id_prefix"]


class SweepLoop:
    """Runs a sweep to its end (or raises KeyboardInterrupt after stopping the trials): `spec` says
    what the sweep is; `room` reserves hosts, `searcher` suggests configs, `scheduler` decides on
    results, `stopper` (RunConfig.stop) may stop a trial or the sweep after each result, `reporter`
    shows the trial table; `trials` (those of a restored sweep, else empty) grows as trials are created
    and is what the state file holds. After `run()`, `fail_fast_error` is the error that ended the
    sweep under `fail_fast` (else None), and `raised` each failed trial's exception as it pickled it."""

    def __init__(self, spec: SweepSpec, trials: list[tr.Trial], *, room: ClusterRoom, searcher: Searcher,
                 scheduler: TrialScheduler, reporter: Any, stopper: Optional[Stopper] = None,
                 callbacks: Optional[CallbackList] = None):
        self.spec = spec
        self.callbacks = callbacks if callbacks is not None else CallbackList()
        self.step = 0  # the loop's steps, Ray's `iteration` argument of the callbacks
        self.paused: set[str] = set()  # held by the scheduler until it unpauses them (not started meanwhile)
        self.requeued: list[str] = []  # paused and free to start again: they start after the trials that wait
        self.stop_paused: set[str] = set()  # paused trials the scheduler stopped while their process still ran
        self.exploited: set[str] = set()  # trials that start again from another trial's checkpoint (PBT)
        self.room, self.searcher, self.scheduler, self.reporter = room, searcher, scheduler, reporter
        self.stopper = stopper if stopper is not None else NoopStopper()
        self.fail_fast_error: Optional[tuple[str, tr.TrialError]] = None  # (trial id, its error)
        self.raised: dict[str, str] = {}  # trial id -> its last exception as the trial pickled it (base64)
        self.unplaceable = room.never_fits(spec.demand)  # every trial then ends as ERROR with this message
        self.trials = trials
        self.events: "queue.Queue" = queue.Queue()
        self.running: dict[str, _Running] = {}
        self.exhausted = len(trials) >= spec.total_trials
        self.stopping = ""  # why no new trial starts (the time budget)
        scheduler.set_controller(_Controller(self))

    # ------------------------------------------------------------------ the loop

    def run(self) -> None:
        """Run the sweep until every trial ended (or the time budget is spent); Ctrl-C stops the
        trials and raises KeyboardInterrupt after the state file was written."""
        started, budget = time.monotonic(), self.spec.limits.time_budget_s
        if self.callbacks:
            stop = self.stopper if budget is None else CombinedStopper(self.stopper, TimeoutStopper(budget))
            num_samples = self.spec.header.get("num_samples")
            self.callbacks.call("setup", stop=stop, num_samples=-1 if num_samples == 10**9 else num_samples,
                                total_num_samples=self.spec.total_trials)
        try:
            while True:
                self.step += 1
                self._callback("on_step_begin")
                if budget is not None and not self.stopping and time.monotonic() - started > budget:
                    self._stop_all(f"time_budget_s={budget} reached")
                    for running in self.running.values():  # Ray stops them now, not at their next result
                        running.budget_stopped = True
                        _signal(running.proc, signal.SIGINT)
                self._start_trials()
                if not self.running and (self.exhausted or self.stopping) and not self._pending():
                    break
                try:
                    trial_id, message = self.events.get(timeout=0.5)
                except queue.Empty:
                    self.reporter.update(self.trials)
                    self._callback("on_step_end")
                    continue
                self._handle(trial_id, message)
                self.reporter.update(self.trials)
                self._callback("on_step_end")
            self.callbacks.call("on_experiment_end", trials=self.trials)
        except KeyboardInterrupt:
            self._interrupt()
            self.callbacks.call("on_experiment_end", trials=self.trials)
            raise
        except StorageError as exc:  # a full disk, a lost mount: the sweep cannot record its trials
            self._kill_running()
            raise StorageError(f"{exc}. The sweep stopped its trials; {tr.STATE_FILE} keeps the last state it "
                               f"could write and every committed checkpoint is kept. Free the space, then "
                               f"Tuner.restore({self.spec.experiment_path!r}, trainable) goes on from there."
                               ) from exc
        except Exception:  # a callback's, a scheduler's error: the trials stop, the sweep stays resumable
            self._kill_running()
            raise
        finally:
            try:
                self._save()
            except StorageError as exc:
                if sys.exc_info()[1] is None:
                    raise
                logger.error("the sweep's state file could not be written either: %s", exc)
            self.reporter.finish(self.trials)

    def _callback(self, hook: str, trial: Optional[tr.Trial] = None, **kwargs: Any) -> None:
        """Call `hook` on the sweep's callbacks with Ray's arguments (iteration, trials[, trial])."""
        if self.callbacks:
            extra = {} if trial is None else {"trial": trial}
            self.callbacks.call(hook, iteration=self.step, trials=self.trials, **extra, **kwargs)

    def _pending(self) -> list[tr.Trial]:
        """The trials that may start now, the one to start first first: new and retried trials in order,
        then paused ones free to go again (Ray's FIFO order), as the scheduler chooses among them."""
        if self.stopping:
            return []
        waiting = [t for t in self.trials if t.status == tr.TrialStatus.PENDING and t.trial_id not in self.running
                   and t.trial_id not in self.paused]
        later = [t for t in waiting if t.trial_id in self.requeued]
        ordered = [t for t in waiting if t.trial_id not in self.requeued] + \
            sorted(later, key=lambda t: self.requeued.index(t.trial_id))
        chosen = self.scheduler.choose_trial_to_run([t.trial_id for t in ordered])
        return sorted(ordered, key=lambda t: t.trial_id != chosen)

    def _start_trials(self) -> None:
        """Start trials while max_concurrent_trials and the hosts allow; the rest wait (queue) for a
        running trial to end. Hosts are reserved before a new trial is drawn from the searcher, so a
        trial is created only when it can start."""
        at_most = self.spec.limits.max_concurrent
        if getattr(self.scheduler, "holds_paused_trials", False):
            # Ray creates trials ahead of room (its pending trials): a synchronous scheduler must see a
            # bracket's trials before it halves it, not only those that had room so far.
            while not (self.exhausted or self.stopping) and len(self._pending()) < MAX_PENDING_TRIALS:
                if self._new_trial() is None:
                    break
        while not (at_most and len(self.running) >= at_most):
            if self.unplaceable:
                if not self._fail_unplaceable():
                    return
                continue
            reservation = self.room.reserve(self.spec.demand)
            if reservation is None:
                return  # queued: a running trial's end frees room
            pending = self._pending()
            trial = pending[0] if pending else None if (self.exhausted or self.stopping) else self._new_trial()
            if trial is None:
                self.room.release(reservation)
                return
            self._launch(trial, reservation)

    def _fail_unplaceable(self) -> bool:
        """Record the next trial (pending, else new) as failed because no host can ever hold it; False
        when there is none."""
        pending = self._pending()
        trial = pending[0] if pending else None if (self.exhausted or self.stopping) else self._new_trial()
        if trial is None:
            return False
        trial.error = tr.TrialError("minitrain.errors.ConfigError", self.unplaceable)
        trial.status = tr.TrialStatus.ERROR
        self.scheduler.on_trial_remove(trial.trial_id)
        self.searcher.on_trial_complete(trial.trial_id, trial.last_result, error=True)
        self.reporter.trial_changed(trial)
        self._save()
        self._callback("on_trial_error", trial)
        return True

    def _new_trial(self) -> Optional[tr.Trial]:
        if len(self.trials) >= self.spec.total_trials:
            self.exhausted = True
            return None
        index = len(self.trials)
        trial_id = f"{self.spec.id_prefix}_{index:05d}"
        config = self.searcher.suggest(trial_id)
        if config is None:  # a concurrency limit: ask again when a trial ends
            return None
        if config == Searcher.FINISHED:
            self.exhausted = True
            return None
        trial = tr.new_trial(trial_id, "", "", config, index)
        if not trial.config_is_json:  # kept sealed, so that Tuner.restore can run it again with this config
            try:
                trial.config_sealed = restore_spec.seal_value(config)
            except Exception as exc:  # noqa: BLE001 - unpicklable, or no key: a restore says it cannot resume it
                logger.debug("trial %s: its config is not JSON and cannot be kept for a restore: %s", trial_id, exc)
        self.spec.name_trial(trial)
        self.trials.append(trial)
        self.scheduler.on_trial_add(trial_id)
        self._save()
        return trial

    def _launch(self, trial: tr.Trial, reservation: Reservation) -> None:
        if not trial.config_is_json and trial.config is None:
            raise ConfigError(f"trial {trial.name} cannot be resumed: its config was not JSON and was not saved.")
        if trial.iteration > trial.checkpoint_iteration:  # it reports again from its checkpoint on
            trial.iteration = trial.checkpoint_iteration
            trial.checkpoints = [c for c in trial.checkpoints if os.path.exists(c[0])]
        tr.make_tune_dir(self.spec.experiment_path)
        if trial.trial_id not in self.exploited:  # an exploiting trial keeps its own history, as Ray's log
            tr.cut_history(self.spec.experiment_path, trial, trial.iteration)
        self.exploited.discard(trial.trial_id)
        if trial.trial_id in self.requeued:
            self.requeued.remove(trial.trial_id)
        trial_dir = os.path.join(self.spec.experiment_path, trial.dirname)
        context = TuneContext(trial.trial_id, trial.name, trial_dir, self.spec.experiment_name,
                              self.spec.experiment_path, dict(self.spec.trial_resources))
        payload = cloudpickle.dumps(TrialPayload(self.spec.trainable, trial.config, context, trial.checkpoint,
                                                 trial.iteration, reservation.cluster))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(self.spec.pythonpath),
               knobs.TUNE_PARENT.name: str(os.getpid()), **reservation.env,
               # the trial's own subprocesses see only its hosts too (its fit()s get them in the payload)
               HOSTS_ENV_VAR: reservation.host_list()}
        env.pop(HOSTFILE_ENV_VAR, None)
        if env.get(DASHBOARD_ENV):  # the sweep's page holds a fixed port: each trial's fit() takes a free one
            env[DASHBOARD_ENV] = trials_address_value(env[DASHBOARD_ENV])
        # "starting for ..." until its first result
        trial.started_at, trial.startup_s, trial.startup_phase = time.time(), None, ""
        proc, read_fd = self._spawn(trial, env)
        try:
            proc.stdin.write(struct.pack(">Q", len(payload)) + payload)
            proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass  # it died at once; its end arrives through the pipe's EOF
        running = _Running(trial, proc, reservation)
        self.running[trial.trial_id] = running
        logger.debug("trial %s runs on %s", trial.name, reservation.describe())
        trial.status = tr.TrialStatus.RUNNING
        threading.Thread(target=self._read, args=(trial.trial_id, read_fd), daemon=True,
                         name=f"minitrain-tune-{trial.trial_id}").start()
        self.reporter.trial_changed(trial)
        self._save()
        self._callback("on_trial_start", trial)
        if trial.checkpoint:
            self._callback("on_trial_restore", trial)

    def _spawn(self, trial: tr.Trial, env: dict) -> tuple[Any, int]:
        """Start `trial`'s process: (its Popen, the read end of its report pipe). The process reads its
        payload on stdin, writes its messages on the pipe, and logs to the trial's log file."""
        read_fd, write_fd = os.pipe()
        with open(tr.open_log(self.spec.experiment_path, trial), "ab") as log:
            proc = subprocess.Popen([sys.executable, "-m", "minitrain.tune.trial_process", str(write_fd)],
                                    stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT,
                                    pass_fds=(write_fd,), start_new_session=True, env=env)
        os.close(write_fd)
        return proc, read_fd

    def _read(self, trial_id: str, fd: int) -> None:
        with os.fdopen(fd, "r") as stream:
            for line in stream:
                try:
                    message = messages.decode(line)
                except messages.MalformedMessage as exc:  # a torn line of a dying process, or a bug
                    logger.debug("trial %s: ignored a report-pipe line: %s", trial_id, exc)
                    continue
                self.events.put((trial_id, message))
        self.events.put((trial_id, _PIPE_CLOSED))

    # ------------------------------------------------------------------ events

    def _handle(self, trial_id: str, message: "TrialMessage | _PipeClosed") -> None:
        running = self.running.get(trial_id)
        if running is None:
            return
        if isinstance(message, TrialReported):
            self._on_result(running, message)
        elif isinstance(message, TrialStarting):  # shown by the next redraw of the table and the page
            running.trial.startup_phase = message.phase
        elif isinstance(message, _PipeClosed):
            self._on_exit(running)
        else:  # TrialFinished, TrialFailed or TrialInterrupted: how the trial ended, acted on at its exit
            running.ended = message

    def _on_result(self, running: _Running, message: TrialReported) -> None:
        trial, now = running.trial, time.monotonic()
        if trial.startup_s is None and trial.started_at is not None:  # its start-up cost, kept
            trial.startup_s = max(time.time() - trial.started_at, 0.0)
        trial.iteration += 1
        running.since_restore += 1
        this_iter = now - running.last_report
        running.last_report = now
        trial.time_total_s += this_iter
        result = dict(message.metrics)
        result.update(training_iteration=trial.iteration, time_this_iter_s=this_iter,
                      time_total_s=trial.time_total_s, timestamp=int(time.time()), trial_id=trial.trial_id,
                      iterations_since_restore=running.since_restore, done=False)
        evicted: list[str] = []
        if message.checkpoint:
            trial.checkpoint, trial.checkpoint_iteration = message.checkpoint, trial.iteration
            trial.checkpoints.append((message.checkpoint, result))
            evicted = self._retain(trial)
            self._callback("on_checkpoint", trial, checkpoint=Checkpoint(message.checkpoint))
            self._callback("on_trial_save", trial)
        trial.last_result = result
        tr.append_history(self.spec.experiment_path, trial, result)
        decision = self.scheduler.on_trial_result(trial.trial_id, result)
        self.searcher.on_trial_result(trial.trial_id, result)
        if decision == STOP and not running.stop_sent:
            trial.stop_reason = self._stop_reason(result)
        if self._stopper_says_stop(running, result):
            decision = STOP
        self._callback("on_trial_result", trial, result=dict(result))
        if decision == STOP or self.stopping:
            running.stop_sent = True
            running.pausing = False
            self.paused.discard(trial.trial_id)
            running.answer(Decision.STOP)
        elif decision == PAUSE or (decision == NOOP and running.pausing):
            running.pausing = True
            if decision == PAUSE and getattr(self.scheduler, "holds_paused_trials", False):
                self.paused.add(trial.trial_id)
            running.answer(Decision.STOP)
        else:
            running.answer(Decision.CONTINUE)
        self._save()
        for path in evicted:  # deleted once the state file no longer names them
            shutil.rmtree(path, ignore_errors=True)

    def _stopper_says_stop(self, running: _Running, result: dict) -> bool:
        """Ask RunConfig.stop about this result: True stops the trial; its stop_all() stops the sweep;
        a `stop` key the result lacks fails the trial (as Ray's TuneError)."""
        trial = running.trial
        try:
            stop = self.stopper(trial.trial_id, result)
        except MissingStopKey as exc:
            running.forced_error = tr.TrialError("minitrain.tune.stopper.MissingStopKey", str(exc))
            return True
        if stop and not running.stop_sent:
            trial.stop_reason = trial.stop_reason or \
                f"stopped by RunConfig(stop=...) at training_iteration={trial.iteration}"
        if self.stopper.stop_all() and not self.stopping:
            self._stop_all(f"RunConfig(stop=...) stopped the sweep at {trial.name}'s training_iteration="
                           f"{trial.iteration}")
        return bool(stop)

    def _retain(self, trial: tr.Trial) -> list[str]:
        """Apply the sweep's retention to `trial`'s checkpoints; the paths to delete (only directories
        `tune.report` made in the trial directory: a fit()'s own checkpoints are its to keep)."""
        keep = self.spec.retention
        if keep.num_to_keep is None:
            return []
        trial_dir = os.path.join(self.spec.experiment_path, trial.dirname)
        records = [CheckpointRecord(path, metrics, index) for index, (path, metrics) in enumerate(trial.checkpoints)
                   if os.path.dirname(os.path.normpath(path)) == trial_dir]
        try:
            outcome = retain(records, keep.num_to_keep, keep.attribute, keep.order)
        except ValueError as exc:
            logger.warning("trial %s: its checkpoints are all kept: %s", trial.name, exc)
            return []
        gone = {record.dir_name for record in outcome.evicted}
        trial.checkpoints = [c for c in trial.checkpoints if c[0] not in gone]
        return sorted(gone)

    def _stop_reason(self, result: dict) -> str:
        scheduler = self.scheduler
        attr = getattr(scheduler, "time_attr", "training_iteration")
        if isinstance(scheduler, AsyncHyperBandScheduler) and result.get(attr, 0) >= scheduler.max_t:
            return f"reached max_t={scheduler.max_t} ({attr})"
        return f"stopped early by {scheduler.describe()} at {attr}={result.get(attr)}"

    def _on_exit(self, running: _Running) -> None:
        trial = running.trial
        try:
            returncode = running.proc.wait(timeout=EXIT_WAIT_S)
        except subprocess.TimeoutExpired:
            _kill_group(running.proc)
            returncode = running.proc.wait()
        running.proc.stdin.close()
        del self.running[trial.trial_id]
        self.room.release(running.reservation)
        ended = running.ended
        budget_stop = running.budget_stopped and (ended is None or isinstance(ended, TrialInterrupted))
        if running.pausing and isinstance(ended, TrialFinished) and ended.stopped and running.forced_error is None \
                and not self.stopping and trial.trial_id not in self.stop_paused:
            trial.status = tr.TrialStatus.PENDING  # paused: it starts again from its latest checkpoint
            if trial.trial_id not in self.paused:
                self.requeued.append(trial.trial_id)
            self.reporter.trial_changed(trial)
            self._save()
            return
        self.paused.discard(trial.trial_id)
        if trial.trial_id in self.stop_paused:  # the scheduler stopped it while it paused
            self.stop_paused.discard(trial.trial_id)
            trial.stop_reason = trial.stop_reason or f"stopped by {self.scheduler.describe()} while paused"
            if isinstance(ended, TrialFinished):
                running.stop_sent = True
        if (isinstance(ended, TrialFinished) or budget_stop) and running.forced_error is None:
            trial.status = tr.TrialStatus.TERMINATED
            if trial.last_result is not None:
                trial.last_result = {**trial.last_result, "done": True}
            if isinstance(ended, TrialFinished) and not ended.stopped:
                trial.stop_reason = trial.stop_reason if running.stop_sent else None
            self.scheduler.on_trial_complete(trial.trial_id, trial.last_result)
            self.searcher.on_trial_complete(trial.trial_id, trial.last_result)
            self._callback("on_trial_complete", trial)
        elif isinstance(ended, TrialInterrupted) or (self.stopping and running.stop_sent and ended is None):
            trial.status = tr.TrialStatus.PENDING  # Ctrl-C: resumable
        elif running.forced_error is not None:  # the loop failed it: no retry would do better
            trial.error = running.forced_error
            self._errored(trial)
        else:
            trial.error = ended.error if isinstance(ended, TrialFailed) else tr.TrialError(
                "TrialProcessDied", f"the trial process {_describe_exit(returncode)} without reporting why; see "
                                    f"{tr.log_path(self.spec.experiment_path, trial)}")
            self.raised.pop(trial.trial_id, None)
            if isinstance(ended, TrialFailed) and ended.pickled:
                self.raised[trial.trial_id] = ended.pickled
            self._failed(trial)
        self.reporter.trial_changed(trial)
        self._save()

    def _failed(self, trial: tr.Trial) -> None:
        max_failures = self.spec.limits.max_failures
        if max_failures < 0 or trial.num_failures < max_failures:
            trial.num_failures += 1
            trial.status = tr.TrialStatus.PENDING
            logger.warning("trial %s failed (%s); retrying it (%d of %s) from %s", trial.name, trial.error.summary,
                           trial.num_failures, "inf" if max_failures < 0 else max_failures,
                           trial.checkpoint or "the start")
            self._callback("on_trial_recover", trial)
            return
        self._errored(trial)

    def _errored(self, trial: tr.Trial) -> None:
        """`trial` ends in ERROR; under fail_fast the sweep stops with it."""
        trial.status = tr.TrialStatus.ERROR
        self.scheduler.on_trial_remove(trial.trial_id)
        self.searcher.on_trial_complete(trial.trial_id, trial.last_result, error=True)
        self._callback("on_trial_error", trial)
        if self.spec.limits.fail_fast and self.fail_fast_error is None:
            self.fail_fast_error = (trial.trial_id, trial.error)
            self._stop_all(f"fail_fast: trial {trial.name} failed")

    def _stop_all(self, why: str) -> None:
        self.stopping = why
        for running in self.running.values():
            running.trial.stop_reason = running.trial.stop_reason or why
            running.stop_sent = True

    # ------------------------------------------------------------------ Ctrl-C

    def _interrupt(self) -> None:
        """Ctrl-C: every trial process gets SIGINT (a fit() in it stops its workers cleanly), then the
        loop waits for them (a second Ctrl-C kills them); unfinished trials stay PENDING."""
        logger.warning("interrupted: stopping %d running trial(s); resume with Tuner.restore(%r, trainable)",
                       len(self.running), self.spec.experiment_path)
        self.stopping = "interrupted"
        for running in list(self.running.values()):
            _signal(running.proc, signal.SIGINT)
        deadline = time.monotonic() + INTERRUPT_WAIT_S
        try:
            while self.running and time.monotonic() < deadline:
                try:
                    trial_id, message = self.events.get(timeout=0.5)
                except queue.Empty:
                    continue
                if isinstance(message, TrialReported) and trial_id in self.running:
                    self.running[trial_id].answer(Decision.STOP)
                    continue
                self._handle(trial_id, message)
        except KeyboardInterrupt:
            pass
        self._kill_running()

    def _kill_running(self) -> None:
        """Kill every running trial's process group; they are PENDING again (a restore resumes them)."""
        for running in list(self.running.values()):
            _kill_group(running.proc)
            running.proc.wait()
            running.trial.status = tr.TrialStatus.PENDING
            del self.running[running.trial.trial_id]
            self.room.release(running.reservation)
        for trial in self.trials:
            if trial.status == tr.TrialStatus.RUNNING:
                trial.status = tr.TrialStatus.PENDING

    def _save(self) -> None:
        tr.write_state(self.spec.experiment_path, self.spec.header, self.trials)


class _Controller(SchedulerController):
    """The loop as its scheduler sees it (minitrain.tune.schedulers.SchedulerController)."""

    def __init__(self, loop: SweepLoop):
        self._loop = loop
        self.experiment_path = loop.spec.experiment_path

    def _trial(self, trial_id: str) -> tr.Trial:
        for trial in self._loop.trials:
            if trial.trial_id == trial_id:
                return trial
        raise KeyError(f"no trial {trial_id!r} in this sweep")

    def trial_ids(self) -> list:
        return [t.trial_id for t in self._loop.trials]

    def config(self, trial_id: str) -> dict:
        return self._trial(trial_id).config

    def status(self, trial_id: str) -> str:
        loop = self._loop
        running = loop.running.get(trial_id)
        if trial_id in loop.paused or (running is not None and running.pausing) or \
                (trial_id in loop.requeued and running is None):
            return "PAUSED"
        return str(self._trial(trial_id).status)

    def checkpoint(self, trial_id: str) -> Optional[tuple]:
        trial = self._trial(trial_id)
        if not trial.checkpoint:
            return None
        result = next((m for path, m in reversed(trial.checkpoints) if path == trial.checkpoint), None)
        return trial.checkpoint, trial.checkpoint_iteration, result or {}

    def has_waiting_trials(self) -> bool:
        loop = self._loop
        return bool(loop._pending()) or bool(loop.paused) or \
            (not loop.exhausted and len(loop.trials) < loop.spec.total_trials and not loop.stopping)

    def exploit(self, trial_id: str, config: dict, checkpoint: tuple) -> None:
        loop, trial = self._loop, self._trial(trial_id)
        path, iteration, result = checkpoint
        if not os.path.isdir(path):
            raise ConfigError(f"PopulationBasedTraining: the checkpoint {path} that trial {trial.name} should "
                              "exploit is gone; keep more checkpoints (CheckpointConfig(num_to_keep=...)).")
        target = os.path.join(loop.spec.experiment_path, trial.dirname, f"pbt_checkpoint_{iteration:06d}")
        if os.path.exists(target):
            shutil.rmtree(target)
        shutil.copytree(path, target)  # its own copy: the donor's retention may delete the original
        trial.config = config
        trial.config_is_json = tr.new_trial(trial_id, "", "", config, 0).config_is_json
        if not trial.config_is_json:
            try:
                trial.config_sealed = restore_spec.seal_value(config)
            except Exception as exc:  # noqa: BLE001 - a restore then says it cannot resume it
                logger.debug("trial %s: its explored config cannot be kept for a restore: %s", trial_id, exc)
        # Ray's restore takes the iteration and time of the checkpoint's result
        trial.checkpoint, trial.checkpoint_iteration, trial.iteration = target, iteration, iteration
        trial.time_total_s = float(result.get("time_total_s", trial.time_total_s))
        trial.checkpoints.append((target, result))
        loop.exploited.add(trial_id)
        running = loop.running.get(trial_id)
        if running is not None:
            running.pausing = True

    def unpause(self, trial_id: str) -> None:
        loop = self._loop
        if trial_id in loop.paused:
            loop.paused.discard(trial_id)
            if trial_id not in loop.running:
                loop.requeued.append(trial_id)

    def stop_paused(self, trial_id: str) -> None:
        loop, trial = self._loop, self._trial(trial_id)
        loop.paused.discard(trial_id)
        if trial_id in loop.requeued:
            loop.requeued.remove(trial_id)
        if trial_id in loop.running:  # its process still ends: it is TERMINATED then
            loop.stop_paused.add(trial_id)
            return
        if trial.finished:
            return
        trial.status = tr.TrialStatus.TERMINATED
        trial.stop_reason = trial.stop_reason or f"stopped by {loop.scheduler.describe()} while paused"
        if trial.last_result is not None:
            trial.last_result = {**trial.last_result, "done": True}
        loop.scheduler.on_trial_complete(trial_id, trial.last_result)
        loop.searcher.on_trial_complete(trial_id, trial.last_result)
        loop.reporter.trial_changed(trial)
        loop._callback("on_trial_complete", trial)


def _signal(proc: Any, sig: int) -> None:
    if not isinstance(proc, subprocess.Popen):  # an in-process fake of a test
        proc.send_signal(sig)
        return
    try:
        os.kill(proc.pid, sig)
    except ProcessLookupError:
        pass


def _kill_group(proc: Any) -> None:
    if not isinstance(proc, subprocess.Popen):  # an in-process fake of a test
        proc.kill()
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the trial's session; its fit()'s agents end with their lease
    except (ProcessLookupError, PermissionError):
        pass


def _describe_exit(returncode: int) -> str:
    code, sig = decode_returncode(returncode)
    if sig:
        return f"was killed by {signal.Signals(sig).name}"
    return f"exited with code {code}"
