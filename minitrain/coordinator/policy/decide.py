"""The controller's decisions (pure): where the run is, plus what is true now, gives what happens next.

`decide(loop, seen, now, rules)` is the whole policy of the run's lifecycle: when to start an attempt,
when a rank counts as hung, whether a failure restarts the group or ends the run, how long a stop or a
drain may take, and what a Ctrl-C does. It does no I/O and reads no clock, so every path is unit-tested
with scripted inputs (tests/unit/test_decide.py). The controller turns the world into `Seen`, calls
`decide`, and executes the returned actions; a new behaviour (resize, preemption) is a new fact in
`Seen` and a few rows here, not a new wait loop. What it reads and returns (`Loop`, `Seen`, `Rules`,
`Decision`) is defined in coordinator/policy/loop.py, the actions in coordinator/policy/actions.py.

Every run state is real and timed: the loop stays in RESTARTING while the old attempt's processes exit
and their streams drain, and in STOPPING until the same has happened on the way to the terminal state.
A `Wait` says what the loop waits for inside a state, each with a deadline. This is the run's one
drawing of its lifecycle (run_state.py holds the table of allowed moves it follows):

    LAUNCHING/AGENTS --every agent connected--> STARTING/WORKERS --every rank training--> RUNNING/WORKERS
    STARTING|RUNNING/WORKERS --a rank failed, retry allowed--> [RESTARTING/CATCH_UP: a failed rank's last
        round pending --reported by every live rank, or the grace passed-->] RESTARTING/EXIT --exited-->
        RESTARTING/DRAIN --drained--> [RESTARTING/AGENTS: lost nodes relaunched --connected--> ]
        STARTING/WORKERS (attempt + 1)
    RESTARTING/DRAIN --drained, and the attempts in a row without progress reached their limit--> STOPPING(FAILED)
    RUNNING/WORKERS --a rank silent past its hang deadline--> RUNNING/STACKS --stacks in--> (ranks fail) WORKERS
    RUNNING/WORKERS --preemption signal--> RUNNING/PREEMPT --every rank reported the agreed round-->
        STOPPING(ABORTED)/EXIT ...; --a second signal to one process, the timeout, a failure--> STOPPING(ABORTED),
        killed at once
    any --finished | budget spent | Ctrl-C | launch failed | preemption signal--> STOPPING/EXIT ->
        STOPPING/DRAIN -> terminal
    (a spent budget goes through STOPPING/CATCH_UP first when a failed rank's last round is pending)

The catch-up wait exists because `report()` is not a barrier: a rank may fail right after its report()
of round R returned while a peer has not reached round R yet. Stopping the attempt at once would lose
that round (its metrics, its checkpoint, its `after_report`); Ray loses none, because there a report()
returns only after every rank reported. So while such a round is pending (`Seen.round_pending`), the
live ranks run on until each has reported it (or exited, or failed too: a peer blocked in a collective
with the dead rank usually fails as soon as the dead process is gone), for at most `Rules.catch_up_s`;
then the attempt is stopped as always. With nothing pending the stop starts in the same turn as before.

An elastic run (`Rules.elastic`: it has a `Rules.sizing`) charges a failure only once the failed attempt is
down: if a node of it was lost and the survivors hold `min_workers`, the restart is a resize (SHRINK: the
next attempt starts at once with the survivors, `max_failures` untouched); otherwise one failure is charged
as above. While it runs, lost hosts are probed again each resize interval, and when more workers fit
than run on nodes ready to take them (`Seen.fits_ready`: a node that came back is ready once its fork
server is warm) and the interval since the attempt started has passed, the attempt is stopped at
the next committed checkpoint and restarted larger (GROW). The sizes are coordinator/policy/elastic.py's,
applied by coordinator/sizing.py.

A restart is judged for progress once the failed attempt is down and every report of it is taken: an
attempt that committed a round beyond the furthest one the run had committed before it (`Seen.progressed`;
steps redone after resuming from an older checkpoint are not progress) resets `Loop.no_progress`, another
failed attempt adds one, and at `Rules.max_attempts_without_progress` the run stops (FAILED) instead of
restarting, whatever the failure budget has left: the same failure would come again. A resize counts
neither way.

The preempt wait stops a preempted run at a checkpoint every rank agrees on, with no collective in the
user's loop (coordinator/facts/preemption.py): the first signal while RUNNING sends every rank the notice
(AgreePreemption); once every rank reported the agreed round (`Seen.preempt_reached`, at most
`Rules.preempt_timeout_s` after the signal) the attempt is stopped gracefully towards ABORTED. A second
signal to the same process (driver or agent), the timeout or a failed rank kills the workers at once (the
first signal of each other process is the same preemption: Kubernetes and scancel signal them all); a run that finishes meanwhile succeeds.
In other states a signal stops the run gracefully; during a stop only a second one matters. A preempted
run is never restarted inside `fit()`: its machines are going away (the resume is the next `fit()`).
"""

