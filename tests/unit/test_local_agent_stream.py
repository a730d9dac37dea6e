"""The agent's stream on the coordinator's local socket (minitrain.coordinator.transport.local_agents,
minitrain.agent.transport.local_call), in process over a real Unix socket, served by the real coordinator server
and service: the same events and commands as over gRPC, the token checked before anything is parsed,
hostile connections refused, every way the stream ends, and the private directory it lives in."""

from __future__ import annotations

import os
import queue
import socket
import stat
import time

import pytest
from google.protobuf.internal.encoder import _VarintBytes
from hypothesis import given
from hypothesis import strategies as st

from minitrain import commands as cmd
from minitrain.agent.transport.local_call import LocalAgentCall, LocalStreamBroken
from minitrain.agent.transport.stream import CoordinatorStream
from minitrain.coordinator.facts import events as ev
from minitrain.coordinator.transport import local_agents
from minitrain.coordinator.transport.server import CoordinatorServer
from minitrain.coordinator.transport.service import CoordinatorService, Hub
from minitrain.records import NodeInfo
from minitrain.rpc import local_stream, socket_directory
from minitrain.rpc._gen import minitrain_pb2 as pb

TOKEN = "t" * 43
RUN_ID = "run-1"
DEADLINE_S = 10.0
NODE = NodeInfo(node_id="localhost", hostname="h", address="127.0.0.1", ifname="lo", agent_pid=7, cpus=2,
                memory_bytes=1 << 30, gpu_ids=(), python="/usr/bin/python3", minitrain_version="0")


class _Logs:
    def __init__(self):
        self.lines = []

    def write(self, attempt, rank, node, stderr, lines):
        self.lines.append((attempt, rank, node, stderr, list(lines)))

    def open(self, attempt, rank):
        pass


@pytest.fixture
def coordinator():
    events: queue.SimpleQueue = queue.SimpleQueue()
    hub = Hub()
    logs = _Logs()
    service = CoordinatorService(RUN_ID, events, hub, logs, lease_timeout_s=60.0, node_ids=("localhost",))
    server = CoordinatorServer(service, hub, TOKEN, local_agents=True).start()
    try:
        yield server, events, hub, logs
    finally:
        server.stop()


def _next_event(events: queue.SimpleQueue, kind):
    deadline = time.monotonic() + DEADLINE_S
    while True:
        event = events.get(timeout=max(deadline - time.monotonic(), 0.01))
        if isinstance(event, kind):
            return event


def _wait(condition, what: str):
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def _agent(server: CoordinatorServer, token: str = TOKEN, run_id: str = RUN_ID) -> CoordinatorStream:
    return CoordinatorStream(server.address, "localhost", run_id, token, local_address=server.local_agent_address)


def _raw(server: CoordinatorServer) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(DEADLINE_S)
    sock.connect(local_stream.socket_path(server.local_agent_address))
    return sock


def _closed_by_peer(sock: socket.socket) -> bool:
    """True once the coordinator closed the connection (EOF or a reset), reading whatever came first."""
    try:
        while sock.recv(65536):
            pass
    except ConnectionResetError:
        pass
    return True


def test_an_agent_on_the_local_socket_is_served_as_over_grpc(coordinator):
    """Hello -> AgentConnected with the node; the agent's facts -> events and log lines; commands ->
    records on the agent's side; Shutdown ends the agent's stream with its reason; the close is seen
    as the agent's loss by the coordinator."""
    server, events, hub, logs = coordinator
    assert server.local_agent_address.startswith("local:")
    agent = _agent(server)
    agent.open(NODE)
    try:
        connected = _next_event(events, ev.AgentConnected)
        assert connected.node.node_id == "localhost" and connected.node.agent_pid == 7
        assert connected.node.address == "127.0.0.1"  # the hello's, as over gRPC
        agent.spawned(0, 1, 4242)
        agent.log_line(0, 1, True, "boom")
        spawned = _next_event(events, ev.WorkerSpawned)
        assert (spawned.node_id, spawned.attempt, spawned.rank, spawned.pid) == ("localhost", 0, 1, 4242)
        _wait(lambda: logs.lines, "the log line")
        assert logs.lines == [(0, 1, "h", True, ["boom"])]
        assert hub.to_agent("localhost", cmd.DumpStacks(attempt=3))
        assert agent.next_command(DEADLINE_S) == cmd.DumpStacks(attempt=3)
        assert hub.to_agent("localhost", cmd.Shutdown(reason="finished"))
        _wait(lambda: agent.ended, "the agent's stream to end")
        assert agent.shutdown == cmd.Shutdown(reason="finished")
        assert agent.end_reason == "the coordinator shut the run down (finished)"
    finally:
        agent.close()
    lost = _next_event(events, ev.AgentLost)
    assert lost.node_id == "localhost"


