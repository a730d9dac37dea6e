"""The agent's relay of worker streams (minitrain.agent.transport.relay), in process: the local stream protocol
(minitrain.rpc.local_stream) over its Unix socket with the real LocalWorkerClient as the worker, hostile
connections speaking raw bytes, and the agent's coalescing request iterator. A worker killed as a process
is in tests/process/test_relay_processes.py."""

from __future__ import annotations

import contextlib
import os
import queue
import socket
import stat
import struct
import time
import threading

import pytest

from relay_support import Upward

from minitrain.agent.transport import relay as relay_module
from minitrain.agent.transport.relay import RelayServer, coalesced_requests
from minitrain.agent.transport.stream import CoordinatorStream
from minitrain.rpc import local_stream, socket_directory
from minitrain.rpc._gen import minitrain_pb2 as pb
from minitrain.rpc.channel import END_OF_STREAM
from minitrain.worker.transport.client import StreamClosed, WorkerClient
from minitrain.worker.transport.local_client import LocalWorkerClient

TOKEN = "the-run-token"
DEADLINE_S = 30.0


@pytest.fixture
def upward():
    return Upward(DEADLINE_S)


def _client(relay: RelayServer, rank: int, token: str = TOKEN) -> WorkerClient:
    return LocalWorkerClient(relay.address, token, "run-1", 0, rank)


def _command(number: int, world_size: int) -> pb.RelayedCommand:
    return pb.RelayedCommand(stream=number, command=pb.WorkerCommand(assignment=pb.Assignment(world_size=world_size)))


def _hello_from(client: WorkerClient, upward: Upward) -> int:
    """Send hello and return the stream number the relay gave the client's stream."""
    client.send_hello(1000 + client.rank, "")
    upward.wait_for(lambda items: any(i.message.rank == client.rank for i in items), f"rank {client.rank}'s hello")
    return upward.stream_of_rank(client.rank)


def test_two_concurrent_streams_arrive_in_their_order_with_distinct_numbers_and_close_once(relay, upward):
    clients = [_client(relay, rank) for rank in (0, 1)]
    count = 200
    senders = [threading.Thread(target=lambda c=c: [c.send_phase(i) for i in range(count)])
               for c in clients]
    for sender in senders:
        sender.start()
    for sender in senders:
        sender.join(DEADLINE_S)
    for client in clients:
        assert client.close(DEADLINE_S), "the relay did not end the stream after the worker's half-close"
    upward.wait_for(lambda items: sum(i.closed for i in items) == 2, "both streams' ends")
    numbers = {item.stream for item in upward.items}
    assert len(numbers) == 2 and min(numbers) >= 1
    for number in numbers:
        items = upward.of_stream(number)
        assert items[-1].closed and upward.closed(number) == 1
        messages = [item.message for item in items[:-1]]
        assert len({m.rank for m in messages}) == 1, "one stream carried two workers' messages"
        assert [m.phase.phase for m in messages] == list(range(count))


def test_commands_reach_their_own_stream_and_close_ends_it(relay, upward):
    first, second = _client(relay, 0), _client(relay, 1)
    first_number, second_number = _hello_from(first, upward), _hello_from(second, upward)
    assert first_number != second_number
    relay.deliver(pb.RelayedDown(items=[
        _command(second_number, 22), _command(first_number, 11),
        _command(999, 33),  # no such stream: dropped
    ]))
    assert first.wait_assignment(DEADLINE_S).worker.world_size == 11
    assert second.wait_assignment(DEADLINE_S).worker.world_size == 22
    # A close ends only that worker's response stream, after the commands routed before it.
    relay.deliver(pb.RelayedDown(items=[
        pb.RelayedCommand(stream=first_number, command=pb.WorkerCommand(rendezvous=pb.Rendezvous(master_port=7))),
        pb.RelayedCommand(stream=first_number, close=True)]))
    assert first.wait_rendezvous(DEADLINE_S).port == 7
    with pytest.raises(StreamClosed, match="closed the stream"):
        first.wait_phase_ack(1, DEADLINE_S)
    upward.wait_for(lambda items: any(i.closed and i.stream == first_number for i in items), "the closed item")
    # A command for the ended stream is dropped; the other stream still works.
    relay.deliver(pb.RelayedDown(items=[_command(first_number, 44),
                                        pb.RelayedCommand(stream=second_number, command=pb.WorkerCommand(
                                            rendezvous=pb.Rendezvous(master_port=8)))]))
    assert second.wait_rendezvous(DEADLINE_S).port == 8
    assert second.close(DEADLINE_S)
    upward.wait_for(lambda items: any(i.closed and i.stream == second_number for i in items), "the second end")
    assert upward.closed(first_number) == 1 and upward.closed(second_number) == 1


