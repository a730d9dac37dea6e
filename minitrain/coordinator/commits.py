"""Reports of an attempt: rank-0 history, rounds, checkpoint commits and acknowledgements.

The controller hands every report of the current attempt here. A completed checkpoint round is
committed (index first, then evictions) before the report that completed it is acknowledged, so a
checkpoint report that returned on every rank is never lost.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from typing import Callable, Optional, Protocol

from minitrain.coordinator import events as ev
from minitrain.coordinator.attempt import AttemptTracker
from minitrain.coordinator.metrics_log import MetricsLog
from minitrain.coordinator.rounds import CompletedRound, RoundConflict, RoundTracker
from minitrain.coordinator.service import Hub
from minitrain.records import Phase, ReportRecord, WorkerFailure
from minitrain.retention import CheckpointRecord
from minitrain.rpc._gen import minitrain_pb2 as pb
from minitrain.storage import StorageError

logger = logging.getLogger("minitrain")


class CheckpointBook(Protocol):
    """The part of `minitrain.checkpoint_manager.CheckpointManager` the coordinator uses."""

    report_index: int
    latest: Optional[CheckpointRecord]
    records: tuple
    committed_dir_names: set

    def register(self, record: CheckpointRecord):
        """Commit a checkpoint: index first, then evictions."""

    def advance_report_index(self, n: int) -> None:
        """Rounds up to n were processed."""

    def delete_garbage(self) -> list[str]:
        """Remove directories of uncommitted checkpoints."""

    def save(self) -> None:
        """Write the index now."""


@dataclass
class History:
    """Rank 0's reports of this `fit()`, and what its training function returned."""

    last_metrics: Optional[dict] = None
    metrics: list = field(default_factory=list)
    return_value: bytes = b""


class Commits:
    """Report handling for the run; `start_attempt` before each attempt's first report."""

    def __init__(self, checkpoints: CheckpointBook, metrics_log: MetricsLog, hub: Hub,
                 clock: Callable[[], float] = time.time):
        self.checkpoints = checkpoints
        self.history = History()
        self._metrics_log = metrics_log
        self._hub = hub
        self._clock = clock
        self._rounds: Optional[RoundTracker] = None
        self._base = 0

    @property
    def report_base(self) -> int:
        """The run-wide index of the current attempt's round 0."""
        return self._base

    def start_attempt(self, world_size: int) -> None:
        """New rounds for a new attempt, numbered on from the rounds processed so far."""
        self._rounds = RoundTracker(world_size)
        self._base = self.checkpoints.report_index

    def on_report(self, tracker: AttemptTracker, report: ReportRecord) -> None:
        """Record one report of the current attempt; commit what it completes; acknowledge it."""
        if report.rank in tracker.ranks:
            tracker.ranks[report.rank].last_progress = self._clock()
        if report.rank == 0:
            self.history.last_metrics = report.metrics
            self.history.metrics.append(report.metrics)
            self._metrics_log.append(report.metrics, self._base + report.round, report.attempt,
                                     report.reported_at)
        try:
            completed = self._rounds.add(report.rank, report.round, report.metrics, report.checkpoint_dir_name)
        except RoundConflict as exc:
            self._fail_rank(tracker, report.rank, "CheckpointDirConflict", str(exc))
            return
        self._commit(tracker, completed)
        if report.wants_ack:
            ack = pb.WorkerCommand(report_ack=pb.ReportAck(round=report.round))
            self._hub.send_to_worker(tracker.attempt, report.rank, ack)

    def on_done(self, tracker: AttemptTracker, event: ev.WorkerDone) -> None:
        """A rank finished: it holds back no later round; rank 0's return value is kept."""
        if event.rank == 0:
            self.history.return_value = event.return_value
        self._commit(tracker, self._rounds.finish(event.rank, event.reports))

    def send_checkpoint_list(self, event: ev.CheckpointsRequested) -> None:
        """Answer a worker's get_all_reported_checkpoints()."""
        entries = [pb.CheckpointEntry(dir_name=r.dir_name, metrics_json=json.dumps(r.metrics))
                   for r in self.checkpoints.records]
        command = pb.WorkerCommand(checkpoint_list=pb.CheckpointList(request_id=event.request_id,
                                                                     checkpoints=entries))
        self._hub.send_to_worker(event.attempt, event.rank, command)

    def persist(self) -> None:
        """Write the buffered metrics and the index (with its round counter)."""
        self._metrics_log.flush()
        self.checkpoints.save()

    def _commit(self, tracker: AttemptTracker, completed: list[CompletedRound]) -> None:
        for done in completed:
            index = self._base + done.round
            self.checkpoints.advance_report_index(index + 1)
            if not done.checkpoint_dir_name:
                continue
            record = CheckpointRecord(dir_name=done.checkpoint_dir_name, metrics=done.rank0_metrics or {},
                                      report_index=index, attempt=tracker.attempt, committed_at=self._clock())
            try:
                self._metrics_log.flush()
                self.checkpoints.register(record)
            except (ValueError, StorageError) as exc:  # a non-numeric score, an empty or vanished dir
                self._fail_rank(tracker, 0, type(exc).__name__, f"could not commit {record.dir_name}: {exc}")
                return
            logger.debug("committed %s (round %d)", record.dir_name, index)

    def _fail_rank(self, tracker: AttemptTracker, rank: int, exc_type: str, message: str) -> None:
        state = tracker.ranks[rank]
        tracker.on_failed(ev.WorkerFailed(tracker.attempt, WorkerFailure(
            rank=rank, node=state.node_name, pid=state.pid, phase=Phase.TRAINING, time=self._clock(),
            exc_type=exc_type, message=message), b""))
