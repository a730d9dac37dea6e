"""The workers of one attempt: started, answered, and stopped through their node agents.

A `WorkerGroup` owns one attempt's side effects: it sends each node its share of the ranks, answers
every worker's stream (assignment, rendezvous, phase acknowledgements, the release of rank 0), asks for
stacks, stops the workers and closes what is left of their streams. It decides nothing: when to start,
stop or give up is `decide`'s; what each rank did is in its `AttemptTracker`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional

from minitrain import commands as cmd
from minitrain.coordinator.facts import events as ev
from minitrain.coordinator.facts.attempt import AttemptTracker
from minitrain.coordinator.facts.outbox import Outbox
from minitrain.coordinator.policy.hangs import waits_in_collective
from minitrain.records import FailureKind, NodeInfo, WorkerAssignment, WorkerFailure

logger = logging.getLogger("minitrain")


@dataclass(frozen=True)
class LaunchSettings:
    """What every worker of the run is told, whatever its attempt."""

    experiment_name: str
    run_path: str
    payload: bytes
    backend: str
    dist_timeout_s: float
    cwd: str
    worker_env: Mapping[str, str]
    relay: bool = False  # the workers' streams go through their agents' relays
    preemption_signals: tuple[str, ...] = ()  # what the agents report as preemptions (FailureConfig)
    memory_tier_bytes: int = 0  # each node's memory tier: 0 none, -1 the host's default (CheckpointConfig)
    storage: bytes = b""  # the run's Storage, pickled: where the agents persist their tiers' shards


@dataclass(frozen=True)
class ResumePoint:
    """Where an attempt's workers take over: the latest committed checkpoint and the report count;
    `restore`: that checkpoint's shards in the memory tiers, when they are there."""

    checkpoint_dir: str  # "" when nothing is committed yet
    report_index_base: int
    committed_dir_names: tuple[str, ...]
    restore: Optional[cmd.RestoreView] = None