def test_a_broken_connection_sends_exactly_one_closed(relay, upward):
    client = _client(relay, 3)
    number = _hello_from(client, upward)
    client._socket.shutdown(socket.SHUT_RDWR)  # the connection goes away without the client's close()
    upward.wait_for(lambda items: any(i.closed for i in items), "the closed item")
    # The stream is gone: a close from the coordinator now is dropped and sends nothing more.
    relay.deliver(pb.RelayedDown(items=[pb.RelayedCommand(stream=number, close=True)]))
    later = _client(relay, 4)
    later_number = _hello_from(later, upward)  # the relay served this after the close was routed
    assert later_number > number, "stream numbers are never reused"
    assert upward.closed(number) == 1
    assert later.close(DEADLINE_S)


@contextlib.contextmanager
def _relay_timed(monkeypatch, upward, **timing):
    """A started relay with `local_stream`'s timing constants set as given (READ_INTERVAL_S=...); stopped
    at the end."""
    for name, value in timing.items():
        monkeypatch.setattr(local_stream, name, value)
    relay = RelayServer(TOKEN, upward.send_up).start()
    try:
        yield relay
    finally:
        relay.stop()


NEVER = 3600.0  # an interval or a linger that no test outlasts: the relay reads only when rung or asked


def _raw(relay: RelayServer) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(local_stream.socket_path(relay.address))
    return sock


def _refused(sock: socket.socket) -> bool:
    """True once the relay closed `sock` (it reads EOF, or a reset), within the deadline."""
    sock.settimeout(DEADLINE_S)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    finally:
        sock.close()


def _with_doorbell(sock: socket.socket, data: bytes) -> None:
    doorbell = os.eventfd(0)
    try:
        socket.send_fds(sock, [data], [doorbell])
    finally:
        os.close(doorbell)


@pytest.mark.parametrize("hello", ["wrong token", "no token", "no magic", "no doorbell", "oversized",
                                   "closed early"])
def test_a_connection_without_the_run_token_is_refused_before_any_message_is_relayed(relay, upward, hello):
    intruder = _raw(relay)
    message = local_stream.frame(pb.WorkerMessage(rank=5, hello=pb.WorkerHello(pid=5)).SerializeToString())
    if hello == "wrong token":
        _with_doorbell(intruder, local_stream.hello("not-" + TOKEN) + message)
    elif hello == "no token":
        _with_doorbell(intruder, local_stream.frame(local_stream.HELLO_MAGIC) + message)
    elif hello == "no magic":
        _with_doorbell(intruder, local_stream.frame(TOKEN.encode()) + message)
    elif hello == "no doorbell":
        intruder.sendall(local_stream.hello(TOKEN) + message)
    elif hello == "oversized":  # a length no hello has: refused before reading it
        _with_doorbell(intruder, struct.pack(">I", 1 << 30))
    else:
        intruder.shutdown(socket.SHUT_WR)
    assert _refused(intruder)
    # A rightful worker after it is relayed as stream 1: the refused connection never got a number.
    assert _hello_from(_client(relay, 6), upward) == 1
    assert [item.message.rank for item in upward.items] == [6]


def test_a_worker_with_a_wrong_token_sees_its_stream_end(relay, upward):
    intruder = _client(relay, 5, token="wrong-token")
    intruder.send_hello(5, "")
    with pytest.raises(StreamClosed):
        intruder.wait_assignment(DEADLINE_S)
    intruder.close(DEADLINE_S)
    assert upward.items == []


