"""The user's texts of the run's course and end (coordinator/outcome.py): the log line of each kind of
move, the late waits, and the outcome with its error message. The words are checked because users and
the e2e tests read them."""

from __future__ import annotations

import logging

from minitrain.coordinator.facts.attempt import AttemptTracker
from minitrain.coordinator.facts.commits import History
from minitrain.coordinator.outcome import failure_message, log_late, log_move, run_outcome
from minitrain.coordinator.policy.actions import MoveTo
from minitrain.coordinator.policy.loop import Loop, Rules, Wait
from minitrain.records import Phase, WorkerAssignment, WorkerFailure
from minitrain.run_state import RunState as S

RULES = Rules(max_failures=2, stop_grace_s=1.0)


def _tracker(attempt=0, failed=False):
    assignments = [WorkerAssignment(rank=r, local_rank=0, world_size=2, local_world_size=1, node_rank=r,
                                    node_id=f"n{r}") for r in range(2)]
    tracker = AttemptTracker.create(attempt, assignments, {"n0": "host-n0", "n1": "host-n1"})
    if failed:
        tracker.fail(WorkerFailure(rank=1, node="host-n1", pid=7, phase=Phase.TRAINING, time=1.0,
                                   exc_type="builtins.ValueError", message="boom"))
    return tracker


def _logged(caplog, *args):
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="minitrain"):
        log_move(*args)
    return [(r.levelname, r.getMessage()) for r in caplog.records]


def test_each_kind_of_move_says_why_in_its_own_words(caplog):
    failed = _tracker(failed=True)
    root = failed.root_cause_line()
    assert _logged(caplog, S.RUNNING, MoveTo(S.RESTARTING, root), Loop(state=S.RESTARTING), failed, RULES, "") == [
        ("WARNING", f"attempt 0: {root}; stopping every rank of the attempt")]
    loop = Loop(state=S.STARTING, attempt=1, failures=1)
    assert _logged(caplog, S.RESTARTING, MoveTo(S.STARTING, "restart"), loop, failed, RULES, "") == [
        ("WARNING", f"attempt 0 failed ({root}); restarting as attempt 1 (failure 1, max_failures=2, "
                    "1 retries left)")]
    spent = MoveTo(S.STOPPING, root, S.FAILED)
    assert _logged(caplog, S.RUNNING, spent, Loop(state=S.STOPPING), failed, RULES, "") == [
        ("WARNING", f"attempt 0: {root}; stopping every rank of the attempt"),
        ("ERROR", f"attempt 0 failed ({root}); failure budget spent (max_failures=2)")]
    cannot = MoveTo(S.STOPPING, "no host can hold it", S.FAILED)
    assert _logged(caplog, S.STARTING, cannot, Loop(state=S.STOPPING), failed, RULES, "no host") == [
        ("ERROR", "the run cannot go on: no host can hold it")]
    assert _logged(caplog, S.RUNNING, MoveTo(S.STOPPING, "Ctrl-C", S.ABORTED), Loop(state=S.STOPPING), None,
                   RULES, "") == [("WARNING", "Ctrl-C: stopping the workers (press Ctrl-C again to kill them at once)")]
    assert _logged(caplog, S.STARTING, MoveTo(S.RUNNING, "every rank is training"), Loop(state=S.RUNNING), None,
                   RULES, "") == []  # an ordinary move is logged at debug level only


def test_unlimited_retries_are_said_so(caplog):
    loop = Loop(state=S.STARTING, attempt=3, failures=3)
    [(_, line)] = _logged(caplog, S.RESTARTING, MoveTo(S.STARTING, "r"), loop, _tracker(2, failed=True),
                          Rules(max_failures=-1, stop_grace_s=1.0), "")
    assert line.endswith("(failure 3, max_failures=-1, unlimited retries)")