from __future__ import annotations

from dataclasses import replace

from minitrain.coordinator.policy.actions import (
    GROW, SHRINK, AgreePreemption, CloseStreams, CollectStacks, DeclareHung, DropDeadAgents, ForgetAgents, MoveTo,
    PrepareForkServers, RelaunchAgents, StartAttempt, StopWorkers,
)
from minitrain.coordinator.policy.loop import (
    INTERRUPTED, PREEMPTED, Action, Decision, LogLate, Loop, Rules, Seen, Wait,
)
from minitrain.run_state import RunState


# ---------------------------------------------------------------------- the policy


def decide(loop: Loop, seen: Seen, now: float, rules: Rules) -> Decision:
    """The next step of the run from `loop` given `seen` at time `now`."""
    if loop.finished:
        return Decision(loop)
    if seen.interrupted:
        return _interrupt(loop, seen, now, rules)
    if seen.preempted:
        return _preempt(loop, seen, now, rules)
    if loop.state is RunState.PENDING:
        return Decision(replace(loop, state=RunState.LAUNCHING, waiting_for=Wait.AGENTS, reason="starting node agents",
                                deadline=now + rules.agent_start_timeout_s),
                        (MoveTo(RunState.LAUNCHING, "starting node agents"),))
    if loop.waiting_for is Wait.AGENTS:
        return _agents(loop, seen, now, rules)
    if loop.waiting_for is Wait.WORKERS:
        return _workers(loop, seen, now, rules)
    if loop.waiting_for is Wait.STACKS:
        return _stacks(loop, seen, now, rules)
    if loop.waiting_for is Wait.CATCH_UP:
        return _catch_up(loop, seen, now, rules)
    if loop.waiting_for is Wait.PREEMPT:
        return _preempting(loop, seen, now, rules)
    if loop.waiting_for is Wait.EXIT:
        return _exit(loop, seen, now, rules)
    return _drain(loop, seen, now, rules)


def _interrupt(loop: Loop, seen: Seen, now: float, rules: Rules) -> Decision:
    """The first Ctrl-C stops the workers gracefully on the way to ABORTED. One during a stop (the
    second, or the first while a failure or success is being torn down) kills the workers at once and
    keeps the stop's target: the outcome that was already decided stays the outcome."""
    loop = replace(loop, interrupts=loop.interrupts + 1)
    if loop.state is not RunState.STOPPING:
        return _stop(loop, seen, now, rules, RunState.ABORTED, INTERRUPTED)
    return _kill_during_stop(loop, now, rules)


def _kill_during_stop(loop: Loop, now: float, rules: Rules) -> Decision:
    """STOPPING, told to hurry (a second Ctrl-C or preemption signal): kill what is left at once."""
    if loop.waiting_for is Wait.EXIT:
        return Decision(loop, (StopWorkers(0.0),))
    if loop.waiting_for is Wait.CATCH_UP:  # the pending round is given up
        return Decision(replace(loop, waiting_for=Wait.EXIT, deadline=now + rules.stop_margin_s), (StopWorkers(0.0),))
    return Decision(loop)