def test_a_connection_that_says_nothing_is_dropped_after_the_hello_timeout(monkeypatch, upward):
    with _relay_timed(monkeypatch, upward, HELLO_TIMEOUT_S=0.2) as relay:
        silent = _raw(relay)
        assert _refused(silent)
        assert _hello_from(_client(relay, 1), upward) == 1


def test_a_plain_report_waits_for_the_interval_and_an_awaited_message_rings_at_once(monkeypatch, upward):
    """The relay reads on its interval, on a doorbell, and on drain(): with an interval and a linger of an
    hour, a plain report goes up only when the relay is asked to drain (as the agent does before it
    reports an exit) or when a message someone waits for rings, and then in the worker's order."""
    with _relay_timed(monkeypatch, upward, READ_INTERVAL_S=NEVER, LINGER_S=NEVER) as relay:
        client = _client(relay, 2)
        number = _hello_from(client, upward)  # a hello rings
        client.put(client.report_message(0, '{"a": 0}', "", False))
        assert relay.drain(DEADLINE_S)
        assert [i.message.report.round for i in upward.of_stream(number) if i.message.HasField("report")] == [0]
        client.put(client.report_message(1, '{"a": 1}', "", False))
        client.send_phase(3)  # rings: the report before it goes up too, first
        upward.wait_for(lambda items: any(i.message.HasField("phase") and i.message.phase.phase == 3
                                          for i in items), "the phase change")
        kinds = [i.message.WhichOneof("body") for i in upward.of_stream(number)]
        assert kinds == ["hello", "report", "report", "phase"]
        assert client.close(DEADLINE_S)


def test_a_frame_written_in_parts_is_read_to_its_end_without_another_ring(monkeypatch, upward):
    with _relay_timed(monkeypatch, upward, READ_INTERVAL_S=NEVER, LINGER_S=NEVER) as relay:
        sock = _raw(relay)
        doorbell = os.eventfd(0)
        socket.send_fds(sock, [local_stream.hello(TOKEN)], [doorbell])
        data = local_stream.frame(pb.WorkerMessage(rank=7, hello=pb.WorkerHello(pid=7)).SerializeToString())
        sock.sendall(data[:3])
        os.eventfd_write(doorbell, local_stream.URGENT_RING)
        assert relay.drain(DEADLINE_S) and upward.items == []  # the first part is read, and held
        sock.sendall(data[3:])  # no ring: a frame it was rung for is watched while it is half read
        upward.wait_for(lambda items: any(i.message.rank == 7 for i in items), "the completed frame")
        sock.close()
        assert relay.drain(DEADLINE_S)  # an end is read on the interval or when asked, as the agent does
        upward.wait_for(lambda items: any(i.closed for i in items), "the end")
        os.close(doorbell)


def test_bytes_that_are_not_messages_end_the_stream_once(relay, upward):
    sock = _raw(relay)
    _with_doorbell(sock, local_stream.hello(TOKEN)
                   + local_stream.frame(pb.WorkerMessage(rank=8, hello=pb.WorkerHello(pid=8)).SerializeToString())
                   + local_stream.frame(b"\xff\xff\xff not protobuf"))
    relay.drain(DEADLINE_S)
    upward.wait_for(lambda items: any(i.closed for i in items), "the end")
    assert [(i.closed, i.message.rank) for i in upward.items] == [(False, 8), (True, 0)]
    assert _refused(sock)


def test_the_directory_is_private_and_stop_ends_streams_and_removes_it(upward):
    relay = RelayServer(TOKEN, upward.send_up).start()
    directory = relay.directory
    assert relay.address == f"local:{directory}/relay.sock"
    assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700
    assert stat.S_ISSOCK(os.stat(os.path.join(directory, "relay.sock")).st_mode)
    client = _client(relay, 0)
    number = _hello_from(client, upward)
    relay.stop()
    upward.wait_for(lambda items: any(i.closed and i.stream == number for i in items), "the end at stop")
    with pytest.raises(StreamClosed):
        client.wait_assignment(DEADLINE_S)
    assert not os.path.exists(directory) and relay.directory is None
    relay.deliver(pb.RelayedDown(items=[_command(number, 1)]))  # after stop: dropped, no error
    relay.stop()  # idempotent
    client.close(DEADLINE_S)
    assert upward.closed(number) == 1