def test_what_the_agent_queued_before_close_goes_up_before_its_end(coordinator):
    """More than the socket holds (8 MiB of log lines) is queued, then the agent closes at once: all of it
    reaches the coordinator, in order, before the agent's end."""
    server, events, _, logs = coordinator
    agent = _agent(server)
    agent.open(NODE)
    _next_event(events, ev.AgentConnected)
    for line in range(4000):
        agent.log_line(1, 0, False, f"{line:06d}" + "x" * 2048)
    agent.spawned(1, 0, 1000)
    agent.close()
    assert _next_event(events, (ev.WorkerSpawned, ev.AgentLost)).pid == 1000
    assert [int(entry[4][0][:6]) for entry in logs.lines] == list(range(4000))
    assert isinstance(_next_event(events, ev.AgentLost), ev.AgentLost)


def test_the_coordinator_stopping_ends_the_agent_s_stream(coordinator):
    server, events, _, _ = coordinator
    agent = _agent(server)
    agent.open(NODE)
    try:
        _next_event(events, ev.AgentConnected)
        server.stop()
        _wait(lambda: agent.ended, "the agent's stream to end")
        assert agent.shutdown is None and agent.end_reason == "the coordinator closed the stream"
        assert _next_event(events, ev.AgentLost).node_id == "localhost"
    finally:
        agent.close()


def test_a_wrong_token_is_refused_before_anything_is_parsed(coordinator):
    server, events, _, _ = coordinator
    agent = _agent(server, token="x" * 43)
    agent.open(NODE)
    try:
        _wait(lambda: agent.ended, "the refused stream to end")
        assert (agent.end_reason == "the coordinator closed the stream"
                or agent.end_reason.startswith("the local stream broke"))
    finally:
        agent.close()
    assert events.empty()  # no hello was read: no event at all


@pytest.mark.parametrize("first_bytes", [
    b"",  # nothing: the hello's deadline passes
    local_stream.frame(local_stream.HELLO_MAGIC + TOKEN.encode()),  # a worker's hello on the agents' socket
    (local_stream.MAX_HELLO_BYTES + 1).to_bytes(4, "big"),  # a hello too long to buffer
    b"\x00\x00\x00\x10GET / HTTP/1.1\r\n",  # not minitrain at all
], ids=["silent", "worker-hello", "oversized", "http"])
def test_a_hostile_connection_is_closed_without_an_event(coordinator, monkeypatch, first_bytes):
    monkeypatch.setattr(local_stream, "HELLO_TIMEOUT_S", 0.2)
    server, events, _, _ = coordinator
    with _raw(server) as sock:
        sock.sendall(first_bytes)
        assert _closed_by_peer(sock)
    assert events.empty()


