"""The controller: the one owner of a run's lifecycle, as one stepped loop.

It runs on the thread that called `fit()`. Servicer threads put facts (events) into its queue. Each
turn of the loop takes every queued event (waiting at most POLL_S for the first) and records it
(the attempt's tracker, the commits, the connected agents), observes what is now true (`Seen`), asks
the pure `decide()` what happens next, and executes the returned actions: state moves (checked by
`run_state.check_move`, then told to the observers' `on_state`), the attempt's start and stop through
its `WorkerGroup`, agent relaunches through the launcher's handles. The run's state is the loop's
(`decide.Loop.state`), held nowhere else. Nothing else decides to retry or give up, and nothing here
waits in a loop of its own: a stop, a drain, the wait for agents and for stacks are stages of the one
loop, with deadlines.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import queue
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping, Optional, Protocol, Sequence, Union

from minitrain.coordinator import events as ev
from minitrain.coordinator.attempt import AttemptTracker, RankState
from minitrain.coordinator.commits import CheckpointBook, Commits
from minitrain.coordinator.decide import (
    Action, CloseStreams, CollectStacks, DeclareHung, ForgetAgents, LogLate, Loop, MoveTo, PrepareForkServers,
    RelaunchAgents, Rules, Seen, Stage, StartAttempt, StopWorkers, Watch, decide,
)
from minitrain.coordinator.hangs import AUTO, AUTO_FLOOR_S, HangRule, Pace
from minitrain.coordinator.metrics_log import MetricsLog
from minitrain.coordinator.observers import (
    AttemptEnd, AttemptInfo, Observers, RunInfo, RunObserver, StackDump, TelemetrySample,
)
from minitrain.coordinator.policy import HostBackoff
from minitrain.coordinator.ranks import assign_ranks
from minitrain.coordinator.service import Hub
from minitrain.coordinator.worker_group import LaunchSettings, ResumePoint, WorkerGroup
from minitrain.errors import ConfigError, render_failures
from minitrain.records import NodeInfo, Phase, RunOutcome
from minitrain.run_state import IllegalTransition, RunState, check_move, ray_status
from minitrain.rpc._gen import minitrain_pb2 as pb

logger = logging.getLogger("minitrain")

POLL_S = 0.05  # the longest the loop waits for an event before it looks at its deadlines again


class FailurePolicy(Protocol):
    """The part of FailureConfig the controller uses."""

    max_failures: int
    worker_stop_grace_s: float
    worker_hang_timeout_s: Union[float, str, None]
    worker_hang_floor_s: Optional[float]

    def allows_retry(self, failures_so_far: int) -> bool:
        """True when one more attempt may start after `failures_so_far` failures."""


class AgentHandles(Protocol):
    """The launcher's view of the agent processes it started."""

    def dead_agents(self) -> dict[str, str]:
        """node_id -> why, for agents whose process ended before they should have."""

    def relaunch(self, node_id: str) -> bool:
        """Start a new agent for a node whose agent died; False when that is not possible."""

    def forget(self, node_id: str) -> None:
        """Stop waiting for the agent of `node_id` (it failed to come back)."""


@dataclass(frozen=True)
class RunSpec:
    """Everything the controller needs to run one `fit()`; built by the trainer."""

    run_id: str
    experiment_name: str
    run_path: str
    num_workers: int
    node_ids: tuple[str, ...]
    payload: bytes
    backend: str
    dist_timeout_s: float
    failure_policy: FailurePolicy
    worker_env: Mapping[str, str] = field(default_factory=dict)
    cwd: str = ""
    gpus_per_worker: float = 0.0
    cpus_per_worker: float = 1.0
    placement_strategy: str = "PACK"
    node_slots: Mapping[str, Optional[int]] = field(default_factory=dict)
    local_node_ids: frozenset = frozenset()  # nodes on this machine: a lost agent there is replaced at once
    agent_start_timeout_s: float = 60.0
    relay: bool = False  # workers' streams go through their agents' relays (config.relays_workers)