def _preempt(loop: Loop, seen: Seen, now: float, rules: Rules) -> Decision:
    """Preemption signals arrived. The first one while every rank trains starts the agreement (the
    PREEMPT wait); in any other state it stops the run now (gracefully: no round can be agreed before
    every rank trains, and what is committed stands). A second signal to a process that had one
    (`Seen.preempted_again`) kills the workers at once; during a stop only such a signal matters. The
    first signal of each other process (every pod or job step signalled at once) is the same preemption."""
    first = loop.preemptions == 0
    loop = replace(loop, preemptions=loop.preemptions + seen.preempted)
    if loop.state is RunState.STOPPING:
        return _kill_during_stop(loop, now, rules) if seen.preempted_again else Decision(loop)
    if seen.preempted_again:
        return _stop_now(loop, seen, now, rules, f"{PREEMPTED}: a second signal stopped the run at once")
    if not first:  # another process's notice of the preemption under way: the rest of what is seen decides
        return decide(loop, replace(seen, preempted=0), now, rules)
    if loop.state is RunState.RUNNING and loop.waiting_for is Wait.WORKERS and not seen.failed and not seen.finished:
        reason = f"{PREEMPTED}: checkpointing at a round every rank agrees on"
        return Decision(replace(loop, waiting_for=Wait.PREEMPT, reason=reason, deadline=now + rules.preempt_timeout_s),
                        (AgreePreemption(),))
    return _stop(loop, seen, now, rules, RunState.ABORTED, f"{PREEMPTED} before every rank was training")


def _stop_now(loop: Loop, seen: Seen, now: float, rules: Rules, reason: str) -> Decision:
    """Head for ABORTED through STOPPING and kill the attempt's workers without a grace period."""
    loop = replace(loop, state=RunState.STOPPING, target=RunState.ABORTED, reason=reason)
    move = MoveTo(RunState.STOPPING, reason, RunState.ABORTED)
    if not seen.has_attempt:
        return _end(loop, (move,))
    if not seen.all_exited:
        return Decision(replace(loop, waiting_for=Wait.EXIT, deadline=now + rules.stop_margin_s),
                        (move, StopWorkers(0.0)))
    return Decision(replace(loop, waiting_for=Wait.DRAIN, deadline=now + rules.drain_s), (move,))


def _preempting(loop: Loop, seen: Seen, now: float, rules: Rules) -> Decision:
    """RUNNING after a preemption signal: wait until every rank reported the agreed round, then stop
    the attempt gracefully (ABORTED). A run that finished meanwhile succeeds; a failed rank or the
    timeout kills the workers at once."""
    if seen.start_error or seen.failed:
        return _stop_now(loop, seen, now, rules, f"{PREEMPTED}, and a rank failed meanwhile: {seen.root_cause}")
    if seen.finished:
        return _stop(loop, seen, now, rules, RunState.SUCCEEDED, "every rank finished")
    if seen.preempt_reached:
        return _stop(loop, seen, now, rules, RunState.ABORTED, f"{PREEMPTED}: every rank reported the agreed round")
    if now <= loop.deadline:
        return Decision(loop)
    decision = _stop_now(loop, seen, now, rules, f"{PREEMPTED}: the agreed round was not reached within "
                                                 f"{rules.preempt_timeout_s:g} s")
    return replace(decision, actions=(LogLate(Wait.PREEMPT),) + decision.actions)


def _stop(loop: Loop, seen: Seen, now: float, rules: Rules, target: RunState, reason: str) -> Decision:
    """Head for `target` through STOPPING: stop the attempt's workers (if any are left), drain, end."""
    loop = replace(loop, state=RunState.STOPPING, target=target, reason=reason)
    move = MoveTo(RunState.STOPPING, reason, target)
    if not seen.has_attempt:
        return _end(loop, (move,))
    return _stop_attempt(loop, seen, now, rules, (move,))


def _stop_attempt(loop: Loop, seen: Seen, now: float, rules: Rules, actions: tuple[Action, ...]) -> Decision:
    """RESTARTING or STOPPING: stop the attempt's processes (if any are left), then drain."""
    if not seen.all_exited:
        return Decision(replace(loop, waiting_for=Wait.EXIT, deadline=now + rules.stop_grace_s + rules.stop_margin_s),
                        actions + (StopWorkers(rules.stop_grace_s),))
    return Decision(replace(loop, waiting_for=Wait.DRAIN, deadline=now + rules.drain_s), actions)


def _end(loop: Loop, actions: tuple[Action, ...] = ()) -> Decision:
    return Decision(replace(loop, state=loop.target, waiting_for=Wait.DONE, deadline=None),
                    actions + (MoveTo(loop.target, loop.reason),))


