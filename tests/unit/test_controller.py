"""The real `Controller`, stepped turn by turn in process (as Ray's test_controller.py steps its control
loop): the fakes of tests/controller_support.py stand around it (a recording outbox keeps the commands the
controller sends, fake agent handles stand in for the launcher, a fake clock moves only when a test says so),
and the tests play the events agents and workers would send (coordinator/facts/events.py). They assert on the
states the loop reaches, the commands sent and what the observers were told. The pure policy is tested on its
own in test_decide.py.
"""

from __future__ import annotations

import queue
import threading
import time
import typing

import pytest

from controller_support import FakeAgents, FakeClock, RecordingObserver, RecordingOutbox, agent_node, make_controller

from minitrain.commands import Assignment, DumpStacks, Release, Rendezvous, Shutdown, StartWorkers, StopWorkers
from minitrain.config import FailureConfig
from minitrain.coordinator.controller import IDLE_WAIT_S, POLL_S
from minitrain.coordinator.facts import events as ev
from minitrain.coordinator.observers import TelemetrySample
from minitrain.coordinator.policy import actions  # its StopWorkers is not the command of that name
from minitrain.coordinator.policy.loop import CATCH_UP_S, Action
from minitrain.records import Phase, ReportRecord, WorkerFailure
from minitrain.run_state import RunState

NODES = ("n0", "n1")


class Harness:
    """One controller over two one-slot nodes (rank r runs on node n<r>), with its fakes."""

    def __init__(self, tmp_path, *, max_failures=0, hang_timeout_s=None, local=()):
        self.clock = FakeClock(1000.0)
        self.outbox, self.agents = RecordingOutbox(), FakeAgents(relaunchable=local)
        self.observer = RecordingObserver()
        self.events: queue.SimpleQueue = queue.SimpleQueue()
        policy = FailureConfig(max_failures=max_failures, worker_hang_timeout_s=hang_timeout_s,
                               worker_stop_grace_s=1.0)
        self.controller = make_controller(tmp_path, self.outbox, self.agents, events=self.events, clock=self.clock,
                                          observers=[self.observer], payload=b"payload", num_workers=len(NODES),
                                          node_ids=NODES, failure_limits=policy, local_node_ids=frozenset(local))
        self.controller.begin()
        self.states = []

    def send(self, *events) -> None:
        """Events as the servicer threads would queue them, then the loop's turns until it waits."""
        for event in events:
            self.events.put(event)
        self.settle()

    def settle(self) -> None:
        """Step until turns do nothing (a turn that only moves to a later wait acts on the next one),
        noting each state reached."""
        idle = 0
        for _ in range(100):
            wait_s = self.controller.step(0.0)
            if not self.states or self.states[-1] is not self.controller.state:
                self.states.append(self.controller.state)
            idle = idle + 1 if wait_s > 0 else 0
            if idle == 3 or self.controller.finished:
                return
        raise AssertionError("the loop did not settle")

    @property
    def now(self) -> float:
        return self.clock.now

    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)
        self.settle()

    def connect(self, *nodes, stream=0) -> None:
        self.send(*(ev.AgentConnected(agent_node(n), stream) for n in nodes))

    def train(self, attempt: int) -> None:
        """Every rank of `attempt` starts, connects and enters its training function."""
        for rank, node in enumerate(NODES):
            self.send(ev.WorkerSpawned(node, attempt, rank, 100 + rank), ev.WorkerConnected(attempt, rank, 100 + rank, "h"))
        self.send(ev.StoreReady(attempt, "127.0.0.1", 29500))
        for phase in (Phase.DIST_INIT, Phase.TRAINING):
            self.send(*(ev.WorkerPhaseChanged(attempt, rank, phase) for rank in range(len(NODES))))

    def report(self, attempt: int, round_: int) -> None:
        self.send(ev.ReportsReceived(tuple(ReportRecord(attempt, rank, round_, f'{{"round": {round_}}}', self.now)
                                           for rank in range(len(NODES)))))

    def report_of(self, attempt: int, rank: int, *rounds: int) -> None:
        """`rank`'s reports of `rounds`, one batch."""
        self.send(ev.ReportsReceived(tuple(ReportRecord(attempt, rank, r, f'{{"round": {r}}}', self.now)
                                           for r in rounds)))

    def exit_all(self, attempt: int, *, stopped: bool) -> None:
        """Every rank's process of `attempt` ends (stopped by its agent, or after its function returned)."""
        for rank, node in enumerate(NODES):
            if not stopped:
                self.send(ev.WorkerDone(attempt, rank, reports=1))
            self.send(ev.WorkerStreamClosed(attempt, rank),
                      ev.WorkerExited(node, attempt, rank, 100 + rank, 0 if not stopped else None,
                                      None if not stopped else 15, stopped, self.now))

    def end(self):
        return self.controller.end()