def test_stop_leaves_what_it_did_not_create(upward):
    relay = RelayServer(TOKEN, upward.send_up).start()
    directory = relay.directory
    stranger = os.path.join(directory, "not-ours")
    open(stranger, "w").close()
    try:
        relay.stop()
        assert os.path.exists(stranger) and not os.path.exists(os.path.join(directory, "relay.sock"))
    finally:
        os.unlink(stranger)
        os.rmdir(directory)


def test_only_the_directories_of_dead_agents_are_swept(tmp_path):
    def relay_directory(name: str, files=("relay.sock",)) -> str:
        directory = tmp_path / f"minitrain-relay-{name}"
        directory.mkdir(mode=0o700)
        for file in files:
            (directory / file).touch()
        return str(directory)

    dead = relay_directory("dead", files=("relay.sock", "owner.lock"))  # nobody holds its lock
    dead_with_stranger = relay_directory("stranger", files=("relay.sock", "owner.lock", "not-ours"))
    being_made = relay_directory("new", files=())  # no lock file yet: not ours to judge
    alive = relay_directory("alive", files=("relay.sock",))
    held = socket_directory.hold_owner_lock(alive)  # as a live agent holds it
    other = tmp_path / "something-else"
    other.mkdir()
    (other / "owner.lock").touch()
    try:
        removed = socket_directory.remove_stale(str(tmp_path), relay_module.DIRECTORY_PREFIX,
                                                relay_module.SOCKET_NAME)
    finally:
        os.close(held)
    assert sorted(removed) == sorted([dead, dead_with_stranger])
    assert not os.path.exists(dead)
    assert os.listdir(dead_with_stranger) == ["not-ours"]
    assert os.path.isdir(being_made) and sorted(os.listdir(alive)) == ["owner.lock", "relay.sock"]
    assert os.path.exists(other / "owner.lock")


def test_a_live_relays_directory_survives_another_relays_start(upward):
    first = RelayServer(TOKEN, upward.send_up).start()
    second = RelayServer(TOKEN, upward.send_up).start()
    try:
        assert os.path.exists(os.path.join(first.directory, "relay.sock"))
        assert sorted(os.listdir(first.directory)) == ["owner.lock", "relay.sock"]
        assert _hello_from(_client(first, 0), upward) == 1
    finally:
        second.stop()
        first.stop()


# ---------------------------------------------------------------------------------- coalescing


def _relayed(stream: int, phase: int) -> pb.RelayedMessage:
    return pb.RelayedMessage(stream=stream, message=pb.WorkerMessage(phase=pb.PhaseChange(phase=phase)))


def _batch(items: list, queued_at: float) -> tuple:
    return ("batch", [(item.stream, item.message.phase.phase) for item in items])


def _queued(item: pb.RelayedMessage, at: float = 0.0) -> tuple:
    """A relayed item as the agent's stream queues it (see coalesced_requests)."""
    return (at, [item])


def _bundle(messages: list) -> tuple:
    return ("bundle", messages)


def test_what_is_queued_together_goes_as_one_message_in_order():
    """Runs of relayed items become one batch each; with the agent's own messages between them they go
    as one bundle (an AgentBatch), in the order they were queued."""
    outbox: "queue.SimpleQueue" = queue.SimpleQueue()
    for phase in range(3):
        outbox.put(_queued(_relayed(1 + phase % 2, phase)))
    own = pb.AgentMessage(heartbeat=pb.Heartbeat(sent_at=1.0))
    outbox.put(own)
    outbox.put(_queued(_relayed(2, 3)))
    outbox.put(_queued(_relayed(1, 4)))
    outbox.put(END_OF_STREAM)
    sent = list(coalesced_requests(outbox, _batch, _bundle))
    assert sent == [("bundle", [("batch", [(1, 0), (2, 1), (1, 2)]), own, ("batch", [(2, 3), (1, 4)])])]