def _start(loop: Loop, now: float, attempt: int, reason: str, rules: Rules) -> Decision:
    actions: tuple[Action, ...] = (MoveTo(RunState.STARTING, reason), StartAttempt(attempt, loop.resize))
    if rules.restart_may_come(loop.failures):
        # The fork server imports torch while the attempt starts: a crash at start-up (the commonest
        # kind) then restarts from it instead of waiting for its imports.
        actions += (PrepareForkServers(),)
    return Decision(replace(loop, state=RunState.STARTING, waiting_for=Wait.WORKERS, attempt=attempt, deadline=None,
                            reason=reason, sized_at=now, grow_armed=None), actions)


def _agents(loop: Loop, seen: Seen, now: float, rules: Rules) -> Decision:
    """LAUNCHING, or RESTARTING after lost nodes got new agents: wait until every expected agent is in."""
    restarting = loop.state is RunState.RESTARTING
    if rules.elastic and not restarting and seen.agents_missing and seen.fits >= rules.sizing.min_workers:
        return _elastic_launch(loop, seen, now, rules)
    if not seen.agents_missing:
        attempt = loop.attempt + 1 if restarting else loop.attempt
        return _start(loop, now, attempt, f"starting attempt {attempt}", rules)
    why = seen.agents_failed
    if not why and now > loop.deadline:
        why = (f"node agent(s) {', '.join(seen.agents_missing)} did not connect within "
               f"{rules.agent_start_timeout_s:g} s")
    if not why:
        return Decision(loop)
    if restarting:  # the hosts that came back are used; the start fails if they are too few
        attempt = loop.attempt + 1
        decision = _start(loop, now, attempt, f"starting attempt {attempt}", rules)
        return replace(decision, actions=(ForgetAgents(why),) + decision.actions)
    return _stop(loop, seen, now, rules, RunState.FAILED, why)


def _elastic_launch(loop: Loop, seen: Seen, now: float, rules: Rules) -> Decision:
    """LAUNCHING an elastic run whose min workers fit on the agents that are in, while others are not:
    start `start_wait_s` after min first fitted, or at once when an agent died (its host is out until it
    is probed again) or the agents' deadline passed; the hosts that come later are used when it grows."""
    if loop.min_fit_at is None:
        loop = replace(loop, min_fit_at=now)
    waited = now >= loop.min_fit_at + rules.sizing.start_wait_s
    if not (waited or seen.agents_failed or now > loop.deadline):
        return Decision(loop)
    reason = f"starting attempt {loop.attempt} with {seen.fits} worker(s) that fit; not yet in: " \
             f"{', '.join(seen.agents_missing)}"
    decision = _start(loop, now, loop.attempt, reason, rules)
    return replace(decision, actions=(DropDeadAgents(),) + decision.actions)


def _workers(loop: Loop, seen: Seen, now: float, rules: Rules) -> Decision:
    """STARTING or RUNNING: wait for the attempt to finish, fail, or go silent."""
    if seen.start_error:
        return _stop(loop, seen, now, rules, RunState.FAILED, seen.start_error)
    if seen.failed:
        return _failed(loop, seen, now, rules)
    if seen.finished:
        return _stop(loop, seen, now, rules, RunState.SUCCEEDED, "every rank finished")
    actions: tuple[Action, ...] = ()
    if loop.state is RunState.STARTING and seen.all_training:
        loop = replace(loop, state=RunState.RUNNING, reason="every rank is training")
        actions = (MoveTo(RunState.RUNNING, "every rank is training"),)
        if rules.restart_may_come(loop.failures):  # a warm fork server pays off only if a restart may come
            actions += (PrepareForkServers(),)
    hung = _silent_ranks(seen, now)
    if hung:
        loop = replace(loop, waiting_for=Wait.STACKS, hung=hung, deadline=now + rules.stack_wait_s)
        return Decision(loop, actions + (CollectStacks(),))
    if rules.elastic:
        return _elastic(loop, seen, now, rules, actions)
    return Decision(loop, actions)


