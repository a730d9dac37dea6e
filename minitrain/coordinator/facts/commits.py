"""Reports of an attempt: rank 0's latest metrics, rounds, checkpoint commits and acknowledgements.

The controller hands every report of the current attempt here, also while the attempt is being
stopped, so every report a rank sent before it failed or was stopped is processed. A completed
round is committed at once (its staged uploads moved into place, the index written, then evictions),
and only then are the ranks waiting in a checkpoint report acknowledged: a report that returned on
every rank is committed. A checkpoint list is answered once the asking rank's earlier reports are
processed (Ray's `get_all_reported_checkpoints` blocks the same way).

It also knows whether the current attempt made progress (`progressed`): it committed a round beyond the
furthest one the run had committed before it. Run-wide round numbers only grow across attempts, so they
cannot tell: an attempt resumes from the latest committed checkpoint, and its round r is the training
step after that checkpoint's plus r, which an earlier attempt may have reached already. So each committed
round is placed at that step (its position): the resumed checkpoint's position + 1 + r, the position of a
checkpoint committed by this fit() being kept, and that of one from an earlier fit() being its run-wide
index. This assumes the training function resumes from `get_checkpoint()`, as Ray's contract has it.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass
from typing import Callable, Optional, Protocol, Sequence

from minitrain.commands import CheckpointEntry, CheckpointList, ReportAck, ReportReceipt
from minitrain.coordinator.facts import events as ev
from minitrain.coordinator.facts.attempt import AttemptTracker
from minitrain.coordinator.facts.durability import Durability, HeldRound
from minitrain.coordinator.facts.metrics_log import MetricsLog
from minitrain.coordinator.facts.outbox import Outbox
from minitrain.coordinator.observers import Observers, RankMetrics, RoundInfo
from minitrain.coordinator.policy.rounds import CompletedRound, RoundConflict, RoundTracker
from minitrain.records import FailureKind, Phase, ReportRecord, WorkerFailure
from minitrain.storage.filesystem import StorageError
from minitrain.storage.layout import staged_dir
from minitrain.storage.retention import CheckpointRecord

logger = logging.getLogger("minitrain")


class CheckpointBook(Protocol):
    """The part of `minitrain.storage.checkpoint_manager.CheckpointManager` the coordinator uses."""

    report_index: int
    latest: Optional[CheckpointRecord]
    records: tuple
    committed_dir_names: set
    preemptions: int  # fit()s of the run a preemption ended, before this one's

    def commit(self, record: CheckpointRecord, staged: tuple[str, ...] = ()):
        """Move staged uploads into the checkpoint directory, then register it: index, then evictions."""

    def advance_report_index(self, n: int) -> None:
        """Rounds up to n were processed."""

    def expect_in_place(self, dir_name: str) -> None:
        """Ranks wrote into `dir_name` in the run directory (NO_UPLOAD) beside ranks whose files are
        staged or in a memory tier: the commit merges those into it."""

    def delete_garbage(self) -> list[str]:
        """Remove directories of uncommitted checkpoints."""

    def save(self) -> None:
        """Write the index now."""

    def note_preemption(self) -> None:
        """A preemption ends this fit(): count it in the index (written by the next save)."""


@dataclass
class History:
    """Rank 0's latest metrics in this `fit()`, and what its training function returned. Only the latest:
    every rank-0 report is in `metrics.jsonl` (`MetricsLog`, the one record of them), so a run that reports
    every step holds no growing list of them in the driver."""

    last_metrics: Optional[dict] = None
    return_value: bytes = b""


class Commits:
    """Report handling for the run; `start_attempt` before each attempt's first report."""

    def __init__(self, checkpoints: CheckpointBook, metrics_log: MetricsLog, outbox: Outbox,
                 clock: Callable[[], float] = time.time, observers: Optional[Observers] = None):
        self.checkpoints = checkpoints
        self._observers = observers if observers is not None else Observers()
        self._tell_report = self._observers.report_fan_out  # looked up once, called per report
        self._world_size = 0
        self.history = History()
        self._metrics_log = metrics_log
        self._outbox = outbox
        self._clock = clock
        self._rounds: Optional[RoundTracker] = None
        self._base = 0
        self._list_requests: list[ev.CheckpointsRequested] = []  # waiting for their rounds
        self.checkpoints_committed = 0  # by this fit(), in any attempt (an elastic run grows at the next one)
        # Progress (see the module docstring): positions of the checkpoints this fit() committed, by run-wide
        # index; the position the current attempt resumed from (-1: no checkpoint); the furthest position
        # committed by this fit() (None: none yet).
        self._positions: dict[int, int] = {}
        self._resumed_at = -1
        self._furthest: Optional[int] = None
        self.progressed = False  # the current attempt moved `_furthest` on
        # Rounds committed in memory on their way to storage (the two commit levels).
        self.durability = Durability(self._commit_durable, outbox, self._durability_failed, self._durable)
        self._tracker: Optional[AttemptTracker] = None  # the current attempt's (`attach`)

    @property
    def report_base(self) -> int:
        """The run-wide index of the current attempt's round 0."""
        return self._base

    def resume_record(self) -> Optional[CheckpointRecord]:
        """What a new attempt resumes from: the latest committed checkpoint, in memory or on storage."""
        durable, held = self.checkpoints.latest, self.durability.latest
        if held is not None and (durable is None or held.record.report_index >= durable.report_index):
            return held.record
        return durable

    def committed_names(self) -> set[str]:
        """The directory names of the kept checkpoints and of those committed in memory only."""
        return self.checkpoints.committed_dir_names | {held.dir_name for held in self.durability.pending}

    def attach(self, tracker: AttemptTracker) -> None:
        """The current attempt's tracker (a round that cannot become durable fails its rank 0)."""
        self._tracker = tracker

    def start_attempt(self, world_size: int) -> None:
        """New rounds for a new attempt, numbered on from the rounds processed so far."""
        self._world_size = world_size
        self._rounds = RoundTracker(world_size)
        self._base = self.checkpoints.report_index
        self._list_requests = []
        latest = self.resume_record()  # what the attempt resumes from (current_attempt.py's ResumePoint)
        self._resumed_at = -1 if latest is None else self._positions.get(latest.report_index, latest.report_index)
        self.progressed = False

    @property
    def last_round(self) -> Optional[int]:
        """The run-wide index of the last committed round (of any fit() of the run); None before the first."""
        return self.checkpoints.report_index - 1 if self.checkpoints.report_index > 0 else None

    def on_reports(self, tracker: AttemptTracker, reports: Sequence[ReportRecord]) -> None:
        """Record reports of the current attempt, in order: each one is told to the observers, marks its
        rank's progress, is given its receipt when it asks for one (the worker's report window,
        `minitrain.rpc.report_window`), and commits and acknowledges what it completes.
        Only rank 0's metrics are parsed here (the other ranks' stay JSON text until an observer reads
        them)."""
        tell = self._tell_report
        reported = tracker.reported
        now = self._clock()
        add = self._rounds.add
        for report in reports:
            if tell is not None:
                tell(report)
            rank = report.rank
            reported(rank, report.round, now)
            self._tracker = tracker
            if rank == 0:
                metrics = report.metrics
                self.history.last_metrics = metrics
                self._metrics_log.append(metrics, self._base + report.round, report.attempt, report.reported_at,
                                         report.metrics_json)
            try:
                completed = add(rank, report.round, report.metrics_json, report.checkpoint_dir_name,
                                staged=report.staged, wants_ack=report.wants_ack, in_tier=report.in_tier)
            except RoundConflict as exc:
                self._fail_rank(tracker, rank, "CheckpointDirConflict", str(exc))
                continue
            if report.wants_receipt:
                self._outbox.to_worker(tracker.attempt, rank, ReportReceipt(report.round))
            if completed:
                self._commit(tracker, completed)

    def on_done(self, tracker: AttemptTracker, event: ev.WorkerDone) -> None:
        """A rank finished: it holds back no later round; rank 0's return value is kept."""
        if event.rank == 0:
            self.history.return_value = event.return_value
        self._commit(tracker, self._rounds.finish(event.rank, event.reports))

    def request_checkpoint_list(self, event: ev.CheckpointsRequested) -> None:
        """A worker's get_all_reported_checkpoints(): answered once every round up to its own last
        report is processed (at once when they are)."""
        self._list_requests.append(event)
        self._answer_list_requests()

    def _answer_list_requests(self) -> None:
        processed = self._rounds.next_round if self._rounds is not None else 0
        waiting = []
        for event in self._list_requests:
            if event.rounds > processed:
                waiting.append(event)
                continue
            records = self.checkpoints.records + tuple(held.record for held in self.durability.pending)
            entries = tuple(CheckpointEntry(r.dir_name, r.metrics) for r in records)
            self._outbox.to_worker(event.attempt, event.rank, CheckpointList(event.request_id, entries))
        self._list_requests = waiting

    def persist(self) -> None:
        """Write the buffered metrics and the index (with its round counter), however the run ended. A
        failure is logged, not raised: the run's own outcome matters more."""
        try:
            self._metrics_log.flush()
            self.checkpoints.save()
        except Exception as exc:  # noqa: BLE001 - say what was not saved
            logger.error("could not save the run's metrics history or index: %s", exc)

    def delete_uncommitted(self) -> None:
        """Before an attempt and after the run: delete what earlier attempts left that the run created
        and never committed. A failure here costs nothing committed (a stale writer of a lost node may
        still be writing into its staging directory), so it is logged, not raised. Nothing is deleted
        while rounds committed in memory are being written to storage: their agents write into the
        staging area now (the end of the run, after they are durable, deletes what is left)."""
        if self.durability.pending:
            logger.debug("keeping the staging area: %d round(s) are being written to storage",
                         len(self.durability.pending))
            return
        try:
            garbage = self.checkpoints.delete_garbage()
        except Exception as exc:  # noqa: BLE001 - storage errors of any filesystem
            logger.warning("could not delete the uncommitted uploads of earlier attempts (%s); the next "
                           "attempt deletes them", exc)
            return
        if garbage:
            logger.info("removed what earlier attempts left uncommitted: %s", ", ".join(garbage))

    def _commit(self, tracker: AttemptTracker, completed: list[CompletedRound]) -> None:
        for done in completed:
            index = self._base + done.round
            self.checkpoints.advance_report_index(index + 1)
            record = None
            held = False
            by_rank = RankMetrics(done.metrics_by_rank, self._world_size)  # parsed when read, once
            if done.checkpoint_dir_name:
                record = CheckpointRecord(dir_name=done.checkpoint_dir_name, metrics=by_rank[0] or {},
                                          report_index=index, attempt=tracker.attempt,
                                          committed_at=self._clock())
                staged = tuple(staged_dir(tracker.attempt, rank, record.dir_name) for rank in done.staged_ranks)
                try:
                    self._metrics_log.flush()
                    if done.in_place_ranks and (done.staged_ranks or done.tier_ranks):  # a mix of upload modes
                        self.checkpoints.expect_in_place(record.dir_name)
                    if done.tier_ranks or self.durability.pending:  # committed in memory; durable later, in order
                        held = True
                        self.durability.hold(record, tracker.attempt, _holders(tracker, done.tier_ranks),
                                             done.staged_ranks, self._acknowledger(tracker.attempt, done))
                    else:
                        record = dataclasses.replace(record, durable_at=record.committed_at)
                        self.checkpoints.commit(record, staged)
                        self.durability.superseded()
                        self._durable(record)
                except (ValueError, StorageError) as exc:  # a non-numeric score, an empty or vanished dir
                    self._fail_rank(tracker, 0, type(exc).__name__, f"could not commit {record.dir_name}: {exc}")
                    return
                self.checkpoints_committed += 1
                logger.debug("committed %s (round %d)", record.dir_name, index)
            position = self._resumed_at + 1 + done.round
            if record is not None:
                self._positions[index] = position
            redone = self._furthest is not None and position <= self._furthest  # an earlier attempt got here
            if self._furthest is None or position > self._furthest:  # beyond every earlier attempt's too
                self._furthest = position
                self.progressed = True
            if self._observers:
                self._observers.on_round(RoundInfo(tracker.attempt, index, by_rank, record, self._clock(),
                                                   redone=redone))
            if not held:
                for rank in done.ack_ranks:
                    self._outbox.to_worker(tracker.attempt, rank, ReportAck(done.round))
        if completed and self._list_requests:
            self._answer_list_requests()

    def _acknowledger(self, attempt: int, done: CompletedRound) -> Callable[[], None]:
        """What acknowledges `done`'s waiting ranks, called once its round is committed in memory."""
        def ack() -> None:
            for rank in done.ack_ranks:
                self._outbox.to_worker(attempt, rank, ReportAck(done.round))
        return ack

    def _durability_failed(self, held: HeldRound, why: str) -> None:
        """A round committed in memory cannot become durable: the current attempt's rank 0 fails with
        the reason (the failure policy decides what follows, as for any commit that failed)."""
        tracker = self._tracker
        if tracker is not None and tracker.ranks:
            self._fail_rank(tracker, 0, "CheckpointNotDurable", why)

    def _commit_durable(self, record: CheckpointRecord, staged: tuple[str, ...]) -> None:
        """Commit on storage a round that was committed in memory (its `durable_at` is now)."""
        self.checkpoints.commit(dataclasses.replace(record, durable_at=self._clock()), staged)

    def _durable(self, record: CheckpointRecord) -> None:
        if self._observers:
            self._observers.on_durable(record, self._clock())

    def _fail_rank(self, tracker: AttemptTracker, rank: int, exc_type: str, message: str) -> None:
        state = tracker.ranks[rank]
        tracker.fail(WorkerFailure(
            rank=rank, node=state.node_name, pid=state.pid, phase=Phase.TRAINING, time=self._clock(),
            exc_type=exc_type, message=message, kind=FailureKind.COMMIT))


def _holders(tracker: AttemptTracker, ranks: tuple[int, ...]) -> dict[str, tuple[int, ...]]:
    """The node holding each rank's shard in its memory tier: node id -> its ranks, in rank order."""
    holders: dict[str, list[int]] = {}
    for rank in ranks:
        holders.setdefault(tracker.ranks[rank].assignment.node_id, []).append(rank)
    return {node_id: tuple(node_ranks) for node_id, node_ranks in holders.items()}
