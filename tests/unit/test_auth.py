"""minitrain.rpc.auth against REAL gRPC servers on 127.0.0.1:0 (sync and asyncio), no mocks.

Each server serves a `CoordinatorServicer` subclass that records every call that reaches it. The
house rule under test: the token is checked before a handler is chosen, so a refused call never
reaches a handler and its request bytes are never parsed (garbage bytes are answered with
UNAUTHENTICATED, not with the INTERNAL a deserialisation failure would give).
"""

from __future__ import annotations

import asyncio
import base64
import queue
import threading
import time
from concurrent import futures

import grpc
import pytest
from grpc import aio

from minitrain.coordinator.facts import events as ev
from minitrain.coordinator.transport.server import CoordinatorServer
from minitrain.coordinator.transport.service import CoordinatorService, Hub
from minitrain.rpc import auth
from minitrain.rpc._gen import minitrain_pb2 as pb
from minitrain.rpc._gen import minitrain_pb2_grpc as pb_grpc

RPC_TIMEOUT_S = 10.0  # a deadline on every call, so a bug shows up as a failure, not a hang
WORKER_METHOD = "/minitrain.v1.Coordinator/WorkerStream"
AGENT_METHOD = "/minitrain.v1.Coordinator/AgentStream"
GARBAGE = b"\xff\xff\xff\xff"  # not a valid protobuf message: parsing it fails


def _worker_hello(run_id: str = "run-1") -> pb.WorkerMessage:
    return pb.WorkerMessage(run_id=run_id, attempt=0, rank=0, hello=pb.WorkerHello(pid=1, hostname="h"))


def _echo(message: pb.WorkerMessage) -> pb.WorkerCommand:
    return pb.WorkerCommand(abort=pb.Abort(reason=f"echo {message.run_id}"))


# ---------------------------------------------------------------------------------- sync server


class SyncRecordingServicer(pb_grpc.CoordinatorServicer):
    """Records each call that reaches a handler, and each request it parsed."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.requests: list = []
        self._lock = threading.Lock()

    def _record(self, name: str) -> None:
        with self._lock:
            self.calls.append(name)

    def WorkerStream(self, request_iterator, context):
        self._record("WorkerStream")
        for message in request_iterator:
            self.requests.append(message)
            yield _echo(message)

    def AgentStream(self, request_iterator, context):
        self._record("AgentStream")
        for message in request_iterator:
            self.requests.append(message)
            yield pb.AgentCommand(heartbeat=pb.Heartbeat(sent_at=1.0))


@pytest.fixture
def sync_server():
    token = auth.new_token()
    servicer = SyncRecordingServicer()
    refused: list[str] = []
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4),
                         interceptors=[auth.TokenAuthInterceptor(token, on_refused=refused.append)])
    pb_grpc.add_CoordinatorServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    assert port > 0
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield token, servicer, refused, channel
    finally:
        channel.close()
        # A grace (not None) makes stop() return at once; the wait is bounded either way.
        assert server.stop(grace=0.5).wait(timeout=RPC_TIMEOUT_S), "sync server did not stop"


def _sync_worker_call(channel, metadata, messages=None):
    stub = pb_grpc.CoordinatorStub(channel)
    messages = [_worker_hello()] if messages is None else messages
    return list(stub.WorkerStream(iter(messages), metadata=metadata, timeout=RPC_TIMEOUT_S))


def _sync_raw_call(channel, metadata, payload: bytes):
    # Identity serializers: the bytes go on the wire exactly as given.
    raw = channel.stream_stream(WORKER_METHOD, request_serializer=None, response_deserializer=None)
    return list(raw(iter([payload]), metadata=metadata, timeout=RPC_TIMEOUT_S))


WRONG_METADATA = [
    pytest.param(None, id="no-metadata"),
    pytest.param((("x-other", "value"),), id="other-metadata-only"),
    pytest.param(auth.call_metadata("wrong-token"), id="wrong-token"),
    pytest.param(auth.call_metadata(""), id="empty-token"),
]


@pytest.mark.parametrize("metadata", WRONG_METADATA)
def test_sync_refuses_missing_or_wrong_token(sync_server, metadata):
    token, servicer, refused, channel = sync_server
    with pytest.raises(grpc.RpcError) as info:
        _sync_worker_call(channel, metadata)
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert servicer.calls == []
    assert servicer.requests == []
    assert refused == [WORKER_METHOD]


def test_sync_refuses_near_miss_tokens(sync_server):
    token, servicer, refused, channel = sync_server
    for near in (token[:-1], token + "x", token.upper() if token.upper() != token else token + "A",
                 " " + token):
        with pytest.raises(grpc.RpcError) as info:
            _sync_worker_call(channel, auth.call_metadata(near))
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED, near
    assert servicer.calls == []


def test_sync_refused_request_bytes_are_never_parsed(sync_server):
    token, servicer, refused, channel = sync_server
    with pytest.raises(grpc.RpcError) as info:
        _sync_raw_call(channel, auth.call_metadata("wrong-token"), GARBAGE)
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert servicer.calls == []


def test_sync_right_token_reaches_handler(sync_server):
    token, servicer, refused, channel = sync_server
    responses = _sync_worker_call(channel, auth.call_metadata(token), [_worker_hello("run-7")])
    assert [r.abort.reason for r in responses] == ["echo run-7"]
    assert servicer.calls == ["WorkerStream"]
    assert [m.run_id for m in servicer.requests] == ["run-7"]
    assert refused == []


def test_sync_token_checked_on_every_method(sync_server):
    token, servicer, refused, channel = sync_server
    stub = pb_grpc.CoordinatorStub(channel)
    message = pb.AgentMessage(run_id="r", node_id="n", heartbeat=pb.Heartbeat(sent_at=1.0))
    with pytest.raises(grpc.RpcError) as info:
        list(stub.AgentStream(iter([message]), metadata=auth.call_metadata("nope"), timeout=RPC_TIMEOUT_S))
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert servicer.calls == []
    responses = list(stub.AgentStream(iter([message]), metadata=auth.call_metadata(token),
                                       timeout=RPC_TIMEOUT_S))
    assert len(responses) == 1 and responses[0].WhichOneof("body") == "heartbeat"
    assert servicer.calls == ["AgentStream"]
    assert refused == [AGENT_METHOD]


# ---------------------------------------------------------------------------------- asyncio server


class AioRecordingServicer(pb_grpc.CoordinatorServicer):
    """The asyncio twin of SyncRecordingServicer."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.requests: list = []

    async def WorkerStream(self, request_iterator, context):
        self.calls.append("WorkerStream")
        async for message in request_iterator:
            self.requests.append(message)
            yield _echo(message)

    async def AgentStream(self, request_iterator, context):
        self.calls.append("AgentStream")
        async for message in request_iterator:
            self.requests.append(message)
            yield pb.AgentCommand(heartbeat=pb.Heartbeat(sent_at=1.0))