def _elastic(loop: Loop, seen: Seen, now: float, rules: Rules, actions: tuple[Action, ...]) -> Decision:
    """STARTING or RUNNING an elastic run: nodes whose new agent died are out again; lost hosts whose
    retry interval ran out get a new agent (probed); and when more workers fit than run on ready nodes
    (`seen.fits_ready`), at least the resize interval after the attempt started, the attempt is
    restarted larger at the next committed checkpoint (`seen.checkpoints_committed` past the count when
    growth became due), not charged."""
    if seen.agents_failed:
        actions += (DropDeadAgents(),)
    if seen.probe_due:
        actions += (RelaunchAgents(),)
    # (A node that came back counts once its warm worker is ready: fits_ready, not fits.)
    due = loop.state is RunState.RUNNING and seen.fits_ready > seen.size and \
        now >= loop.sized_at + rules.sizing.resize_interval_s
    if not due:
        return Decision(loop if loop.grow_armed is None else replace(loop, grow_armed=None), actions)
    if loop.grow_armed is None:
        return Decision(replace(loop, grow_armed=seen.checkpoints_committed), actions)
    if seen.checkpoints_committed <= loop.grow_armed:
        return Decision(loop, actions)
    reason = f"resize {seen.size} -> {seen.fits} workers at the checkpoint boundary: more workers fit"
    loop = replace(loop, state=RunState.RESTARTING, reason=reason, resize=GROW, grow_armed=None)
    return _stop_attempt(loop, seen, now, rules, actions + (MoveTo(RunState.RESTARTING, reason),))


def _silent_ranks(seen: Seen, now: float) -> tuple[int, ...]:
    return tuple(sorted(r for r, w in seen.watched.items() if now - w.last_progress > w.deadline_s))


def _failed(loop: Loop, seen: Seen, now: float, rules: Rules) -> Decision:
    """A rank failed: stop the attempt; restart within the failure budget, else fail the run. When a
    round a failed rank reported is pending, the live ranks first get `catch_up_s` to complete it.
    An elastic run charges nothing yet: whether a node loss made it a resize is judged once the attempt
    is down (`_judge`), when every loss is known (a peer's broken collective often arrives first)."""
    reason = seen.root_cause
    if rules.elastic:
        loop = replace(loop, state=RunState.RESTARTING, reason=reason, judging=True, resize="")
        move = MoveTo(RunState.RESTARTING, reason)
        return _await_round(loop, now, rules, move) if seen.round_pending else \
            _stop_attempt(loop, seen, now, rules, (move,))
    failures = loop.failures + 1
    loop = replace(loop, failures=failures, resize="")
    if not rules.allows_retry(failures):
        if seen.round_pending:
            loop = replace(loop, state=RunState.STOPPING, target=RunState.FAILED, reason=reason)
            return _await_round(loop, now, rules, MoveTo(RunState.STOPPING, reason, RunState.FAILED))
        return _stop(loop, seen, now, rules, RunState.FAILED, reason)
    loop = replace(loop, state=RunState.RESTARTING, reason=reason)
    move = MoveTo(RunState.RESTARTING, reason)
    if seen.round_pending:
        return _await_round(loop, now, rules, move)
    return _stop_attempt(loop, seen, now, rules, (move,))


def _await_round(loop: Loop, now: float, rules: Rules, move: MoveTo) -> Decision:
    """Make `move` and let the live ranks run on to complete the pending round (`_catch_up`)."""
    return Decision(replace(loop, waiting_for=Wait.CATCH_UP, deadline=now + rules.catch_up_s), (move,))


def _catch_up(loop: Loop, seen: Seen, now: float, rules: Rules) -> Decision:
    """RESTARTING or STOPPING after a failure: the live ranks run on until the round a failed rank
    reported last is complete (its commit happens as the last report is recorded), or can no longer
    be (a rank that had not reported it exited or failed), or the grace ran out; then the attempt is
    stopped as always."""
    if seen.round_pending and now <= loop.deadline:
        return Decision(loop)
    late = (LogLate(Wait.CATCH_UP),) if seen.round_pending else ()
    return _stop_attempt(loop, seen, now, rules, late)