def test_connections_still_open_at_stop_are_closed_quietly(coordinator, caplog, capfd):
    """A connection with no hello yet, one halfway through its hello and a served agent stream, all open
    when the coordinator stops: each is closed without a traceback (asyncio once logged one per
    connection whose task ended cancelled), and one debug line says how many there were."""
    caplog.set_level("DEBUG")
    server, events, _, _ = coordinator
    with _raw(server) as silent, _raw(server) as partial, _raw(server) as agent:
        partial.sendall(local_stream.hello(TOKEN, local_stream.AGENT_HELLO_MAGIC)[:6])
        agent.sendall(local_stream.hello(TOKEN, local_stream.AGENT_HELLO_MAGIC))
        hello = pb.AgentMessage(run_id=RUN_ID, node_id="localhost", sent_at=time.time(),
                                hello=pb.AgentHello(hostname="h", pid=9))
        agent.sendall(local_stream.frame(hello.SerializeToString()))
        _next_event(events, ev.AgentConnected)
        # The listener serves all three (its own count: nothing outside says a hello is half read).
        _wait(lambda: len(server._local._connections) == 3, "three connections being served")
        server.stop()
        assert all(_closed_by_peer(sock) for sock in (silent, partial, agent))
    assert [r for r in caplog.records if r.exc_info or r.levelno >= 40] == []
    assert not [r for r in caplog.records if r.name == "minitrain.coordinator" and r.levelno >= 30]
    assert [r.getMessage() for r in caplog.records if "still open at stop" in r.getMessage()] == [
        "closed 3 local agent connection(s) still open at stop"]
    assert "Traceback" not in capfd.readouterr().err


def test_bytes_that_are_not_messages_end_the_stream_as_broken(coordinator):
    server, events, _, _ = coordinator
    with _raw(server) as sock:
        sock.sendall(local_stream.hello(TOKEN, local_stream.AGENT_HELLO_MAGIC))
        hello = pb.AgentMessage(run_id=RUN_ID, node_id="localhost", sent_at=time.time(),
                                hello=pb.AgentHello(hostname="h", pid=9))
        sock.sendall(local_stream.frame(hello.SerializeToString()))
        assert _next_event(events, ev.AgentConnected).node.agent_pid == 9
        sock.sendall(local_stream.frame(b"\xff\xff\xff\xff"))  # not an AgentMessage
        assert _closed_by_peer(sock)
    lost = _next_event(events, ev.AgentLost)
    assert lost.reason == "its connection broke (DecodeError)"


def test_another_run_s_agent_is_refused_with_its_reason(coordinator, caplog):
    server, events, _, _ = coordinator
    agent = _agent(server, run_id="run-2")
    agent.open(NODE)
    try:
        _wait(lambda: agent.ended, "the refused stream to end")
    finally:
        agent.close()
    assert events.empty()
    assert any("serves run 'run-1', not 'run-2'" in record.getMessage() for record in caplog.records)


def test_the_socket_lives_in_a_private_directory_removed_at_stop(coordinator):
    server, _, _, _ = coordinator
    path = local_stream.socket_path(server.local_agent_address)
    directory = os.path.dirname(path)
    assert os.path.basename(directory).startswith(local_agents.DIRECTORY_PREFIX)
    assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700
    assert sorted(os.listdir(directory)) == ["agents.sock", socket_directory.LOCK_NAME]
    server.stop()
    assert not os.path.exists(directory)


def test_a_dead_coordinator_s_directory_is_swept_and_a_live_one_kept(tmp_path):
    """What a SIGKILLed driver leaves (its lock free) goes at the next start; a live one's (lock held) stays."""
    def directory(name: str, files=()) -> str:
        path = tmp_path / f"{local_agents.DIRECTORY_PREFIX}{name}"
        path.mkdir(mode=0o700)
        for file in files:
            (path / file).touch()
        return str(path)

    dead = directory("dead", files=("agents.sock", socket_directory.LOCK_NAME))
    alive = directory("alive", files=("agents.sock",))
    held = socket_directory.hold_owner_lock(alive)
    stranger = directory("stranger", files=("agents.sock", socket_directory.LOCK_NAME, "not-ours"))
    try:
        removed = socket_directory.remove_stale(str(tmp_path), local_agents.DIRECTORY_PREFIX,
                                                local_agents.SOCKET_NAME)
    finally:
        os.close(held)
    assert sorted(removed) == sorted([dead, stranger]) and not os.path.exists(dead)
    assert sorted(os.listdir(alive)) == ["agents.sock", socket_directory.LOCK_NAME]
    assert os.listdir(stranger) == ["not-ours"]  # only our files go: the stranger's, and so the directory, stay


