"""The run lifecycle's one vocabulary (L0: stdlib only): the states, the table of allowed moves and the
check every move passes.

PENDING -> LAUNCHING -> STARTING -> RUNNING; STARTING/RUNNING -> RESTARTING -> STARTING; any
non-terminal state -> STOPPING(target); STOPPING -> its target (SUCCEEDED | FAILED | ABORTED).
Terminal states are reachable only through STOPPING, so no path skips the teardown.

The state itself has one holder: the controller's `decide.Loop`. Every move it makes is checked by
`check_move`. Code compares `RunState` members, never their names.
"""

from __future__ import annotations

import enum
from typing import Optional


class RunState(enum.Enum):
    """The states of one run (one `fit()`)."""

    PENDING = "PENDING"  # fit() called; nothing started yet
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
    """A move not in ALLOWED was attempted: a bug in the controller, never a user error."""


def check_move(previous: RunState, next_state: RunState, target: Optional[RunState] = None,
               heading: Optional[RunState] = None) -> None:
    """Raise IllegalTransition unless the run may move from `previous` to `next_state`.

    `target` is the move's own: required (a terminal state) with a move to STOPPING, refused with any
    other. `heading` is where the run's STOPPING leads (the target it was entered with): a move out
    of STOPPING must go there."""
    if next_state not in ALLOWED[previous]:
        raise IllegalTransition(f"{previous.value} -> {next_state.value} is not allowed")
    if next_state is RunState.STOPPING:
        if target not in TERMINAL:
            raise IllegalTransition(f"STOPPING needs a terminal target, got {target}")
    elif target is not None:
        raise IllegalTransition(f"only STOPPING takes a target, got {next_state.value} -> {target}")
    elif previous is RunState.STOPPING and next_state is not heading:
        where = heading.value if heading is not None else "nowhere"
        raise IllegalTransition(f"STOPPING was headed to {where}, not {next_state.value}")