async def _with_aio_server(scenario):
    """Start an aio server with the interceptor, run `scenario(token, servicer, refused, channel)`.

    The channel is a synchronous one, as minitrain's agents and workers use, and the scenario runs in
    a thread beside the server's event loop. (grpc.aio's client misreports a server's early status as
    INTERNAL "Internal error from Core" when its request writer loses the race with the trailers,
    grpc/grpc#36066; the sync client reports the server's status.)
    """
    token = auth.new_token()
    servicer = AioRecordingServicer()
    refused: list[str] = []
    server = aio.server(interceptors=[auth.AioTokenAuthInterceptor(token, on_refused=refused.append)])
    pb_grpc.add_CoordinatorServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    assert port > 0
    await server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            await asyncio.to_thread(scenario, token, servicer, refused, channel)
    finally:
        await server.stop(grace=None)


def _aio_status(call_factory) -> grpc.StatusCode:
    """Run a failing call against the aio server; return its status and what the server recorded."""

    def run(token, servicer, refused, channel):
        with pytest.raises(grpc.RpcError) as info:
            call_factory(token, channel)
        result.append((info.value.code(), list(servicer.calls), list(servicer.requests), list(refused)))

    result: list = []
    asyncio.run(_with_aio_server(run))
    return result[0]


@pytest.mark.parametrize("metadata", WRONG_METADATA)
def test_aio_refuses_missing_or_wrong_token(metadata):
    def call(token, channel):
        stub = pb_grpc.CoordinatorStub(channel)
        list(stub.WorkerStream(iter([_worker_hello()]), metadata=metadata, timeout=RPC_TIMEOUT_S))

    code, calls, requests, refused = _aio_status(call)
    assert code == grpc.StatusCode.UNAUTHENTICATED
    assert calls == [] and requests == []
    assert refused == [WORKER_METHOD]


def test_aio_refused_request_bytes_are_never_parsed():
    def call(token, channel):
        raw = channel.stream_stream(WORKER_METHOD, request_serializer=None, response_deserializer=None)
        list(raw(iter([GARBAGE]), metadata=auth.call_metadata("wrong"), timeout=RPC_TIMEOUT_S))

    code, calls, requests, refused = _aio_status(call)
    assert code == grpc.StatusCode.UNAUTHENTICATED
    assert calls == [] and requests == []


def test_aio_garbage_with_right_token_is_a_parse_error():
    def call(token, channel):
        raw = channel.stream_stream(WORKER_METHOD, request_serializer=None, response_deserializer=None)
        list(raw(iter([GARBAGE]), metadata=auth.call_metadata(token), timeout=RPC_TIMEOUT_S))

    code, calls, requests, refused = _aio_status(call)
    assert code not in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.OK)
    assert requests == [] and refused == []


