"""The observer fan-out: every observer is told in turn, a failing one is logged and never stops the
others, and an observer may implement only the methods it needs."""

from __future__ import annotations

import logging

from minitrain.coordinator.observers import AttemptInfo, Observers, RunObserver


class Recorder(RunObserver):
    def __init__(self, calls):
        self.calls = calls

    def on_attempt_start(self, attempt):
        self.calls.append(("recorder", attempt.attempt, attempt.world_size))


class Broken(RunObserver):
    def on_attempt_start(self, attempt):
        raise RuntimeError("observer bug")


class OnlyReports:
    def on_report(self, report):
        raise AssertionError("never called for an attempt start")


def test_every_observer_is_told_in_order_and_a_failing_one_is_contained(caplog):
    calls = []
    observers = Observers([Broken(), OnlyReports(), Recorder(calls)])
    with caplog.at_level(logging.ERROR, logger="minitrain"):
        observers.notify("on_attempt_start", AttemptInfo(attempt=2, hosts=("a", "a", "b"), started_at=0.0))
    assert calls == [("recorder", 2, 3)]
    assert "observer bug" in caplog.text and "on_attempt_start" in caplog.text


def test_no_observers_is_falsy_so_callers_can_skip_building_arguments():
    assert not Observers() and Observers([RunObserver()])