def _stacks(loop: Loop, seen: Seen, now: float, rules: Rules) -> Decision:
    """RUNNING with silent ranks: once their stacks are in (or the wait ran out), they fail as hung,
    with every rank that went past its deadline meanwhile. When one rank freezes, its peers block
    waiting for it and their deadlines fall due within milliseconds of its own, in an order set by when
    their last reports arrived (batched reports arrive together): the rank that froze may fall due just
    after the check that found a waiting peer, and it must be among the ranks declared, or a waiting peer
    would be the only candidate for the root cause."""
    if not seen.stacks_answered and now <= loop.deadline:
        return Decision(loop)
    late = () if seen.stacks_answered else (LogLate(Wait.STACKS),)
    hung = tuple(sorted(set(loop.hung) | set(_silent_ranks(seen, now))))
    return Decision(replace(loop, waiting_for=Wait.WORKERS, hung=(), deadline=None),
                    late + (DeclareHung(hung),))


def _judge(loop: Loop, seen: Seen, rules: Rules) -> Loop:
    """An elastic run's failed attempt is down: a node of it was lost and the survivors hold at least
    `min_workers`: a resize (SHRINK), not charged; otherwise one failure charged, as a fixed-size run's."""
    loop = replace(loop, judging=False)
    if seen.lost_in_attempt and seen.fits >= rules.sizing.min_workers:
        return replace(loop, resize=SHRINK)
    return replace(loop, failures=loop.failures + 1)


def _count_progress(loop: Loop, seen: Seen) -> Loop:
    """A restarted attempt is down, every report of it taken: one more failed attempt without progress,
    unless it made progress (`seen.progressed`), which resets the count; a resize is no failure, so it
    leaves the count as it is unless it made progress. Steps redone after resuming from an older
    checkpoint are not progress (Commits.progressed)."""
    if seen.progressed:
        return replace(loop, no_progress=0) if loop.no_progress else loop
    return loop if loop.resize else replace(loop, no_progress=loop.no_progress + 1)


def _exit(loop: Loop, seen: Seen, now: float, rules: Rules) -> Decision:
    """RESTARTING or STOPPING: wait until every process of the attempt exited."""
    if not seen.all_exited and now <= loop.deadline:
        return Decision(loop)
    late = () if seen.all_exited else (LogLate(Wait.EXIT),)
    return Decision(replace(loop, waiting_for=Wait.DRAIN, deadline=now + rules.drain_s), late)


def _drain(loop: Loop, seen: Seen, now: float, rules: Rules) -> Decision:
    """RESTARTING or STOPPING: take the ranks' last messages (reports sent before a peer failed still
    complete rounds), then close what is still open and go on."""
    if not seen.all_drained and now <= loop.deadline:
        return Decision(loop)
    actions: tuple[Action, ...] = (CloseStreams(),)
    if loop.state is RunState.STOPPING:
        return _end(loop, actions)
    if loop.judging:
        loop = _judge(loop, seen, rules)
        if not loop.resize and not rules.allows_retry(loop.failures):
            decision = _stop(loop, seen, now, rules, RunState.FAILED, loop.reason)
            return replace(decision, actions=actions + decision.actions)
    loop = _count_progress(loop, seen)
    if loop.resize == SHRINK:  # start at once with the survivors; lost hosts are probed later
        decision = _start(loop, now, loop.attempt + 1, f"starting attempt {loop.attempt + 1}", rules)
        return replace(decision, actions=actions + (RelaunchAgents(),) * seen.lost_nodes + decision.actions)
    if not loop.resize and rules.stops_without_progress(loop.no_progress):  # (a resize is no failure)
        reason = (f"no progress in the last {loop.no_progress} attempts (FailureConfig.max_attempts_without_progress="
                  f"{rules.max_attempts_without_progress}); the last failed: {seen.root_cause or loop.reason}")
        decision = _stop(loop, seen, now, rules, RunState.FAILED, reason)
        return replace(decision, actions=actions + decision.actions)
    if seen.lost_nodes:
        return Decision(replace(loop, waiting_for=Wait.AGENTS, deadline=now + rules.agent_start_timeout_s),
                        actions + (RelaunchAgents(),))
    attempt = loop.attempt + 1
    decision = _start(loop, now, attempt, f"starting attempt {attempt}", rules)
    return replace(decision, actions=actions + decision.actions)