def _failure(attempt: int, rank: int, message: str, time: float) -> ev.WorkerFailed:
    return ev.WorkerFailed(attempt, WorkerFailure(rank=rank, node="", pid=0, phase=Phase.TRAINING, time=time,
                                                  exc_type="builtins.ValueError", message=message,
                                                  traceback=f"Traceback ...\nValueError: {message}\n"), b"")


def _started(h: Harness) -> None:
    """Agents connected, attempt 0 started and every rank training: RUNNING."""
    h.settle()
    h.connect(*NODES)
    h.train(0)
    assert h.controller.state is RunState.RUNNING


# ---------------------------------------------------------------------------------- tests


def test_a_run_goes_from_its_agents_to_success(tmp_path):
    h = Harness(tmp_path)
    h.settle()
    assert h.controller.state is RunState.LAUNCHING
    assert h.outbox.delivered("agent") == []  # nothing starts before every agent is in
    h.connect("n0")
    assert h.outbox.agent_kinds(StartWorkers) == []
    h.connect("n1")
    assert sorted(h.outbox.agent_kinds(StartWorkers)) == ["n0", "n1"]  # one StartWorkers per node
    [attempt] = h.observer.named("on_attempt_start")
    assert attempt.attempt == 0 and attempt.hosts == ("host-n0", "host-n1")
    h.train(0)
    assert h.controller.state is RunState.RUNNING
    assert h.outbox.worker_kinds(Assignment) == [(0, 0), (0, 1)]
    assert h.outbox.worker_kinds(Rendezvous) == [(0, 0), (0, 1)]
    h.report(0, 0)
    assert [(r.index, r.metrics_by_rank[0]) for r in h.observer.named("on_round")] == [(0, {"round": 0})]
    h.exit_all(0, stopped=False)
    assert (0, 0) in h.outbox.worker_kinds(Release)  # rank 0 holds the store until every rank is done
    assert h.controller.state is RunState.SUCCEEDED and h.controller.finished
    assert h.states[-3:] == [RunState.RUNNING, RunState.STOPPING, RunState.SUCCEEDED]
    outcome = h.end()
    assert outcome.state is RunState.SUCCEEDED and outcome.error_message == "" and outcome.last_metrics == {"round": 0}
    assert sorted(h.outbox.agent_kinds(Shutdown)) == ["n0", "n1"]
    hooks = [hook for hook, _ in h.observer.calls]
    assert hooks[0] == "on_run_start" and hooks[-2:] == ["on_attempt_end", "on_run_end"]


def test_a_failed_rank_within_the_budget_restarts_the_group_as_a_new_attempt(tmp_path):
    h = Harness(tmp_path, max_failures=1)
    _started(h)
    h.send(_failure(0, 1, "boom", h.now))
    assert h.controller.state is RunState.RESTARTING
    assert sorted(h.outbox.agent_kinds(StopWorkers)) == ["n0", "n1"]
    h.exit_all(0, stopped=True)
    assert h.controller.state is RunState.STARTING
    [end] = h.observer.named("on_attempt_end")
    assert end.restarting and end.root_cause == "rank 1 on host-n1 (pid 101) during training: ValueError: boom"
    assert sorted(h.outbox.agent_kinds(StartWorkers)) == ["n0", "n0", "n1", "n1"]  # attempt 1 on both nodes
    h.send(ev.WorkerConnected(0, 0, 100, "h"))  # a straggler of attempt 0 is sent away
    assert (0, 0) in h.outbox.closed
    h.train(1)
    assert h.controller.state is RunState.RUNNING
    h.exit_all(1, stopped=False)
    assert h.end().state is RunState.SUCCEEDED


