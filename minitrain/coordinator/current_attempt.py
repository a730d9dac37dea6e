"""The run's current attempt, as the controller's loop records it: its workers and its events.

`CurrentAttempt` holds the one `WorkerGroup` of the run that is current (None before the first start)
and records each event of an attempt where it belongs: the group and its `AttemptTracker` (connections,
phases, exits, failures, stacks), the `Commits` (reports, finished ranks, checkpoint lists), the
`HangWatch` (reports and phase changes) and the observers (telemetry, with the rank's host, pid and
phase added; stacks; the attempt's start and end). An event of any other attempt is stale: it is
dropped (a worker of an earlier attempt that connects is sent away). Reports are judged one by one:
a batch may hold reports of an earlier attempt, and a report sent before a peer failed still counts
while the attempt is being stopped.

It decides nothing: when to start, stop or give up is `decide`'s, executed by the controller.
"""

from __future__ import annotations

import logging
from typing import Callable, Mapping, Optional

from minitrain.coordinator.facts import events as ev
from minitrain.coordinator.facts.attempt import AttemptTracker
from minitrain.coordinator.facts.commits import Commits
from minitrain.coordinator.facts.hang_watch import HangWatch
from minitrain.coordinator.facts.outbox import Outbox
from minitrain.coordinator.facts.worker_group import LaunchSettings, ResumePoint, WorkerGroup
from minitrain.coordinator.observers import AttemptEnd, AttemptInfo, Observers, StackDump, TelemetrySample
from minitrain.records import NodeInfo, WorkerAssignment

logger = logging.getLogger("minitrain")

Handler = Callable[[ev.RunEvent], None]


