"""minitrain.coordinator.states: the one table of allowed run-state transitions, checked exhaustively."""

from __future__ import annotations

import itertools

import pytest

from minitrain.coordinator.states import ALLOWED, TERMINAL, IllegalTransition, RunState, RunStateMachine
from minitrain.records import Step

S = RunState

# The shortest legal path from PENDING to each state, so a machine can be put in any state honestly.
_PATH_TO = {
    S.PENDING: [],
    S.LAUNCHING: [(S.LAUNCHING, None)],
    S.STARTING: [(S.LAUNCHING, None), (S.STARTING, None)],
    S.RUNNING: [(S.LAUNCHING, None), (S.STARTING, None), (S.RUNNING, None)],
    S.RESTARTING: [(S.LAUNCHING, None), (S.STARTING, None), (S.RESTARTING, None)],
    S.STOPPING: [(S.STOPPING, S.FAILED)],
    S.SUCCEEDED: [(S.STOPPING, S.SUCCEEDED), (S.SUCCEEDED, None)],
    S.FAILED: [(S.STOPPING, S.FAILED), (S.FAILED, None)],
    S.ABORTED: [(S.STOPPING, S.ABORTED), (S.ABORTED, None)],
}


class FakeClock:
    """Returns 100.0, 101.0, ... so each Step's time is predictable."""

    def __init__(self) -> None:
        self.now = 99.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


def _machine_in(state: RunState, stopping_target: RunState = S.FAILED) -> RunStateMachine:
    machine = RunStateMachine(clock=FakeClock())
    for next_state, target in _PATH_TO[state]:
        if next_state is S.STOPPING:
            target = stopping_target if state is S.STOPPING else target
        machine.move(next_state, "setup", attempt=0, target=target)
    assert machine.state is state
    return machine


def test_table_covers_every_state_and_terminal_is_exact():
    assert set(ALLOWED) == set(RunState)
    assert TERMINAL == {S.SUCCEEDED, S.FAILED, S.ABORTED}
    assert {s for s in RunState if s.is_terminal} == TERMINAL


def test_initial_state_is_pending_with_empty_history():
    machine = RunStateMachine()
    assert machine.state is S.PENDING and machine.history == [] and machine.target is None


@pytest.mark.parametrize(("current", "next_state"),
                         [(c, n) for c in RunState for n in sorted(ALLOWED[c], key=lambda s: s.value)])
def test_every_allowed_transition_works(current, next_state):
    # From STOPPING the only legal move is to its target; pick the machine's target to match.
    machine = _machine_in(current, stopping_target=next_state if current is S.STOPPING else S.FAILED)
    before = len(machine.history)
    target = S.ABORTED if next_state is S.STOPPING else None
    machine.move(next_state, "because", attempt=3, target=target)
    assert machine.state is next_state
    assert len(machine.history) == before + 1
    step = machine.history[-1]
    assert (step.previous, step.next, step.reason, step.attempt) == (current.value, next_state.value,
                                                                      "because", 3)
    if next_state is S.STOPPING:
        assert machine.target is S.ABORTED


@pytest.mark.parametrize(("current", "next_state"),
                         [(c, n) for c, n in itertools.product(RunState, RunState) if n not in ALLOWED[c]])
def test_every_pair_not_in_table_is_illegal(current, next_state):
    machine = _machine_in(current)
    history = list(machine.history)
    target = S.FAILED if next_state is S.STOPPING else None
    with pytest.raises(IllegalTransition) as info:
        machine.move(next_state, "nope", attempt=0, target=target)
    assert current.value in str(info.value) and next_state.value in str(info.value)
    assert machine.state is current, "a refused move must not change the state"
    assert machine.history == history, "a refused move must not be recorded"


def test_illegal_pairs_are_exhaustive():
    legal = sum(len(v) for v in ALLOWED.values())
    illegal = sum(1 for c, n in itertools.product(RunState, RunState) if n not in ALLOWED[c])
    assert legal + illegal == len(RunState) ** 2


def test_no_self_loops():
    for state in RunState:
        assert state not in ALLOWED[state]