def test_a_single_message_goes_as_it_is_and_own_messages_alone_are_bundled():
    outbox: "queue.SimpleQueue" = queue.SimpleQueue()
    spawned = [pb.AgentMessage(spawned=pb.WorkerSpawned(rank=r)) for r in range(3)]
    outbox.put(spawned[0])
    outbox.put(END_OF_STREAM)
    assert list(coalesced_requests(outbox, _batch, _bundle)) == [spawned[0]]  # not wrapped
    for message in spawned:
        outbox.put(message)
    outbox.put(END_OF_STREAM)
    assert list(coalesced_requests(outbox, _batch, _bundle)) == [("bundle", spawned)]


def test_the_agent_s_bundle_is_an_agent_batch_stamped_with_its_first_message_s_time():
    stream = CoordinatorStream("127.0.0.1:1", "node-a", "run-1", TOKEN)
    outbox = stream._outbox
    outbox.put(pb.AgentMessage(sent_at=5.0, spawned=pb.WorkerSpawned(rank=0)))
    outbox.put(_queued(_relayed(1, 0), at=6.0))
    outbox.put(pb.AgentMessage(sent_at=7.0, exited=pb.WorkerExited(rank=0)))
    outbox.put(END_OF_STREAM)
    [sent] = list(coalesced_requests(outbox, stream._relayed_batch, stream._bundle))
    assert (sent.run_id, sent.node_id, sent.sent_at, sent.WhichOneof("body")) == ("run-1", "node-a", 5.0, "batch")
    inner = sent.batch.messages
    assert [m.WhichOneof("body") for m in inner] == ["spawned", "relayed", "exited"]
    assert [m.sent_at for m in inner] == [5.0, 6.0, 7.0]  # each keeps its own stamp (the lease reads it)


def test_a_batch_is_stamped_with_the_time_its_first_item_was_queued():
    """The batch's stamp is when its oldest item was queued: the time it waited in the agent's queue
    counts in the coordinator's allowance for a late message, as a heartbeat queued there would."""
    outbox: "queue.SimpleQueue" = queue.SimpleQueue()
    outbox.put(_queued(_relayed(1, 0), at=10.0))
    outbox.put(_queued(_relayed(1, 1), at=11.0))
    outbox.put(pb.AgentMessage(sent_at=12.0))
    outbox.put(_queued(_relayed(1, 2), at=13.0))
    outbox.put(END_OF_STREAM)
    [(_, stamps)] = coalesced_requests(outbox, lambda items, queued_at: queued_at, _bundle)
    assert [s if isinstance(s, float) else s.sent_at for s in stamps] == [10.0, 12.0, 13.0]


def test_an_idle_queue_sends_an_item_at_once_and_items_queued_meanwhile_go_together():
    outbox: "queue.SimpleQueue" = queue.SimpleQueue()
    requests = coalesced_requests(outbox, _batch, _bundle)
    outbox.put(_queued(_relayed(1, 0)))
    assert next(requests) == ("batch", [(1, 0)])  # nothing else queued: no wait for more
    # The consumer (gRPC's sending thread) is busy meanwhile: what piles up goes as one message.
    for phase in range(1, 5):
        outbox.put(_queued(_relayed(1, phase)))
    assert next(requests) == ("batch", [(1, 1), (1, 2), (1, 3), (1, 4)])
    outbox.put(END_OF_STREAM)
    assert list(requests) == []


