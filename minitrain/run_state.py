"""The run lifecycle's one vocabulary (L0: stdlib only): the states, the table of allowed moves, the
check every move passes, and the one translation into the words users read.

The allowed moves are the table `ALLOWED`; terminal states are reachable only through STOPPING, so no
path skips the teardown. The drawing of the lifecycle (each move with why it happens, and what the loop
waits for inside each state) is in coordinator/policy/decide.py's docstring, and only there.

The state itself has one holder: the controller's `Loop` (coordinator/policy/loop.py). Every move it makes is checked by
`check_move` and told to the run's observers (`RunObserver.on_state`) as `RunState` values. Code
compares `RunState` members; text for people and for other systems' vocabularies (the dashboard's
JSON, Prometheus, the console, the events file) comes from `ray_status` only.
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


# Ray Train's RunStatus words for the outcomes; a state in progress keeps its own name (RUNNING and
# RESTARTING are Ray's too), so that STARTING means one thing in the log, the console and the dashboard.
_RAY_WORDS = {RunState.SUCCEEDED: "FINISHED", RunState.FAILED: "ERRORED", RunState.ABORTED: "ABORTED"}


def ray_status(state: RunState) -> str:
    """The word users read for `state`: FINISHED, ERRORED or ABORTED for the outcomes (Ray Train's),
    the state's own name for the others. The monitor's JSON and events file, the dashboard,
    Prometheus, the console and the logs show this word; only `Callback.on_run_end` keeps its
    documented SUCCEEDED / FAILED / ABORTED (the state's name)."""
    return _RAY_WORDS.get(state, state.value)


_STATES_BY_WORD = {ray_status(state): state for state in RunState}


def from_ray_status(word: str) -> Optional[RunState]:
    """The state `ray_status` names `word` (None for a word it never returns): for readers of the JSON
    the monitor wrote (the dashboard's pages, a run directory's events file)."""
    return _STATES_BY_WORD.get(word)