class WorkerGroup:
    """One attempt's workers. Build it with `start()`; feed it the attempt's events with `handle()`."""

    def __init__(self, tracker: AttemptTracker, outbox: Outbox, nodes: Mapping[str, NodeInfo],
                 settings: LaunchSettings, resume: ResumePoint, clock: Callable[[], float]):
        self.tracker = tracker
        self._outbox = outbox
        self._nodes = dict(nodes)
        self._settings = settings
        self._resume = resume
        self._clock = clock
        self._stacks: dict[int, str] = {}
        self._stacks_asked: set[int] = set()

    @property
    def attempt(self) -> int:
        """The attempt number."""
        return self.tracker.attempt

    @classmethod
    def start(cls, attempt: int, assignments: list[WorkerAssignment], nodes: Mapping[str, NodeInfo],
              outbox: Outbox, settings: LaunchSettings, resume: ResumePoint,
              clock: Callable[[], float]) -> "WorkerGroup":
        """Send each node its ranks of `attempt`. A node whose stream is already closed counts as lost."""
        names = {node_id: node.hostname for node_id, node in nodes.items()}
        group = cls(AttemptTracker.create(attempt, assignments, names), outbox, nodes, settings, resume, clock)
        by_node: dict[str, list[WorkerAssignment]] = {}
        for assignment in assignments:
            by_node.setdefault(assignment.node_id, []).append(assignment)
        for node_id, node_assignments in by_node.items():
            command = cmd.StartWorkers(
                attempt=attempt,
                workers=tuple(cmd.WorkerLaunch(rank=a.rank, local_rank=a.local_rank) for a in node_assignments),
                cwd=settings.cwd,
                env=node_env(settings.worker_env, nodes[node_id], node_assignments),
                relay=settings.relay,
                preemption_signals=settings.preemption_signals,
                memory_tier_bytes=settings.memory_tier_bytes,
                storage=settings.storage,
                restore=resume.restore,
                replicas=len(nodes) > 1,
            )
            if not outbox.to_agent(node_id, command):
                group.tracker.on_node_lost(node_id, "its stream closed before the workers started", clock())
        logger.info("attempt %d: starting %d worker(s) on %d node(s)", attempt, len(assignments), len(by_node))
        return group

    # ------------------------------------------------------------------ the attempt's events

    def handle(self, event: ev.RunEvent) -> None:
        """Apply one event of this attempt (the caller checked its attempt number); other kinds are not a
        worker's and are ignored."""
        apply = _APPLY.get(type(event))
        if apply is not None:
            apply(self, event)

    def _on_store_ready(self, event: ev.StoreReady) -> None:
        self.tracker.on_store_ready(event)
        for rank, state in self.tracker.ranks.items():
            if state.connected:
                self._send_rendezvous(rank)

    def _on_phase(self, event: ev.WorkerPhaseChanged) -> None:
        self.tracker.on_phase(event)
        self.tracker.progressed(event.rank, self._clock())
        self._outbox.to_worker(event.attempt, event.rank, cmd.PhaseAck(event.phase))

    def _on_stack(self, event: ev.StackDumped) -> None:
        self._stacks[event.rank] = event.text

    def _on_connected(self, event: ev.WorkerConnected) -> None:
        tracker = self.tracker
        if event.rank not in tracker.ranks or tracker.stop_requested:
            self._outbox.close_worker(event.attempt, event.rank)
            return
        tracker.on_connected(event)
        state = tracker.ranks[event.rank]
        rank0_node = self._nodes[tracker.ranks[0].assignment.node_id]
        settings = self._settings
        resume = self._resume
        assignment = cmd.Assignment(
            worker=state.assignment, experiment_name=settings.experiment_name, backend=settings.backend,
            dist_timeout_s=settings.dist_timeout_s, payload=settings.payload,
            store_address=rank0_node.address, storage_path=settings.run_path,
            initial_checkpoint_dir=resume.checkpoint_dir, report_index_base=resume.report_index_base,
            committed_dir_names=resume.committed_dir_names,
        )
        self._outbox.to_worker(self.attempt, event.rank, assignment)
        if tracker.rendezvous is not None:
            self._send_rendezvous(event.rank)

    def _send_rendezvous(self, rank: int) -> None:
        address, port = self.tracker.rendezvous
        self._outbox.to_worker(self.attempt, rank, cmd.Rendezvous(address, port))

    # ------------------------------------------------------------------ commands

    def release_when_all_done(self) -> None:
        """Once every rank's function returned (and its last rounds were committed), let rank 0 exit:
        it holds the TCPStore the others may still read from."""
        if self.tracker.all_done():
            self._outbox.to_worker(self.attempt, 0, cmd.Release())

    def prepare_fork_servers(self) -> None:
        """Ask each node to keep a fork server warm for as many workers as it runs now."""
        per_node: dict[str, int] = {}
        for state in self.tracker.ranks.values():
            per_node[state.assignment.node_id] = per_node.get(state.assignment.node_id, 0) + 1
        for node_id, count in per_node.items():
            self._outbox.to_agent(node_id, cmd.PrepareForkServers(count))

    def collect_stacks(self) -> None:
        """Ask every node for the stacks of its workers; `stacks_answered()` says when all are in."""
        self._stacks = {}
        self._stacks_asked = {r for r, s in self.tracker.ranks.items() if not s.exited}
        for node_id in self.tracker.nodes():
            self._outbox.to_agent(node_id, cmd.DumpStacks(self.attempt))

    def ask_stacks(self, rank: int) -> bool:
        """Ask the node of `rank` for its workers' stacks (its agent dumps every worker of the attempt
        it runs); False when the rank is not running."""
        state = self.tracker.ranks.get(rank)
        if state is None or state.exited:
            return False
        return self._outbox.to_agent(state.assignment.node_id, cmd.DumpStacks(self.attempt))

    def stacks_answered(self) -> bool:
        """Every rank asked for that is still alive sent its stacks."""
        alive = {r for r in self._stacks_asked if not self.tracker.ranks[r].exited}
        return alive.issubset(self._stacks)

    def declare_hung(self, ranks: tuple[int, ...], deadlines: Mapping[int, tuple[float, str]]) -> None:
        """Record a hang failure for each of `ranks`, with its stacks (or why there are none), the
        deadline it passed and how that was set (`deadlines`: rank -> (seconds, explanation)), its last
        completed report, and the ranks that merely wait for it in a collective."""
        now = self._clock()
        tracker = self.tracker
        waiting = sorted(r for r, text in self._stacks.items() if waits_in_collective(text))
        for rank in ranks:
            state = tracker.ranks[rank]
            deadline_s, how = deadlines[rank]
            text = self._stacks.get(rank) or ("(no stack: the process did not answer SIGUSR1; it is stopped, e.g. "
                                              "by SIGSTOP, or blocked in the kernel)")
            consequence = rank in waiting
            last = ("it made no report in this attempt" if state.last_round is None
                    else f"its last report was round {state.last_round}")
            if consequence:
                role = "it waits in a collective for a peer"
            else:
                others = [r for r in waiting if r != rank]
                role = (f"rank(s) {', '.join(map(str, others))} wait for it in a collective" if others
                        else "no other rank was found waiting in a collective")
            failure = WorkerFailure(
                rank=rank, node=state.node_name, pid=state.pid,
                # Stamped when it last made progress, not when found: the rank that stopped first is
                # the earliest failure, so it is the root cause when several are found in one check.
                phase=state.phase, time=state.last_progress,
                exc_type="WorkerHangError", kind=FailureKind.HANG,
                message=(f"rank {rank} on {state.node_name} (pid {state.pid}) made no progress for "
                         f"{now - state.last_progress:.1f} s, past its hang deadline of {deadline_s:g} s "
                         f"({how}); {last}; {role}. The stacks of every thread of every rank are in the logs"),
                traceback=f"Stacks of rank {rank} when it was found hung:\n{text}",
                consequence=consequence)
            tracker.fail(failure)
        logger.error("attempt %d: rank(s) %s stopped making progress past their hang deadline", self.attempt,
                     ",".join(map(str, ranks)))

    def stop(self, grace_s: float) -> None:
        """Ask every node to stop its workers (SIGTERM, `grace_s`, SIGKILL); a node that cannot be told
        is lost, and so are its ranks."""
        self.tracker.note_stop()
        for node_id in self.tracker.nodes():
            if not self._outbox.to_agent(node_id, cmd.StopWorkers(self.attempt, grace_s)):
                self.tracker.on_node_lost(node_id, "its stream is closed", self._clock())

    def close_streams(self) -> None:
        """Close every stream still open (a rank of a lost node may be frozen, not gone): nothing it
        sends later is read."""
        for rank, state in self.tracker.ranks.items():
            if state.connected:
                self._outbox.close_worker(self.attempt, rank)


