"""The node agent's own logic, in process (no worker is started): the commands it acts on and the facts
it reports about a worker's end, through a stream that records what it is told. The stream itself (the
lease in both directions, commands as records, its messages) is in test_agent_stream.py; the agent's
processes are tested for real in tests/process and tests/e2e; its signal handlers in
test_agent_signals.py."""

from __future__ import annotations

import signal

import pytest

from minitrain import commands as cmd
from minitrain.agent import agent as agent_module
from minitrain.agent.agent import NodeAgent


class RecordingStream:
    """Stands in for the CoordinatorStream: records the facts reported, in order."""

    def __init__(self):
        self.facts: list[tuple[str, tuple, dict]] = []

    def __getattr__(self, name):
        if name not in ("spawned", "exited", "log_line", "stack_dump", "warmed"):
            raise AttributeError(name)
        return lambda *args, **kwargs: self.facts.append((name, args, kwargs))


@pytest.fixture
def agent():
    node_agent = NodeAgent("127.0.0.1:1", "node-a", "run-1", "token", lease_timeout_s=0.5)
    node_agent._stream = RecordingStream()
    return node_agent


@pytest.mark.parametrize("returncode, stopped, expected", [
    (0, False, {"exit_code": 0, "signal": None}),
    (3, False, {"exit_code": 3, "signal": None}),
    (-signal.SIGSEGV, False, {"exit_code": None, "signal": signal.SIGSEGV}),
    (-signal.SIGTERM, True, {"exit_code": None, "signal": signal.SIGTERM, "stopped_by_agent": True}),
])
def test_a_worker_s_end_is_reported_with_its_code_or_signal(agent, returncode, stopped, expected):
    agent._send_exit(2, 1, 4242, returncode, stopped=stopped, exited_at=123.0)
    [(fact, args, kwargs)] = agent._stream.facts
    assert (fact, args, kwargs["exited_at"], kwargs["stopped_by_agent"]) == ("exited", (2, 1, 4242), 123.0, stopped)
    for name, value in expected.items():
        assert kwargs[name] == value, name
    assert not kwargs["oom_suspected"] and kwargs["spawn_error"] == ""


def test_a_worker_that_cannot_be_started_is_reported_with_the_reason(agent, monkeypatch):
    def no_room(env, cwd):
        raise OSError(12, "Cannot allocate memory")

    monkeypatch.setattr(agent_module, "start_worker", no_room)
    start = cmd.StartWorkers(attempt=1, workers=(cmd.WorkerLaunch(0, 0), cmd.WorkerLaunch(1, 1)), cwd="", env={})
    agent._start_workers(start)
    facts = agent._stream.facts
    assert [(fact, args) for fact, args, _ in facts] == [("exited", (1, 0, 0)), ("exited", (1, 1, 0))]
    assert all("Cannot allocate memory" in kwargs["spawn_error"] for _, _, kwargs in facts)
    assert agent._workers == {} and agent._unexited == {}


def test_commands_that_do_not_apply_are_ignored(agent):
    agent._execute(cmd.PrepareForkServers(count=2))  # nothing started yet
    assert agent._fork_server.pids() == [] and agent._fork_server.key is None
    agent._execute(cmd.StopWorkers(attempt=5, grace_s=1.0))  # no such workers here
    agent._execute(cmd.DumpStacks(attempt=5))
    assert agent._stream.facts == []


def test_a_fork_server_can_be_readied_for_a_start_this_agent_has_not_seen(agent, monkeypatch):
    """An elastic run readies a returning host for the start it will get: the fork server's key is the
    key of a StartWorkers with that cwd and env, so that start forks from it."""
    monkeypatch.setattr(agent._fork_server, "refill", lambda: None)  # no real fork server process here
    agent._execute(cmd.PrepareForkServers(count=1, env={"GLOO_SOCKET_IFNAME": "eth0"}, cwd="/w"))
    key, env = agent._worker_env({"GLOO_SOCKET_IFNAME": "eth0"}, "/w")
    assert agent._fork_server.key == key and agent._fork_server.wanted and agent._fork_server.cwd == "/w"
    assert env["GLOO_SOCKET_IFNAME"] == "eth0" and env["PYTHONUNBUFFERED"] == "1"
    assert agent._worker_env({"GLOO_SOCKET_IFNAME": "eth1"}, "/w")[0] != key  # another start: another server


def test_a_warm_up_for_a_start_is_answered_once_when_its_fork_server_is_ready(agent, monkeypatch):
    """The coordinator grows onto a returning node only once it heard that node's answer: ready, or
    never (then it grows cold); the answer goes once, and a start that came first cancels it."""
    monkeypatch.setattr(agent._fork_server, "refill", lambda: None)  # the real server: tests/process
    answers = iter([None, None, (True, "")])
    monkeypatch.setattr(agent._fork_server, "readiness", lambda: next(answers))
    agent._execute(cmd.PrepareForkServers(count=1, env={}, cwd="/w"))  # answers None (still importing)
    agent._answer_warm_up()
    assert agent._stream.facts == []
    agent._answer_warm_up()  # ready
    agent._answer_warm_up()  # nothing more to say
    assert agent._stream.facts == [("warmed", (True, ""), {})]
    agent._execute(cmd.PrepareForkServers(count=1))  # keeping the last start's server warm: no answer asked
    agent._answer_warm_up()
    assert len(agent._stream.facts) == 1


def test_a_warm_up_whose_fork_server_never_gets_ready_is_answered_not_ready(agent, monkeypatch):
    monkeypatch.setattr(agent._fork_server, "refill", lambda: None)
    monkeypatch.setattr(agent._fork_server, "readiness", lambda: None)  # importing for ever
    agent._execute(cmd.PrepareForkServers(count=1, env={}, cwd="/w"))
    agent._answer_warm_up()
    assert agent._stream.facts == []
    agent._warm_up_asked -= agent_module.READY_WAIT_S  # as long as a start would wait for it has passed
    agent._answer_warm_up()
    [(fact, (ready, detail), _)] = agent._stream.facts
    assert fact == "warmed" and not ready and "not ready within 60 s" in detail


def test_a_start_cancels_the_warm_up_answer(agent, monkeypatch):
    monkeypatch.setattr(agent._fork_server, "refill", lambda: None)
    monkeypatch.setattr(agent._fork_server, "readiness", lambda: (True, ""))
    monkeypatch.setattr(agent_module, "start_worker", lambda env, cwd: (_ for _ in ()).throw(OSError(1, "no")))
    agent._execute(cmd.PrepareForkServers(count=1, env={}, cwd="/w"))
    agent._start_workers(cmd.StartWorkers(attempt=1, workers=(cmd.WorkerLaunch(0, 0),), cwd="/w", env={}))
    agent._answer_warm_up()
    assert [fact for fact, _, _ in agent._stream.facts] == ["exited"]  # the start's, no answer
