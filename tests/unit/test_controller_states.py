"""The run's state as the real Controller keeps it (in process, without agents): the loop is its one
holder, every move passes `check_move` before anyone hears of it, and the observers' `on_state` gets
every move in order, as RunState values, with the run monitor showing each one as it comes."""

from __future__ import annotations

import pytest

from controller_support import FakeAgents, FakeClock, make_controller

from minitrain.coordinator import controller as controller_module
from minitrain.coordinator.observers import RunObserver
from minitrain.coordinator.policy.actions import MoveTo
from minitrain.coordinator.policy.loop import Decision, Loop
from minitrain.coordinator.transport.service import Hub
from minitrain.monitoring.monitor import RunMonitor
from minitrain.run_state import IllegalTransition, RunState, ray_status

S = RunState


class Moves(RunObserver):
    """Records each move with what the controller and the monitor (told first) show at that moment."""

    def __init__(self, monitor: RunMonitor):
        self.monitor = monitor
        self.controller = None
        self.moves = []
        self.shown = []
        self.ended = None

    def on_state(self, previous, next_state, reason, attempt):
        self.moves.append((previous, next_state, reason, attempt))
        self.shown.append(self.monitor.run()["state"])

    def on_run_end(self, outcome):
        self.ended = (outcome.state, self.controller.state, self.monitor.run()["state"])


def _controller(tmp_path, agents, observers, agent_start_timeout_s=60.0):
    """A one-node run sending through the real (unconnected) Hub, on a clock one second on at each read."""
    return make_controller(tmp_path, Hub(), agents, clock=FakeClock(1000.0, tick_s=1.0), observers=observers,
                           num_workers=1, node_ids=("n0",), agent_start_timeout_s=agent_start_timeout_s)


def test_an_observer_is_told_every_move_in_order_as_run_state_values_and_the_monitor_shows_each(tmp_path):
    monitor = RunMonitor()
    moves = Moves(monitor)
    controller = _controller(tmp_path, FakeAgents(dead={"n0": "exit code 1"}), [monitor, moves])
    moves.controller = controller
    assert controller.state is S.PENDING
    outcome = controller.run()
    assert [(p, n) for p, n, _, _ in moves.moves] == [(S.PENDING, S.LAUNCHING), (S.LAUNCHING, S.STOPPING),
                                                      (S.STOPPING, S.FAILED)]
    assert all(type(p) is RunState and type(n) is RunState for p, n, _, _ in moves.moves)
    assert [a for _, _, _, a in moves.moves] == [0, 0, 0]
    assert moves.moves[0][2] == "starting node agents" and "n0: exit code 1" in moves.moves[1][2]
    assert moves.shown == ["LAUNCHING", "STOPPING", "ERRORED"]  # the monitor, at each move
    assert outcome.state is S.FAILED and controller.state is S.FAILED
    assert moves.ended == (S.FAILED, S.FAILED, "ERRORED")


def test_agents_that_never_connect_fail_the_run_through_stopping(tmp_path):
    monitor = RunMonitor()
    moves = Moves(monitor)
    controller = _controller(tmp_path, FakeAgents(), [monitor, moves], agent_start_timeout_s=5.0)
    moves.controller = controller
    assert controller.run().state is S.FAILED
    assert [n for _, n, _, _ in moves.moves] == [S.LAUNCHING, S.STOPPING, S.FAILED]
    assert "did not connect within 5 s" in moves.moves[1][2]
    assert moves.shown == [ray_status(n) for _, n, _, _ in moves.moves]


def test_a_move_the_table_forbids_is_refused_before_anyone_hears_of_it(tmp_path, monkeypatch):
    moves = Moves(RunMonitor())
    controller = _controller(tmp_path, FakeAgents(), [moves])
    bad = Decision(Loop(state=S.RUNNING), (MoveTo(S.RUNNING, "skipping the start"),))
    monkeypatch.setattr(controller_module, "decide", lambda loop, seen, now, rules: bad)
    with pytest.raises(IllegalTransition, match="PENDING -> RUNNING"):
        controller.run()
    assert moves.moves == []


def test_moves_that_do_not_lead_to_the_decided_state_are_refused(tmp_path, monkeypatch):
    moves = Moves(RunMonitor())
    controller = _controller(tmp_path, FakeAgents(), [moves])
    bad = Decision(Loop(state=S.STARTING), (MoveTo(S.LAUNCHING, "agents"),))
    monkeypatch.setattr(controller_module, "decide", lambda loop, seen, now, rules: bad)
    with pytest.raises(IllegalTransition, match="end in LAUNCHING, its loop in STARTING"):
        controller.run()