class Controller:
    """Runs attempts until the run succeeds, fails past its budget, or is aborted."""

    def __init__(self, spec: RunSpec, hub: Hub, events: "queue.SimpleQueue[ev.RunEvent]",
                 agents: AgentHandles, checkpoints: CheckpointBook, metrics_log: MetricsLog,
                 clock: Callable[[], float] = time.time, observers: Sequence[RunObserver] = ()):
        self._spec = spec
        self._checkpoints = checkpoints
        self._observers = Observers(observers)
        self._commits = Commits(checkpoints, metrics_log, hub, clock, self._observers)
        self._hub = hub
        self._events = events
        self._agents = agents
        self._clock = clock
        policy = spec.failure_policy
        self._rules = Rules(max_failures=policy.max_failures, stop_grace_s=policy.worker_stop_grace_s,
                            agent_start_timeout_s=spec.agent_start_timeout_s)
        self._hang_rule = HangRule(timeout_s=policy.worker_hang_timeout_s,
                                   floor_s=policy.worker_hang_floor_s or AUTO_FLOOR_S)
        self._pace = Pace()  # every rank's report intervals, across attempts
        self._loop = Loop()
        self._nodes: dict[str, NodeInfo] = {}
        self._streams: dict[str, int] = {}  # node_id -> its agent's current stream
        self._lost_nodes: dict[str, str] = {}
        self._relaunched: list[str] = []  # lost nodes given a new agent, not yet back
        self._backoff = HostBackoff()
        self._group: Optional[WorkerGroup] = None
        self._start_error = ""  # why the last start could not place the workers
        self._config_error: Optional[ConfigError] = None  # an unsatisfiable request: raised from run()
        self._interrupts = 0  # Ctrl-C presses not yet given to decide()
        self._attempt_ended = True  # on_attempt_end was sent for the latest attempt (or none started)
        self._training_tracker: Optional[AttemptTracker] = None  # the attempt seen with every rank training
        # The hang watch (_watched): the attempt it was last built for, then, and when it is due again.
        self._watch_tracker: Optional[AttemptTracker] = None
        self._watch_from = self._watch_due = 0.0

    @property
    def state(self) -> RunState:
        """The current run state (the loop's)."""
        return self._loop.state

    # ------------------------------------------------------------------ the loop

    def run(self) -> RunOutcome:
        """Drive the run to a terminal state and describe how it ended.

        Ctrl-C (SIGINT): the workers are stopped gracefully (a second one skips the grace), the run
        ends ABORTED, and KeyboardInterrupt is raised once they are gone. A request no host can hold
        raises ConfigError after the teardown.
        """
        spec = self._spec
        self._observers.notify("on_run_start", RunInfo(spec.run_id, spec.experiment_name, spec.run_path,
                                                       spec.num_workers, self._clock(),
                                                       request_stacks=self.request_stacks))
        try:
            with _sigint_noted(self._note_interrupt):
                self._run_loop()
        finally:
            self._shutdown_agents()
            self._persist()
            self._delete_garbage()
        outcome = self._outcome()
        self._end_attempt(restarting=False)
        self._observers.notify("on_run_end", outcome)
        if self._loop.interrupts:
            raise KeyboardInterrupt
        if self._config_error is not None:
            raise self._config_error
        return outcome

    def _run_loop(self) -> None:
        wait_s = 0.0
        while not self._loop.finished:
            try:
                self._take_events(wait_s)
                now = self._clock()  # one instant for what is seen and for the decision on it
                decision = decide(self._loop, self._observe(now), now, self._rules)
                previous, self._loop = self._loop.state, decision.loop
                self._act(previous, decision.actions)
                # Act again at once after acting (a stage may already be over); otherwise wait for news.
                wait_s = 0.0 if decision.actions else POLL_S
            except KeyboardInterrupt:  # SIGINT while someone else's handler raises it: same meaning
                self._note_interrupt()
                wait_s = 0.0

    def request_stacks(self, rank: int) -> None:
        """Any thread: ask `rank` of the current attempt for its stacks; they reach the observers'
        `on_stacks` (and the rank's log). The loop acts on it within one turn."""
        self._events.put(ev.StacksWanted(rank))

    def _note_interrupt(self) -> None:
        """Called from the SIGINT handler: only counts (the loop acts on it within one turn)."""
        self._interrupts += 1

    def _take_events(self, wait_s: float) -> None:
        """Record every queued event, waiting up to `wait_s` for the first."""
        try:
            event = self._events.get(timeout=wait_s) if wait_s > 0 else self._events.get_nowait()
        except queue.Empty:
            return
        while True:
            self._handle(event)
            try:
                event = self._events.get_nowait()
            except queue.Empty:
                return

    def _observe(self, now: float) -> Seen:
        """What is true at `now`, for `decide`."""
        expected = [n for n in self._spec.node_ids if n not in self._lost_nodes]
        missing = tuple(n for n in expected if n not in self._nodes)
        agents_failed = ""
        if missing:
            dead = {n: why for n, why in self._agents.dead_agents().items() if n in missing}
            if dead:
                agents_failed = "node agent(s) failed to start: " + "; ".join(
                    f"{n}: {why}" for n, why in sorted(dead.items()))
        interrupted, self._interrupts = self._interrupts > 0, 0
        seen = Seen(agents_missing=missing, agents_failed=agents_failed, lost_nodes=bool(self._lost_nodes),
                    start_error=self._start_error, interrupted=interrupted)
        if self._group is None:
            return seen
        tracker = self._group.tracker
        failed = tracker.failed()
        return dataclasses.replace(
            seen, has_attempt=True, failed=failed, finished=tracker.finished(),
            all_training=self._all_training(tracker), all_exited=tracker.all_exited(),
            all_drained=tracker.all_drained(), stacks_answered=self._group.stacks_answered(),
            watched=self._watched(tracker, now),
            root_cause=_root_cause_text(tracker) if failed else "")

    # ------------------------------------------------------------------ actions

    def _act(self, previous: RunState, actions: Sequence[Action]) -> None:
        """Execute a decision's actions in order; `previous` is the state the decision started from.
        Its moves must lead from there to the loop's state."""
        for action in actions:
            if isinstance(action, MoveTo):
                self._move(previous, action)
                previous = action.state
            else:
                self._execute(action)
        if previous is not self._loop.state:
            raise IllegalTransition(f"decide's moves end in {previous.value}, its loop in "
                                    f"{self._loop.state.value}")

    def _execute(self, action: Action) -> None:
        group = self._group
        if isinstance(action, StartAttempt):
            self._start(action.attempt)
        elif isinstance(action, RelaunchAgents):
            self._relaunch_lost_agents()
        elif isinstance(action, ForgetAgents):
            self._forget_relaunched(action.reason)
        elif isinstance(action, LogLate):
            self._log_late(action.stage)
        elif group is None:
            return
        elif isinstance(action, StopWorkers):
            group.stop(action.grace_s)
        elif isinstance(action, CollectStacks):
            group.collect_stacks()
        elif isinstance(action, DeclareHung):
            group.declare_hung(action.ranks, {r: self._hang_deadline(group.tracker, r) for r in action.ranks})
        elif isinstance(action, CloseStreams):
            group.close_streams()
        elif isinstance(action, PrepareForkServers):
            group.prepare_fork_servers()

    def _move(self, previous: RunState, move: MoveTo) -> None:
        """Check a move of the run's state, say why it happens, and tell the observers."""
        loop, group = self._loop, self._group
        check_move(previous, move.state, move.target, heading=loop.target)
        failed = group is not None and group.tracker.failed() and not self._start_error
        if move.state is RunState.RESTARTING or (move.target is RunState.FAILED and failed):
            logger.warning("attempt %d: %s; stopping every rank of the attempt", group.attempt, move.reason)
        if move.state is RunState.STARTING and previous is RunState.RESTARTING:
            self._end_attempt(restarting=True)
            # Failures learned during the stop (a lost node, say) can be the real cause: judge again.
            left = self._spec.failure_policy.retries_left(loop.failures)
            logger.warning("attempt %d failed (%s); restarting as attempt %d (failure %d, max_failures=%d, %s)",
                           group.attempt, _root_cause_text(group.tracker), loop.attempt, loop.failures,
                           self._rules.max_failures, "unlimited retries" if left is None else f"{left} retries left")
        elif move.state is RunState.STOPPING and move.target is RunState.FAILED:
            if failed:
                logger.error("attempt %d failed (%s); failure budget spent (max_failures=%d)", group.attempt,
                             move.reason, self._rules.max_failures)
            else:
                logger.error("the run cannot go on: %s", move.reason)
        elif move.state is RunState.STOPPING and move.target is RunState.ABORTED:
            logger.warning("%s: stopping the workers (press Ctrl-C again to kill them at once)", move.reason)
        logger.debug("run state %s -> %s (attempt %d): %s", ray_status(previous), ray_status(move.state),
                     loop.attempt, move.reason)
        self._observers.on_state(previous, move.state, move.reason, loop.attempt)

    def _log_late(self, stage: Stage) -> None:
        tracker = self._group.tracker if self._group is not None else None
        if stage is Stage.EXIT and tracker is not None:
            alive = [r for r, s in tracker.ranks.items() if not s.exited]
            logger.error("ranks %s of attempt %d did not confirm their exit in time", alive, tracker.attempt)
        elif stage is Stage.STACKS and tracker is not None:
            logger.warning("attempt %d: not every rank sent its stacks within %g s", tracker.attempt,
                           self._rules.stack_wait_s)

    def _start(self, attempt: int) -> None:
        """Place the ranks of `attempt` on the nodes that are in, and start them."""
        nodes = [self._nodes[n] for n in self._spec.node_ids if n not in self._lost_nodes and n in self._nodes]
        spec = self._spec
        try:
            assignments = assign_ranks(nodes, spec.num_workers, spec.gpus_per_worker, spec.placement_strategy,
                                       spec.cpus_per_worker, dict(spec.node_slots))
        except ConfigError as exc:
            if not self._lost_nodes:  # the request itself is unsatisfiable: never retried
                self._config_error = exc
                self._start_error = str(exc)
                return
            lost = "; ".join(f"{n} ({why})" for n, why in sorted(self._lost_nodes.items()))
            self._start_error = f"the hosts that remain cannot hold the run after losing {lost}: {exc}"
            logger.error("cannot start attempt %d: %s", attempt, self._start_error)
            return
        self._start_error = ""
        self._delete_garbage()
        self._commits.start_attempt(len(assignments))
        latest = self._checkpoints.latest
        resume = ResumePoint(checkpoint_dir=latest.dir_name if latest is not None else "",
                             report_index_base=self._commits.report_base,
                             committed_dir_names=tuple(sorted(self._checkpoints.committed_dir_names)))
        settings = LaunchSettings(experiment_name=spec.experiment_name, run_path=spec.run_path,
                                  payload=spec.payload, backend=spec.backend, dist_timeout_s=spec.dist_timeout_s,
                                  cwd=spec.cwd, worker_env=spec.worker_env, relay=spec.relay)
        self._group = WorkerGroup.start(attempt, assignments, {n.node_id: n for n in nodes}, self._hub,
                                        settings, resume, self._clock)
        self._attempt_ended = False
        hosts = tuple(state.node_name for _, state in sorted(self._group.tracker.ranks.items()))
        self._observers.notify("on_attempt_start", AttemptInfo(attempt, hosts, self._clock()))

    def _relaunch_lost_agents(self) -> None:
        """Before a new attempt: replace lost agents on this machine at once; re-admit a lost remote
        host only after its backoff (it may be gone for good)."""
        now = self._clock()
        self._relaunched = []
        for node_id in list(self._lost_nodes):
            if node_id not in self._spec.local_node_ids and not self._backoff.may_retry(node_id, now):
                continue
            if self._agents.relaunch(node_id):
                logger.warning("node %s: starting a new agent (the old one was lost: %s)", node_id,
                               self._lost_nodes[node_id])
                self._nodes.pop(node_id, None)
                del self._lost_nodes[node_id]
                self._relaunched.append(node_id)

    def _forget_relaunched(self, reason: str) -> None:
        """Relaunched agents that did not connect stay out, and their hosts back off longer."""
        for node_id in self._relaunched:
            if node_id not in self._nodes:
                self._agents.forget(node_id)
                self._lost_nodes[node_id] = f"it did not come back ({reason})"
                self._backoff.failed(node_id, self._clock())
        self._relaunched = []

    def _delete_garbage(self) -> None:
        """Before an attempt: delete what earlier attempts left that the run created and never
        committed. A failure here costs nothing committed (a stale writer of a lost node may still
        be writing into its staging directory), so it is logged, not raised."""
        try:
            garbage = self._checkpoints.delete_garbage()
        except Exception as exc:  # noqa: BLE001 - storage errors of any filesystem
            logger.warning("could not delete the uncommitted uploads of earlier attempts (%s); the next "
                           "attempt deletes them", exc)
            return
        if garbage:
            logger.info("removed what earlier attempts left uncommitted: %s", ", ".join(garbage))

    def _persist(self) -> None:
        """Keep the metrics history and the report counter, however the run ended."""
        try:
            self._commits.persist()
        except Exception as exc:  # the run's own outcome matters more; say what was not saved
            logger.error("could not save the run's metrics history or index: %s", exc)

    def _end_attempt(self, restarting: bool) -> None:
        """Tell the observers, once, that the latest attempt is over."""
        if self._attempt_ended or self._group is None:
            return
        self._attempt_ended = True
        tracker = self._group.tracker
        failures = tuple(tracker.failures())
        self._observers.notify("on_attempt_end", AttemptEnd(
            attempt=tracker.attempt, failures=failures, root_cause=_root_cause_text(tracker) if failures else "",
            restarting=restarting, ended_at=self._clock(), exceptions=tracker.exc_pickles()))

    def _shutdown_agents(self) -> None:
        for node_id in list(self._nodes):
            self._hub.send_to_agent(node_id, pb.AgentCommand(shutdown=pb.Shutdown(reason="run ended")))

    # ------------------------------------------------------------------ events

    def _handle(self, event: ev.RunEvent) -> None:
        group = self._group
        if type(event) is ev.ReportsReceived:  # the most frequent event by far: tested first
            self._on_reports(group, event.reports)
        elif isinstance(event, ev.AgentConnected):
            self._nodes[event.node.node_id] = event.node
            self._streams[event.node.node_id] = event.stream
        elif isinstance(event, ev.AgentLost):
            if event.stream == self._streams.get(event.node_id, event.stream):
                self._on_agent_lost(event)
        elif isinstance(event, ev.StacksWanted):
            if group is not None:
                group.ask_stacks(event.rank)
        elif group is None or _attempt_of(event) != group.attempt:
            self._reject_stale(event)
        elif isinstance(event, ev.WorkerPhaseChanged):
            state = group.tracker.ranks.get(event.rank)
            if state is not None and state.phase < Phase.TRAINING <= event.phase:
                self._pace.started(event.rank)  # the interval up to its first report spans a start
            group.handle(event)
        elif isinstance(event, ev.TelemetryReceived):
            self._observe_telemetry(group.tracker, event.sample)
        elif isinstance(event, ev.CheckpointsRequested):
            self._commits.request_checkpoint_list(event)
        elif isinstance(event, ev.StackDumped):
            group.handle(event)
            self._observers.notify("on_stacks", StackDump(event.attempt, event.rank, event.text))
        elif isinstance(event, ev.WorkerDone):
            group.handle(event)
            self._commits.on_done(group.tracker, event)
            group.release_when_all_done()
        else:
            group.handle(event)

    def _on_reports(self, group: Optional[WorkerGroup], reports: tuple) -> None:
        """Record a batch of reports; those of another attempt than the current one are stale. Also
        while the attempt is being stopped: a report sent before a peer failed still counts."""
        if group is None:
            logger.debug("ignoring %d reports: no attempt runs", len(reports))
            return
        attempt = group.attempt
        current = reports
        for report in reports:
            if report.attempt != attempt:
                current = tuple(r for r in reports if r.attempt == attempt)
                logger.debug("ignoring %d reports of a stale attempt", len(reports) - len(current))
                break
        if not current:
            return
        self._commits.on_reports(group.tracker, current)
        now, reported = self._clock(), self._pace.reported
        for report in current:
            reported(report.rank, now)

    def _observe_telemetry(self, tracker: AttemptTracker, sample: TelemetrySample) -> None:
        """Pass a rank's telemetry on to the observers with its host, pid and phase (it never moves the
        hang clock: a rank that only samples is not progressing)."""
        state = tracker.ranks.get(sample.rank)
        if state is None or not self._observers:
            return
        # A copy built from the fields (dataclasses.replace costs about 1 us more, per sample of every rank).
        self._observers.notify("on_telemetry", TelemetrySample(
            **{**vars(sample), "host": state.node_name, "pid": state.pid, "phase": state.phase.name}))

    def _all_training(self, tracker: AttemptTracker) -> bool:
        """`tracker.all_training()`, asked only until it is true: it only matters until then (decide()
        leaves STARTING when it is), and it scans every rank."""
        if self._training_tracker is not tracker:
            if not tracker.all_training():
                return False
            self._training_tracker = tracker
        return True

    def _watched(self, tracker: AttemptTracker, now: float) -> dict[int, Watch]:
        """The hang clock of every live rank in its training function that has a deadline; empty
        while no rank can be silent past its deadline at `now`.

        Building it scans every rank: at thousands of ranks, doing that at every turn of the loop was
        the largest cost per event. So it is built only when the earliest moment a rank could be past
        its deadline has come (`_watch_due`), and that moment is kept: the minimum over the live
        training ranks of their last progress plus their deadline. A deadline that can shrink
        without an event of the rank itself (taken from the group's pace) counts as the rule's
        shortest one. Every event that changes a rank's own deadline (a report, a phase) also restarts
        its clock at or after the scan, as does a rank's entry into training, and no deadline is
        shorter than the rule's shortest: no rank can be silent past its deadline before then."""
        if tracker is self._watch_tracker and self._watch_from <= now < self._watch_due:
            return {}
        rule, pace = self._hang_rule, self._pace
        shortest = rule.shortest_deadline_s()
        fixed = rule.timeout_s != AUTO  # the deadline does not depend on a pace
        watched = {}
        due = math.inf if shortest is None else now + shortest
        for rank, state in tracker.ranks.items():
            if state.phase >= Phase.TRAINING and not state.done and not state.exited:
                deadline_s = rule.deadline_s(pace.slowest(rank), **self._hang_facts(state))
                if deadline_s is not None:
                    watched[rank] = Watch(state.last_progress, deadline_s)
                if shortest is not None:
                    own = deadline_s is not None and (fixed or pace.knows(rank))
                    due = min(due, state.last_progress + (deadline_s if own else shortest))
        self._watch_tracker, self._watch_from, self._watch_due = tracker, now, due
        return watched

    def _hang_deadline(self, tracker: AttemptTracker, rank: int) -> tuple[float, str]:
        """How long hung `rank` could stay silent, and how that was set (for its failure message)."""
        slowest, facts = self._pace.slowest(rank), self._hang_facts(tracker.ranks[rank])
        return self._hang_rule.deadline_s(slowest, **facts) or 0.0, self._hang_rule.explain(slowest, **facts)

    @staticmethod
    def _hang_facts(state: RankState) -> dict[str, bool]:
        return {"starting": state.last_round is None, "uploading": state.phase is Phase.CHECKPOINT_UPLOAD}

    def _reject_stale(self, event: ev.RunEvent) -> None:
        if isinstance(event, ev.WorkerConnected):
            # A worker of an earlier attempt: end its stream so it exits.
            self._hub.close_worker(event.attempt, event.rank)
        logger.debug("ignoring %s of a stale attempt", type(event).__name__)

    def _on_agent_lost(self, event: ev.AgentLost) -> None:
        if self._loop.state.is_terminal or event.node_id in self._lost_nodes:
            return
        self._lost_nodes[event.node_id] = event.reason
        self._backoff.failed(event.node_id, self._clock())
        if self._group is not None:
            self._group.tracker.on_node_lost(event.node_id, event.reason, self._clock())
        if self._loop.state is not RunState.STOPPING:
            logger.warning("node %s lost: %s", event.node_id, event.reason)

    # ------------------------------------------------------------------ outcome

    def _outcome(self) -> RunOutcome:
        state = self._loop.state
        if self._group is None:  # no attempt started: the agents did not come up
            return RunOutcome(state=state, attempt=self._loop.attempt, last_metrics=None,
                              error_message=self._loop.reason)
        tracker = self._group.tracker
        failures = tuple(tracker.failures())
        message = ""
        if failures:
            hint = (f"The failure budget is spent (FailureConfig.max_failures="
                    f"{self._spec.failure_policy.max_failures}); raise it to retry more often. "
                    f"Worker logs: {self._spec.run_path}/logs/attempt_{tracker.attempt}/")
            message = render_failures(list(failures), tracker.attempt, hint)
        if self._start_error:
            message = f"{message}\n\nNo restart was possible: {self._start_error}"
        return RunOutcome(
            state=state, attempt=tracker.attempt, last_metrics=self._commits.history.last_metrics,
            metrics_history=tuple(self._commits.history.metrics), failures=failures,
            exceptions=tracker.exc_pickles(), error_message=message,
            return_value=self._commits.history.return_value,
        )


def _attempt_of(event: ev.RunEvent) -> Optional[int]:
    """The attempt an event belongs to (reports are judged one by one, in `_on_reports`)."""
    return getattr(event, "attempt", None)


@contextlib.contextmanager
def _sigint_noted(note: Callable[[], None]):
    """While the loop runs on the main thread with Python's default SIGINT handling, Ctrl-C only calls
    `note` (the loop acts on it at its next turn) instead of raising KeyboardInterrupt wherever the
    thread happens to be, which could cut an action in half. A third press raises at once, for a
    teardown that is itself stuck."""
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
        yield
        return
    presses = 0

    def on_sigint(signum, frame):
        nonlocal presses
        presses += 1
        if presses >= 3:
            raise KeyboardInterrupt
        note()

    signal.signal(signal.SIGINT, on_sigint)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _root_cause_text(tracker: AttemptTracker) -> str:
    """One line naming the attempt's root-cause failure, for the log and the run state."""
    return render_failures(tracker.failures(), tracker.attempt).splitlines()[1].removeprefix("Root cause: ")
