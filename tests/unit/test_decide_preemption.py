"""decide()'s preemption rows, scripted: the PREEMPT wait, a second signal, the timeout, a signal
outside RUNNING, during a stop, and a run that finishes meanwhile."""

from __future__ import annotations

from dataclasses import replace

from minitrain.coordinator.policy.actions import AgreePreemption, CloseStreams, MoveTo, StopWorkers
from minitrain.coordinator.policy.decide import decide
from minitrain.coordinator.policy.loop import LogLate, Loop, Rules, Seen, Wait
from minitrain.run_state import RunState, check_move

S = RunState
RULES = Rules(max_failures=3, stop_grace_s=3.0, preempt_timeout_s=20.0)
RUNNING = Loop(state=S.RUNNING, waiting_for=Wait.WORKERS)
TRAINING = Seen(has_attempt=True, all_training=True)


def _signal(loop: Loop, now: float = 1.0, count: int = 1, seen: Seen = TRAINING, again: bool = False):
    return decide(loop, replace(seen, preempted=count, preempted_again=again), now, RULES)


def test_the_first_signal_while_running_asks_every_rank_to_agree_and_keeps_running():
    decision = _signal(RUNNING)
    assert decision.actions == (AgreePreemption(),)
    loop = decision.loop
    assert (loop.state, loop.waiting_for, loop.deadline, loop.preemptions) == (S.RUNNING, Wait.PREEMPT, 21.0, 1)
    assert decide(loop, TRAINING, 5.0, RULES).loop == loop  # waits for the round


def test_the_agreed_round_reached_stops_gracefully_toward_aborted():
    loop = _signal(RUNNING).loop
    decision = decide(loop, replace(TRAINING, preempt_reached=True), 2.0, RULES)
    move = decision.actions[0]
    assert move.state is S.STOPPING and move.target is S.ABORTED and move.reason.startswith("preempted")
    assert decision.actions[1:] == (StopWorkers(3.0),)
    exited = replace(TRAINING, preempt_reached=True, all_exited=True, all_drained=True)
    loop = decide(decision.loop, exited, 2.5, RULES).loop
    final = decide(loop, exited, 2.6, RULES)
    assert final.loop.state is S.ABORTED and final.loop.preemptions == 1
    assert final.actions[0] == CloseStreams()


def test_a_second_signal_to_one_process_kills_at_once():
    loop = _signal(RUNNING).loop
    decision = _signal(loop, now=2.0, again=True)
    assert decision.actions[0] == MoveTo(S.STOPPING, "preempted: a second signal stopped the run at once", S.ABORTED)
    assert decision.actions[1] == StopWorkers(0.0) and decision.loop.preemptions == 2


def test_two_signals_at_once_to_one_process_kill_at_once():
    decision = _signal(RUNNING, count=2, again=True)
    assert StopWorkers(0.0) in decision.actions and decision.loop.state is S.STOPPING


def test_the_first_signal_of_every_other_process_is_the_same_preemption():
    """Kubernetes deleting a job, or scancel, signals every pod or step at once: one agreement, not a kill."""
    at_once = _signal(RUNNING, count=3)
    assert at_once.actions == (AgreePreemption(),) and at_once.loop.waiting_for is Wait.PREEMPT
    loop = _signal(RUNNING).loop
    later = _signal(loop, now=2.0)
    assert later.actions == () and later.loop == replace(loop, preemptions=2)
    reached = decide(loop, replace(TRAINING, preempted=1, preempt_reached=True), 2.0, RULES)
    assert reached.loop.state is S.STOPPING and reached.actions[1:] == (StopWorkers(3.0),)  # not lost that turn


def test_the_timeout_kills_at_once_and_says_so():
    loop = _signal(RUNNING).loop
    decision = decide(loop, TRAINING, 21.5, RULES)
    assert decision.actions[0] == LogLate(Wait.PREEMPT)
    assert decision.actions[1].target is S.ABORTED and decision.actions[2] == StopWorkers(0.0)


def test_a_run_that_finishes_meanwhile_succeeds():
    loop = _signal(RUNNING).loop
    decision = decide(loop, replace(TRAINING, finished=True, all_exited=True), 2.0, RULES)
    assert decision.actions[0] == MoveTo(S.STOPPING, "every rank finished", S.SUCCEEDED)


def test_a_failure_during_the_agreement_stops_at_once_without_a_restart():
    loop = _signal(RUNNING).loop
    decision = decide(loop, replace(TRAINING, failed=True, root_cause="rank 1 died"), 2.0, RULES)
    assert decision.loop.state is S.STOPPING and decision.loop.target is S.ABORTED
    assert StopWorkers(0.0) in decision.actions and decision.loop.failures == 0  # no budget spent


def test_a_signal_before_every_rank_trains_stops_gracefully():
    starting = Loop(state=S.STARTING, waiting_for=Wait.WORKERS)
    decision = _signal(starting, seen=Seen(has_attempt=True))
    assert decision.actions == (MoveTo(S.STOPPING, "preempted before every rank was training", S.ABORTED),
                                StopWorkers(3.0))
    launching = Loop(state=S.LAUNCHING, waiting_for=Wait.AGENTS, deadline=60.0)
    decision = _signal(launching, seen=Seen(agents_missing=("n1",)))
    assert decision.loop.state is S.ABORTED  # no attempt: straight through STOPPING


def test_during_a_stop_only_a_second_signal_matters():
    stopping = Loop(state=S.STOPPING, waiting_for=Wait.EXIT, target=S.SUCCEEDED, deadline=10.0)
    first = _signal(stopping)
    assert first.actions == () and first.loop.target is S.SUCCEEDED
    other = _signal(first.loop)
    assert other.actions == () and other.loop.target is S.SUCCEEDED  # another process's first signal
    second = _signal(other.loop, again=True)
    assert second.actions == (StopWorkers(0.0),) and second.loop.target is S.SUCCEEDED


def test_ctrl_c_during_the_agreement_is_ctrl_c():
    loop = _signal(RUNNING).loop
    decision = decide(loop, replace(TRAINING, interrupted=True), 2.0, RULES)
    assert decision.loop.interrupts == 1 and decision.loop.target is S.ABORTED
    assert decision.actions[-1] == StopWorkers(3.0)


def test_every_preemption_path_passes_the_transition_check():
    paths = [
        [(replace(TRAINING, preempted=1), 1.0), (replace(TRAINING, preempt_reached=True), 2.0),
         (replace(TRAINING, all_exited=True), 3.0), (replace(TRAINING, all_exited=True, all_drained=True), 4.0)],
        [(replace(TRAINING, preempted=1), 1.0), (TRAINING, 30.0), (replace(TRAINING, all_exited=True), 31.0),
         (replace(TRAINING, all_exited=True, all_drained=True), 32.0)],
    ]
    for path in paths:
        loop, state = RUNNING, S.RUNNING
        for seen, now in path:
            decision = decide(loop, seen, now, RULES)
            for action in decision.actions:
                if isinstance(action, MoveTo):
                    check_move(state, action.state, action.target, heading=decision.loop.target)
                    state = action.state
            loop = decision.loop
        assert loop.state is S.ABORTED
