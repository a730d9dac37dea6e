"""The observer fan-out: every observer is told in turn, a failing one is logged and never stops the
others, and an observer may implement only the methods it needs."""

from __future__ import annotations

import logging

import pytest

from minitrain.coordinator.observers import AttemptInfo, Observers, RankMetrics, RunObserver
from minitrain.run_state import RunState


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
        observers.on_attempt_start(AttemptInfo(attempt=2, hosts=("a", "a", "b"), started_at=0.0))
    assert calls == [("recorder", 2, 3)]
    assert "observer bug" in caplog.text and "on_attempt_start" in caplog.text


def test_no_observers_is_falsy_so_callers_can_skip_building_arguments():
    assert not Observers() and Observers([RunObserver()])


def test_the_report_fan_out_calls_every_observer_s_on_report_and_contains_failures(caplog):
    seen = []

    class Seen:
        def on_report(self, report):
            seen.append(report)

    class Raises:
        def on_report(self, report):
            raise RuntimeError("observer bug")

    assert Observers([Recorder([])]).report_fan_out is None  # nobody listens: the caller skips
    tell = Observers([Raises(), Seen(), Recorder([])]).report_fan_out
    with caplog.at_level(logging.ERROR, logger="minitrain"):
        tell("a")
        tell("b")
    assert seen == ["a", "b"] and [r.exc_info[1].args for r in caplog.records] == [("observer bug",)] * 2


def test_the_fan_out_is_itself_an_observer_forwarding_every_hook_by_method(caplog):
    """`Observers` is a RunObserver: each hook is a method that reaches every observer having it (an
    observer that kept the base no-op is skipped), a failing one contained; none is left as the
    base's silent no-op."""
    for name in (n for n in vars(RunObserver) if n.startswith("on_")):
        assert getattr(Observers, name) is not getattr(RunObserver, name), f"Observers.{name} is not forwarded"
    moves = []

    class States(RunObserver):
        def on_state(self, previous, next_state, reason, attempt):
            moves.append((previous, next_state, reason, attempt))

    class Raises(RunObserver):
        def on_state(self, previous, next_state, reason, attempt):
            raise RuntimeError("observer bug")

    observers = Observers([Raises(), Recorder([]), States()])
    with caplog.at_level(logging.ERROR, logger="minitrain"):
        observers.on_state(RunState.PENDING, RunState.LAUNCHING, "starting node agents", 0)
    assert moves == [(RunState.PENDING, RunState.LAUNCHING, "starting node agents", 0)]
    assert "observer bug" in caplog.text and "on_state" in caplog.text
    calls = []
    Observers([Recorder(calls)]).on_attempt_start(AttemptInfo(attempt=1, hosts=("a",), started_at=0.0))
    assert calls == [("recorder", 1, 1)]
    Observers().on_state(RunState.PENDING, RunState.LAUNCHING, "", 0)  # nobody listens: nothing happens


def test_rank_metrics_parse_each_rank_when_first_read():
    """A round's metrics by rank stay the JSON each rank sent until read: a rank nobody reads is never
    parsed (here: its text is not JSON, and nothing fails until it is read), a rank read twice is parsed
    once, and a rank that did not report the round is None."""
    metrics = RankMetrics({0: '{"loss": 0.5}', 2: "not json"}, 4)
    assert len(metrics) == 4
    first = metrics[0]
    assert first == {"loss": 0.5} and metrics[0] is first and metrics[-4] is first
    assert metrics[1] is None and metrics[3] is None
    with pytest.raises(ValueError):
        metrics[2]
    with pytest.raises(IndexError, match="rank 4 out of range for 4 ranks"):
        metrics[4]
    assert metrics[:2] == ({"loss": 0.5}, None)
    assert RankMetrics({0: "{}", 1: '{"a": 1}'}, 2) == ({}, {"a": 1}) == RankMetrics({0: "{}", 1: '{"a": 1}'}, 2)
    assert RankMetrics({}, 1) != (None, None)
