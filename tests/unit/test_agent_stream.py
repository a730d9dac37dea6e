"""The node agent's stream with the coordinator (minitrain.agent.transport.stream), in process: the lease in both
directions, the commands it turns into records, how and why it ends, and the messages the agent's facts
become. Its relay wiring is in test_agent_relay.py; the agent over a real stream in tests/process and
tests/e2e."""

from __future__ import annotations

import queue
import threading
import time

import grpc
import pytest

from minitrain import commands as cmd
from minitrain.agent.transport import stream as stream_module
from minitrain.agent.transport.stream import CoordinatorStream
from minitrain.records import NodeInfo
from minitrain.rpc._gen import minitrain_pb2 as pb
from minitrain.rpc.channel import END_OF_STREAM

DEADLINE_S = 10.0


@pytest.fixture
def stream(monkeypatch):
    monkeypatch.setattr(stream_module, "HEARTBEAT_INTERVAL_S", 0.01)
    return CoordinatorStream("127.0.0.1:1", "node-a", "run-1", "token", lease_timeout_s=0.5)


def _drain(outbox: "queue.SimpleQueue") -> list:
    messages = []
    while True:
        try:
            messages.append(outbox.get_nowait())
        except queue.Empty:
            return messages


def _kinds(messages) -> list[str]:
    return [m.WhichOneof("body") for m in messages]


class _Commands:
    """A stand-in for the AgentStream call: yields the scripted commands, then raises `error` if any."""

    def __init__(self, commands, error=None):
        self._commands, self._error = commands, error
        self.cancelled = False

    def __iter__(self):
        yield from self._commands
        if self._error is not None:
            raise self._error

    def cancel(self):
        self.cancelled = True


class _Broken(grpc.RpcError):
    def code(self):
        return grpc.StatusCode.UNAVAILABLE


def test_heartbeats_flow_while_the_coordinator_is_heard_and_the_lease_ends_after_its_silence(stream):
    stream._lease.heard()
    beating = threading.Thread(target=stream._heartbeat, daemon=True)
    beating.start()
    # It beats while heard (every message carries the run and node), then the 0.5 s lease runs out.
    assert stream._ended.wait(DEADLINE_S), "the lease never ended"
    beating.join(DEADLINE_S)
    sent = _drain(stream._outbox)
    assert sent and set(_kinds(sent)) == {"heartbeat"}
    assert {(m.run_id, m.node_id) for m in sent} == {("run-1", "node-a")}
    assert stream.ended and stream.end_reason.startswith("the coordinator sent nothing for ")
    assert stream.shutdown is None


def test_no_heartbeat_goes_while_other_messages_do_and_every_message_is_stamped(monkeypatch):
    """Heartbeats were half of what thousands of agents sent the coordinator at one report a second:
    an agent that queued anything within HEARTBEAT_INTERVAL_S sends none (any message renews its lease
    at the coordinator, and carries the stamp the lease's allowance is measured from). Once it is
    quiet, heartbeats come again."""
    monkeypatch.setattr(stream_module, "HEARTBEAT_INTERVAL_S", 0.2)
    stream = CoordinatorStream("127.0.0.1:1", "node-a", "run-1", "token", lease_timeout_s=30.0)
    beating = threading.Thread(target=stream._heartbeat, daemon=True)
    beating.start()
    try:
        busy_until = time.monotonic() + 1.0  # five intervals, a message every twentieth of one
        while time.monotonic() < busy_until:
            stream.log_line(0, 0, False, "x")
            stream._queue_relayed([pb.RelayedMessage(stream=1, closed=True)])
            time.sleep(0.01)
        busy = _drain(stream._outbox)
        deadline = time.monotonic() + DEADLINE_S
        quiet: list = []
        while not quiet and time.monotonic() < deadline:  # quiet now: a heartbeat comes
            quiet = _drain(stream._outbox)
            time.sleep(0.01)
    finally:
        stream.end("test over")
        beating.join(DEADLINE_S)
    own = [m for m in busy if not isinstance(m, tuple)]
    assert own and set(_kinds(own)) == {"logs"}  # no heartbeat among them
    assert all(abs(m.sent_at - time.time()) < DEADLINE_S for m in own)
    assert all(isinstance(t[0], float) for t in busy if isinstance(t, tuple))
    assert _kinds(quiet) == ["heartbeat"] and abs(quiet[0].sent_at - time.time()) < DEADLINE_S


def test_commands_become_records_heartbeats_renew_the_lease_and_shutdown_ends_the_stream(stream):
    stream._call = _Commands([
        pb.AgentCommand(heartbeat=pb.Heartbeat()),
        pb.AgentCommand(start=pb.StartWorkers(attempt=0, workers=[pb.WorkerLaunch(rank=1, local_rank=0)],
                                              cwd="/w", env={"A": "1"}, relay=True)),
        pb.AgentCommand(dump_stacks=pb.DumpStacks(attempt=0)),
        pb.AgentCommand(),  # empty: not a command, nothing queued
        pb.AgentCommand(shutdown=pb.Shutdown(reason="done")),
        pb.AgentCommand(stop=pb.StopWorkers(attempt=0))])  # after Shutdown: never read
    stream._lease.last_heard = 0.0
    stream._receive()
    assert stream._lease.last_heard > 0.0
    assert stream.ended and stream.shutdown == cmd.Shutdown(reason="done")
    assert stream.end_reason == "the coordinator shut the run down (done)"
    assert stream.next_command(0.0) == cmd.StartWorkers(
        attempt=0, workers=(cmd.WorkerLaunch(rank=1, local_rank=0),), cwd="/w", env={"A": "1"}, relay=True)
    assert stream.next_command(0.0) == cmd.DumpStacks(attempt=0)
    # Then the wake-up its end queued (the command loop looks at once, not at its next poll), then nothing.
    assert stream._commands.qsize() == 1 and stream.next_command(0.0) is None
    assert stream._commands.empty() and stream.next_command(0.0) is None


