"""minitrain.run_state: the one table of allowed run-state moves and its check, exhaustively; the one
translation into the words users read."""

from __future__ import annotations

import itertools

import pytest

from minitrain.run_state import (
    ALLOWED, TERMINAL, IllegalTransition, RunState, check_move, from_ray_status, ray_status,
)

S = RunState


def _target_for(next_state: RunState):
    """A move's own target: a terminal state with STOPPING, none otherwise."""
    return S.FAILED if next_state is S.STOPPING else None


def test_table_covers_every_state_and_terminal_is_exact():
    assert set(ALLOWED) == set(RunState)
    assert TERMINAL == {S.SUCCEEDED, S.FAILED, S.ABORTED}
    assert {s for s in RunState if s.is_terminal} == TERMINAL


@pytest.mark.parametrize(("current", "next_state"),
                         [(c, n) for c in RunState for n in sorted(ALLOWED[c], key=lambda s: s.value)])
def test_every_allowed_transition_passes(current, next_state):
    # From STOPPING the only legal move is to where it is headed.
    heading = next_state if current is S.STOPPING else None
    check_move(current, next_state, _target_for(next_state), heading=heading)


@pytest.mark.parametrize(("current", "next_state"),
                         [(c, n) for c, n in itertools.product(RunState, RunState) if n not in ALLOWED[c]])
def test_every_pair_not_in_table_is_illegal(current, next_state):
    with pytest.raises(IllegalTransition) as info:
        check_move(current, next_state, _target_for(next_state), heading=S.FAILED)
    assert current.value in str(info.value) and next_state.value in str(info.value)


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
            with pytest.raises(IllegalTransition):
                check_move(state, next_state, _target_for(next_state), heading=state)


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
    with pytest.raises(IllegalTransition):
        check_move(S.RUNNING, S.STOPPING, bad_target)


@pytest.mark.parametrize("target", sorted(TERMINAL, key=lambda s: s.value))
def test_stopping_then_only_its_target(target):
    check_move(S.RUNNING, S.STOPPING, target)
    for other in TERMINAL - {target}:
        with pytest.raises(IllegalTransition, match=f"headed to {target.value}"):
            check_move(S.STOPPING, other, heading=target)
    check_move(S.STOPPING, target, heading=target)
    with pytest.raises(IllegalTransition, match="headed to nowhere"):
        check_move(S.STOPPING, target)


@pytest.mark.parametrize("next_state", [S.LAUNCHING, S.STARTING, S.RUNNING, S.RESTARTING])
def test_only_stopping_takes_a_target(next_state):
    [previous] = [s for s in (S.PENDING, S.LAUNCHING, S.STARTING) if next_state in ALLOWED[s]][:1]
    check_move(previous, next_state)
    with pytest.raises(IllegalTransition):
        check_move(previous, next_state, S.SUCCEEDED)


def test_terminal_target_with_illegal_terminal_move_is_refused():
    with pytest.raises(IllegalTransition):
        check_move(S.STOPPING, S.SUCCEEDED, S.SUCCEEDED, heading=S.SUCCEEDED)


def test_a_whole_run_passes_move_by_move():
    heading = None
    path = [(S.PENDING, S.LAUNCHING, None), (S.LAUNCHING, S.STARTING, None), (S.STARTING, S.RUNNING, None),
            (S.RUNNING, S.RESTARTING, None), (S.RESTARTING, S.STARTING, None), (S.STARTING, S.STOPPING, S.FAILED),
            (S.STOPPING, S.FAILED, None)]
    for previous, next_state, target in path:
        check_move(previous, next_state, target, heading=heading)
        heading = target or heading


def test_the_user_facing_words_are_ray_s_for_the_outcomes_and_the_state_s_own_name_otherwise():
    assert {s: ray_status(s) for s in TERMINAL} == {S.SUCCEEDED: "FINISHED", S.FAILED: "ERRORED",
                                                    S.ABORTED: "ABORTED"}
    for state in set(RunState) - TERMINAL:
        assert ray_status(state) == state.value  # STARTING is STARTING in the log, the console and the page


def test_the_translation_is_total_one_to_one_and_read_back():
    words = [ray_status(state) for state in RunState]
    assert all(isinstance(w, str) and w for w in words) and len(set(words)) == len(RunState)
    for state in RunState:
        assert from_ray_status(ray_status(state)) is state
    assert from_ray_status("SUCCEEDED") is None and from_ray_status("") is None
