"""A run's preemption as the coordinator records it: the signals, the notice to the ranks, each rank's
answer, and the agreed round. What the run does about a signal (agree, stop, kill at once) is
`decide`'s; this module owns the facts and the one rule that picks the round (`agreed_round`).

The protocol, one notice and one answer per rank, never a collective in the user's loop:

1. A preemption signal reaches the driver or an agent; `decide` asks for agreement (AgreePreemption)
   and `notify` sends every rank of the attempt a `PreemptionNotice`.
2. The worker's stream thread reads it, marks the rank noticed, and answers at once with the number of
   reports the rank had made (`PreemptionSeen`); from then on that rank's next `report()` (and any
   `get_preemption_info()`) waits until the round is known (minitrain.worker.preemption). The answer
   does not wait for the training loop, so a rank blocked in a collective or in a checkpoint report
   answers too.
3. Once every rank that may still report has answered, `settle` picks R = `agreed_round(answers)` and
   sends it (`PreemptionRound`). Every rank sees `get_preemption_info()` non-None from its R-th
   report on and None before it; the report with index R carries the checkpoint; a rank holds after
   that report until it is stopped.
4. `reached` says when every rank reported round R (its commit happened as the last of them was
   recorded): `decide` then stops the attempt.
"""

from __future__ import annotations

import logging
from typing import Callable, Iterable, Optional

from minitrain.commands import PreemptionNotice, PreemptionRound
from minitrain.coordinator.facts import events as ev
from minitrain.coordinator.facts.attempt import AttemptTracker
from minitrain.coordinator.facts.outbox import Outbox
from minitrain.records import PreemptionInfo

logger = logging.getLogger("minitrain")

DRIVER = ""  # the node id of a signal the driver received


def agreed_round(answers: Iterable[int]) -> int:
    """The agreed round from the ranks' answers (how many reports each had made when it read the
    notice): one more than the largest.

    Why this is safe and the smallest such round: a rank that answered n may have been told None by
    `get_preemption_info()` after n reports, never after more (once noticed it waits for the round),
    so R must exceed every answer; and a rank that answered n makes at most one more report (n + 1
    in all) before it learns R, so R = max + 1 is reached by every rank after it learned it. A report
    in flight when the signal came is counted: the worker answers, not the coordinator's view of the
    reports it has recorded."""
    return max(answers, default=0) + 1


class Preemption:
    """The preemption facts of one run (see the module docstring); `timeout_s` is
    `FailureConfig.preemption_timeout_s` (for the deadline the ranks are told)."""

    def __init__(self, outbox: Outbox, clock: Callable[[], float], timeout_s: float):
        self._outbox = outbox
        self._clock = clock
        self._timeout_s = timeout_s
        self.signals: list[tuple[str, str]] = []  # (node id or DRIVER, signal name), in arrival order
        self.first_at: Optional[float] = None
        self._unseen = 0  # signals not yet given to decide()
        self._unseen_again = False  # one of them came from a process that had signalled before
        self._attempt: Optional[int] = None  # the attempt that was told (None: no notice sent)
        self._answers: dict[int, int] = {}
        self.round: Optional[int] = None
        self.info: Optional[PreemptionInfo] = None
        self.completed = False  # every rank reported the agreed round

    @property
    def active(self) -> bool:
        """A notice was sent and the round is not reached yet."""
        return self._attempt is not None and not self.completed

    def signalled(self, event: ev.PreemptionSignalled) -> None:
        """Record a signal (the driver's or an agent's)."""
        if self.first_at is None:
            self.first_at = self._clock()
        if any(node == event.node_id for node, _ in self.signals):
            self._unseen_again = True
        self.signals.append((event.node_id, event.signal))
        self._unseen += 1
        where = "the driver" if event.node_id == DRIVER else f"node {event.node_id}"
        logger.warning("preemption signal %s on %s", event.signal, where)

    def take_new(self) -> tuple[int, bool]:
        """How many signals arrived since the last call, and whether one of them came from a process
        (the driver, a node's agent) that had signalled before (for `Seen.preempted` and
        `Seen.preempted_again`). One signal on each process is one preemption: Kubernetes deleting a job
        and Slurm's ``scancel`` send SIGTERM to every pod or step at once."""
        count, again = self._unseen, self._unseen_again
        self._unseen, self._unseen_again = 0, False
        return count, again

    def notify(self, tracker: AttemptTracker) -> None:
        """Send every rank of `tracker`'s attempt the notice (AgreePreemption)."""
        self._attempt = tracker.attempt
        for rank in tracker.ranks:
            self._outbox.to_worker(tracker.attempt, rank, PreemptionNotice())

    def seen(self, event: ev.PreemptionSeen) -> None:
        """A rank's answer to the notice."""
        if event.attempt == self._attempt and self.round is None:
            self._answers[event.rank] = event.rounds

    def settle(self, tracker: AttemptTracker) -> None:
        """Once every rank that may still report has answered, pick the round and tell every rank."""
        if self._attempt != tracker.attempt or self.round is not None:
            return
        waiting = [r for r, s in tracker.ranks.items()
                   if r not in self._answers and not (s.done or s.exited or s.failure is not None)]
        if waiting:
            return
        self.round = agreed_round(self._answers.values())
        self.info = self._info(tracker, self.round)
        node_ranks = tuple((node, tuple(ranks)) for node, ranks in sorted(self.info.preempted_node_to_ranks.items()))
        command = PreemptionRound(self.round, self.info.deadline_ms or 0, node_ranks, self.info.signal)
        for rank in tracker.ranks:
            self._outbox.to_worker(tracker.attempt, rank, command)
        logger.warning("preemption: every rank checkpoints at report round %d of attempt %d (answers: %s)",
                       self.round, tracker.attempt, dict(sorted(self._answers.items())))

    def reached(self, tracker: AttemptTracker) -> bool:
        """Every rank reported the agreed round (or finished before it), and not every rank finished
        (then the run simply ends). Remembered once true (`completed`). Asked only while the run waits
        for the round: a rank killed later has not reported it."""
        if self.round is None or self._attempt != tracker.attempt or tracker.all_done():
            return False
        round_ = self.round
        if all(s.done or (s.last_round is not None and s.last_round >= round_) for s in tracker.ranks.values()):
            self.completed = True
        return self.completed

    def outcome_info(self, tracker: Optional[AttemptTracker]) -> Optional[PreemptionInfo]:
        """What `PreemptionError.preemption_info` says: the info the ranks saw, or (no round was agreed:
        the signal came before every rank trained, or the answers did not all come) the signals alone."""
        if self.info is not None:
            return self.info
        if not self.signals:
            return None
        return self._info(tracker, -1)

    def _info(self, tracker: Optional[AttemptTracker], round_: int) -> PreemptionInfo:
        nodes = {node for node, _ in self.signals}
        by_node: dict[str, list[int]] = {}
        if tracker is not None:
            for rank, state in sorted(tracker.ranks.items()):
                node = state.assignment.node_id
                if DRIVER in nodes or node in nodes:
                    by_node.setdefault(node, []).append(rank)
        for node in nodes - {DRIVER} - set(by_node):
            by_node[node] = []
        deadline = None if self.first_at is None else int((self.first_at + self._timeout_s) * 1000)
        return PreemptionInfo(deadline_ms=deadline, preempted_node_to_ranks=by_node, round=round_,
                              signal=self.signals[0][1] if self.signals else "")
