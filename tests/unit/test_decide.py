"""The controller's policy, scripted: `decide()` fed observations, no processes (as Ray Train v2's
scripted-policy tests and TorchElastic's pure rendezvous tests do)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, strategies as st

from decide_support import run_script

from minitrain.coordinator.policy.actions import (
    CloseStreams, CollectStacks, DeclareHung, ForgetAgents, MoveTo, PrepareForkServers, RelaunchAgents, StartAttempt,
    StopWorkers,
)
from minitrain.coordinator.policy.decide import decide
from minitrain.coordinator.policy.loop import LogLate, Loop, Rules, Seen, Wait, Watch
from minitrain.run_state import RunState, check_move

S = RunState
RULES = Rules(max_failures=1, stop_grace_s=3.0, agent_start_timeout_s=60.0)
RUNNING_ATTEMPT = Seen(has_attempt=True, all_training=True)
EXITED = replace(RUNNING_ATTEMPT, failed=True, all_exited=True, root_cause="rank 1 raised ValueError")


def _run(script, loop=Loop(), rules=RULES):
    """Feed (seen, now) pairs; return the final loop and every action, in order."""
    return run_script(script, loop, rules)


def _running(failures=0, attempt=0) -> Loop:
    return Loop(state=S.RUNNING, waiting_for=Wait.WORKERS, attempt=attempt, failures=failures)


def _kinds(actions):
    return [type(a).__name__ for a in actions]


def test_a_clean_run_launches_starts_runs_and_succeeds_through_stopping():
    loop, actions = _run([
        (Seen(agents_missing=("n0",)), 0.0),  # PENDING -> LAUNCHING
        (Seen(agents_missing=("n0",)), 1.0),  # still waiting
        (Seen(), 2.0),  # the agent is in
        (Seen(has_attempt=True), 2.1),  # ranks starting
        (RUNNING_ATTEMPT, 3.0),
        (replace(RUNNING_ATTEMPT, finished=True, all_exited=True), 9.0),
        (replace(RUNNING_ATTEMPT, finished=True, all_exited=True, all_drained=True), 9.1),
    ])
    moves = [a.state for a in actions if isinstance(a, MoveTo)]
    assert moves == [S.LAUNCHING, S.STARTING, S.RUNNING, S.STOPPING, S.SUCCEEDED]
    assert StartAttempt(0) in actions and loop.finished and loop.state is S.SUCCEEDED
    assert actions[-2:] == [CloseStreams(), MoveTo(S.SUCCEEDED, "every rank finished")]


def test_every_move_decide_makes_passes_the_transition_check():
    """decide never makes a move `check_move` refuses, on any scripted path."""
    scripts = [
        [(Seen(), 0), (Seen(has_attempt=True), 0), (RUNNING_ATTEMPT, 1),
         (replace(RUNNING_ATTEMPT, failed=True), 2), (EXITED, 3), (replace(EXITED, all_drained=True), 4),
         (Seen(has_attempt=True), 5), (replace(EXITED, failed=True), 6), (replace(EXITED, all_drained=True), 7)],
        [(Seen(agents_missing=("n0",)), 0), (Seen(agents_failed="n0: exit 1", agents_missing=("n0",)), 0)],
        [(Seen(), 0), (Seen(has_attempt=True, interrupted=True), 1), (Seen(has_attempt=True, interrupted=True), 2),
         (replace(EXITED, all_drained=True), 3), (replace(EXITED, all_drained=True), 4)],
    ]
    for script in scripts:
        _, actions = _run(script)
        state, heading = S.PENDING, None
        for move in (a for a in actions if isinstance(a, MoveTo)):
            check_move(state, move.state, move.target, heading=heading)
            state, heading = move.state, move.target or heading
        assert state.is_terminal


def test_a_failure_within_budget_restarts_after_the_old_attempt_exited_and_drained():
    loop, actions = _run([(replace(RUNNING_ATTEMPT, failed=True, root_cause="boom"), 100.0)], _running())
    assert loop.state is S.RESTARTING and loop.waiting_for is Wait.EXIT and loop.failures == 1
    assert actions == [MoveTo(S.RESTARTING, "boom"), StopWorkers(3.0)]
    assert loop.deadline == 100.0 + 3.0 + RULES.stop_margin_s
    # Still stopping: nothing new happens, and RESTARTING lasts as long as the stop does.
    loop, actions = _run([(replace(RUNNING_ATTEMPT, failed=True), 101.0)], loop)
    assert actions == [] and loop.state is S.RESTARTING
    loop, actions = _run([(EXITED, 102.0)], loop)
    assert loop.waiting_for is Wait.DRAIN and actions == []
    loop, actions = _run([(replace(EXITED, all_drained=True), 102.5)], loop)
    assert actions == [CloseStreams(), MoveTo(S.STARTING, "starting attempt 1"), StartAttempt(1)]
    assert loop.attempt == 1 and loop.state is S.STARTING


def test_the_failure_past_the_budget_fails_the_run_with_its_root_cause():
    loop, actions = _run([(replace(RUNNING_ATTEMPT, failed=True, root_cause="rank 0 OOM"), 5.0)], _running(failures=1))
    assert loop.failures == 2 and loop.state is S.STOPPING and loop.target is S.FAILED
    assert actions == [MoveTo(S.STOPPING, "rank 0 OOM", S.FAILED), StopWorkers(3.0)]
    loop, actions = _run([(EXITED, 6.0), (replace(EXITED, all_drained=True), 6.1)], loop)
    assert loop.state is S.FAILED and actions[-1] == MoveTo(S.FAILED, "rank 0 OOM")


@pytest.mark.parametrize("max_failures, failures_before, restarts", [
    (0, 0, False), (1, 0, True), (1, 1, False), (3, 2, True), (-1, 1000, True)])
def test_the_budget_follows_ray_retry_while_failures_le_max_failures(max_failures, failures_before, restarts):
    rules = replace(RULES, max_failures=max_failures)
    loop, _ = _run([(replace(RUNNING_ATTEMPT, failed=True), 0.0)], _running(failures_before), rules)
    assert (loop.state is S.RESTARTING) == restarts


def test_a_stop_that_is_not_confirmed_gives_up_at_its_deadline_and_says_so():
    loop, _ = _run([(replace(RUNNING_ATTEMPT, failed=True), 0.0)], _running())
    stopping = replace(RUNNING_ATTEMPT, failed=True)  # a frozen rank never confirms its exit
    loop, actions = _run([(stopping, loop.deadline)], loop)
    assert loop.waiting_for is Wait.EXIT and actions == []
    loop, actions = _run([(stopping, loop.deadline + 0.01)], loop)
    assert loop.waiting_for is Wait.DRAIN and actions == [LogLate(Wait.EXIT)]
    loop, actions = _run([(stopping, loop.deadline + 0.01)], loop)  # nor does its stream end
    assert actions[0] == CloseStreams() and StartAttempt(1) in actions


def test_the_drain_waits_for_every_stream_so_reports_behind_a_failure_are_taken():
    loop, _ = _run([(EXITED, 0.0)], _running())  # every process already gone: straight to DRAIN
    assert loop.waiting_for is Wait.DRAIN
    loop, actions = _run([(EXITED, 1.0)], loop)
    assert actions == [], "closed the streams before their last messages were read"
    loop, actions = _run([(replace(EXITED, all_drained=True), 1.2)], loop)
    assert actions[0] == CloseStreams()


def test_launch_fails_when_an_agent_dies_or_does_not_connect_in_time():
    loop, actions = _run([(Seen(agents_missing=("n1",)), 0.0),
                          (Seen(agents_missing=("n1",), agents_failed="node agent(s) failed to start: n1: ssh"), 1.0)])
    assert loop.state is S.FAILED and "n1: ssh" in loop.reason
    assert [a.state for a in actions if isinstance(a, MoveTo)] == [S.LAUNCHING, S.STOPPING, S.FAILED]
    loop, _ = _run([(Seen(agents_missing=("n1", "n2")), 0.0), (Seen(agents_missing=("n1", "n2")), 60.0)])
    assert loop.state is S.LAUNCHING
    loop, _ = _run([(Seen(agents_missing=("n2",)), 60.01)], loop)
    assert loop.state is S.FAILED and loop.reason == "node agent(s) n2 did not connect within 60 s"


def test_lost_nodes_get_new_agents_before_the_next_attempt_and_the_run_goes_on_without_the_late():
    lost = replace(EXITED, all_drained=True, lost_nodes=True)
    loop, _ = _run([(EXITED, 0.0)], _running())
    loop, actions = _run([(lost, 1.0)], loop)
    assert actions == [CloseStreams(), RelaunchAgents()] and loop.waiting_for is Wait.AGENTS
    assert loop.state is S.RESTARTING  # still restarting while the agents come up
    loop, actions = _run([(replace(lost, agents_missing=("n1",)), 30.0)], loop)
    assert actions == []
    loop, actions = _run([(replace(lost, agents_missing=("n1",)), 61.5)], loop)
    assert isinstance(actions[0], ForgetAgents) and actions[-1] == StartAttempt(1)
    # If the hosts left cannot hold the run, the start says so and the run fails with that reason.
    loop, actions = _run([(replace(lost, start_error="the hosts that remain cannot hold the run"), 62.0)], loop)
    assert loop.target is S.FAILED and loop.reason == "the hosts that remain cannot hold the run"


def test_relaunched_agents_that_connect_start_the_next_attempt_at_once():
    loop, _ = _run([(EXITED, 0.0), (replace(EXITED, all_drained=True, lost_nodes=True), 0.1)], _running())
    loop, actions = _run([(replace(EXITED, all_drained=True, lost_nodes=True), 0.5)], loop)
    assert actions == [MoveTo(S.STARTING, "starting attempt 1"), StartAttempt(1)]


def _watched(deadline_s=10.0, **last_progress):
    return {int(r[1:]): Watch(t, deadline_s) for r, t in last_progress.items()}


def test_a_silent_rank_gets_its_stacks_collected_then_fails_as_hung():
    seen = replace(RUNNING_ATTEMPT, watched=_watched(r0=100.0, r1=92.0, r2=89.5))
    loop, actions = _run([(seen, 100.0)], _running())
    assert loop.waiting_for is Wait.STACKS and loop.hung == (2,) and actions == [CollectStacks()]
    loop, actions = _run([(seen, 101.0)], loop)  # not every stack is in yet
    assert actions == []
    loop, actions = _run([(replace(seen, stacks_answered=True), 101.5)], loop)
    assert actions == [DeclareHung((2,))] and loop.waiting_for is Wait.WORKERS
    loop, actions = _run([(replace(seen, failed=True, root_cause="rank 2 hung"), 101.6)], loop)
    assert loop.state is S.RESTARTING


def test_ranks_that_fall_due_while_stacks_are_collected_are_declared_with_the_first():
    # Rank 1 froze; rank 0 waits for it and its deadline (from a report that arrived a little
    # earlier) falls due first. By the time the stacks are in, rank 1 is past its deadline too and is
    # declared with rank 0, so the root-cause choice sees it (rank 2 is not yet due and is not).
    seen = replace(RUNNING_ATTEMPT, watched=_watched(r0=89.99, r1=90.0, r2=95.0))
    loop, actions = _run([(seen, 100.0)], _running())
    assert loop.hung == (0,) and actions == [CollectStacks()]
    loop, actions = _run([(replace(seen, stacks_answered=True), 100.05)], loop)
    assert actions == [DeclareHung((0, 1))]


def test_stacks_that_never_come_do_not_hold_the_run():
    seen = replace(RUNNING_ATTEMPT, watched=_watched(r0=0.0))
    loop, _ = _run([(seen, 20.0)], _running())
    loop, actions = _run([(seen, 20.0 + RULES.stack_wait_s + 0.1)], loop)
    assert actions == [LogLate(Wait.STACKS), DeclareHung((0,))]


def test_each_rank_is_judged_by_its_own_deadline_and_unwatched_ranks_never_hang():
    watched = {0: Watch(0.0, 600.0), 1: Watch(50.0, 20.0)}  # rank 2 is not watched at all (no deadline)
    loop, actions = _run([(replace(RUNNING_ATTEMPT, watched=watched), 69.0)], _running())
    assert actions == [] and loop.waiting_for is Wait.WORKERS
    loop, actions = _run([(replace(RUNNING_ATTEMPT, watched=watched), 70.5)], _running())
    assert loop.hung == (1,) and actions == [CollectStacks()]
    loop, actions = _run([(RUNNING_ATTEMPT, 1e9)], _running())
    assert actions == [] and loop.waiting_for is Wait.WORKERS


def test_fork_servers_are_prepared_only_when_a_restart_may_come():
    starting = Loop(state=S.STARTING, waiting_for=Wait.WORKERS)
    _, actions = _run([(RUNNING_ATTEMPT, 0.0)], starting)
    assert PrepareForkServers() in actions
    _, actions = _run([(RUNNING_ATTEMPT, 0.0)], starting, replace(RULES, max_failures=0))
    assert PrepareForkServers() not in actions and MoveTo(S.RUNNING, "every rank is training") in actions


def test_fork_servers_are_prepared_with_each_start_that_a_restart_may_follow():
    # With the start, not once the ranks train: a crash at start-up must find the fork server warming up.
    _, actions = _run([(Seen(), 0.0)], Loop(state=S.LAUNCHING, waiting_for=Wait.AGENTS))
    assert actions[-2:] == [StartAttempt(0), PrepareForkServers()]
    _, actions = _run([(Seen(), 0.0)], Loop(state=S.LAUNCHING, waiting_for=Wait.AGENTS), replace(RULES, max_failures=0))
    assert actions[-1] == StartAttempt(0) and PrepareForkServers() not in actions
    # A restart that another may follow (failure 1 of 2); the last retry's start has none (see above).
    draining = Loop(state=S.RESTARTING, waiting_for=Wait.DRAIN, failures=1, deadline=1e9)
    _, actions = _run([(replace(EXITED, all_drained=True), 0.0)], draining, replace(RULES, max_failures=2))
    assert actions[-2:] == [StartAttempt(1), PrepareForkServers()]


def test_ctrl_c_stops_gracefully_then_a_second_one_kills_at_once():
    loop, actions = _run([(replace(RUNNING_ATTEMPT, interrupted=True), 0.0)], _running())
    assert loop.state is S.STOPPING and loop.target is S.ABORTED and loop.interrupts == 1
    assert actions == [MoveTo(S.STOPPING, "interrupted by the user (Ctrl-C)", S.ABORTED), StopWorkers(3.0)]
    loop, actions = _run([(replace(RUNNING_ATTEMPT, interrupted=True), 0.5)], loop)
    assert actions == [StopWorkers(0.0)] and loop.interrupts == 2
    loop, _ = _run([(replace(EXITED, all_drained=True), 0.6), (replace(EXITED, all_drained=True), 0.7)], loop)
    assert loop.state is S.ABORTED


def test_ctrl_c_during_a_failing_teardown_hurries_it_and_keeps_the_failure():
    loop, _ = _run([(replace(RUNNING_ATTEMPT, failed=True, root_cause="boom"), 0.0)], _running(failures=1))
    loop, actions = _run([(replace(RUNNING_ATTEMPT, failed=True, interrupted=True), 0.1)], loop)
    assert actions == [StopWorkers(0.0)] and loop.target is S.FAILED and loop.interrupts == 1


def test_ctrl_c_while_launching_ends_at_once():
    loop, actions = _run([(Seen(agents_missing=("n0",)), 0.0), (Seen(agents_missing=("n0",), interrupted=True), 1.0)])
    assert loop.state is S.ABORTED and StopWorkers(3.0) not in actions


def test_an_unsatisfiable_first_start_fails_without_a_teardown():
    loop, actions = _run([(Seen(), 0.0), (Seen(), 0.1), (Seen(start_error="needs 9 GPUs"), 0.2)])
    assert loop.state is S.FAILED and loop.reason == "needs 9 GPUs"
    assert not any(isinstance(a, StopWorkers) for a in actions)


# ---------------------------------------------------------------------- catch-up of a failed rank's last round

PENDING = replace(RUNNING_ATTEMPT, failed=True, round_pending=True, root_cause="rank 1 raised after round 3")


def test_a_pending_round_lets_the_live_ranks_run_on_before_the_stop():
    loop, actions = _run([(PENDING, 100.0)], _running())
    assert loop.state is S.RESTARTING and loop.waiting_for is Wait.CATCH_UP and loop.failures == 1
    assert actions == [MoveTo(S.RESTARTING, PENDING.root_cause)]  # no StopWorkers yet
    assert loop.deadline == 100.0 + RULES.catch_up_s
    loop, actions = _run([(PENDING, 101.0), (PENDING, 105.0)], loop)
    assert loop.waiting_for is Wait.CATCH_UP and actions == []
    loop, actions = _run([(replace(PENDING, round_pending=False), 106.0)], loop)  # the last rank reported it
    assert loop.waiting_for is Wait.EXIT and actions == [StopWorkers(3.0)]
    assert loop.deadline == 106.0 + 3.0 + RULES.stop_margin_s


def test_without_a_pending_round_the_stop_starts_in_the_same_decision_as_before():
    loop, actions = _run([(replace(PENDING, round_pending=False), 100.0)], _running())
    assert loop.waiting_for is Wait.EXIT and actions == [MoveTo(S.RESTARTING, PENDING.root_cause), StopWorkers(3.0)]


def test_a_round_that_never_completes_holds_the_stop_only_for_the_grace_and_says_so():
    loop, actions = _run([(PENDING, 100.0), (PENDING, 100.0 + RULES.catch_up_s),
                          (PENDING, 100.0 + RULES.catch_up_s + 0.01)], _running())
    assert loop.waiting_for is Wait.EXIT and actions[1:] == [LogLate(Wait.CATCH_UP), StopWorkers(3.0)]


def test_a_pending_round_is_completed_before_a_spent_budget_fails_the_run():
    loop, actions = _run([(PENDING, 100.0)], _running(failures=1))
    assert (loop.state, loop.waiting_for, loop.target) == (S.STOPPING, Wait.CATCH_UP, S.FAILED)
    assert actions == [MoveTo(S.STOPPING, PENDING.root_cause, S.FAILED)]
    loop, actions = _run([(replace(PENDING, round_pending=False), 101.0),
                          (replace(EXITED, all_drained=True), 102.0), (replace(EXITED, all_drained=True), 102.1)],
                         loop)
    assert loop.state is S.FAILED and actions[0] == StopWorkers(3.0)


def test_ranks_that_all_exited_during_the_catch_up_are_drained_without_a_stop():
    loop, actions = _run([(PENDING, 100.0), (replace(EXITED, round_pending=False), 101.0)], _running())
    assert loop.waiting_for is Wait.DRAIN and not any(isinstance(a, StopWorkers) for a in actions)


def test_ctrl_c_during_the_catch_up_stops_at_once():
    loop, _ = _run([(PENDING, 100.0)], _running())
    aborted, actions = _run([(replace(PENDING, interrupted=True), 101.0)], loop)
    assert (aborted.state, aborted.waiting_for, aborted.target) == (S.STOPPING, Wait.EXIT, S.ABORTED)
    assert actions == [MoveTo(S.STOPPING, "interrupted by the user (Ctrl-C)", S.ABORTED), StopWorkers(3.0)]
    spent, _ = _run([(PENDING, 100.0)], _running(failures=1))
    hurried, actions = _run([(replace(PENDING, interrupted=True), 101.0)], spent)
    assert (hurried.waiting_for, hurried.target) == (Wait.EXIT, S.FAILED) and actions == [StopWorkers(0.0)]


_SEEN = st.builds(
    Seen, agents_missing=st.sampled_from([(), ("n1",)]), agents_failed=st.sampled_from(["", "died"]),
    lost_nodes=st.booleans(), start_error=st.sampled_from(["", "too small"]), has_attempt=st.booleans(),
    failed=st.booleans(), finished=st.booleans(), all_training=st.booleans(), all_exited=st.booleans(),
    all_drained=st.booleans(), stacks_answered=st.booleans(), round_pending=st.booleans(),
    watched=st.dictionaries(st.integers(0, 3), st.builds(Watch, st.floats(0, 100), st.floats(0.1, 50))), root_cause=st.just("cause"),
    interrupted=st.booleans())


@given(st.lists(st.tuples(_SEEN, st.floats(0, 5)), max_size=40), st.integers(-1, 3))
def test_any_sequence_of_observations_moves_only_along_allowed_transitions(script, max_failures):
    """Whatever the world reports, in any order: every move passes the transition check, the
    attempt only grows, an attempt is started only from STARTING, and a terminal state is final."""
    rules = replace(RULES, max_failures=max_failures)
    loop, now, state = Loop(), 0.0, S.PENDING
    for seen, step in script:
        now += step
        decision = decide(loop, seen, now, rules)
        assert decision.loop.attempt >= loop.attempt
        if loop.finished:
            assert decision.actions == () and decision.loop == loop
        for action in decision.actions:
            if isinstance(action, MoveTo):
                # As the controller checks each move (heading: where the decided loop's STOPPING leads).
                check_move(state, action.state, action.target, heading=decision.loop.target)
                state = action.state
            if isinstance(action, StartAttempt):
                assert state is S.STARTING and action.attempt == decision.loop.attempt
        assert decision.loop.state is state
        loop = decision.loop


@given(st.lists(st.tuples(_SEEN, st.floats(0, 5)), max_size=40), st.integers(-1, 3))
def test_the_catch_up_wait_is_entered_only_for_a_pending_round_and_always_ends_by_its_deadline(script, max_failures):
    """Whatever the world reports: the catch-up wait starts only when a failed rank's round is pending,
    its deadline is at most `catch_up_s` away, and no decision after the deadline stays in it."""
    rules = replace(RULES, max_failures=max_failures)
    loop, now = Loop(), 0.0
    for seen, step in script:
        now += step
        decision = decide(loop, seen, now, rules)
        after = decision.loop
        if after.waiting_for is Wait.CATCH_UP:
            if loop.waiting_for is not Wait.CATCH_UP:
                assert seen.round_pending and seen.failed and after.deadline == now + rules.catch_up_s
            else:
                assert now <= loop.deadline and after.deadline == loop.deadline and seen.round_pending
        loop = after


# ---------------------------------------------------------------------- attempts without progress

NO_LIMIT = replace(RULES, max_failures=-1)  # the failure budget never stops these runs: only the progress rule
STALLED = "rank 0 on vm (pid 7) during training: RuntimeError: CUDA error: an illegal memory access"


def _fail_and_drain(loop: Loop, rules: Rules, *, progressed=False, now=0.0, **seen):
    """A rank of the running attempt fails; the attempt exits and drains, every report of it taken
    (`progressed`: it committed a round beyond the furthest before it). Returns the loop and the actions
    of the turn that judged it."""
    failed = replace(RUNNING_ATTEMPT, failed=True, root_cause=STALLED, **seen)
    down = replace(failed, all_exited=True, all_drained=True, progressed=progressed)
    loop, _ = _run([(failed, now), (down, now + 0.1)], loop, rules)  # RESTARTING/EXIT, then DRAIN
    assert loop.state is S.RESTARTING and loop.waiting_for is Wait.DRAIN
    return _run([(down, now + 0.2)], loop, rules)


def _runs_again(loop: Loop, rules: Rules, now: float) -> Loop:
    loop, _ = _run([(RUNNING_ATTEMPT, now)], loop, rules)
    assert loop.state is S.RUNNING
    return loop


@pytest.mark.parametrize("limit", [1, 3])
def test_attempts_in_a_row_without_progress_stop_the_run_whatever_max_failures_allows(limit):
    rules = replace(NO_LIMIT, max_attempts_without_progress=limit)
    loop = _running()
    for n in range(1, limit):
        loop, actions = _fail_and_drain(loop, rules, now=10.0 * n)
        assert loop.state is S.STARTING and loop.no_progress == n and StartAttempt(n) in actions
        loop = _runs_again(loop, rules, 10.0 * n + 1)
    loop, actions = _fail_and_drain(loop, rules, now=100.0)
    reason = (f"no progress in the last {limit} attempts (FailureConfig.max_attempts_without_progress={limit}); "
              f"the last failed: {STALLED}")
    assert actions == [CloseStreams(), MoveTo(S.STOPPING, reason, S.FAILED)]
    assert (loop.state, loop.target, loop.no_progress, loop.failures) == (S.STOPPING, S.FAILED, limit, limit)
    loop, actions = _run([(replace(EXITED, all_drained=True), 100.3)], loop, rules)
    assert loop.state is S.FAILED and actions[-1] == MoveTo(S.FAILED, reason)


def test_an_attempt_that_made_progress_resets_the_count():
    rules = replace(NO_LIMIT, max_attempts_without_progress=2)
    loop, _ = _fail_and_drain(_running(), rules)
    assert loop.no_progress == 1
    loop = _runs_again(loop, rules, 1.0)
    loop, actions = _fail_and_drain(loop, rules, progressed=True, now=2.0)  # a commit beyond: restarted
    assert loop.state is S.STARTING and loop.no_progress == 0 and StartAttempt(2) in actions
    loop = _runs_again(loop, rules, 3.0)
    loop, _ = _fail_and_drain(loop, rules, now=4.0)
    assert loop.state is S.STARTING and loop.no_progress == 1
    loop = _runs_again(loop, rules, 5.0)
    loop, _ = _fail_and_drain(loop, rules, now=6.0)
    assert loop.target is S.FAILED and loop.failures == 4


def test_minus_one_never_stops_for_lack_of_progress():
    rules = replace(NO_LIMIT, max_attempts_without_progress=-1)
    loop = _running()
    for n in range(1, 20):
        loop, _ = _fail_and_drain(loop, rules, now=10.0 * n)
        assert loop.state is S.STARTING and loop.no_progress == n
        loop = _runs_again(loop, rules, 10.0 * n + 1)


def test_a_spent_failure_budget_stops_with_its_own_reason_before_progress_is_counted():
    rules = replace(RULES, max_failures=1, max_attempts_without_progress=2)
    loop, _ = _fail_and_drain(_running(), rules)
    loop = _runs_again(loop, rules, 1.0)
    loop, actions = _run([(replace(RUNNING_ATTEMPT, failed=True, root_cause=STALLED), 2.0)], loop, rules)
    assert loop.target is S.FAILED and loop.reason == STALLED and loop.no_progress == 1


def test_an_elastic_shrink_is_not_a_failure_without_progress():
    from minitrain.coordinator.policy.elastic import Sizing

    rules = replace(NO_LIMIT, max_attempts_without_progress=2, sizing=Sizing(min_workers=1, resize_interval_s=5.0))
    loop, _ = _fail_and_drain(_running(), rules, fits=1, size=2)  # a failure charged: no node was lost
    assert loop.state is S.STARTING and (loop.failures, loop.no_progress, loop.resize) == (1, 1, "")
    loop = _runs_again(loop, rules, 1.0)
    for n in range(2, 6):  # node after node lost with its ranks: resizes, neither charged nor counted
        loop, actions = _fail_and_drain(loop, rules, now=10.0 * n, lost_in_attempt=True, fits=1, size=2)
        assert loop.state is S.STARTING and loop.resize == "shrink" and (loop.failures, loop.no_progress) == (1, 1)
        loop = _runs_again(loop, rules, 10.0 * n + 1)
    loop, _ = _fail_and_drain(loop, rules, now=100.0, fits=1, size=2)
    assert loop.target is S.FAILED and loop.reason.startswith("no progress in the last 2 attempts")
