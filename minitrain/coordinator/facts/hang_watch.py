"""The hang watch: the hang clocks `decide()` judges, rebuilt only when a deadline can be due.

When a rank counts as hung is `hangs.HangRule`'s to say, from the rank's pace (`hangs.Pace`, its
report intervals). `HangWatch` holds the run's rule and pace (the pace is kept across attempts), is
told of the events that move them, and answers the controller's two questions: which ranks' clocks
`decide()` must look at now (`watched`), and the deadline a hung rank passed (`deadline`).
"""

from __future__ import annotations

import math
from typing import Iterable, Optional

from minitrain.coordinator.facts import events as ev
from minitrain.coordinator.facts.attempt import AttemptTracker, RankState
from minitrain.coordinator.policy.hangs import AUTO, HangRule, Pace
from minitrain.coordinator.policy.loop import Watch
from minitrain.records import Phase, ReportRecord


class HangWatch:
    """The run's hang rule and pace, and the watch built from them (see `watched`)."""

    def __init__(self, rule: HangRule) -> None:
        self.rule = rule
        self.pace = Pace()  # every rank's report intervals, across attempts
        # The attempt the watch was last built for, then, and when it is due again (`watched`).
        self._tracker: Optional[AttemptTracker] = None
        self._built_at = self._due = 0.0

    # ------------------------------------------------------------------ facts in

    def phase_changed(self, tracker: AttemptTracker, event: ev.WorkerPhaseChanged) -> None:
        """Called before `tracker` records `event`: a rank that enters its training function starts a
        new chain of intervals (the one up to its first report spans a start)."""
        state = tracker.ranks.get(event.rank)
        if state is not None and state.phase < Phase.TRAINING <= event.phase:
            self.pace.started(event.rank)

    def reported(self, reports: Iterable[ReportRecord], now: float) -> None:
        """Reports of the current attempt were recorded at `now`."""
        reported = self.pace.reported
        for report in reports:
            reported(report.rank, now)

    # ------------------------------------------------------------------ questions

    def deadline_s(self, rank: int, state: RankState) -> Optional[float]:
        """How long `rank` (in `state`) may be silent now before it is hung; None when never."""
        return self.rule.deadline_s(self.pace.slowest(rank), starting=state.last_round is None,
                                    uploading=state.phase is Phase.CHECKPOINT_UPLOAD)

    def deadline(self, tracker: AttemptTracker, rank: int) -> tuple[float, str]:
        """How long hung `rank` could stay silent, and how that was set (for its failure message)."""
        state, slowest = tracker.ranks[rank], self.pace.slowest(rank)
        starting, uploading = state.last_round is None, state.phase is Phase.CHECKPOINT_UPLOAD
        return (self.rule.deadline_s(slowest, starting=starting, uploading=uploading) or 0.0,
                self.rule.explain(slowest, starting=starting, uploading=uploading))

    def due(self, tracker: AttemptTracker) -> float:
        """The earliest moment a live training rank of `tracker`'s attempt can be silent past its deadline,
        as of the last time `watched` was built for it (no event has to come for that moment to arrive; each
        event that could bring it nearer is followed by a turn that asks `watched` again); 0.0 when the watch
        was built for another attempt, inf when no rank has a deadline."""
        return self._due if tracker is self._tracker else 0.0

    def watched(self, tracker: AttemptTracker, now: float) -> dict[int, Watch]:
        """The hang clock of every live rank in its training function that has a deadline; empty
        while no rank can be silent past its deadline at `now`.

        Building it scans every rank: at thousands of ranks, doing that at every turn of the loop was
        the largest cost per event. So it is built only when the earliest moment a rank could be past
        its deadline has come (`_due`), and that moment is kept: the minimum over the live training
        ranks of their last progress plus their deadline. A deadline that can shrink without an event
        of the rank itself (taken from the group's pace) counts as the rule's shortest one. Every
        event that changes a rank's own deadline (a report, a phase) also restarts its clock at or
        after the scan, as does a rank's entry into training, and no deadline is shorter than the
        rule's shortest: no rank can be silent past its deadline before then."""
        if tracker is self._tracker and self._built_at <= now < self._due:
            return {}
        rule, pace = self.rule, self.pace
        shortest = rule.shortest_deadline_s()
        fixed = rule.timeout_s != AUTO  # the deadline does not depend on a pace
        watched = {}
        due = math.inf if shortest is None else now + shortest
        for rank, state in tracker.ranks.items():
            if state.phase >= Phase.TRAINING and not state.done and not state.exited:
                deadline_s = rule.deadline_s(pace.slowest(rank), starting=state.last_round is None,
                                             uploading=state.phase is Phase.CHECKPOINT_UPLOAD)
                if deadline_s is not None:
                    watched[rank] = Watch(state.last_progress, deadline_s)
                if shortest is not None:
                    own = deadline_s is not None and (fixed or pace.knows(rank))
                    due = min(due, state.last_progress + (deadline_s if own else shortest))
        self._tracker, self._built_at, self._due = tracker, now, due
        return watched
