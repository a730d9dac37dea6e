"""The controller: the one owner of a run's lifecycle.

It runs on the thread that called `fit()`. Servicer threads put facts (events) into its queue; the
controller alone moves the run between states (through `RunStateMachine`), starts and stops attempts,
and applies the failure budget. Nothing else decides to retry or give up.
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping, Optional, Protocol, Sequence

from minitrain.coordinator import events as ev
from minitrain.coordinator.attempt import AttemptTracker
from minitrain.coordinator.hangs import waits_in_collective
from minitrain.coordinator.commits import CheckpointBook, Commits, ReportObserver
from minitrain.coordinator.metrics_log import MetricsLog
from minitrain.coordinator.policy import HostBackoff, RemainingHostsTooSmall
from minitrain.coordinator.ranks import assign_ranks
from minitrain.coordinator.service import Hub
from minitrain.coordinator.states import RunState, RunStateMachine
from minitrain.errors import ConfigError, LaunchError, render_failures
from minitrain.records import FailureKind, NodeInfo, Phase, RunOutcome, WorkerAssignment, WorkerFailure
from minitrain.rpc import convert
from minitrain.rpc._gen import minitrain_pb2 as pb

logger = logging.getLogger("minitrain")

POLL_S = 0.05
STACK_WAIT_S = 5.0  # the agents wait up to 2 s for each dump
STOP_MARGIN_S = 10.0  # on top of the grace: SIGKILL plus the agents' bounded waits
DRAIN_S = 5.0  # after the processes exited, for their streams' last messages (normally milliseconds)


class FailurePolicy(Protocol):
    """The part of FailureConfig the controller uses."""

    max_failures: int
    worker_stop_grace_s: float
    worker_hang_timeout_s: Optional[float]

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


class Controller:
    """Runs attempts until the run succeeds, fails past its budget, or is aborted."""

    def __init__(self, spec: RunSpec, hub: Hub, events: "queue.SimpleQueue[ev.RunEvent]",
                 agents: AgentHandles, checkpoints: CheckpointBook, metrics_log: MetricsLog,
                 clock: Callable[[], float] = time.time, observers: Sequence[ReportObserver] = ()):
        self._spec = spec
        self._checkpoints = checkpoints
        self._commits = Commits(checkpoints, metrics_log, hub, clock, observers)
        self._hub = hub
        self._events = events
        self._agents = agents
        self._clock = clock
        self._machine = RunStateMachine(clock)
        self._nodes: dict[str, NodeInfo] = {}
        self._streams: dict[str, int] = {}  # node_id -> its agent's current stream
        self._lost_nodes: dict[str, str] = {}
        self._backoff = HostBackoff()
        self._stack_dumps: dict[int, str] = {}
        self._tracker: Optional[AttemptTracker] = None
        self._attempt = 0
        self._failures = 0

    @property
    def state(self) -> RunState:
        """The current run state."""
        return self._machine.state

    # ------------------------------------------------------------------ the run

    def run(self) -> RunOutcome:
        """Drive the run to a terminal state and describe how it ended.

        KeyboardInterrupt: the workers are stopped gracefully (a second interrupt skips the grace),
        the run ends ABORTED, and the interrupt is re-raised.
        """
        try:
            self._machine.move(RunState.LAUNCHING, "starting node agents", 0)
            self._wait_for_agents()
            return self._run_attempts()
        except KeyboardInterrupt:
            self._abort("interrupted by the user (Ctrl-C)")
            raise
        except LaunchError as exc:
            self._stop(RunState.FAILED, str(exc))
            return RunOutcome(state="FAILED", attempt=self._attempt, last_metrics=None,
                              error_message=str(exc))
        except ConfigError as exc:  # an unsatisfiable request: fail at once with the reason, never retry
            self._stop(RunState.FAILED, str(exc))
            raise
        finally:
            self._shutdown_agents()
            self._persist()
            self._delete_garbage()

    def _persist(self) -> None:
        """Keep the metrics history and the report counter, however the run ended."""
        try:
            self._commits.persist()
        except Exception as exc:  # the run's own outcome matters more; say what was not saved
            logger.error("could not save the run's metrics history or index: %s", exc)

    def _run_attempts(self) -> RunOutcome:
        while True:
            self._machine.move(RunState.STARTING, f"starting attempt {self._attempt}", self._attempt)
            try:
                tracker = self._start_attempt()
            except RemainingHostsTooSmall as exc:
                logger.error("cannot start attempt %d: %s", self._attempt, exc)
                self._stop(RunState.FAILED, str(exc))
                outcome = self._outcome("FAILED", self._tracker)
                return dataclasses.replace(outcome, error_message=f"{outcome.error_message}\n\n"
                                                                  f"No restart was possible: {exc}")
            self._supervise(tracker)
            if not tracker.failed():
                self._stop(RunState.SUCCEEDED, "every rank finished")
                return self._outcome("SUCCEEDED", tracker)
            self._failures += 1
            logger.warning("attempt %d: %s; stopping every rank of the attempt", tracker.attempt,
                           _root_cause_text(tracker))
            self._stop_attempt(tracker, self._spec.failure_policy.worker_stop_grace_s)
            # Failures learned during the stop (a lost node, say) can be the real cause: judge again.
            root = _root_cause_text(tracker)
            policy = self._spec.failure_policy
            if policy.allows_retry(self._failures):
                left = policy.retries_left(self._failures)
                logger.warning("attempt %d failed (%s); restarting as attempt %d (failure %d, max_failures=%d, "
                               "%s)", tracker.attempt, root, tracker.attempt + 1, self._failures,
                               policy.max_failures, "unlimited retries" if left is None else f"{left} retries left")
                self._machine.move(RunState.RESTARTING, root, self._attempt)
                self._attempt += 1
                continue
            logger.error("attempt %d failed (%s); failure budget spent (max_failures=%d)",
                         tracker.attempt, root, policy.max_failures)
            self._stop(RunState.FAILED, root)
            return self._outcome("FAILED", tracker)

    # ------------------------------------------------------------------ launching

    def _wait_for_agents(self) -> None:
        deadline = self._clock() + self._spec.agent_start_timeout_s
        expected = set(self._spec.node_ids) - set(self._lost_nodes)
        while not expected.issubset(self._nodes):
            dead = {n: why for n, why in self._agents.dead_agents().items() if n not in self._nodes}
            if dead:
                raise LaunchError("node agent(s) failed to start: " +
                                  "; ".join(f"{n}: {why}" for n, why in sorted(dead.items())))
            if self._clock() > deadline:
                missing = ", ".join(sorted(expected - set(self._nodes)))
                raise LaunchError(f"node agent(s) {missing} did not connect within "
                                  f"{self._spec.agent_start_timeout_s:g} s")
            self._next_event()

    def _relaunch_lost_agents(self) -> None:
        """Before a new attempt: replace lost agents on this machine at once; re-admit a lost remote
        host only after its backoff (it may be gone for good), and keep it out if it fails again."""
        now = self._clock()
        retry = [n for n in self._lost_nodes
                 if n in self._spec.local_node_ids or self._backoff.may_retry(n, now)]
        for node_id in retry:
            if self._agents.relaunch(node_id):
                logger.warning("node %s: starting a new agent (the old one was lost: %s)", node_id,
                               self._lost_nodes[node_id])
                self._nodes.pop(node_id, None)
                del self._lost_nodes[node_id]
        try:
            self._wait_for_agents()
        except LaunchError as exc:
            for node_id in retry:
                if node_id not in self._nodes:
                    self._agents.forget(node_id)
                    self._lost_nodes[node_id] = f"it did not come back ({exc})"
                    self._backoff.failed(node_id, self._clock())

    def _start_attempt(self) -> AttemptTracker:
        if self._lost_nodes:
            self._relaunch_lost_agents()
        nodes = [self._nodes[n] for n in self._spec.node_ids if n not in self._lost_nodes and n in self._nodes]
        try:
            assignments = assign_ranks(nodes, self._spec.num_workers, self._spec.gpus_per_worker,
                                       self._spec.placement_strategy, self._spec.cpus_per_worker,
                                       dict(self._spec.node_slots))
        except ConfigError as exc:
            if not self._lost_nodes:
                raise
            lost = "; ".join(f"{n} ({why})" for n, why in sorted(self._lost_nodes.items()))
            raise RemainingHostsTooSmall(f"the hosts that remain cannot hold the run after losing {lost}: "
                                         f"{exc}") from None
        self._delete_garbage()
        names = {n.node_id: n.hostname for n in nodes}
        tracker = AttemptTracker.create(self._attempt, assignments, names)
        self._tracker = tracker
        self._commits.start_attempt(len(assignments))
        by_node: dict[str, list[WorkerAssignment]] = {}
        for assignment in assignments:
            by_node.setdefault(assignment.node_id, []).append(assignment)
        for node_id, node_assignments in by_node.items():
            command = pb.AgentCommand(start=pb.StartWorkers(
                attempt=self._attempt,
                workers=[pb.WorkerLaunch(rank=a.rank, local_rank=a.local_rank) for a in node_assignments],
                cwd=self._spec.cwd,
                env=self._node_env(self._nodes[node_id], node_assignments),
            ))
            if not self._hub.send_to_agent(node_id, command):
                tracker.on_node_lost(node_id, "its stream closed before the workers started", self._clock())
        logger.info("attempt %d: starting %d worker(s) on %d node(s)", self._attempt,
                    len(assignments), len(by_node))
        return tracker

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

    def _node_env(self, node: NodeInfo, assignments: list[WorkerAssignment]) -> dict[str, str]:
        env = dict(self._spec.worker_env)
        # Collective traffic goes over the interface that reaches the other nodes, unless the user chose.
        if node.ifname:
            for name in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
                env.setdefault(name, node.ifname)
        # torchrun's default: one OpenMP thread per worker when several share a node, unless set.
        if len(assignments) > 1 and "OMP_NUM_THREADS" not in env:
            env["OMP_NUM_THREADS"] = "1"
        indices = sorted({i for a in assignments for i in a.gpu_ids})
        if indices:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(node.gpu_ids[i]) for i in indices)
        return env

    # ------------------------------------------------------------------ supervising

    def _supervise(self, tracker: AttemptTracker) -> None:
        """Handle events until every rank finished or one failed (a hang counts as a failure)."""
        hang_timeout = self._spec.failure_policy.worker_hang_timeout_s
        while not tracker.failed() and not tracker.finished():
            self._next_event()
            if self._machine.state is RunState.STARTING and tracker.all_training():
                self._machine.move(RunState.RUNNING, "every rank is training", tracker.attempt)
                self._prepare_fork_servers(tracker)
            if hang_timeout:
                self._check_hangs(tracker, hang_timeout)

    def _prepare_fork_servers(self, tracker: AttemptTracker) -> None:
        """A fork server on each node makes a restart cheap; keep one only when a restart may come."""
        if not self._spec.failure_policy.allows_retry(self._failures + 1):
            return
        per_node: dict[str, int] = {}
        for state in tracker.ranks.values():
            per_node[state.assignment.node_id] = per_node.get(state.assignment.node_id, 0) + 1
        for node_id, count in per_node.items():
            self._hub.send_to_agent(node_id, pb.AgentCommand(prepare_fork_servers=pb.PrepareForkServers(count=count)))

    def _check_hangs(self, tracker: AttemptTracker, timeout_s: float) -> None:
        now = self._clock()
        hung = [r for r, s in sorted(tracker.ranks.items())
                if s.phase >= Phase.TRAINING and not s.done and not s.exited
                and now - s.last_progress > timeout_s]
        if not hung:
            return
        dumps = self._collect_stacks(tracker)
        for rank in hung:
            silent = now - tracker.ranks[rank].last_progress
            text = dumps.get(rank) or ("(no stack: the process did not answer SIGUSR1; it is stopped, e.g. by "
                                       "SIGSTOP, or blocked in the kernel)")
            failure = WorkerFailure(
                rank=rank, node=tracker.ranks[rank].node_name, pid=tracker.ranks[rank].pid,
                # Stamped when it last made progress, not when found: the rank that stopped first is
                # the earliest failure, so it is the root cause when several are found in one check.
                phase=tracker.ranks[rank].phase, time=tracker.ranks[rank].last_progress,
                exc_type="WorkerHangError", kind=FailureKind.HANG,
                message=(f"rank {rank} made no progress (no report) for {silent:.1f} s, past "
                         f"FailureConfig.worker_hang_timeout_s={timeout_s:g}; the stacks of every thread of "
                         "every rank are in the logs"),
                traceback=f"Stacks of rank {rank} when it was found hung:\n{text}",
                consequence=waits_in_collective(dumps.get(rank, "")))
            tracker.on_failed(ev.WorkerFailed(tracker.attempt, failure, b""))
        logger.error("attempt %d: rank(s) %s stopped making progress for over %g s", tracker.attempt,
                     ",".join(map(str, hung)), timeout_s)

    def _collect_stacks(self, tracker: AttemptTracker) -> dict[int, str]:
        """Ask every node for every worker's stacks; wait (bounded) for the answers."""
        self._stack_dumps = {}
        alive = {r for r, s in tracker.ranks.items() if not s.exited}
        for node_id in tracker.nodes():
            self._hub.send_to_agent(node_id, pb.AgentCommand(dump_stacks=pb.DumpStacks(attempt=tracker.attempt)))
        deadline = self._clock() + STACK_WAIT_S
        while not alive.issubset(self._stack_dumps) and self._clock() < deadline:
            self._next_event()
            alive = {r for r, s in tracker.ranks.items() if not s.exited}
        return dict(self._stack_dumps)

    def _stop_attempt(self, tracker: AttemptTracker, grace_s: float) -> None:
        """Stop every worker of the attempt and wait (bounded) until each has exited."""
        tracker.stop_requested = True
        for node_id in tracker.nodes():
            command = pb.AgentCommand(stop=pb.StopWorkers(attempt=tracker.attempt, grace_s=grace_s))
            if not self._hub.send_to_agent(node_id, command):
                tracker.on_node_lost(node_id, "its stream is closed", self._clock())
        deadline = self._clock() + grace_s + STOP_MARGIN_S
        while not tracker.all_exited():
            if self._clock() > deadline:
                alive = [r for r, s in tracker.ranks.items() if not s.exited]
                logger.error("ranks %s of attempt %d did not confirm their exit in time", alive,
                             tracker.attempt)
                break
            self._next_event()
        self._drain(tracker)

    def _drain(self, tracker: AttemptTracker) -> None:
        """Handle what the attempt's ranks sent before they ended (reports behind a peer's failure
        complete rounds, and those rounds are committed), then close whatever stream is still open
        (a rank of a lost node may be frozen, not gone): nothing it sends later is read."""
        deadline = self._clock() + DRAIN_S
        while not tracker.all_drained() and self._clock() < deadline:
            self._next_event()
        while True:  # what is already queued, without waiting
            try:
                self._handle(self._events.get_nowait())
            except queue.Empty:
                break
        for rank, state in tracker.ranks.items():
            if state.connected:
                self._hub.close_worker(tracker.attempt, rank)
    def _abort(self, reason: str) -> None:
        tracker = self._tracker
        if not self._machine.state.is_terminal and self._machine.state is not RunState.STOPPING:
            self._machine.move(RunState.STOPPING, reason, self._attempt, target=RunState.ABORTED)
        if tracker is not None and not tracker.all_exited():
            logger.warning("%s: stopping the workers (press Ctrl-C again to kill them at once)", reason)
            try:
                self._stop_attempt(tracker, self._spec.failure_policy.worker_stop_grace_s)
            except KeyboardInterrupt:
                self._stop_attempt(tracker, 0.0)
        if self._machine.state is RunState.STOPPING:
            self._machine.move(RunState.ABORTED, reason, self._attempt)

    def _stop(self, target: RunState, reason: str) -> None:
        self._machine.move(RunState.STOPPING, reason, self._attempt, target=target)
        tracker = self._tracker
        if tracker is not None and not tracker.all_exited():
            self._stop_attempt(tracker, self._spec.failure_policy.worker_stop_grace_s)
        elif tracker is not None:
            self._drain(tracker)
        self._machine.move(target, reason, self._attempt)

    def _shutdown_agents(self) -> None:
        for node_id in list(self._nodes):
            self._hub.send_to_agent(node_id, pb.AgentCommand(shutdown=pb.Shutdown(reason="run ended")))

    # ------------------------------------------------------------------ events

    def _next_event(self) -> None:
        try:
            event = self._events.get(timeout=POLL_S)
        except queue.Empty:
            return
        self._handle(event)

    def _handle(self, event: ev.RunEvent) -> None:
        tracker = self._tracker
        if isinstance(event, ev.ReportReceived):
            report = event.report
            # Also while the attempt is being stopped: a report sent before a peer failed still counts.
            if tracker is not None and report.attempt == tracker.attempt:
                self._commits.on_report(tracker, report)
        elif isinstance(event, ev.AgentConnected):
            self._nodes[event.node.node_id] = event.node
            self._streams[event.node.node_id] = event.stream
        elif isinstance(event, ev.AgentLost):
            if event.stream == self._streams.get(event.node_id, event.stream):
                self._on_agent_lost(event)
        elif isinstance(event, ev.StackDumped):
            if tracker is not None and event.attempt == tracker.attempt:
                self._stack_dumps[event.rank] = event.text
        elif tracker is None or getattr(event, "attempt", tracker.attempt) != tracker.attempt:
            self._reject_stale(event)
        elif isinstance(event, ev.WorkerConnected):
            self._on_worker_connected(tracker, event)
        elif isinstance(event, ev.StoreReady):
            tracker.rendezvous = (event.address, event.port)
            for rank, state in tracker.ranks.items():
                if state.connected:
                    self._send_rendezvous(tracker, rank)
        elif isinstance(event, ev.WorkerPhaseChanged):
            tracker.on_phase(event)
            if event.rank in tracker.ranks:
                tracker.ranks[event.rank].last_progress = self._clock()
            ack = pb.WorkerCommand(phase_ack=pb.PhaseAck(phase=int(event.phase)))
            self._hub.send_to_worker(event.attempt, event.rank, ack)
        elif isinstance(event, ev.WorkerSpawned):
            tracker.on_spawned(event)
        elif isinstance(event, ev.WorkerDone):
            tracker.on_done(event)
            self._commits.on_done(tracker, event)
            if all(s.done for s in tracker.ranks.values()):
                self._hub.send_to_worker(tracker.attempt, 0, pb.WorkerCommand(release=pb.Release()))
        elif isinstance(event, ev.CheckpointsRequested):
            self._commits.request_checkpoint_list(event)
        elif isinstance(event, ev.WorkerStreamClosed):
            tracker.on_stream_closed(event)
        elif isinstance(event, ev.WorkerFailed):
            tracker.on_failed(event)
        elif isinstance(event, ev.WorkerExited):
            tracker.on_exited(event)

    def _reject_stale(self, event: ev.RunEvent) -> None:
        if isinstance(event, ev.WorkerConnected):
            # A worker of an earlier attempt: end its stream so it exits.
            self._hub.close_worker(event.attempt, event.rank)
        logger.debug("ignoring %s of a stale attempt", type(event).__name__)

    def _on_agent_lost(self, event: ev.AgentLost) -> None:
        if self._machine.state.is_terminal or event.node_id in self._lost_nodes:
            return
        self._lost_nodes[event.node_id] = event.reason
        self._backoff.failed(event.node_id, self._clock())
        if self._tracker is not None:
            self._tracker.on_node_lost(event.node_id, event.reason, self._clock())
        if self._machine.state is not RunState.STOPPING:
            logger.warning("node %s lost: %s", event.node_id, event.reason)

    def _on_worker_connected(self, tracker: AttemptTracker, event: ev.WorkerConnected) -> None:
        if event.rank not in tracker.ranks or tracker.stop_requested:
            self._hub.close_worker(event.attempt, event.rank)
            return
        tracker.on_connected(event)
        state = tracker.ranks[event.rank]
        rank0_node = self._nodes[tracker.ranks[0].assignment.node_id]
        message = convert.assignment_message(
            state.assignment, experiment_name=self._spec.experiment_name, backend=self._spec.backend,
            dist_timeout_s=self._spec.dist_timeout_s, payload=self._spec.payload,
            store_address=rank0_node.address, storage_path=self._spec.run_path,
        )
        latest = self._checkpoints.latest
        message.initial_checkpoint_dir = latest.dir_name if latest is not None else ""
        message.report_index_base = self._commits.report_base
        message.committed_dir_names.extend(sorted(self._checkpoints.committed_dir_names))
        self._hub.send_to_worker(tracker.attempt, event.rank, pb.WorkerCommand(assignment=message))
        if tracker.rendezvous is not None:
            self._send_rendezvous(tracker, event.rank)

    def _send_rendezvous(self, tracker: AttemptTracker, rank: int) -> None:
        address, port = tracker.rendezvous
        command = pb.WorkerCommand(rendezvous=pb.Rendezvous(master_addr=address, master_port=port))
        self._hub.send_to_worker(tracker.attempt, rank, command)

    # ------------------------------------------------------------------ outcome

    def _outcome(self, state: str, tracker: AttemptTracker) -> RunOutcome:
        failures = tuple(tracker.failures())
        message = ""
        if failures:
            hint = (f"The failure budget is spent (FailureConfig.max_failures="
                    f"{self._spec.failure_policy.max_failures}); raise it to retry more often. "
                    f"Worker logs: {self._spec.run_path}/logs/attempt_{tracker.attempt}/")
            message = render_failures(list(failures), tracker.attempt, hint)
        return RunOutcome(
            state=state, attempt=tracker.attempt, last_metrics=self._commits.history.last_metrics,
            metrics_history=tuple(self._commits.history.metrics), failures=failures,
            exceptions=tracker.exc_pickles(), error_message=message,
            return_value=self._commits.history.return_value,
        )


def _root_cause_text(tracker: AttemptTracker) -> str:
    """One line naming the attempt's root-cause failure, for the log and the run state."""
    return render_failures(tracker.failures(), tracker.attempt).splitlines()[1].removeprefix("Root cause: ")
