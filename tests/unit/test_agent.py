"""The node agent's own logic, in process (no worker is started): the lease in both directions, the
command stream, and the facts it reports about a worker's end. Its processes are tested for real in
tests/process and tests/e2e; its signal handlers in test_agent_signals.py."""

from __future__ import annotations

import queue
import signal
import threading
import time

import grpc
import pytest

from minitrain.agent import agent as agent_module
from minitrain.agent.agent import NodeAgent
from minitrain.rpc._gen import minitrain_pb2 as pb

DEADLINE_S = 10.0


@pytest.fixture
def agent(monkeypatch):
    monkeypatch.setattr(agent_module, "HEARTBEAT_INTERVAL_S", 0.01)
    return NodeAgent("127.0.0.1:1", "node-a", "run-1", "token", lease_timeout_s=0.5)


def _drain(outbox: "queue.SimpleQueue") -> list:
    messages = []
    while True:
        try:
            messages.append(outbox.get_nowait())
        except queue.Empty:
            return messages


def _kinds(messages) -> list[str]:
    return [m.WhichOneof("body") for m in messages]


def test_heartbeats_flow_while_the_coordinator_is_heard_and_the_lease_ends_after_its_silence(agent):
    agent._lease.heard()
    beating = threading.Thread(target=agent._heartbeat, daemon=True)
    beating.start()
    # It beats while heard (every message carries the run and node), then the 0.5 s lease runs out.
    assert agent._finished.wait(DEADLINE_S), "the lease never ended"
    beating.join(DEADLINE_S)
    sent = _drain(agent._outbox)
    assert sent and set(_kinds(sent)) == {"heartbeat"}
    assert {(m.run_id, m.node_id) for m in sent} == {("run-1", "node-a")}
    assert agent._end_reason.startswith("the coordinator sent nothing for ")


class _Commands:
    """A stand-in for the AgentStream call: yields the scripted commands, then raises `error` if any."""

    def __init__(self, commands, error=None):
        self._commands, self._error = commands, error

    def __iter__(self):
        yield from self._commands
        if self._error is not None:
            raise self._error


class _Broken(grpc.RpcError):
    def code(self):
        return grpc.StatusCode.UNAVAILABLE


def test_commands_are_queued_heartbeats_renew_the_lease_and_shutdown_ends_the_stream(agent):
    start = pb.AgentCommand(start=pb.StartWorkers(attempt=0))
    agent._call = _Commands([pb.AgentCommand(heartbeat=pb.Heartbeat()), start,
                             pb.AgentCommand(shutdown=pb.Shutdown(reason="done")),
                             pb.AgentCommand(stop=pb.StopWorkers(attempt=0))])  # after Shutdown: never read
    agent._lease.last_heard = 0.0
    agent._receive()
    assert agent._lease.last_heard > 0.0 and agent._shutdown_requested and agent._finished.is_set()
    queued = _drain(agent._commands)
    # The start, then an empty command that wakes the command loop at once (not at its next poll).
    assert queued == [start, pb.AgentCommand()]


@pytest.mark.parametrize("call, reason", [
    (_Commands([], error=_Broken()), "the connection broke: UNAVAILABLE"),
    (_Commands([]), "the coordinator closed the stream"),
])
def test_a_stream_that_ends_without_shutdown_ends_the_lease_with_its_reason(agent, call, reason):
    agent._call = call
    agent._receive()
    assert agent._finished.is_set() and not agent._shutdown_requested and agent._end_reason == reason


@pytest.mark.parametrize("returncode, stopped, expected", [
    (0, False, {"exit_code": 0, "signal": 0}),
    (3, False, {"exit_code": 3, "signal": 0}),
    (-signal.SIGSEGV, False, {"exit_code": 0, "signal": signal.SIGSEGV}),
    (-signal.SIGTERM, True, {"signal": signal.SIGTERM, "stopped_by_agent": True}),
])
def test_a_worker_s_end_is_reported_with_its_code_or_signal(agent, returncode, stopped, expected):
    agent._send_exit(2, 1, 4242, returncode, stopped=stopped, exited_at=123.0)
    (message,) = _drain(agent._outbox)
    exited = message.exited
    assert (exited.attempt, exited.rank, exited.pid, exited.exited_at) == (2, 1, 4242, 123.0)
    for name, value in expected.items():
        assert getattr(exited, name) == value, name
    assert not exited.oom_suspected and exited.spawn_error == ""


def test_a_worker_that_cannot_be_started_is_reported_with_the_reason(agent, monkeypatch):
    def no_room(env, cwd):
        raise OSError(12, "Cannot allocate memory")

    monkeypatch.setattr(agent_module, "start_worker", no_room)
    start = pb.StartWorkers(attempt=1, workers=[pb.WorkerLaunch(rank=0), pb.WorkerLaunch(rank=1)])
    agent._start_workers(start)
    exits = [m.exited for m in _drain(agent._outbox)]
    assert [(e.attempt, e.rank) for e in exits] == [(1, 0), (1, 1)]
    assert all("Cannot allocate memory" in e.spawn_error for e in exits)
    assert agent._workers == {}


def test_commands_that_do_not_apply_are_ignored(agent):
    agent._execute(pb.AgentCommand(prepare_fork_servers=pb.PrepareForkServers(count=2)))  # nothing started yet
    assert agent._fork_server.pids() == [] and agent._fork_server.key is None
    agent._execute(pb.AgentCommand())  # the wake-up command
    assert _drain(agent._outbox) == []


def test_a_late_heartbeat_extends_the_lease_by_its_delay(agent):
    """A coordinator heartbeat read 2 s after it was stamped (its stream backlogged behind commands):
    the 0.5 s lease then allows 2.5 s of silence, so a busy coordinator is not taken for a dead one;
    an unstamped heartbeat changes nothing."""
    agent._call = _Commands([pb.AgentCommand(heartbeat=pb.Heartbeat(sent_at=time.time() - 2.0)),
                             pb.AgentCommand(heartbeat=pb.Heartbeat())])
    agent._receive()
    assert 1.9 < agent._lease.backlog_s < 3.0
    agent._lease.last_heard -= 1.0  # 1 s of silence: past the 0.5 s lease, within lease + delay
    assert not agent._lease.expired()
    agent._lease.last_heard -= 2.0
    assert agent._lease.expired()