def test_the_turn_that_enters_a_wait_is_followed_by_one_at_once(tmp_path):
    """Every process of the failed attempt exited: the turn that moves to the drain wait (no action of its
    own) is followed by one at once, which finds the streams ended and starts the next attempt. Waiting
    POLL_S there for an event that is not coming cost every restart 50 ms."""
    h = Harness(tmp_path, max_failures=1)
    _started(h)
    h.send(_failure(0, 1, "boom", h.now))
    assert h.controller.state is RunState.RESTARTING and h.controller.step(0.0) == POLL_S
    for rank, node in enumerate(NODES):
        h.events.put(ev.WorkerStreamClosed(0, rank))
        h.events.put(ev.WorkerExited(node, 0, rank, 100 + rank, None, 15, True, h.now))
    assert h.controller.step(0.0) == 0.0  # all exited: the drain wait begins ...
    assert h.outbox.agent_kinds(StartWorkers).count("n0") == 1
    h.controller.step(0.0)  # ... and the next turn, at once, finds every stream ended
    assert h.controller.state is RunState.STARTING and h.outbox.agent_kinds(StartWorkers).count("n0") == 2


def _rank_1_fails_ahead_of_rank_0(h: Harness) -> None:
    """Rank 0 reported rounds 0-2; rank 1 reported rounds 0-3 and failed right after (report() is no
    barrier): round 3 is pending."""
    _started(h)
    h.report_of(0, 0, 0, 1, 2)
    h.report_of(0, 1, 0, 1, 2, 3)
    h.send(_failure(0, 1, "after round 3", h.now))
    assert h.outbox.agent_kinds(StopWorkers) == []


def test_a_failed_rank_s_last_round_is_committed_once_its_peer_reports_it_then_the_attempt_stops(tmp_path):
    h = Harness(tmp_path, max_failures=1)
    _rank_1_fails_ahead_of_rank_0(h)
    assert h.controller.state is RunState.RESTARTING
    h.advance(2.0)
    assert h.outbox.agent_kinds(StopWorkers) == []  # rank 0 still runs on
    h.report_of(0, 0, 3)  # the round completes: committed (told as a round), then the attempt stops
    assert [r.index for r in h.observer.named("on_round")] == [0, 1, 2, 3]
    assert sorted(h.outbox.agent_kinds(StopWorkers)) == ["n0", "n1"]
    h.exit_all(0, stopped=True)
    assert h.controller.state is RunState.STARTING


def test_a_peer_that_never_reports_the_round_holds_the_stop_only_for_the_grace(tmp_path):
    h = Harness(tmp_path, max_failures=1)
    _rank_1_fails_ahead_of_rank_0(h)
    h.advance(CATCH_UP_S)
    assert h.outbox.agent_kinds(StopWorkers) == []
    h.advance(0.1)
    assert sorted(h.outbox.agent_kinds(StopWorkers)) == ["n0", "n1"]
    assert [r.index for r in h.observer.named("on_round")] == [0, 1, 2]  # round 3 is lost
    h.exit_all(0, stopped=True)
    assert h.controller.state is RunState.STARTING


def test_a_peer_that_fails_too_ends_the_catch_up_at_once(tmp_path):
    h = Harness(tmp_path, max_failures=0)
    _rank_1_fails_ahead_of_rank_0(h)
    assert h.controller.state is RunState.STOPPING  # the budget is spent: on the way to FAILED
    h.send(_failure(0, 0, "Connection closed by peer", h.now))  # e.g. its all_reduce with rank 1 broke
    assert sorted(h.outbox.agent_kinds(StopWorkers)) == ["n0", "n1"]
    h.exit_all(0, stopped=True)
    assert h.controller.state is RunState.FAILED


def test_a_spent_budget_fails_the_run_with_the_root_cause(tmp_path):
    h = Harness(tmp_path, max_failures=0)
    _started(h)
    h.send(_failure(0, 0, "Connection reset by peer", h.now), _failure(0, 1, "the real one", h.now + 1))
    assert h.controller.state is RunState.STOPPING
    h.exit_all(0, stopped=True)
    assert h.controller.state is RunState.FAILED
    outcome = h.end()
    lines = outcome.error_message.splitlines()
    assert lines[1] == "Root cause: rank 1 on host-n1 (pid 101) during training: ValueError: the real one"
    assert "FailureConfig.max_failures=0" in outcome.error_message and len(outcome.failures) == 2