def test_a_batch_is_capped_by_items_and_by_bytes(monkeypatch):
    monkeypatch.setattr(relay_module, "MAX_BATCH_ITEMS", 2)
    outbox: "queue.SimpleQueue" = queue.SimpleQueue()
    for phase in range(5):
        outbox.put(_queued(_relayed(1, phase)))
    outbox.put(END_OF_STREAM)
    assert [len(b[1]) for b in coalesced_requests(outbox, _batch, _bundle)] == [2, 2, 1]
    own = pb.AgentMessage(spawned=pb.WorkerSpawned(rank=7))
    for _ in range(3):  # an own message counts as one item: one past the cap goes in the next message
        outbox.put(own)
    outbox.put(END_OF_STREAM)
    assert list(coalesced_requests(outbox, _batch, _bundle)) == [("bundle", [own, own]), own]

    monkeypatch.setattr(relay_module, "MAX_BATCH_ITEMS", 10_000)
    big = pb.RelayedMessage(stream=1, message=pb.WorkerMessage(
        failure=pb.WorkerFailure(message="x" * 1000)))
    monkeypatch.setattr(relay_module, "MAX_BATCH_BYTES", 2 * big.ByteSize() + 1)
    for _ in range(5):
        outbox.put(_queued(big))
    outbox.put(END_OF_STREAM)
    assert [len(b[1]) for b in coalesced_requests(outbox, _batch, _bundle)] == [2, 2, 1]


# ---------------------------------------------------------------------------------- the agent's wiring


def test_the_agent_s_stream_relays_its_workers_messages_and_delivers_relayed_commands():
    stream = CoordinatorStream("127.0.0.1:1", "node-a", "run-1", TOKEN)
    stream._relay.start()
    try:
        client = LocalWorkerClient(stream.relay_address, TOKEN, "run-1", 0, 0)
        client.send_hello(1, "")
        queued_at, [item] = stream._outbox.get(timeout=DEADLINE_S)
        assert isinstance(item, pb.RelayedMessage) and item.message.hello.pid == 1
        assert abs(queued_at - time.time()) < DEADLINE_S
        stream._outbox.put((queued_at, [item]))
        stream._outbox.put(END_OF_STREAM)
        [sent] = list(coalesced_requests(stream._outbox, stream._relayed_batch, stream._bundle))
        assert (sent.run_id, sent.node_id, sent.WhichOneof("body")) == ("run-1", "node-a", "relayed")
        assert list(sent.relayed.items) == [item]
        assert sent.sent_at == queued_at  # stamped when queued, not when sent (the lease's allowance)

        class _Call:  # the coordinator's commands as the AgentStream call yields them
            def __iter__(self):
                yield pb.AgentCommand(relayed=pb.RelayedDown(items=[_command(item.stream, 9)]))
                yield pb.AgentCommand(shutdown=pb.Shutdown(reason="done"))

        stream._call = _Call()
        stream._receive()
        assert client.wait_assignment(DEADLINE_S).worker.world_size == 9
        assert stream.next_command(0.0) is None and stream._commands.empty()  # only the wake-up: not a command
        assert client.close(DEADLINE_S)
    finally:
        stream._relay.stop()


def test_a_quiet_relay_stops_reading_on_the_interval_and_a_report_after_quiet_rings(monkeypatch, upward):
    """No wake-ups for a quiet host: once a read found nothing for QUIET_AFTER_S the relay reads only when
    rung; a worker's plain report after RING_AFTER_S without a write rings (plainly: read a linger
    later), so it is never left unread."""
    with _relay_timed(monkeypatch, upward, READ_INTERVAL_S=0.01, RING_AFTER_S=0.1, QUIET_AFTER_S=0.2,
                      LINGER_S=0.05) as relay:
        client = _client(relay, 2)
        number = _hello_from(client, upward)
        deadline = time.monotonic() + DEADLINE_S
        while relay._last_read - relay._last_data < local_stream.QUIET_AFTER_S:  # it goes quiet by itself
            assert time.monotonic() < deadline, "the relay never went quiet"
            time.sleep(0.01)
        reads = relay._last_read
        client.put(client.report_message(0, '{"a": 0}', "", False))  # the first write after quiet: rings
        upward.wait_for(lambda items: any(i.message.HasField("report") for i in items), "the report")
        assert relay._last_read > reads
        assert [i.message.WhichOneof("body") for i in upward.of_stream(number)] == ["hello", "report"]
        assert client.close(DEADLINE_S)


