"""What the user is told of how the run goes and how it ended, as the controller's loop acts.

`log_move` says why a move of the run's state happens (a failed attempt being stopped, the restart
with the budget left, a spent budget, a run that cannot go on, Ctrl-C), `log_late` names a wait of the
loop that ran past its deadline, and `run_outcome` describes the ended run for `fit()`, with
`failure_message` as its error text (the last attempt's failures, root cause first, through
`errors.render_failures`; a run that stopped for lack of progress (`stopped_without_progress`) says so
first; every failed attempt, grouped by host, when there were several). `failed_attempt` is the record of
an attempt that failed, as the summary and `WorkerGroupError.failed_attempts` list it. The root cause's
one line is the tracker's (`AttemptTracker.root_cause_line`).
These texts are the user's and the tests' (e2e tests grep the logs): change them with care.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Optional

from minitrain.coordinator.facts.attempt import AttemptTracker
from minitrain.coordinator.facts.commits import History
from minitrain.coordinator.facts.preemption import DRIVER, Preemption
from minitrain.coordinator.policy.actions import MoveTo
from minitrain.coordinator.policy.loop import CATCH_UP_S, Loop, Rules, Wait
from minitrain.errors import no_progress_line, render_failed_attempts, render_failures, root_cause
from minitrain.records import FailedAttempt, RunOutcome
from minitrain.run_state import RunState, ray_status

logger = logging.getLogger("minitrain")


def log_move(previous: RunState, move: MoveTo, loop: Loop, tracker: Optional[AttemptTracker], rules: Rules,
             start_error: str) -> None:
    """Log why the run moves from `previous` by `move`, as the loop stands after the decision (`loop`);
    `tracker` is the latest attempt's (None before the first), `start_error` why it could not start."""
    failed = tracker is not None and tracker.failed() and not start_error
    # (a failed attempt stopped on the way to a restart was said so when it began: RESTARTING)
    if move.state is RunState.RESTARTING or (move.target is RunState.FAILED and failed and
                                             previous is not RunState.RESTARTING):
        logger.warning("attempt %d: %s; stopping every rank of the attempt", tracker.attempt, move.reason)
        if loop.waiting_for is Wait.CATCH_UP:
            round_, behind = tracker.ranks_behind()
            logger.warning("attempt %d: round %d was reported by every failed rank but not yet by rank(s) %s; "
                           "the stop waits until they did (at most %g s), so that the round is committed",
                           tracker.attempt, round_, ",".join(map(str, behind)), rules.catch_up_s)
    if move.state is RunState.STARTING and previous is RunState.RESTARTING and loop.resize:
        pass  # an elastic resize, not a charged failure: the controller logs its line once the size is known
    elif move.state is RunState.STARTING and previous is RunState.RESTARTING:
        # Failures learned during the stop (a lost node, say) can be the real cause: judge again.
        left = rules.retries_left(loop.failures)
        budget = "unlimited retries" if left is None else f"{left} retries left"
        if loop.no_progress and rules.max_attempts_without_progress != -1:
            budget += (f"; {loop.no_progress} attempt(s) in a row without progress, the run stops at "
                       f"{rules.max_attempts_without_progress}")
        logger.warning("attempt %d failed (%s); restarting as attempt %d (failure %d, max_failures=%d, %s)",
                       tracker.attempt, tracker.root_cause_line(), loop.attempt, loop.failures,
                       rules.max_failures, budget)
    elif move.state is RunState.STOPPING and move.target is RunState.FAILED:
        if stopped_without_progress(loop, rules):
            logger.error("%s. The run stops here, whatever max_failures=%d allows: a restart would fail the "
                         "same way (FailureConfig.max_attempts_without_progress=-1 turns this stop off)",
                         move.reason, rules.max_failures)
        elif failed:
            logger.error("attempt %d failed (%s); failure budget spent (max_failures=%d)", tracker.attempt,
                         move.reason, rules.max_failures)
        else:
            logger.error("the run cannot go on: %s", move.reason)
    elif move.state is RunState.STOPPING and move.target is RunState.ABORTED:
        logger.warning("%s: stopping the workers (press Ctrl-C again to kill them at once)", move.reason)
    logger.debug("run state %s -> %s (attempt %d): %s", ray_status(previous), ray_status(move.state),
                 loop.attempt, move.reason)


