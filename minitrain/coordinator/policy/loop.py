"""What `decide` (coordinator/policy/decide.py) reads and returns: where the run is (`Loop`, `Wait`), what is
true now (`Seen`, `Watch`), the limits it applies (`Rules`) and its answer (`Decision`, the `Action`s of
coordinator/policy/actions.py plus `LogLate`). Plain frozen records; the policy itself is decide's.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Mapping, Optional, Union

from minitrain.coordinator.policy.actions import (
    AgreePreemption, CloseStreams, CollectStacks, DeclareHung, DropDeadAgents, ForgetAgents, MoveTo,
    PrepareForkServers, RelaunchAgents, StartAttempt, StopWorkers,
)
from minitrain.coordinator.policy.elastic import Sizing
from minitrain.run_state import RunState

if TYPE_CHECKING:
    from minitrain.config import FailureConfig

STACK_WAIT_S = 5.0  # the agents wait up to 2 s for each dump
STOP_MARGIN_S = 10.0  # on top of the grace: SIGKILL plus the agents' bounded waits
DRAIN_S = 5.0  # after the processes exited, for their streams' last messages (normally milliseconds)
# How long the live ranks of a failed attempt may take to report the round a failed rank reported last:
# rank skew is usually a step or a checkpoint upload; a peer blocked in a collective never gets there.
CATCH_UP_S = 10.0
PREEMPT_TIMEOUT_S = 20.0  # FailureConfig.preemption_timeout_s's default
MAX_ATTEMPTS_WITHOUT_PROGRESS = 3  # FailureConfig.max_attempts_without_progress's default
INTERRUPTED = "interrupted by the user (Ctrl-C)"
PREEMPTED = "preempted"  # how every preemption's reason begins (outcome.py, the trainer read it)


class Wait(enum.Enum):
    """What the loop waits for inside its run state (`Loop.waiting_for`), until `Loop.deadline`."""

    AGENTS = "agents"  # every expected node agent connected
    WORKERS = "workers"  # the attempt finishes or a rank fails
    STACKS = "stacks"  # every live rank's thread stacks arrived (a rank was found silent)
    CATCH_UP = "catch_up"  # every live rank reported the round a failed rank reported last
    PREEMPT = "preempt"  # every rank reported the round agreed after a preemption signal
    EXIT = "exit"  # every process of the attempt exited
    DRAIN = "drain"  # every stream of the attempt delivered its last message
    DONE = "done"  # the run is in its terminal state


@dataclass(frozen=True)
class Rules:
    """The limits `decide` applies, and the run's budgets: the failure budget (`allows_retry`,
    `retries_left`: restarts inside one fit()), its limit on attempts in a row that fail without progress
    (`stops_without_progress`, whatever the failure budget says), and the preemption budget
    (`allows_resume`: whether the next fit() may resume a preempted run).

    Built from the run's FailureConfig by `from_config`."""

    max_failures: int  # -1: unlimited
    stop_grace_s: float
    agent_start_timeout_s: float = 60.0
    stack_wait_s: float = STACK_WAIT_S
    stop_margin_s: float = STOP_MARGIN_S
    drain_s: float = DRAIN_S
    catch_up_s: float = CATCH_UP_S
    preempt_timeout_s: float = PREEMPT_TIMEOUT_S
    max_preemption_failures: int = -1  # -1: unlimited
    max_attempts_without_progress: int = MAX_ATTEMPTS_WITHOUT_PROGRESS  # -1: no limit
    # An elastic run's sizing (ScalingConfig(num_workers=(min, max))): None for a fixed size. Its max is the
    # controller's (Seen.fits never exceeds it).
    sizing: Optional[Sizing] = None

    @property
    def elastic(self) -> bool:
        """The run's size may change between attempts (docs/elastic.md): the one test of it."""
        return self.sizing is not None

    @classmethod
    def from_config(cls, failure: "FailureConfig", agent_start_timeout_s: float = 60.0,
                    sizing: Optional[Sizing] = None) -> "Rules":
        """The rules of a run whose failure settings are `failure` (its `max_failures`,
        `worker_stop_grace_s`, `preemption_timeout_s`, `max_preemption_failures` and
        `max_attempts_without_progress`), waiting up to `agent_start_timeout_s` for its node agents;
        `sizing` for an elastic run (`RunSpec.sizing`)."""
        return cls(max_failures=failure.max_failures, stop_grace_s=failure.worker_stop_grace_s,
                   agent_start_timeout_s=agent_start_timeout_s,
                   preempt_timeout_s=getattr(failure, "preemption_timeout_s", PREEMPT_TIMEOUT_S),
                   max_preemption_failures=getattr(failure, "max_preemption_failures", -1),
                   max_attempts_without_progress=getattr(failure, "max_attempts_without_progress",
                                                         MAX_ATTEMPTS_WITHOUT_PROGRESS),
                   sizing=sizing)

    def allows_retry(self, failures: int) -> bool:
        """Whether the run restarts after its `failures`-th failure (this one included).

        As Ray: retry while `failures <= max_failures`, so `max_failures=1` retries the first failure and
        the second one is fatal; -1 retries forever."""
        return self.max_failures == -1 or failures <= self.max_failures

    def restart_may_come(self, failures: int) -> bool:
        """Whether a restart may follow the current attempt: a failure within the budget, or (elastic
        runs) a resize."""
        return self.elastic or self.allows_retry(failures + 1)

    def retries_left(self, failures: int) -> Optional[int]:
        """Restarts still allowed after `failures` failures: None when unlimited (-1), never below 0."""
        return None if self.max_failures == -1 else max(0, self.max_failures - failures)

    def stops_without_progress(self, attempts: int) -> bool:
        """Whether the run stops once `attempts` attempts in a row (the latest included) failed without
        progress: at `max_attempts_without_progress`, whatever `max_failures` allows; -1 never. Progress
        is a committed round beyond the furthest one committed before the attempt
        (`Seen.progressed`); a resize and a preemption are not failures and count neither way."""
        return self.max_attempts_without_progress != -1 and attempts >= self.max_attempts_without_progress

    def allows_resume(self, preemptions: int) -> bool:
        """Whether a run that preemptions ended `preemptions` times (this one included) may be resumed by
        the next fit(): while `preemptions <= max_preemption_failures`; -1 always. A preemption never
        spends `max_failures` (it ends the fit(); it is counted in the run's index for the next one)."""
        return self.max_preemption_failures == -1 or preemptions <= self.max_preemption_failures