def test_a_flood_of_silent_connections_does_not_hold_up_a_worker_and_is_dropped(monkeypatch, upward):
    flood = []
    with _relay_timed(monkeypatch, upward, HELLO_TIMEOUT_S=1.0) as relay:
        try:
            flood = [_raw(relay) for _ in range(200)]
            client = _client(relay, 1)
            assert _hello_from(client, upward) == 1  # served while 200 connections say nothing
            for sock in flood:
                assert _refused(sock)  # each dropped at its deadline
            assert relay._hellos == {} and list(relay._streams) == [1]
            assert client.close(DEADLINE_S)
        finally:
            for sock in flood:
                sock.close()


def test_close_twice_and_sends_after_close_are_harmless(relay, upward):
    """A worker's SIGTERM flush closes its stream after the normal close already did (found by the e2e
    suite run relayed): the second close, and a message queued after it, raise nothing."""
    client = _client(relay, 4)
    _hello_from(client, upward)
    assert client.close(DEADLINE_S)
    assert client.close(0.1)  # already closed: still True, nothing raised
    client.send_phase(5)  # dropped: the stream ended
    client.put(client.report_message(0, "{}", "", False))
    assert not any(i.message.HasField("phase") for i in upward.items)


# The workers' lease on their agent, on a short clock: a heartbeat every HEARTBEAT_S, a lease of LEASE_S
# (ten heartbeats: a test process stalled for a second on a loaded 2-core machine keeps it). With the real
# ones, and a frozen agent process, in tests/process/test_worker_lease.py.
HEARTBEAT_S = 0.15
LEASE_S = 1.5


class _Lost:
    """A worker's `on_agent_lost`, in process: records each call (a worker process's own ends it)."""

    def __init__(self) -> None:
        self.reasons: list[str] = []
        self.called = threading.Event()

    def __call__(self, reason: str) -> None:
        self.reasons.append(reason)
        self.called.set()


def _leased(relay: RelayServer, rank: int, lost: _Lost) -> LocalWorkerClient:
    return LocalWorkerClient(relay.address, TOKEN, "run-1", 0, rank, on_agent_lost=lost, lease_timeout_s=LEASE_S)


def test_a_quiet_worker_keeps_its_lease_on_a_live_agent_by_its_heartbeats(upward):
    """Nothing flows down to a worker between its hello and its assignment (the coordinator may take
    long): the relay's heartbeats alone keep its lease for many lease lengths."""
    relay = RelayServer(TOKEN, upward.send_up, heartbeat_interval_s=HEARTBEAT_S).start()
    try:
        lost = _Lost()
        client = _leased(relay, 1, lost)
        _hello_from(client, upward)
        assert not lost.called.wait(2 * LEASE_S), f"a live agent's worker lost its lease: {lost.reasons}"
        assert client.close(DEADLINE_S)
        assert lost.reasons == []
    finally:
        relay.stop()


def test_commands_flowing_keep_the_lease_without_heartbeats_and_silence_ends_it_once(upward):
    """A busy agent sends commands and no heartbeat (its interval is longer than the test): every command
    renews the lease. Once nothing comes (the agent is connected but silent, as a frozen one is), the
    lease runs out within its length: `on_agent_lost` is called once, and the stream ends with the cause."""
    relay = RelayServer(TOKEN, upward.send_up, heartbeat_interval_s=NEVER).start()
    try:
        lost = _Lost()
        client = _leased(relay, 1, lost)
        number = _hello_from(client, upward)
        busy_until = time.monotonic() + 2 * LEASE_S
        round_ = 0
        while time.monotonic() < busy_until:
            relay.deliver(pb.RelayedDown(items=[pb.RelayedCommand(
                stream=number, command=pb.WorkerCommand(report_receipt=pb.ReportReceipt(round=round_)))]))
            assert not lost.called.wait(LEASE_S / 5), f"a busy agent's worker lost its lease: {lost.reasons}"
            round_ += 1
        client.wait_recorded(round_ - 1, DEADLINE_S)  # every command reached the worker
        silent_from = time.monotonic()
        assert lost.called.wait(DEADLINE_S), "a silent agent's worker kept its lease"
        assert time.monotonic() - silent_from < LEASE_S + 2.0
        [reason] = lost.reasons
        assert "nothing from this worker's node agent" in reason and f"its lease is {LEASE_S:g} s" in reason
        with pytest.raises(StreamClosed, match="node agent"):
            client.wait_assignment(DEADLINE_S)
        client.close(0.1)
        assert lost.reasons == [reason], "on_agent_lost is called once"
    finally:
        relay.stop()