def test_an_agent_that_cannot_reach_the_socket_raises_and_leaves_nothing_open(tmp_path):
    with pytest.raises(LocalStreamBroken, match="could not open the coordinator's local stream"):
        LocalAgentCall(local_stream.address(str(tmp_path / "nothing.sock")), TOKEN, iter(()))
    stream = CoordinatorStream("127.0.0.1:1", "localhost", RUN_ID, TOKEN,
                               local_address=local_stream.address(str(tmp_path / "nothing.sock")))
    with pytest.raises(LocalStreamBroken):
        stream.open(NODE)
    assert stream._relay.directory is None  # the relay it started is stopped again


def test_server_without_local_agents_offers_none():
    server = CoordinatorServer(CoordinatorService(RUN_ID, queue.SimpleQueue(), Hub(), _Logs(), 60.0), Hub(), TOKEN)
    with server:
        assert server.local_agent_address == ""


def test_an_agent_that_stops_reading_is_still_found_by_its_lease(monkeypatch):
    """A frozen agent (SIGSTOP: it neither reads nor writes) that was sent more commands than its socket holds:
    the coordinator's writes never wait on it, so the lease's close still ends its stream and reports it lost."""
    events: queue.SimpleQueue = queue.SimpleQueue()
    hub = Hub()
    service = CoordinatorService(RUN_ID, events, hub, _Logs(), lease_timeout_s=0.5)
    with CoordinatorServer(service, hub, TOKEN, local_agents=True) as server, _raw(server) as sock:
        sock.sendall(local_stream.hello(TOKEN, local_stream.AGENT_HELLO_MAGIC))
        hello = pb.AgentMessage(run_id=RUN_ID, node_id="localhost", sent_at=time.time(),
                                hello=pb.AgentHello(hostname="h", pid=9))
        sock.sendall(local_stream.frame(hello.SerializeToString()))
        _next_event(events, ev.AgentConnected)
        for _ in range(20):  # about 4 MiB of commands, none read
            assert hub.to_agent("localhost", cmd.StartWorkers(attempt=0, workers=(), cwd="/" + "w" * 200_000,
                                                              env={}, relay=True))
        lost = _next_event(events, ev.AgentLost)
        assert lost.node_id == "localhost" and lost.reason.startswith("it sent nothing for ")


def test_a_socket_that_cannot_be_made_leaves_the_agent_on_grpc(tmp_path, monkeypatch, caplog):
    """A temporary directory whose path is too long for a Unix socket (or a full disk): the coordinator
    still serves, over gRPC alone, says why, and leaves nothing behind."""
    deep = tmp_path / ("d" * 100)
    deep.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(deep))
    events: queue.SimpleQueue = queue.SimpleQueue()
    hub = Hub()
    service = CoordinatorService(RUN_ID, events, hub, _Logs(), lease_timeout_s=60.0)
    with CoordinatorServer(service, hub, TOKEN, local_agents=True) as server:
        assert server.local_agent_address == "" and server.port
        assert any("no local socket for this machine's agent" in r.getMessage() and "set TMPDIR" in r.getMessage()
                   for r in caplog.records)
    assert os.listdir(deep) == []


@given(value=st.integers(min_value=0, max_value=2**64 - 1))
def test_varint_is_protobuf_s_own_encoding(value):
    """The table for values below 128 and the loop above it give exactly protobuf's bytes (a report's
    field is spliced into its message by these bytes, unparsed)."""
    assert local_stream.varint(value) == _VarintBytes(value)


def test_a_spliced_field_parses_as_the_field():
    report = pb.Report(round=7, metrics_json='{"loss": 0.5}' * 20)  # longer than 127 bytes: a 2-byte length
    header = pb.WorkerMessage(run_id=RUN_ID, attempt=1, rank=2).SerializeToString()
    field = pb.WorkerMessage.DESCRIPTOR.fields_by_name["report"].number
    spliced = pb.WorkerMessage.FromString(header + local_stream.message_field(field, report.SerializeToString()))
    assert spliced == pb.WorkerMessage(run_id=RUN_ID, attempt=1, rank=2, report=report)