def test_terminal_states_have_no_exits():
    for state in TERMINAL:
        assert ALLOWED[state] == frozenset()
        for next_state in RunState:
            machine = _machine_in(state)
            with pytest.raises(IllegalTransition):
                machine.move(next_state, "after the end", attempt=0,
                             target=S.FAILED if next_state is S.STOPPING else None)


def test_terminal_states_are_reachable_only_through_stopping():
    for state, exits in ALLOWED.items():
        if state is not S.STOPPING:
            assert not (exits & TERMINAL), f"{state} skips STOPPING"


def test_every_non_terminal_state_can_stop():
    for state in RunState:
        if not state.is_terminal and state is not S.STOPPING:
            assert S.STOPPING in ALLOWED[state]


@pytest.mark.parametrize("bad_target", [None, S.RUNNING, S.STOPPING, S.PENDING, S.RESTARTING])
def test_stopping_requires_a_terminal_target(bad_target):
    machine = _machine_in(S.RUNNING)
    with pytest.raises(IllegalTransition):
        machine.move(S.STOPPING, "stop", attempt=0, target=bad_target)
    assert machine.state is S.RUNNING and machine.target is None


@pytest.mark.parametrize("target", sorted(TERMINAL, key=lambda s: s.value))
def test_stopping_then_only_its_target(target):
    for other in TERMINAL - {target}:
        machine = _machine_in(S.RUNNING)
        machine.move(S.STOPPING, "stop", attempt=1, target=target)
        with pytest.raises(IllegalTransition):
            machine.move(other, "wrong end", attempt=1)
        assert machine.state is S.STOPPING
    machine = _machine_in(S.RUNNING)
    machine.move(S.STOPPING, "stop", attempt=1, target=target)
    machine.move(target, "done", attempt=1)
    assert machine.state is target


@pytest.mark.parametrize("next_state", [S.LAUNCHING, S.STARTING, S.RUNNING, S.RESTARTING])
def test_only_stopping_takes_a_target(next_state):
    machine = _machine_in(S.PENDING)
    for state in (S.LAUNCHING, S.STARTING, S.RUNNING):
        if next_state in ALLOWED[machine.state]:
            break
        machine.move(state, "walk", attempt=0)
    assert next_state in ALLOWED[machine.state]
    with pytest.raises(IllegalTransition):
        machine.move(next_state, "with target", attempt=0, target=S.SUCCEEDED)


def test_terminal_target_with_illegal_terminal_move_is_refused():
    machine = _machine_in(S.STOPPING, stopping_target=S.SUCCEEDED)
    with pytest.raises(IllegalTransition):
        machine.move(S.SUCCEEDED, "target given to a terminal move", attempt=0, target=S.SUCCEEDED)


def test_history_records_steps_in_order_with_clock_times():
    machine = RunStateMachine(clock=FakeClock())
    machine.move(S.LAUNCHING, "fit() called", attempt=0)
    machine.move(S.STARTING, "agents up", attempt=0)
    machine.move(S.RUNNING, "all ranks training", attempt=0)
    machine.move(S.RESTARTING, "rank 1 died", attempt=0)
    machine.move(S.STARTING, "retry", attempt=1)
    machine.move(S.STOPPING, "budget spent", attempt=1, target=S.FAILED)
    machine.move(S.FAILED, "teardown done", attempt=1)
    assert machine.history == [
        Step("PENDING", "LAUNCHING", "fit() called", 0, 100.0),
        Step("LAUNCHING", "STARTING", "agents up", 0, 101.0),
        Step("STARTING", "RUNNING", "all ranks training", 0, 102.0),
        Step("RUNNING", "RESTARTING", "rank 1 died", 0, 103.0),
        Step("RESTARTING", "STARTING", "retry", 1, 104.0),
        Step("STARTING", "STOPPING", "budget spent", 1, 105.0),
        Step("STOPPING", "FAILED", "teardown done", 1, 106.0),
    ]
    assert all(isinstance(step, Step) for step in machine.history)
    assert machine.state.is_terminal