def test_attempts_that_fail_without_progress_stop_the_run_whatever_max_failures_allows(tmp_path):
    """Each attempt's round 0 redoes the first attempt's (no checkpoint to resume from): only the first made
    progress; the third attempt in a row without it stops the run, with every failed attempt kept."""
    h = Harness(tmp_path, max_failures=-1)
    _started(h)
    for attempt in range(4):
        if attempt:
            h.train(attempt)
        h.report(attempt, 0)
        h.send(_failure(attempt, 1, "CUDA error: an illegal memory access", h.now))
        h.exit_all(attempt, stopped=True)
        assert h.controller.state is (RunState.STARTING if attempt < 3 else RunState.FAILED)
    assert h.outbox.agent_kinds(StartWorkers).count("n0") == 4  # no fifth attempt
    outcome = h.end()
    assert outcome.no_progress == 3 and [a.progressed for a in outcome.failed_attempts] == [True, False, False, False]
    assert outcome.error_message.splitlines()[0] == (
        "Training stopped: no progress in the last 3 attempts: each failed during training with ValueError: CUDA "
        "error: an illegal memory access (rank 1 on host-n1); last committed round 3. A restart would fail the "
        "same way, so the run stops here whatever max_failures=-1 allows "
        "(FailureConfig.max_attempts_without_progress=3; -1 turns this stop off). Fix the cause and run it again: "
        "the same run name resumes from its last committed checkpoint.")
    assert "4 attempts failed on host host-n1: 4x rank 1 during training: ValueError: CUDA error: an illegal " \
           "memory access" in outcome.error_message


def test_an_agent_lost_mid_run_fails_its_ranks_and_a_local_one_is_replaced(tmp_path):
    h = Harness(tmp_path, max_failures=1, local=("n1",))
    _started(h)
    h.outbox.gone.add("n1")
    h.send(ev.AgentLost("n1", "lease expired"))
    assert h.controller.state is RunState.RESTARTING
    h.send(ev.AgentLost("n1", "lease expired"))  # told twice: counted once
    assert h.outbox.agent_kinds(StopWorkers) == ["n0"]
    h.send(ev.WorkerStreamClosed(0, 0), ev.WorkerExited("n0", 0, 0, 100, None, 15, True, h.now))
    assert h.agents.relaunched == ["n1"]  # on this machine: replaced at once, and waited for
    assert h.controller.state is RunState.RESTARTING and h.outbox.agent_kinds(StartWorkers) == ["n0", "n1"]
    h.outbox.gone.discard("n1")
    h.connect("n1", stream=1)
    assert h.controller.state is RunState.STARTING and h.outbox.agent_kinds(StartWorkers).count("n1") == 2
    [end] = h.observer.named("on_attempt_end")
    assert end.restarting and "node host-n1 was lost: lease expired" in end.root_cause
    h.train(1)
    h.exit_all(1, stopped=False)
    assert h.end().state is RunState.SUCCEEDED


def test_a_silent_rank_is_declared_hung_on_the_fake_clock(tmp_path):
    h = Harness(tmp_path, hang_timeout_s=30.0)
    _started(h)
    h.advance(20.0)
    h.report(0, 0)  # both ranks progress at +20 s
    h.advance(25.0)
    h.send(ev.ReportsReceived((ReportRecord(0, 0, 1, "{}", h.now),)))  # rank 0 goes on; rank 1 is silent
    assert h.controller.state is RunState.RUNNING and h.outbox.agent_kinds(DumpStacks) == []
    h.advance(10.0)  # rank 1 silent for 35 s > 30 s: the stacks are collected first
    assert sorted(h.outbox.agent_kinds(DumpStacks)) == ["n0", "n1"]
    h.send(ev.StackDumped(0, 0, "stack of rank 0"), ev.StackDumped(0, 1, "stack of rank 1"))
    assert h.controller.state is RunState.STOPPING
    assert [d.rank for d in h.observer.named("on_stacks")] == [0, 1]
    h.exit_all(0, stopped=True)
    outcome = h.end()
    assert outcome.state is RunState.FAILED
    [failure] = outcome.failures
    assert failure.rank == 1 and failure.exc_type == "WorkerHangError"
    assert "past its hang deadline of 30 s (FailureConfig.worker_hang_timeout_s=30)" in failure.message