def test_a_worker_whose_relay_ends_sees_the_end_not_a_lost_agent(upward):
    """An agent that is gone closes the socket: the stream ends at once, as closed, and the lease (which
    is for an agent that is there but silent) never fires."""
    relay = RelayServer(TOKEN, upward.send_up, heartbeat_interval_s=HEARTBEAT_S).start()
    lost = _Lost()
    client = _leased(relay, 1, lost)
    _hello_from(client, upward)
    relay.stop()
    with pytest.raises(StreamClosed, match="closed the stream"):
        client.wait_assignment(DEADLINE_S)
    client._reader.join(DEADLINE_S)
    assert not client._reader.is_alive() and lost.reasons == []
    client.close(0.1)


@pytest.mark.parametrize("value", [0, -1.0, float("nan")])
def test_a_heartbeat_interval_or_a_lease_that_is_not_positive_is_refused(value):
    with pytest.raises(ValueError, match=r"heartbeat_interval_s=.* above 0"):
        RelayServer(TOKEN, lambda items: None, heartbeat_interval_s=value)
    with pytest.raises(ValueError, match=r"lease_timeout_s=.* above 0"):
        LocalWorkerClient("local:/nowhere", TOKEN, "run-1", 0, 0, lease_timeout_s=value)


def test_a_message_larger_than_the_socket_buffers_arrives_while_the_relay_would_not_read(monkeypatch, upward):
    """A plain report rings nothing, and with an interval and a linger of an hour the relay would not read
    on its own: a report too large for the socket's buffers rings when its send cannot finish, and the
    half-read frame keeps the relay reading until its end (without that, the worker waited forever)."""
    with _relay_timed(monkeypatch, upward, READ_INTERVAL_S=NEVER, LINGER_S=NEVER) as relay:
        client = _client(relay, 2)
        number = _hello_from(client, upward)
        big = '{"blob": "' + "x" * (8 << 20) + '"}'
        sender = threading.Thread(target=lambda: client.put(client.report_message(0, big, "", False)))
        sender.start()
        sender.join(DEADLINE_S)
        assert not sender.is_alive(), "the worker's send never finished"
        assert relay.drain(DEADLINE_S)
        [report] = [i.message.report for i in upward.of_stream(number) if i.message.HasField("report")]
        assert report.metrics_json == big
        assert client.close(DEADLINE_S)


def test_a_frame_half_read_without_a_ring_is_not_watched_and_ends_on_the_next_interval(monkeypatch, upward):
    """A read that meets a tight loop mid-send leaves a frame half read; the relay does not watch that
    socket (every later send would wake it) but reads the rest on its next interval."""
    with _relay_timed(monkeypatch, upward, READ_INTERVAL_S=0.05, QUIET_AFTER_S=NEVER, LINGER_S=NEVER) as relay:
        sock = _raw(relay)
        doorbell = os.eventfd(0)
        hello = local_stream.frame(pb.WorkerMessage(rank=9, hello=pb.WorkerHello(pid=9)).SerializeToString())
        socket.send_fds(sock, [local_stream.hello(TOKEN) + hello], [doorbell])
        upward.wait_for(lambda items: any(i.message.rank == 9 for i in items), "the hello")
        report = local_stream.frame(pb.WorkerMessage(rank=9, report=pb.Report(round=0)).SerializeToString())
        sock.sendall(report[:3])
        assert relay.drain(DEADLINE_S)
        [stream] = relay._streams.values()
        assert stream.frames.pending and stream.events == 0  # half read, not watched
        sock.sendall(report[3:])  # no ring, no drain: the interval reads it
        upward.wait_for(lambda items: any(i.message.HasField("report") for i in items), "the report")
        sock.close()
        os.close(doorbell)