def test_aio_right_token_reaches_handler():
    seen: list = []

    def scenario(token, servicer, refused, channel):
        stub = pb_grpc.CoordinatorStub(channel)
        responses = list(stub.WorkerStream(iter([_worker_hello("run-9")]),
                                           metadata=auth.call_metadata(token), timeout=RPC_TIMEOUT_S))
        seen.append(([r.abort.reason for r in responses], list(servicer.calls), list(refused)))

    asyncio.run(_with_aio_server(scenario))
    assert seen == [(["echo run-9"], ["WorkerStream"], [])]


# ---------------------------------------------------------------------------------- tokens


def test_new_token_has_at_least_256_bits_and_is_fresh():
    tokens = [auth.new_token() for _ in range(50)]
    assert len(set(tokens)) == len(tokens)
    for token in tokens:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        assert len(raw) >= 32
        token.encode("ascii")  # travels as gRPC metadata: must be ASCII


def test_call_metadata_uses_the_token_key():
    assert auth.call_metadata("t") == ((auth.TOKEN_METADATA_KEY, "t"),)


# ---------------------------------------------------------------------------------- CoordinatorServer


class RecordingLogSink:
    """A log sink that keeps what it was given."""

    def __init__(self) -> None:
        self.lines: list = []

    def write(self, attempt: int, rank: int, node: str, stderr: bool, lines: list[str]) -> None:
        self.lines.append((attempt, rank, node, stderr, list(lines)))


@pytest.fixture
def coordinator_server():
    token = auth.new_token()
    events: queue.SimpleQueue = queue.SimpleQueue()
    hub = Hub()
    sink = RecordingLogSink()
    service = CoordinatorService("run-x", events, hub, sink, lease_timeout_s=60.0)
    server = CoordinatorServer(service, hub, token)
    server.start()
    channel = grpc.insecure_channel(server.address)
    try:
        yield token, events, sink, server, channel
    finally:
        channel.close()
        server.stop()
        assert server._thread is not None and not server._thread.is_alive(), "server thread left running"


def _agent_messages() -> list[pb.AgentMessage]:
    hello = pb.AgentHello(hostname="host-a", pid=42, cpus=2, memory_bytes=1 << 30)
    logs = pb.LogLines(attempt=0, rank=0, stderr=False, lines=["hello"])
    return [pb.AgentMessage(run_id="run-x", node_id="node-a", sent_at=time.time(), hello=hello),
            pb.AgentMessage(run_id="run-x", node_id="node-a", sent_at=time.time(), logs=logs)]


def test_coordinator_server_binds_loopback(coordinator_server):
    token, events, sink, server, channel = coordinator_server
    assert server.address.startswith("127.0.0.1:") and server.port and server.port > 0


@pytest.mark.parametrize("metadata", WRONG_METADATA)
def test_coordinator_server_refuses_wrong_token(coordinator_server, metadata):
    token, events, sink, server, channel = coordinator_server
    stub = pb_grpc.CoordinatorStub(channel)
    with pytest.raises(grpc.RpcError) as info:
        list(stub.AgentStream(iter(_agent_messages()), metadata=metadata, timeout=RPC_TIMEOUT_S))
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    raw = channel.stream_stream(WORKER_METHOD, request_serializer=None, response_deserializer=None)
    with pytest.raises(grpc.RpcError) as info:
        list(raw(iter([GARBAGE]), metadata=metadata, timeout=RPC_TIMEOUT_S))
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert events.empty()
    assert sink.lines == []


def test_coordinator_server_right_token_reaches_service(coordinator_server):
    token, events, sink, server, channel = coordinator_server
    stub = pb_grpc.CoordinatorStub(channel)
    outgoing: queue.SimpleQueue = queue.SimpleQueue()
    done = object()

    def requests():
        for message in _agent_messages():
            yield message
        # Keep the stream open until the test has seen the effects, then close it.
        outgoing.get(timeout=RPC_TIMEOUT_S)

    call = stub.AgentStream(requests(), metadata=auth.call_metadata(token), timeout=RPC_TIMEOUT_S)
    try:
        connected = events.get(timeout=RPC_TIMEOUT_S)
        assert isinstance(connected, ev.AgentConnected)
        assert connected.node.node_id == "node-a" and connected.node.hostname == "host-a"
        assert connected.node.address == "127.0.0.1"
    finally:
        outgoing.put(done)
    lost = events.get(timeout=RPC_TIMEOUT_S)
    assert isinstance(lost, ev.AgentLost) and lost.node_id == "node-a"
    for _ in call:  # the server ends the response stream once the agent's stream ends
        pass
    assert sink.lines == [(0, 0, "host-a", False, ["hello"])]