class CurrentAttempt:
    """The current attempt's `group` and `tracker` (None until `start`), and the handlers of its events
    (`handlers`)."""

    def __init__(self, commits: Commits, hangs: HangWatch, observers: Observers, outbox: Outbox,
                 clock: Callable[[], float]):
        self.group: Optional[WorkerGroup] = None
        self._commits = commits
        self._hangs = hangs
        self._observers = observers
        self._outbox = outbox
        self._clock = clock
        self._ended = True  # on_attempt_end was told for the latest attempt (or none started)

    @property
    def tracker(self) -> Optional[AttemptTracker]:
        """The latest attempt's tracker (None before the first start)."""
        return self.group.tracker if self.group is not None else None

    # ------------------------------------------------------------------ start and end

    def start(self, attempt: int, assignments: list[WorkerAssignment], nodes: Mapping[str, NodeInfo],
              launch: LaunchSettings) -> None:
        """Start `attempt`'s ranks as placed (`assignments`), resuming from the latest committed
        checkpoint and numbering its rounds on from those processed; then tell the observers."""
        self._commits.start_attempt(len(assignments))
        latest = self._commits.resume_record()
        view = self._commits.durability.restore_view()
        resume = ResumePoint(checkpoint_dir=latest.dir_name if latest is not None else "",
                             report_index_base=self._commits.report_base,
                             committed_dir_names=tuple(sorted(self._commits.committed_names())),
                             restore=view if view is not None and latest is not None
                             and view.dir_name == latest.dir_name else None)
        self.group = WorkerGroup.start(attempt, assignments, nodes, self._outbox, launch, resume, self._clock)
        self._commits.attach(self.group.tracker)
        self._ended = False
        states = [state for _, state in sorted(self.group.tracker.ranks.items())]
        hosts = tuple(state.node_name for state in states)
        memory = {state.node_name: nodes[state.assignment.node_id].memory_bytes for state in states
                  if state.assignment.node_id in nodes}
        self._observers.on_attempt_start(AttemptInfo(attempt, hosts, self._clock(), memory))

    def end(self, restarting: bool) -> None:
        """Tell the observers, once, that the latest attempt is over (nothing when none started)."""
        if self._ended or self.group is None:
            return
        self._ended = True
        tracker = self.group.tracker
        self._observers.on_attempt_end(AttemptEnd(
            attempt=tracker.attempt, failures=tuple(tracker.failures()), root_cause=tracker.root_cause_line(),
            restarting=restarting, ended_at=self._clock(), exceptions=tracker.exc_pickles()))

    def node_lost(self, node_id: str, reason: str) -> None:
        """A node is out of the run: the current attempt's ranks on it are lost with it."""
        if self.group is not None:
            self.group.tracker.on_node_lost(node_id, reason, self._clock())

    # ------------------------------------------------------------------ events

    def handlers(self) -> dict[type, Handler]:
        """Each attempt event type's handler. Events of an attempt other than the current one are stale
        (`_of_attempt`), except reports, which are judged one by one (`_on_reports`)."""
        of_attempt = self._of_attempt
        return {
            ev.ReportsReceived: self._on_reports,  # the most frequent event by far
            ev.TelemetryReceived: of_attempt(self._on_telemetry),
            ev.StacksWanted: self._on_stacks_wanted,
            ev.WorkerPhaseChanged: of_attempt(self._on_phase),
            ev.CheckpointsRequested: of_attempt(self._on_checkpoints_requested),
            ev.StackDumped: of_attempt(self._on_stack_dump),
            ev.WorkerDone: of_attempt(self._on_done),
            **dict.fromkeys((ev.WorkerSpawned, ev.WorkerConnected, ev.StoreReady, ev.WorkerStreamClosed,
                             ev.WorkerFailed, ev.WorkerExited), of_attempt(WorkerGroup.handle)),
        }

    def _of_attempt(self, handler: Callable[[WorkerGroup, ev.RunEvent], None]) -> Handler:
        """`handler(group, event)` for events of the current attempt; any other event is stale."""
        def handle(event: ev.RunEvent) -> None:
            group = self.group
            if group is None or event.attempt != group.attempt:
                self._reject_stale(event)
            else:
                handler(group, event)
        return handle

    def _reject_stale(self, event: ev.RunEvent) -> None:
        if isinstance(event, ev.WorkerConnected):
            # A worker of an earlier attempt: end its stream so it exits.
            self._outbox.close_worker(event.attempt, event.rank)
        logger.debug("ignoring %s of a stale attempt", type(event).__name__)

    def _on_reports(self, event: ev.ReportsReceived) -> None:
        """Record a batch of reports; those of another attempt than the current one are stale. Also
        while the attempt is being stopped: a report sent before a peer failed still counts."""
        group, reports = self.group, event.reports
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
        self._hangs.reported(current, self._clock())

    def _on_telemetry(self, group: WorkerGroup, event: ev.TelemetryReceived) -> None:
        """Pass a rank's telemetry on to the observers with its host, pid and phase (it never moves the
        hang clock: a rank that only samples is not progressing)."""
        sample = event.sample
        state = group.tracker.ranks.get(sample.rank)
        if state is None or not self._observers:
            return
        # A copy built from the fields (dataclasses.replace costs about 1 us more, per sample of every rank).
        self._observers.on_telemetry(TelemetrySample(
            **{**vars(sample), "host": state.node_name, "pid": state.pid, "phase": state.phase.name}))

    def _on_stacks_wanted(self, event: ev.StacksWanted) -> None:
        if self.group is not None:
            self.group.ask_stacks(event.rank)

    def _on_phase(self, group: WorkerGroup, event: ev.WorkerPhaseChanged) -> None:
        self._hangs.phase_changed(group.tracker, event)
        group.handle(event)
        self._observers.on_worker_phase(event.attempt, event.rank, event.phase.name)

    def _on_checkpoints_requested(self, group: WorkerGroup, event: ev.CheckpointsRequested) -> None:
        self._commits.request_checkpoint_list(event)

    def _on_stack_dump(self, group: WorkerGroup, event: ev.StackDumped) -> None:
        group.handle(event)
        self._observers.on_stacks(StackDump(event.attempt, event.rank, event.text))

    def _on_done(self, group: WorkerGroup, event: ev.WorkerDone) -> None:
        group.handle(event)
        self._commits.on_done(group.tracker, event)
        group.release_when_all_done()