def test_a_training_attempt_sleeps_until_its_hang_clock_can_run_out_and_other_waits_look_every_poll(tmp_path):
    """An idle turn while ranks train waits for the next event up to the hang watch's due moment (at most
    IDLE_WAIT_S): 20 wake-ups a second of an idle driver were most of its CPU. Waits with deadlines of
    their own still look every POLL_S."""
    h = Harness(tmp_path, hang_timeout_s=30.0)
    h.settle()
    assert h.controller.step(0.0) == POLL_S  # LAUNCHING: the agents' deadline
    _started(h)
    h.report(0, 0)
    assert h.controller.step(0.0) == IDLE_WAIT_S  # the earliest hang is 30 s away
    h.clock.advance(29.7)
    assert h.controller.step(0.0) == pytest.approx(0.3)  # ... now 0.3 s away: the wait ends there
    h.clock.advance(0.29)
    assert h.controller.step(0.0) == POLL_S  # never a busy loop: at least POLL_S
    h.clock.advance(0.02)  # silent for 30.01 s: found on the turn after the wait
    h.settle()
    assert sorted(h.outbox.agent_kinds(DumpStacks)) == ["n0", "n1"]
    assert h.controller.step(0.0) == POLL_S  # STACKS: its own deadline


def test_without_a_hang_deadline_a_training_attempt_waits_at_most_idle_wait_s(tmp_path):
    h = Harness(tmp_path, hang_timeout_s=None)
    _started(h)
    h.report(0, 0)
    h.clock.advance(3600.0)
    assert h.controller.step(0.0) == IDLE_WAIT_S and h.controller.state is RunState.RUNNING


def test_ctrl_c_wakes_a_loop_that_waits_for_an_event(tmp_path):
    """The SIGINT handler's `interrupt()` queues an event: the loop acts at once, not after its wait."""
    h = Harness(tmp_path)
    _started(h)
    turned = threading.Event()
    waiter = threading.Thread(target=lambda: (h.controller.step(60.0), turned.set()), daemon=True)
    began = time.monotonic()
    waiter.start()
    h.controller.interrupt()
    assert turned.wait(10.0), "the loop slept through Ctrl-C"
    assert time.monotonic() - began < 10.0
    assert h.controller.state is RunState.STOPPING and sorted(h.outbox.agent_kinds(StopWorkers)) == ["n0", "n1"]
    h.exit_all(0, stopped=True)
    with pytest.raises(KeyboardInterrupt):
        h.end()


def test_ctrl_c_stops_the_workers_and_aborts_the_run(tmp_path):
    h = Harness(tmp_path)
    _started(h)
    h.controller.interrupt()
    h.settle()
    assert h.controller.state is RunState.STOPPING and sorted(h.outbox.agent_kinds(StopWorkers)) == ["n0", "n1"]
    h.exit_all(0, stopped=True)
    assert h.controller.state is RunState.ABORTED
    with pytest.raises(KeyboardInterrupt):
        h.end()
    assert h.observer.named("on_run_end")[0].state is RunState.ABORTED


def test_telemetry_reaches_the_observers_with_host_pid_and_phase_and_stale_events_are_dropped(tmp_path):
    h = Harness(tmp_path)
    _started(h)
    sample = TelemetrySample(attempt=0, rank=1, time=h.now, reports=0, step_time_s=0.1)
    h.send(ev.TelemetryReceived(0, sample), ev.TelemetryReceived(7, sample))
    [told] = h.observer.named("on_telemetry")
    assert (told.host, told.pid, told.phase) == ("host-n1", 101, "TRAINING")


def test_agents_that_died_before_connecting_end_the_run(tmp_path):
    h = Harness(tmp_path)
    h.connect("n0")
    h.agents.dead["n1"] = "exit code 3"
    h.settle()
    assert h.controller.state is RunState.FAILED
    outcome = h.end()
    assert "node agent(s) failed to start: n1: exit code 3" in outcome.error_message


def test_every_event_and_every_action_has_its_one_handler(tmp_path):
    """The controller routes by type through two tables: every event type of events.py and every action
    of decide's `Action` but MoveTo (executed by `_move`, which needs the state moved from) has one entry."""
    controller = Harness(tmp_path).controller
    event_types = {t for t in vars(ev).values() if isinstance(t, type) and issubclass(t, ev.RunEvent)
                   and t is not ev.RunEvent}
    assert set(controller._handlers) == event_types
    assert set(controller._executors) == set(typing.get_args(Action)) - {actions.MoveTo}


def test_the_actions_of_an_attempt_do_nothing_before_one_started(tmp_path):
    h = Harness(tmp_path)
    for action in (actions.StopWorkers(1.0), actions.CollectStacks(), actions.CloseStreams()):
        h.controller._executors[type(action)](action)
    assert h.outbox.delivered("agent") == [] and h.outbox.closed == []
