"""Bookkeeping of one attempt: what each rank has done so far (pure; no I/O).

The controller feeds events in and asks questions (`all_training`, `finished`, `failed`); turning an
exit into a failure, or ignoring it because minitrain stopped that worker, happens here. This is the
only module that writes a `RankState` or the tracker: the worker group and the commits tell it of progress
(`progressed`, `reported`), of the rendezvous (`on_store_ready`), of the stop (`note_stop`) and of the
failures they judge (`fail`) through its methods, and read the rest.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Optional

from minitrain.coordinator.facts import events as ev
from minitrain.errors import looks_like_peer_loss, root_cause_line
from minitrain.records import FailureKind, Phase, WorkerAssignment, WorkerFailure


@dataclass
class RankState:
    """What is known about one rank in one attempt."""

    assignment: WorkerAssignment
    node_name: str
    pid: int = 0
    connected: bool = False
    stream_open: bool = False  # its stream may still carry messages to the coordinator
    phase: Phase = Phase.UNSPECIFIED
    done: bool = False
    exited: bool = False
    failure: Optional[WorkerFailure] = None
    exc_pickle: bytes = b""
    last_progress: float = 0.0  # when it entered training or last reported (controller's clock)
    last_round: Optional[int] = None  # the round of its last report in this attempt


@dataclass
class AttemptTracker:
    """All ranks of one attempt: `rendezvous` once rank 0's store is up, `stop_requested` once minitrain
    starts tearing the attempt down (both read-only: told through `on_store_ready` and `note_stop`)."""

    attempt: int
    ranks: dict[int, RankState]
    _rendezvous: Optional[tuple[str, int]] = field(default=None, init=False)
    _stop_requested: bool = field(default=False, init=False)
    failure_order: list[int] = field(default_factory=list)
    done_count: int = 0  # ranks whose function returned: `all_done()` without a scan at every WorkerDone
    # root_cause_line(), kept until a failure is recorded or amended (asked at every loop turn once one is)
    _root_line: Optional[str] = field(default=None, init=False, repr=False, compare=False)
    # The root cause (`minitrain.errors.root_cause`) kept as failures come in, as (time, rank): the
    # earliest failure that is not a peer's consequence, and the earliest of all. Found by a scan of every
    # failure at each change, it was quadratic when thousands of ranks failed at once (a lost host among
    # 512 at 4096 x 10 Hz: a quarter of the controller's samples). A failure's time never changes.
    _primary: Optional[tuple[float, int]] = field(default=None, init=False, repr=False, compare=False)
    _earliest: Optional[tuple[float, int]] = field(default=None, init=False, repr=False, compare=False)
    _lost_a_node: bool = field(default=False, init=False, repr=False, compare=False)  # lost_a_node()
    _nodes: Optional[frozenset] = field(default=None, init=False, repr=False, compare=False)  # nodes()
    # The questions asked at every loop turn are answered from counts kept as the facts come in:
    # scanning the ranks at every turn cost a share of the controller that grew with the world size
    # (at 16384 ranks, `all_drained`'s confirming scans alone were 6% of the coordinator's samples).
    exited_count: int = field(default=0, init=False)  # ranks whose process is gone (or whose node was lost)
    open_streams: int = field(default=0, init=False)  # ranks whose stream may still carry messages
    training_count: int = field(default=0, init=False)  # ranks in their training function or beyond
    # node_id -> its ranks, built at the first node loss (`on_node_lost` scanned every rank per lost node)
    _by_node: Optional[dict] = field(default=None, init=False, repr=False, compare=False)

    @classmethod
    def create(cls, attempt: int, assignments: list[WorkerAssignment],
               node_names: dict[str, str]) -> "AttemptTracker":
        """A tracker for `assignments`; `node_names` maps node_id -> hostname for messages."""
        ranks = {a.rank: RankState(a, node_names.get(a.node_id, a.node_id)) for a in assignments}
        return cls(attempt=attempt, ranks=ranks)

    @property
    def rendezvous(self) -> Optional[tuple[str, int]]:
        """(address, port) of rank 0's TCPStore, which every rank is told; None until it is up."""
        return self._rendezvous

    @property
    def stop_requested(self) -> bool:
        """minitrain started tearing the attempt down (`note_stop`): a worker connecting now is sent away."""
        return self._stop_requested

    # ------------------------------------------------------------------ facts in

    def on_store_ready(self, event: ev.StoreReady) -> None:
        """Rank 0's TCPStore is up: its address and port are the attempt's rendezvous."""
        self._rendezvous = (event.address, event.port)

    def note_stop(self) -> None:
        """minitrain starts tearing the attempt down (its workers are told to stop)."""
        self._stop_requested = True

    def on_spawned(self, event: ev.WorkerSpawned) -> None:
        """Remember the pid of a started worker."""
        state = self.ranks.get(event.rank)
        if state is not None:
            state.pid = event.pid

    def on_connected(self, event: ev.WorkerConnected) -> None:
        """The worker opened its stream."""
        state = self.ranks[event.rank]
        state.connected = True
        if not state.stream_open:
            state.stream_open = True
            self.open_streams += 1
        state.pid = event.pid or state.pid
        self._set_phase(state, max(state.phase, Phase.STARTUP))

    def on_stream_closed(self, event: ev.WorkerStreamClosed) -> None:
        """The worker's stream ended: every message it sent has been received."""
        state = self.ranks.get(event.rank)
        if state is not None:
            self._close_stream(state)

    def on_phase(self, event: ev.WorkerPhaseChanged) -> None:
        """The worker moved to a later phase."""
        state = self.ranks.get(event.rank)
        if state is not None:
            self._set_phase(state, event.phase)

    def _set_phase(self, state: RankState, phase: Phase) -> None:
        was_training, state.phase = state.phase >= Phase.TRAINING, phase
        self.training_count += (phase >= Phase.TRAINING) - was_training

    def _close_stream(self, state: RankState) -> None:
        if state.stream_open:
            state.stream_open = False
            self.open_streams -= 1

    def _mark_exited(self, state: RankState) -> None:
        if not state.exited:
            state.exited = True
            self.exited_count += 1

    def progressed(self, rank: int, now: float) -> None:
        """The rank showed progress at `now` other than a report (a phase change): its hang clock restarts."""
        state = self.ranks.get(rank)
        if state is not None:
            state.last_progress = now

    def reported(self, rank: int, round_: int, now: float) -> None:
        """The rank's report of `round_` was recorded at `now`: its hang clock restarts."""
        state = self.ranks.get(rank)
        if state is not None:
            state.last_progress = now
            state.last_round = round_

    def on_done(self, event: ev.WorkerDone) -> None:
        """The worker's function returned and its reports were flushed."""
        state = self.ranks.get(event.rank)
        if state is not None and not state.done:
            state.done = True
            self.done_count += 1

    def on_failed(self, event: ev.WorkerFailed) -> None:
        """The worker captured an exception."""
        self._add_failure(event.failure, event.exc_pickle)

    def fail(self, failure: WorkerFailure) -> None:
        """The coordinator judged `failure.rank` failed (a hang, a refused report, a failed commit): it
        counts as that rank's failure, as one the worker reported would (the first one learned stays)."""
        self._add_failure(failure, b"")

    def _add_failure(self, failure: WorkerFailure, exc_pickle: bytes) -> None:
        state = self.ranks.get(failure.rank)
        if state is None:
            return
        if state.failure is not None:
            if state.failure.kind is FailureKind.PROCESS and not state.failure.exc_type:
                # the exit was learned first: add what the worker said
                state.failure = replace(failure, node=state.node_name, pid=state.pid,
                                        time=state.failure.time, exit_code=state.failure.exit_code,
                                        signal=state.failure.signal)
                state.exc_pickle = exc_pickle
                self._failures_changed(state)
            return
        state.failure = replace(failure, node=state.node_name, pid=state.pid)
        state.exc_pickle = exc_pickle
        self.failure_order.append(state.assignment.rank)
        self._failures_changed(state)

    def on_exited(self, event: ev.WorkerExited) -> None:
        """The process ended: a failure unless it finished cleanly or minitrain stopped it."""
        state = self.ranks.get(event.rank)
        if state is None or state.exited:
            return
        self._mark_exited(state)
        state.pid = event.pid or state.pid
        if state.failure is not None:
            state.failure = replace(state.failure, exit_code=event.exit_code, signal=event.signal,
                                    oom_suspected=event.oom_suspected)
            self._failures_changed(state)
            return
        clean = state.done and event.exit_code == 0
        if clean or event.stopped_by_agent:
            return
        self._record_death(state, event)

    def _record_death(self, state: RankState, event: ev.WorkerExited) -> None:
        message = ""
        if event.spawn_error:
            message = f"could not be started: {event.spawn_error}"
        elif event.exit_code == 0:
            message = "the process exited with code 0 before its training function returned"
        state.failure = WorkerFailure(
            rank=state.assignment.rank, node=state.node_name, pid=state.pid, phase=state.phase,
            time=event.time, exc_type="WorkerProcessError" if message else "", message=message,
            exit_code=event.exit_code, signal=event.signal, oom_suspected=event.oom_suspected,
            kind=FailureKind.PROCESS,
        )
        self.failure_order.append(state.assignment.rank)
        self._failures_changed(state)

    def on_node_lost(self, node_id: str, reason: str, time: float) -> None:
        """Every rank of a lost node that has not exited is gone, and that is a failure of each one that
        had not finished. It counts during a stop too: the peers of a node that died often fail first
        (their collectives break at once, the loss is learned from the lease later), and the loss, not
        their "connection closed by peer", must be the root cause."""
        if self._by_node is None:
            self._by_node = {}
            for state in self.ranks.values():
                self._by_node.setdefault(state.assignment.node_id, []).append(state)
        for state in self._by_node.get(node_id, ()):
            if state.exited:
                continue
            self._mark_exited(state)
            self._close_stream(state)  # nothing from it is waited for (it may be frozen, not gone)
            if state.failure is None and not state.done:
                state.failure = WorkerFailure(
                    rank=state.assignment.rank, node=state.node_name, pid=state.pid, phase=state.phase,
                    time=time, exc_type="NodeLostError", kind=FailureKind.NODE_LOST,
                    message=f"node {state.node_name} was lost: {reason}",
                )
                self.failure_order.append(state.assignment.rank)
                self._failures_changed(state)

    # ------------------------------------------------------------------ questions

    def all_training(self) -> bool:
        """Every rank reached its training function (or beyond). O(1)."""
        return self.training_count == len(self.ranks)

    def all_done(self) -> bool:
        """Every rank's function returned. O(1)."""
        return self.done_count == len(self.ranks)

    def finished(self) -> bool:
        """Every rank returned from its training function and exited cleanly (no rank failed). O(1)."""
        return self.done_count == self.exited_count == len(self.ranks) and not self.failure_order

    def failed(self) -> bool:
        """At least one rank failed."""
        return bool(self.failure_order)

    def all_exited(self) -> bool:
        """No process of this attempt is left. O(1)."""
        return self.exited_count == len(self.ranks)

    def all_drained(self) -> bool:
        """No rank's stream is open: every message the ranks sent has been received. O(1)."""
        return self.open_streams == 0

    def round_pending(self) -> bool:
        """A round that every failed rank reported (the lowest of their last rounds) is not complete,
        and every rank that has not reported it can still: it has not failed, exited or finished
        (a finished rank holds back no later round). What the live ranks of a failed attempt run on
        for (decide's catch-up wait). O(ranks): asked only while a failed attempt is not yet stopped."""
        _, behind = self.ranks_behind()
        return bool(behind) and not any(self.ranks[r].exited for r in behind)

    def ranks_behind(self) -> tuple[Optional[int], tuple[int, ...]]:
        """(round, ranks): the lowest last round of the failed ranks (None when one of them never
        reported, or none failed), and the ranks that neither failed nor finished and have not reported
        it. A rank's reports are recorded in order, so its `last_round` says which rounds it reported."""
        failed = [self.ranks[r].last_round for r in self.failure_order]
        if not failed or None in failed:
            return None, ()
        round_ = min(failed)
        return round_, tuple(r for r, s in self.ranks.items()
                             if s.failure is None and not s.done and (s.last_round is None or s.last_round < round_))

    def failures(self) -> list[WorkerFailure]:
        """The failures, in the order they were learned."""
        return [self.ranks[r].failure for r in self.failure_order]

    def _failures_changed(self, state: RankState) -> None:
        """`state`'s failure was recorded or amended: keep the root cause and lost_a_node current."""
        failure, rank = state.failure, state.assignment.rank
        key = (failure.time, rank)
        if self._earliest is None or key < self._earliest:
            self._earliest = key
        if not looks_like_peer_loss(failure):
            if self._primary is None or key < self._primary:
                self._primary = key
        elif self._primary == key:  # amended into a peer's consequence (rare): the next one, by a scan
            self._primary = min(((self.ranks[r].failure.time, r) for r in self.failure_order
                                 if not looks_like_peer_loss(self.ranks[r].failure)), default=None)
        if failure.kind is FailureKind.NODE_LOST:  # (an amendment never changes a failure's kind)
            self._lost_a_node = True
        self._root_line = None

    def lost_a_node(self) -> bool:
        """A rank of this attempt failed because its node was lost (an elastic run then resizes)."""
        return self._lost_a_node

    def root_cause_line(self) -> str:
        """One line naming the root-cause failure (`minitrain.errors.root_cause_line`), for the log and
        the run state; "" while no rank failed. Formatted once per change of the failures."""
        if self._root_line is None:
            root = self._primary or self._earliest
            self._root_line = root_cause_line([self.ranks[root[1]].failure]) if root else ""
        return self._root_line

    def exc_pickles(self) -> dict[int, bytes]:
        """rank -> pickled exception, for ranks that reported one."""
        return {r: self.ranks[r].exc_pickle for r in self.failure_order if self.ranks[r].exc_pickle}

    def nodes(self) -> frozenset[str]:
        """The node ids that run ranks of this attempt (found once: an attempt's ranks never move)."""
        if self._nodes is None:
            self._nodes = frozenset(s.assignment.node_id for s in self.ranks.values())
        return self._nodes