def warm_up_command(settings: LaunchSettings, node: NodeInfo,
                    assignments: list[WorkerAssignment]) -> cmd.PrepareForkServers:
    """What readies `node` for a start of its `assignments` (of a later attempt): a fork server for
    exactly the environment that start will have, so that the start forks warm workers."""
    return cmd.PrepareForkServers(len(assignments), env=node_env(settings.worker_env, node, assignments),
                                  cwd=settings.cwd)


def node_env(worker_env: Mapping[str, str], node: NodeInfo, assignments: list[WorkerAssignment]) -> dict[str, str]:
    """The environment of `node`'s workers: the run's, plus the interface, thread count and GPUs."""
    env = dict(worker_env)
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


# The worker events an attempt applies, by kind: the group's own steps, or the tracker's record of the fact.
_APPLY: dict[type, Callable[[WorkerGroup, Any], None]] = {
    ev.WorkerConnected: WorkerGroup._on_connected,
    ev.StoreReady: WorkerGroup._on_store_ready,
    ev.WorkerPhaseChanged: WorkerGroup._on_phase,
    ev.StackDumped: WorkerGroup._on_stack,
    ev.WorkerSpawned: lambda group, event: group.tracker.on_spawned(event),
    ev.WorkerDone: lambda group, event: group.tracker.on_done(event),
    ev.WorkerStreamClosed: lambda group, event: group.tracker.on_stream_closed(event),
    ev.WorkerFailed: lambda group, event: group.tracker.on_failed(event),
    ev.WorkerExited: lambda group, event: group.tracker.on_exited(event),
}