def log_late(waiting_for: Wait, tracker: Optional[AttemptTracker], stack_wait_s: float,
             catch_up_s: float = CATCH_UP_S) -> None:
    """Log that the loop's wait `waiting_for` ended at its deadline, not because what it waited for came: some
    ranks of `tracker`'s attempt did not confirm their exit, did not send their stacks, or did not report
    the round a failed rank reported last."""
    if tracker is None:
        return
    if waiting_for is Wait.EXIT:
        alive = [r for r, s in tracker.ranks.items() if not s.exited]
        logger.error("ranks %s of attempt %d did not confirm their exit in time", alive, tracker.attempt)
    elif waiting_for is Wait.STACKS:
        logger.warning("attempt %d: not every rank sent its stacks within %g s", tracker.attempt, stack_wait_s)
    elif waiting_for is Wait.PREEMPT:
        logger.error("attempt %d: not every rank reported the round agreed after the preemption signal in time; "
                     "killing the workers (the last committed checkpoint stands)", tracker.attempt)
    elif waiting_for is Wait.CATCH_UP:
        round_, behind = tracker.ranks_behind()
        logger.warning("attempt %d: rank(s) %s did not report round %s within %g s (blocked, perhaps in a "
                       "collective with a failed rank); stopping the attempt without that round", tracker.attempt,
                       ",".join(map(str, behind)), round_, catch_up_s)


def was_preempted(loop: Loop) -> bool:
    """The run ended ABORTED because of a preemption signal (not Ctrl-C, not a finished run)."""
    return loop.preemptions > 0 and loop.state is RunState.ABORTED and not loop.interrupts


def stopped_without_progress(loop: Loop, rules: Rules) -> int:
    """How many attempts in a row failed without progress when that stopped the run (heading for or in
    FAILED: `Rules.stops_without_progress`); 0 when the run did not stop for that."""
    stopped = loop.target is RunState.FAILED or loop.state is RunState.FAILED
    return loop.no_progress if stopped and rules.stops_without_progress(loop.no_progress) else 0


def failed_attempt(tracker: AttemptTracker, progressed: bool, charged: bool = True) -> Optional[FailedAttempt]:
    """The record of `tracker`'s attempt for the end-of-run summary, from its root cause (None when it did not
    fail); `progressed` and `charged` as `FailedAttempt` says."""
    if not tracker.failed():
        return None
    root = root_cause(tracker.failures())
    return FailedAttempt(attempt=tracker.attempt, host=root.node, rank=root.rank, phase=root.phase,
                         cause=root.cause, progressed=progressed, charged=charged)