@dataclass(frozen=True)
class Loop:
    """Where the run is: the one holder of the run's state. Replaced (never mutated) by every decision."""

    state: RunState = RunState.PENDING
    waiting_for: Wait = Wait.AGENTS
    attempt: int = 0
    failures: int = 0
    # failed attempts in a row that made no progress (Rules.stops_without_progress): counted once a failed
    # attempt is down; an attempt that made progress resets it, a resize leaves it as it is
    no_progress: int = 0
    deadline: Optional[float] = None  # when the wait gives up
    target: Optional[RunState] = None  # the terminal state STOPPING leads to
    reason: str = ""  # why the run is in this state (the last move's reason)
    interrupts: int = 0  # Ctrl-C presses so far
    preemptions: int = 0  # preemption signals so far
    hung: tuple[int, ...] = ()  # STACKS: the ranks found silent
    # Elastic runs only:
    judging: bool = False  # a failed attempt is being stopped; resize or charged failure is judged once it is down
    resize: str = ""  # the restart under way (and the latest start) is a resize: actions.SHRINK or GROW
    sized_at: float = 0.0  # when the current attempt started: growth waits the resize interval from here
    grow_armed: Optional[int] = None  # growth is due: it happens once more checkpoints than this are committed
    min_fit_at: Optional[float] = None  # LAUNCHING: when min_workers first fitted on the agents that are in

    @property
    def finished(self) -> bool:
        """True once the run reached its terminal state."""
        return self.state.is_terminal


@dataclass(frozen=True)
class Watch:
    """A live rank's hang clock: when it last made progress, and how long it may stay silent."""

    last_progress: float
    deadline_s: float


@dataclass(frozen=True)
class Seen:
    """What is true now, as the controller observed it just before deciding."""

    agents_missing: tuple[str, ...] = ()  # expected node agents not connected (yet)
    agents_failed: str = ""  # why some expected agent ended before it connected; "" when none did
    lost_nodes: bool = False  # nodes were lost since the last attempt started (they need new agents)
    start_error: str = ""  # the last start could not place the workers (the remaining hosts are too small)
    has_attempt: bool = False  # an attempt was started
    failed: bool = False  # a rank of the attempt failed
    finished: bool = False  # every rank of the attempt returned and exited cleanly
    all_training: bool = False  # every rank reached its training function
    all_exited: bool = False  # no process of the attempt is left
    all_drained: bool = False  # every stream of the attempt ended
    stacks_answered: bool = False  # every live rank's stacks arrived since they were asked for
    # a round some failed rank reported is not complete yet and every rank that has not reported it is
    # alive (it can still): AttemptTracker.round_pending
    round_pending: bool = False
    watched: Mapping[int, "Watch"] = field(default_factory=dict)  # live training ranks with a hang deadline
    root_cause: str = ""  # one line naming the attempt's root-cause failure
    # the attempt committed a round beyond the furthest one the run had committed before it (Commits.progressed)
    progressed: bool = False
    interrupted: bool = False  # Ctrl-C was pressed since the last decision
    preempted: int = 0  # preemption signals since the last decision
    # one of them reached a process (the driver, a node's agent) that had had one before: "hurry". The first
    # signal of each process is the same preemption (Kubernetes and scancel signal every pod or step at once)
    preempted_again: bool = False
    preempt_reached: bool = False  # every rank reported the round agreed after a preemption
    # Elastic runs only (zero/False otherwise):
    fits: int = 0  # workers the usable nodes hold now, at most max_workers (coordinator/policy/elastic.py)
    fits_ready: int = 0  # of those, on nodes not still warming up for growth (Membership.ready): growth waits for these
    size: int = 0  # ranks of the current attempt
    lost_in_attempt: bool = False  # (while judging) a node of the current attempt was lost with its ranks
    checkpoints_committed: int = 0  # checkpoints committed by this fit() so far
    probe_due: bool = False  # a lost host's retry interval ran out and more workers would be welcome


# ---------------------------------------------------------------------- actions


@dataclass(frozen=True)
class LogLate:
    """The deadline of the wait `waiting_for` passed before what it waited for happened: say so."""

    waiting_for: Wait


Action = Union[MoveTo, StartAttempt, StopWorkers, CollectStacks, DeclareHung, CloseStreams,
               PrepareForkServers, RelaunchAgents, ForgetAgents, DropDeadAgents, AgreePreemption, LogLate]


@dataclass(frozen=True)
class Decision:
    """The next loop state and the actions that take the world there, in order."""

    loop: Loop
    actions: tuple[Action, ...] = ()