@pytest.mark.parametrize("call, reason", [
    (_Commands([], error=_Broken()), "the connection broke: UNAVAILABLE"),
    (_Commands([]), "the coordinator closed the stream"),
])
def test_a_stream_that_ends_without_shutdown_ends_with_its_reason(stream, call, reason):
    stream._call = call
    stream._receive()
    assert stream.ended and stream.shutdown is None and stream.end_reason == reason


def test_the_first_end_keeps_its_reason_and_wakes_a_waiting_command_loop(stream):
    woken = []
    waiting = threading.Thread(target=lambda: woken.append(stream.next_command(DEADLINE_S)))
    started = time.monotonic()
    waiting.start()
    stream.end("received SIGTERM")
    waiting.join(DEADLINE_S)
    assert woken == [None] and time.monotonic() - started < DEADLINE_S / 2
    # The call, cancelled as the agent closes, breaks its reader afterwards: the first reason stays.
    stream._call = _Commands([], error=_Broken())
    stream._receive()
    assert stream.end_reason == "received SIGTERM"


def test_a_late_heartbeat_extends_the_lease_by_its_delay(stream):
    """A coordinator heartbeat read 2 s after it was stamped (its stream backlogged behind commands):
    the 0.5 s lease then allows 2.5 s of silence, so a busy coordinator is not taken for a dead one;
    an unstamped heartbeat changes nothing."""
    stream._call = _Commands([pb.AgentCommand(heartbeat=pb.Heartbeat(sent_at=time.time() - 2.0)),
                              pb.AgentCommand(heartbeat=pb.Heartbeat())])
    stream._receive()
    assert 1.9 < stream._lease.backlog_s < 3.0
    stream._lease.last_heard -= 1.0  # 1 s of silence: past the 0.5 s lease, within lease + delay
    assert not stream._lease.expired()
    stream._lease.last_heard -= 2.0
    assert stream._lease.expired()


def test_the_agent_s_facts_go_up_as_messages_in_the_order_they_were_reported(stream):
    stream.spawned(2, 1, 4242)
    stream.log_line(2, 1, True, "Traceback (most recent call last):")
    stream.stack_dump(2, 1, "Thread 0x1 (most recent call first):")
    stream.exited(2, 1, 4242, exit_code=None, signal=9, stopped_by_agent=False, exited_at=123.0,
                  oom_suspected=True)
    stream.exited(2, 0, 0, exit_code=None, signal=None, stopped_by_agent=False, exited_at=124.0,
                  spawn_error="OSError: [Errno 12] Cannot allocate memory")
    sent = _drain(stream._outbox)
    assert _kinds(sent) == ["spawned", "logs", "stack_dump", "exited", "exited"]
    assert {(m.run_id, m.node_id) for m in sent} == {("run-1", "node-a")}
    spawned, logs, dump, killed, unborn = sent
    assert (spawned.spawned.attempt, spawned.spawned.rank, spawned.spawned.pid) == (2, 1, 4242)
    assert (logs.logs.attempt, logs.logs.rank, logs.logs.stderr, list(logs.logs.lines)) == (
        2, 1, True, ["Traceback (most recent call last):"])
    assert (dump.stack_dump.rank, dump.stack_dump.text) == (1, "Thread 0x1 (most recent call first):")
    killed = killed.exited
    assert (killed.pid, killed.exit_code, killed.signal, killed.exited_at, killed.oom_suspected) == (
        4242, 0, 9, 123.0, True)
    assert unborn.exited.spawn_error.startswith("OSError") and unborn.exited.signal == 0


def test_open_says_hello_first_and_close_ends_the_call_after_what_is_queued(stream, monkeypatch):
    """open() with the channel and stub faked: the hello (the agent's NodeInfo) leads the request
    stream, the relay listens, and close() stops the relay, ends the requests and the call."""
    seen = {}

    class Channel:
        def close(self):
            seen["channel_closed"] = True

    class Stub:
        def __init__(self, channel):
            pass

        def AgentStream(self, requests, metadata, wait_for_ready):
            seen["requests"], seen["metadata"] = requests, dict(metadata)
            seen["call"] = _Commands([])  # the coordinator closes at once: the stream ends
            return seen["call"]

    monkeypatch.setattr(stream_module, "client_channel", lambda address, cert: Channel())
    monkeypatch.setattr(stream_module.pb_grpc, "CoordinatorStub", Stub)
    node = NodeInfo(node_id="node-a", hostname="h", address="10.0.0.2", ifname="eth0", agent_pid=7, cpus=4,
                    memory_bytes=1 << 30, gpu_ids=(0,), python="/usr/bin/python3", minitrain_version="0")
    stream.open(node)
    try:
        assert stream.relay_address.startswith("local:")
        hello = next(seen["requests"])
        assert hello.WhichOneof("body") == "hello" and (hello.run_id, hello.node_id) == ("run-1", "node-a")
        assert (hello.hello.hostname, hello.hello.pid, hello.hello.address, list(hello.hello.gpu_ids)) == (
            "h", 7, "10.0.0.2", [0])
        assert seen["metadata"] == {"x-minitrain-token": "token"}  # the run token on the call
        assert stream._ended.wait(DEADLINE_S) and stream.end_reason == "the coordinator closed the stream"
    finally:
        stream.close()
    assert seen["call"].cancelled and seen["channel_closed"] and stream._relay.directory is None
    rest = list(seen["requests"])  # END_OF_STREAM ends the requests; heartbeats may come before it
    assert set(_kinds(rest)) <= {"heartbeat"} and END_OF_STREAM not in rest