def run_outcome(loop: Loop, tracker: Optional[AttemptTracker], history: History, *, max_failures: int,
                run_path: str, start_error: str, preemption: Optional[Preemption] = None,
                failed_attempts: tuple[FailedAttempt, ...] = (), no_progress: int = 0,
                last_round: Optional[int] = None, not_durable: tuple[str, ...] = ()) -> RunOutcome:
    """How the run ended: its loop's state, the latest attempt (`tracker`, None when none started:
    then the loop's reason is the error) with rank 0's `history`, and `failure_message`; for a
    preempted run (`was_preempted`), what `preemption` recorded and `preemption_message`.
    `failed_attempts`: every attempt that failed, the latest included; `no_progress`: the attempts in a
    row without progress that stopped the run (`stopped_without_progress`; 0: it did not stop for that),
    `last_round` the run-wide index of its last committed round (None: none). `not_durable`: why
    checkpoints committed in memory never reached storage; a run that would have succeeded fails with
    it (its result would name checkpoints that are not there)."""
    if not_durable and loop.state is RunState.SUCCEEDED:
        lines = "\n".join(f"  - {why}" for why in not_durable)
        loop = dataclasses.replace(loop, state=RunState.FAILED, reason=(
            f"Training finished, but checkpoint(s) committed in memory never reached storage:\n{lines}\n"
            "The run directory keeps every checkpoint that did; run the same name again to resume from the "
            "latest of them."))
        tracker = None
    info = preemption.outcome_info(tracker) if preemption is not None and was_preempted(loop) else None
    extra = {} if info is None else {"preemption": info, "drain_timed_out": not preemption.completed}
    if tracker is None:  # no attempt started: the agents did not come up
        return RunOutcome(state=loop.state, attempt=loop.attempt, last_metrics=None, error_message=loop.reason,
                          **extra)
    failures = tuple(tracker.failures())
    message = failure_message(tracker, max_failures, run_path, start_error, failed_attempts=failed_attempts,
                              no_progress=no_progress, last_round=last_round)
    if info is not None:
        message = preemption_message(preemption, loop.reason, message)
    return RunOutcome(
        state=loop.state, attempt=tracker.attempt, last_metrics=history.last_metrics,
        failures=failures, exceptions=tracker.exc_pickles(),
        error_message=message, return_value=history.return_value, failed_attempts=failed_attempts,
        no_progress=no_progress, **extra,
    )


def preemption_message(preemption: Preemption, reason: str, failures: str) -> str:
    """The PreemptionError's text: which signals came where, how the stop went (`reason`), and the
    failures of the attempt when a rank failed meanwhile."""
    where = ", ".join(f"{name} on {'the driver' if node == DRIVER else 'node ' + node}"
                      for node, name in preemption.signals)
    if preemption.completed:
        text = (f"Training was preempted ({where}): every rank reported the agreed round {preemption.round} "
                "and the run stopped.")
    else:
        text = (f"Training was preempted ({where}) and stopped before every rank reported an agreed round "
                f"({reason}).")
    return f"{text}\n\n{failures}" if failures else text


def failure_message(tracker: AttemptTracker, max_failures: int, run_path: str, start_error: str, *,
                    failed_attempts: tuple[FailedAttempt, ...] = (), no_progress: int = 0,
                    last_round: Optional[int] = None) -> str:
    """The outcome's error message: the last attempt's failures (root cause first), with where its
    workers' logs are, and why no restart was possible when none was (`start_error`). A run that stopped
    because `no_progress` attempts in a row failed without progress says so first, with their root
    causes and its `last_round` (`errors.no_progress_line`); with several `failed_attempts`, their
    summary by host (`errors.render_failed_attempts`) comes before the hint."""
    message = ""
    if tracker.failed():
        logs = f"Worker logs: {run_path}/logs/attempt_{tracker.attempt}/"
        hint = (f"The failure budget is spent (FailureConfig.max_failures={max_failures}); raise it to retry "
                f"more often. {logs}")
        if no_progress:
            hint = logs
        if len(failed_attempts) > 1:
            hint = f"{render_failed_attempts(failed_attempts)}\n\n{hint}"
        message = render_failures(tracker.failures(), tracker.attempt, hint)
        if no_progress:
            stalled = [a for a in failed_attempts if a.charged and not a.progressed][-no_progress:]
            message = (f"Training stopped: {no_progress_line(stalled, last_round)}. A restart would fail the "
                       f"same way, so the run stops here whatever max_failures={max_failures} allows "
                       f"(FailureConfig.max_attempts_without_progress={no_progress}; -1 turns this stop off). "
                       f"Fix the cause and run it again: the same run name resumes from its last committed "
                       f"checkpoint.\n\n{message}")
    if start_error:
        message = f"{message}\n\nNo restart was possible: {start_error}"
    return message
