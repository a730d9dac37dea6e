"""A callback that hangs: the run and fit() go on, a bounded number of events waits behind
it and the rest are dropped with one warning naming the stuck call; fit() returns after the drain timeout
with a warning (tests/unit/test_callbacks.py), end to end in tests/e2e/test_driver_signals.py."""

from __future__ import annotations

import logging
import threading

from callbacks_support import WAIT_S, context, round_
from minitrain.callbacks import UserCallback
from minitrain.callbacks import runner as runner_module
from minitrain.callbacks.runner import CallbackRunner
from minitrain.coordinator.observers import RunInfo
from minitrain.records import RunOutcome
from minitrain.run_state import RunState


def test_events_behind_a_hung_callback_are_bounded_and_the_drop_is_named(tmp_path, caplog, monkeypatch):
    monkeypatch.setattr(runner_module, "MAX_QUEUED", 5)
    release = threading.Event()
    entered = threading.Event()

    class Stuck(UserCallback):
        def after_report(self, run_context, metrics, checkpoint):
            entered.set()
            release.wait(WAIT_S)

    runner = CallbackRunner([Stuck()], context(tmp_path), drain_timeout_s=0.2)
    runner.on_run_start(RunInfo("fit1", "run", "p", 2, 0.0))
    runner.on_round(round_(0, {"i": 0}))
    assert entered.wait(WAIT_S)
    with caplog.at_level(logging.WARNING, logger="minitrain"):
        for i in range(1, 50):
            runner.on_round(round_(i, {"i": i}))
        assert runner._calls.qsize() <= 5 and runner.dropped == 49 - 5
        assert [r.getMessage() for r in caplog.records if "wait behind" in r.getMessage()] == [
            "RunConfig.callbacks: 5 events wait behind Stuck.after_report, which has not returned; later events "
            "are not passed to the callbacks (the run goes on)"]
        runner.on_run_end(RunOutcome(state=RunState.SUCCEEDED, attempt=1, last_metrics=None))
    assert "still busy" in caplog.text
    release.set()
    runner._thread.join(WAIT_S)
    assert not runner._thread.is_alive()
