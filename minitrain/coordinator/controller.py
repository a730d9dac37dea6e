"""The controller: the one owner of a run's lifecycle, as one stepped loop, and only that loop.

It runs on the thread that called `fit()`; servicer threads put facts (events, coordinator/facts/events.py)
into its queue. Each turn (`step`) it
- takes every queued event (waiting for the first up to the next moment a deadline can pass: see
  `_next_wait`) and routes it by type, through one
  table, to where it is recorded: the current attempt's events to `CurrentAttempt` (its `WorkerGroup`
  and tracker, the `Commits`, the `HangWatch`, the observers), the agents' to `Membership`;
- sees what is now true (`Seen`) and asks the pure `decide()` what happens next;
- executes the returned actions, routed by type through a second table: a move of the run's state
  is checked (`run_state.check_move`), explained in the log (`outcome.log_move`) and told to the
  observers' `on_state`; the attempt's start (placing its ranks), stop, stacks and streams go to its
  `WorkerGroup`; agent relaunches to `Membership`.
How many workers an attempt gets and where, and an elastic run's resizes, are `AttemptSizes`'
(coordinator/sizing.py).
The run's state is the loop's (`Loop.state`, coordinator/policy/loop.py), held nowhere else. Nothing
else decides to retry or give up, and nothing here waits in a loop of its own: a stop, a drain, the wait
for agents and for stacks are waits of the one loop, with deadlines. When the loop is over the agents are shut down,
the history saved, and the outcome (`outcome.run_outcome`) told to `on_run_end`.
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping, Optional, Protocol, Sequence, Union

from minitrain.commands import Shutdown
from minitrain.coordinator.current_attempt import CurrentAttempt
from minitrain.coordinator.facts import events as ev
from minitrain.coordinator.facts.commits import CheckpointBook, Commits
from minitrain.coordinator.policy.actions import (
    AgreePreemption, CloseStreams, CollectStacks, DeclareHung, DropDeadAgents, ForgetAgents, MoveTo, PrepareForkServers,
    RelaunchAgents, StartAttempt, StopWorkers,
)
from minitrain.coordinator.facts.hang_watch import HangWatch
from minitrain.coordinator.facts.membership import AgentHandles, HostBackoff, Membership
from minitrain.coordinator.facts.metrics_log import MetricsLog
from minitrain.coordinator.facts.outbox import Outbox
from minitrain.coordinator.facts.preemption import DRIVER, Preemption
from minitrain.coordinator.facts.worker_group import LaunchSettings, WorkerGroup
from minitrain.coordinator.observers import Observers, RunInfo, RunObserver
from minitrain.coordinator.outcome import (
    failed_attempt, log_late, log_move, run_outcome, stopped_without_progress, was_preempted,
)
from minitrain.coordinator.policy.decide import decide
from minitrain.coordinator.policy.elastic import Sizing
from minitrain.coordinator.policy.hangs import AUTO_FLOOR_S, HangRule
from minitrain.coordinator.policy.loop import Action, LogLate, Loop, Rules, Seen, Wait
from minitrain.coordinator.preemption_signals import preemption_noted
from minitrain.coordinator.sigint import sigint_noted
from minitrain.coordinator.sizing import AttemptSizes
from minitrain.errors import ConfigError, render_failed_attempts
from minitrain.records import FailedAttempt, RunOutcome
from minitrain.run_state import IllegalTransition, RunState, check_move

logger = logging.getLogger("minitrain")

POLL_S = 0.05  # the longest the loop waits for an event while a wait's deadline may pass unannounced
# ... and while an attempt of a fixed-size run starts or trains (Wait.WORKERS), where every fact decide()
# reads arrives as an event but the hang clocks, whose next due moment the hang watch knows: a bound, not a
# poll (each turn of an idle loop cost the driver ~0.3 ms of CPU, 20 turns a second at POLL_S).
IDLE_WAIT_S = 1.0


class FailureLimits(Protocol):
    """The part of FailureConfig the controller reads (limits; what they mean is `Rules`' and `HangRule`'s):
    the failure budget and the stop grace (through `Rules.from_config`, which also reads the preemption
    settings a FailureConfig has) and the hang deadlines (through `HangRule`)."""

    max_failures: int
    worker_stop_grace_s: float
    worker_hang_timeout_s: Union[float, str, None]
    worker_hang_floor_s: Optional[float]


@dataclass(frozen=True)
class RunSpec:
    """Everything the controller needs to run one `fit()`; built by the trainer. `launch` is what
    every worker of every attempt is told (its experiment name and run path name the run too)."""

    run_id: str
    num_workers: int
    node_ids: tuple[str, ...]
    launch: LaunchSettings
    failure_limits: FailureLimits
    gpus_per_worker: float = 0.0
    cpus_per_worker: float = 1.0
    placement_strategy: str = "PACK"
    node_slots: Mapping[str, Optional[int]] = field(default_factory=dict)
    # Nodes whose lost agent is replaced at once, without a remote host's backoff: this machine's, and a
    # Slurm allocation's (ClusterConfig.replaced_at_once).
    local_node_ids: frozenset = frozenset()
    agent_start_timeout_s: float = 60.0
    # An elastic run's sizing (ScalingConfig(num_workers=(min, max))), read by `Rules`: `num_workers` is then
    # the max. None for a fixed size.
    sizing: Optional[Sizing] = None


class Controller:
    """Runs attempts until the run succeeds, fails past its budget, or is aborted."""

    def __init__(self, spec: RunSpec, outbox: Outbox, events: "queue.SimpleQueue[ev.RunEvent]",
                 agents: AgentHandles, checkpoints: CheckpointBook, metrics_log: MetricsLog,
                 clock: Callable[[], float] = time.time, observers: Sequence[RunObserver] = ()):
        self._spec = spec
        self._observers = Observers(observers)
        self._commits = Commits(checkpoints, metrics_log, outbox, clock, self._observers)
        self._outbox = outbox
        self._events = events
        self._clock = clock
        limits = spec.failure_limits
        self._rules = Rules.from_config(limits, agent_start_timeout_s=spec.agent_start_timeout_s, sizing=spec.sizing)
        backoff = None
        if self._rules.elastic:  # lost hosts are probed again once per resize interval
            backoff = HostBackoff(spec.sizing.resize_interval_s, spec.sizing.resize_interval_s)
        self._hangs = HangWatch(HangRule(timeout_s=limits.worker_hang_timeout_s,
                                         floor_s=limits.worker_hang_floor_s or AUTO_FLOOR_S))
        self._loop = Loop()
        self._membership = Membership(spec.node_ids, spec.local_node_ids, agents, clock, backoff)
        self._sizes = AttemptSizes(spec, self._rules, self._membership, outbox, self._observers, clock)
        self._current = CurrentAttempt(self._commits, self._hangs, self._observers, outbox, clock)
        self._preemption = Preemption(outbox, clock, self._rules.preempt_timeout_s)
        self._start_error = ""  # why the last start could not place the workers
        self._config_error: Optional[ConfigError] = None  # an unsatisfiable request: raised from run()
        self._interrupts = 0  # Ctrl-C presses not yet given to decide()
        self._failed_attempts: list[FailedAttempt] = []  # the attempts over that failed, for the end of the run
        self._handlers = self._event_table()
        self._executors = self._action_table()

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
        self.begin()
        # A preemption signal during the teardown is noted and ignored (the run is ending anyway), rather
        # than killing the driver by its default action before the index is written.
        with preemption_noted(self._preemption_signals(), self.preempt):
            try:
                with sigint_noted(self.interrupt):
                    self._run_loop()
            finally:
                self._tear_down()
        return self._conclude()

    def begin(self) -> None:
        """Tell the observers the run starts (`run()` does; so does a test that steps the loop)."""
        spec = self._spec
        self._observers.on_run_start(RunInfo(spec.run_id, spec.launch.experiment_name, spec.launch.run_path,
                                             spec.num_workers, self._clock(), request_stacks=self.request_stacks))

    def end(self) -> RunOutcome:
        """After the last step of a test that steps the loop: what `run()` does once its loop is over."""
        self._tear_down()
        return self._conclude()

    def _tear_down(self) -> None:
        self._await_durability()
        self._shutdown_agents()
        if was_preempted(self._loop):  # counted against max_preemption_failures by the next fit()
            self._commits.checkpoints.note_preemption()
        self._commits.persist()
        self._commits.delete_uncommitted()

    def _conclude(self) -> RunOutcome:
        spec = self._spec
        self._note_failed_attempt(charged=True)
        outcome = run_outcome(self._loop, self._current.tracker, self._commits.history,
                              max_failures=spec.failure_limits.max_failures, run_path=spec.launch.run_path,
                              start_error=self._start_error, preemption=self._preemption,
                              failed_attempts=tuple(self._failed_attempts),
                              no_progress=stopped_without_progress(self._loop, self._rules),
                              last_round=self._commits.last_round,
                              not_durable=tuple(self._commits.durability.lost_after(self._latest_durable())))
        if outcome.state is RunState.SUCCEEDED and self._failed_attempts:
            logger.warning("the run succeeded after %d failed attempt(s):\n%s", len(self._failed_attempts),
                           render_failed_attempts(self._failed_attempts))
        self._current.end(restarting=False)
        self._observers.on_run_end(outcome)
        if self._loop.interrupts:
            raise KeyboardInterrupt
        if self._config_error is not None:
            raise self._config_error
        return outcome

    def _run_loop(self) -> None:
        wait_s = 0.0
        while not self._loop.finished:
            try:
                wait_s = self.step(wait_s)
            except KeyboardInterrupt:  # SIGINT while someone else's handler raises it: same meaning
                self.interrupt()
                wait_s = 0.0

    @property
    def finished(self) -> bool:
        """The run reached a terminal state and its loop is over."""
        return self._loop.finished

    def step(self, wait_s: float = 0.0) -> float:
        """One turn of the loop: record every queued event (waiting up to `wait_s` for the first), see
        what is true, ask `decide()` and execute its actions. Returns how long the next turn may wait
        for an event. `run()` loops on it; tests call it to drive the controller turn by turn."""
        self._take_events(wait_s)
        now = self._clock()  # one instant for what is seen and for the decision on it
        decision = decide(self._loop, self._observe(now), now, self._rules)
        waiting_for = self._loop.waiting_for
        previous, self._loop = self._loop.state, decision.loop
        self._act(previous, decision.actions)
        # Look again at once after acting or entering a wait (it may already be over: the processes all
        # exited, so are their streams' ends in? Waiting POLL_S there cost every restart 50 ms);
        # otherwise wait for news.
        if decision.actions or decision.loop.waiting_for is not waiting_for:
            return 0.0
        return self._next_wait(now)

    def _next_wait(self, now: float) -> float:
        """How long the next turn may wait for an event, seen at `now` after a turn that did nothing.

        While an attempt of a fixed-size run starts or trains (Wait.WORKERS), `decide` changes its mind
        only on an event (a failure, a phase, an exit, a signal, Ctrl-C: `interrupt` queues one) or on a
        hang clock, and the hang watch knows the earliest moment one can run out (`HangWatch.due`): the
        loop sleeps until then, at most IDLE_WAIT_S. Every other wait has a deadline of its own, and an
        elastic run's intervals run on the membership's clock: those look every POLL_S."""
        loop, group = self._loop, self._current.group
        if loop.waiting_for is not Wait.WORKERS or self._rules.elastic or group is None:
            return POLL_S
        return min(IDLE_WAIT_S, max(POLL_S, self._hangs.due(group.tracker) - now))

    def request_stacks(self, rank: int) -> None:
        """Any thread: ask `rank` of the current attempt for its stacks; they reach the observers'
        `on_stacks` (and the rank's log). The loop acts on it within one turn."""
        self._events.put(ev.StacksWanted(rank))

    def preempt(self, signal_name: str) -> None:
        """What a preemption signal to the driver does (its handler calls it): queues the fact, which
        wakes the loop at once (SimpleQueue.put may be called from a signal handler)."""
        self._events.put(ev.PreemptionSignalled(DRIVER, signal_name, self._clock()))

    def _preemption_signals(self) -> tuple[str, ...]:
        return tuple(getattr(self._spec.failure_limits, "preemption_signals", ()))

    def interrupt(self) -> None:
        """What Ctrl-C does (the SIGINT handler calls it): queues the fact, which wakes the loop at once
        (the workers are stopped gracefully, the run ends ABORTED, `run()` raises KeyboardInterrupt)."""
        self._events.put(ev.Interrupted())

    def _on_interrupted(self, event: ev.Interrupted) -> None:
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
        membership = self._membership
        missing = membership.missing()
        interrupted, self._interrupts = self._interrupts > 0, 0
        preempted, preempted_again = self._preemption.take_new()
        seen = Seen(agents_missing=missing, agents_failed=membership.failed_to_start(missing),
                    lost_nodes=bool(membership.lost), start_error=self._start_error, interrupted=interrupted,
                    preempted=preempted, preempted_again=preempted_again)
        group = self._current.group
        seen = self._sizes.seen(seen, group, self._loop.judging, self._commits.checkpoints_committed)
        if group is None:
            return seen
        tracker = group.tracker
        preempt_reached = False
        if self._loop.waiting_for is Wait.PREEMPT:  # a scan of the ranks: only while a preemption is agreed
            self._preemption.settle(tracker)
            preempt_reached = self._preemption.reached(tracker)
        failed = tracker.failed()
        return dataclasses.replace(
            seen, has_attempt=True, failed=failed, finished=tracker.finished(),
            all_training=tracker.all_training(), all_exited=tracker.all_exited(),
            all_drained=tracker.all_drained(), stacks_answered=group.stacks_answered(),
            watched=self._hangs.watched(tracker, now),
            # a scan of the ranks: only while a failed attempt is not being stopped yet
            round_pending=failed and not tracker.stop_requested and tracker.round_pending(),
            root_cause=tracker.root_cause_line(), preempt_reached=preempt_reached,
            progressed=self._commits.progressed)

    # ------------------------------------------------------------------ actions

    def _act(self, previous: RunState, actions: Sequence[Action]) -> None:
        """Execute a decision's actions in order; `previous` is the state the decision started from.
        Its moves must lead from there to the loop's state."""
        executors = self._executors
        for action in actions:
            if type(action) is MoveTo:
                self._move(previous, action)
                previous = action.state
            else:
                executors[type(action)](action)
        if previous is not self._loop.state:
            raise IllegalTransition(f"decide's moves end in {previous.value}, its loop in "
                                    f"{self._loop.state.value}")

    def _action_table(self) -> dict[type, Callable[[Action], None]]:
        """Each action type's executor but MoveTo's (`_move`, which needs the state moved from). The
        attempt's actions do nothing when no attempt was started."""
        membership, on_group, hangs = self._membership, self._on_group, self._hangs
        return {
            StartAttempt: lambda action: self._start(action.attempt, action.resize),
            DropDeadAgents: lambda action: membership.drop_dead(),
            RelaunchAgents: lambda action: membership.relaunch_lost(),
            ForgetAgents: lambda action: membership.forget_relaunched(action.reason),
            LogLate: lambda action: log_late(action.waiting_for, self._current.tracker, self._rules.stack_wait_s,
                                             self._rules.catch_up_s),
            StopWorkers: on_group(lambda group, action: group.stop(action.grace_s)),
            CollectStacks: on_group(lambda group, action: group.collect_stacks()),
            DeclareHung: on_group(lambda group, action: group.declare_hung(
                action.ranks, {r: hangs.deadline(group.tracker, r) for r in action.ranks})),
            CloseStreams: on_group(lambda group, action: group.close_streams()),
            PrepareForkServers: on_group(lambda group, action: group.prepare_fork_servers()),
            AgreePreemption: on_group(lambda group, action: self._preemption.notify(group.tracker)),
        }

    def _on_group(self, execute: Callable[[WorkerGroup, Action], None]) -> Callable[[Action], None]:
        """`execute(group, action)` on the current attempt's group, if one was started."""
        def run(action: Action) -> None:
            group = self._current.group
            if group is not None:
                execute(group, action)
        return run

    def _move(self, previous: RunState, move: MoveTo) -> None:
        """Check a move of the run's state, say why it happens, and tell the observers (an attempt that
        is restarted is over before its restart is told)."""
        loop = self._loop
        check_move(previous, move.state, move.target, heading=loop.target)
        if move.state is RunState.STARTING and previous is RunState.RESTARTING:
            self._note_failed_attempt(charged=not loop.resize)  # a resize's failures (a lost node) are not charged
            self._current.end(restarting=True)
        log_move(previous, move, loop, self._current.tracker, self._rules, self._start_error)
        self._observers.on_state(previous, move.state, move.reason, loop.attempt)

    def _note_failed_attempt(self, charged: bool) -> None:
        """Keep the record of the latest attempt, once, if it failed (before the next one starts, or at the
        end of the run), with whether it made progress (the commits are still its)."""
        tracker = self._current.tracker
        if tracker is None or (self._failed_attempts and self._failed_attempts[-1].attempt == tracker.attempt):
            return
        record = failed_attempt(tracker, self._commits.progressed, charged)
        if record is not None:
            self._failed_attempts.append(record)

    def _start(self, attempt: int, resize: str = "") -> None:
        """Place the ranks of `attempt` on the nodes that are in (as many as `AttemptSizes.placed` says),
        and start them; `resize`: why an elastic run restarts without a charged failure, if it does."""
        nodes = self._membership.usable()
        try:
            assignments = self._sizes.placed(nodes)
        except ConfigError as exc:
            if not self._membership.lost:  # the request itself is unsatisfiable: never retried
                self._config_error = exc
                self._start_error = str(exc)
                return
            lost = self._membership.lost_text()
            self._start_error = f"the hosts that remain cannot hold the run after losing {lost}: {exc}"
            logger.error("cannot start attempt %d: %s", attempt, self._start_error)
            return
        self._start_error = ""
        if self._commits.durability.restore_needs_storage():
            self._await_durability()
        self._membership.attempt_started()
        self._commits.delete_uncommitted()
        previous = self._current.tracker
        self._current.start(attempt, assignments, {n.node_id: n for n in nodes}, self._spec.launch)
        self._sizes.started(attempt, resize, previous, self._current.tracker)

    def _latest_durable(self) -> Optional[int]:
        latest = self._commits.checkpoints.latest
        return None if latest is None else latest.report_index

    def _await_durability(self) -> None:
        """Wait until every round committed in memory is durable, taking events meanwhile (the agents'
        answers, and their losses: a lost holder loses its rounds by name). Before the agents are shut
        down, however the run ended, and before an attempt whose checkpoint no one node holds whole
        (`Durability.restore_needs_storage`). Bounded by the agents' persistence retries and leases."""
        durability = self._commits.durability
        while durability.pending and not self._interrupts:  # Ctrl-C: the loop acts on it at once
            self._take_events(POLL_S)

    def _shutdown_agents(self) -> None:
        preempted = was_preempted(self._loop)
        for node_id in list(self._membership.nodes):
            self._outbox.to_agent(node_id, Shutdown(reason="run preempted" if preempted else "run ended",
                                                 preempted=preempted))

    # ------------------------------------------------------------------ events

    def _event_table(self) -> dict[type, Callable[[ev.RunEvent], None]]:
        """Each event type's handler: the current attempt's events are recorded by `CurrentAttempt`,
        the agents' by the membership."""
        return {**self._current.handlers(), ev.AgentConnected: self._on_agent_connected,
                ev.ShardsPersisted: self._commits.durability.on_persisted,
                ev.ReplicaReady: self._on_replica_ready,
                ev.AgentLost: self._on_agent_lost, ev.NodeWarmed: self._sizes.warmed,
                ev.Interrupted: self._on_interrupted,
                ev.PreemptionSignalled: self._preemption.signalled,
                ev.PreemptionSeen: self._preemption.seen}

    def _handle(self, event: ev.RunEvent) -> None:
        self._handlers[type(event)](event)

    def _on_agent_connected(self, event: ev.AgentConnected) -> None:
        """A node's agent connected (again): it is in the membership, and an elastic run readies it for
        growth when an attempt runs without it (`AttemptSizes.connected`)."""
        self._membership.connected(event)
        self._commits.durability.node_returned(event.node.node_id)  # a new agent: a new, empty tier
        attempt_runs = self._loop.state in (RunState.STARTING, RunState.RUNNING)
        self._sizes.connected(event.node, self._current.group, attempt_runs)

    def _on_replica_ready(self, event: ev.ReplicaReady) -> None:
        """A node's tier takes replicas: on its address (the one on its route to the coordinator)."""
        node = self._membership.nodes.get(event.node_id)
        if node is not None:
            self._commits.durability.replica_ready(event.node_id, node.address, event.port)

    def _on_agent_lost(self, event: ev.AgentLost) -> None:
        """A node is out of the run (once, and not after the run ended): its ranks are lost with it."""
        current = self._membership.is_current(event)
        lost = not self.state.is_terminal and self._membership.lose(event)
        if lost:
            self._sizes.node_lost(event.node_id, event.reason, self._current.tracker)
            self._current.node_lost(event.node_id, event.reason)  # first: the node's loss is the root cause
        if current:  # its tier went with its agent; also at the end, where the run waits for its rounds
            self._commits.durability.node_lost(event.node_id)
        if not lost:
            return
        if self.state is not RunState.STOPPING:
            logger.warning("node %s lost: %s", event.node_id, event.reason)
