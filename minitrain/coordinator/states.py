"""The run lifecycle: states and the one table of allowed transitions.

PENDING -> LAUNCHING -> STARTING -> RUNNING; STARTING/RUNNING -> RESTARTING -> STARTING; any
non-terminal state -> STOPPING(target); STOPPING -> its target (SUCCEEDED | FAILED | ABORTED).
Terminal states are reachable only through STOPPING, so no path skips the teardown.
"""

from __future__ import annotations

import enum
import logging
import time
from typing import Callable, Optional

from minitrain.records import Step

logger = logging.getLogger("minitrain.coordinator")


class RunState(enum.Enum):
    """The states of one run (one `fit()`)."""

    PENDING = "PENDING"
    LAUNCHING = "LAUNCHING"  # starting node agents
    STARTING = "STARTING"  # an attempt's workers are starting (hello, rendezvous, process group)
    RUNNING = "RUNNING"  # every rank is in its training function
    RESTARTING = "RESTARTING"  # a failure within budget: the attempt is being torn down
    STOPPING = "STOPPING"  # tearing everything down on the way to `target`
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    ABORTED = "ABORTED"

    @property
    def is_terminal(self) -> bool:
        """True for SUCCEEDED, FAILED and ABORTED."""
        return self in TERMINAL


TERMINAL = frozenset({RunState.SUCCEEDED, RunState.FAILED, RunState.ABORTED})

ALLOWED: dict[RunState, frozenset[RunState]] = {
    RunState.PENDING: frozenset({RunState.LAUNCHING, RunState.STOPPING}),
    RunState.LAUNCHING: frozenset({RunState.STARTING, RunState.STOPPING}),
    RunState.STARTING: frozenset({RunState.RUNNING, RunState.RESTARTING, RunState.STOPPING}),
    RunState.RUNNING: frozenset({RunState.RESTARTING, RunState.STOPPING}),
    RunState.RESTARTING: frozenset({RunState.STARTING, RunState.STOPPING}),
    RunState.STOPPING: TERMINAL,
    RunState.SUCCEEDED: frozenset(),
    RunState.FAILED: frozenset(),
    RunState.ABORTED: frozenset(),
}


class IllegalTransition(RuntimeError):
    """A transition not in ALLOWED was attempted: a bug in the controller, never a user error."""


class RunStateMachine:
    """Holds the current state; `move()` is the only way to change it.

    STOPPING carries its target terminal state; from STOPPING only that target may follow. Every move
    is kept as a `Step` in `history` and logged.
    """

    def __init__(self, clock: Callable[[], float] = time.time):
        self.state = RunState.PENDING
        self.target: Optional[RunState] = None
        self.history: list[Step] = []
        self._clock = clock

    def move(self, next_state: RunState, reason: str, attempt: int,
             target: Optional[RunState] = None) -> None:
        """Change state or raise IllegalTransition. `target` is required with STOPPING only."""
        if next_state not in ALLOWED[self.state]:
            raise IllegalTransition(f"{self.state.value} -> {next_state.value} is not allowed ({reason})")
        if next_state is RunState.STOPPING:
            if target not in TERMINAL:
                raise IllegalTransition(f"STOPPING needs a terminal target, got {target}")
            self.target = target
        elif target is not None:
            raise IllegalTransition(f"only STOPPING takes a target, got {next_state.value} -> {target}")
        elif self.state is RunState.STOPPING and next_state is not self.target:
            raise IllegalTransition(f"STOPPING was headed to {self.target.value}, not {next_state.value}")
        step = Step(self.state.value, next_state.value, reason, attempt, self._clock())
        self.history.append(step)
        logger.debug("run state %s -> %s (attempt %d): %s", step.previous, step.next, attempt, reason)
        self.state = next_state