def test_attempts_without_progress_are_counted_in_the_restart_line_and_their_stop_says_why(caplog):
    failed = _tracker(2, failed=True)
    loop = Loop(state=S.STARTING, attempt=3, failures=3, no_progress=2)
    [(_, line)] = _logged(caplog, S.RESTARTING, MoveTo(S.STARTING, "r"), loop, failed,
                          Rules(max_failures=-1, stop_grace_s=1.0), "")
    assert line.endswith("(failure 3, max_failures=-1, unlimited retries; 2 attempt(s) in a row without progress, "
                         "the run stops at 3)")
    reason = "no progress in the last 3 attempts (FailureConfig.max_attempts_without_progress=3); the last failed: x"
    stop = Loop(state=S.STOPPING, target=S.FAILED, attempt=3, failures=4, no_progress=3)
    assert _logged(caplog, S.RESTARTING, MoveTo(S.STOPPING, reason, S.FAILED), stop, failed,
                   Rules(max_failures=-1, stop_grace_s=1.0), "") == [
        ("ERROR", f"{reason}. The run stops here, whatever max_failures=-1 allows: a restart would fail the same way "
                  "(FailureConfig.max_attempts_without_progress=-1 turns this stop off)")]


def test_a_late_wait_names_the_ranks_it_waited_for(caplog):
    tracker = _tracker(attempt=4)
    tracker.ranks[0].exited = True
    with caplog.at_level(logging.INFO, logger="minitrain"):
        log_late(Wait.EXIT, tracker, 5.0)
        log_late(Wait.STACKS, tracker, 5.0)
        log_late(Wait.EXIT, None, 5.0)
    assert [r.getMessage() for r in caplog.records] == [
        "ranks [1] of attempt 4 did not confirm their exit in time",
        "attempt 4: not every rank sent its stacks within 5 s"]


def test_the_outcome_without_an_attempt_carries_the_loop_s_reason():
    loop = Loop(state=S.FAILED, attempt=0, reason="node agent(s) failed to start: n1: exit code 3")
    outcome = run_outcome(loop, None, History(), max_failures=0, run_path="/run", start_error="")
    assert outcome.state is S.FAILED and outcome.error_message == loop.reason and outcome.last_metrics is None


def test_the_failure_message_puts_the_root_cause_first_and_why_no_restart_was_possible():
    failed = _tracker(attempt=1, failed=True)
    history = History(last_metrics={"loss": 1.0}, return_value=b"r")
    outcome = run_outcome(Loop(state=S.FAILED, attempt=1), failed, history, max_failures=0, run_path="/run",
                          start_error="the hosts that remain cannot hold the run")
    message = outcome.error_message
    assert message.splitlines()[1] == f"Root cause: {failed.root_cause_line()}"
    assert ("The failure budget is spent (FailureConfig.max_failures=0); raise it to retry more often. "
            "Worker logs: /run/logs/attempt_1/") in message
    assert message.endswith("\n\nNo restart was possible: the hosts that remain cannot hold the run")
    assert (outcome.attempt, outcome.last_metrics, outcome.return_value) == (1, {"loss": 1.0}, b"r")
    assert failure_message(_tracker(), 0, "/run", "") == ""  # nothing failed: no message


def test_a_catch_up_names_the_pending_round_and_the_ranks_it_waits_for(caplog):
    tracker = _tracker()
    tracker.reported(0, 0, 1.0)
    tracker.reported(1, 0, 1.0)
    tracker.reported(1, 1, 1.0)
    tracker.fail(WorkerFailure(rank=1, node="host-n1", pid=7, phase=Phase.TRAINING, time=1.0,
                               exc_type="builtins.ValueError", message="boom"))
    root = tracker.root_cause_line()
    loop = Loop(state=S.RESTARTING, waiting_for=Wait.CATCH_UP)
    assert _logged(caplog, S.RUNNING, MoveTo(S.RESTARTING, root), loop, tracker, RULES, "") == [
        ("WARNING", f"attempt 0: {root}; stopping every rank of the attempt"),
        ("WARNING", "attempt 0: round 1 was reported by every failed rank but not yet by rank(s) 0; the stop "
                    "waits until they did (at most 10 s), so that the round is committed")]
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="minitrain"):
        log_late(Wait.CATCH_UP, tracker, 5.0, 10.0)
    assert [r.getMessage() for r in caplog.records] == [
        "attempt 0: rank(s) 0 did not report round 1 within 10 s (blocked, perhaps in a collective with a failed "
        "rank); stopping the attempt without that round"]
