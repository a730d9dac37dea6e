"""The coordinator's side of worker streams relayed by a node agent (`RelayedUp` / `RelayedDown`).

A real CoordinatorServer on loopback; the test plays the agent with a real gRPC client stream and
reads the events the service puts for the controller. A relayed stream must behave exactly as a
direct WorkerStream: its hello registers it, its messages become events in order, commands for it
come back down the agent's stream, its end (said by the agent, or the agent's stream ending) is one
WorkerStreamClosed, and that comes before the agent is reported lost.
"""

from __future__ import annotations

import json
import queue
import threading
import time
from typing import Optional

import grpc
import pytest

from minitrain.commands import ReportAck
from minitrain.coordinator.facts import events as ev
from minitrain.coordinator.transport import server as server_module
from minitrain.coordinator.transport.server import CoordinatorServer
from minitrain.coordinator.transport.service import CoordinatorService, Hub
from minitrain.rpc import auth
from minitrain.rpc._gen import minitrain_pb2 as pb
from minitrain.rpc._gen import minitrain_pb2_grpc as pb_grpc
from minitrain.rpc.channel import END_OF_STREAM, client_channel

RUN_ID, TOKEN, NODE = "run-relay", "t" * 43, "node-a"
DEADLINE_S = 20.0


def queued_requests(outbox: "queue.SimpleQueue"):
    """A client stream's request iterator: what is put into `outbox`, one message each, until END_OF_STREAM."""
    while True:
        item = outbox.get()
        if item is END_OF_STREAM:
            return
        yield item


class _NullLogs:
    def write(self, *args) -> None:
        pass

    def open(self, *args) -> None:
        pass


class FakeAgent:
    """An agent's stream to the coordinator, driven by the test."""

    def __init__(self, address: str, node: str = NODE, hello_delay_s: float = 0.0) -> None:
        self.node = node
        self.channel = client_channel(address)
        self.outbox: queue.SimpleQueue = queue.SimpleQueue()
        self.commands: queue.SimpleQueue = queue.SimpleQueue()
        self.send(hello=pb.AgentHello(hostname="host-a", pid=1), sent_at=time.time() - hello_delay_s)
        self.call = pb_grpc.CoordinatorStub(self.channel).AgentStream(
            queued_requests(self.outbox), metadata=auth.call_metadata(TOKEN), wait_for_ready=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        try:
            for command in self.call:
                self.commands.put(command)
        except grpc.RpcError:
            pass

    def send(self, sent_at: Optional[float] = None, **body) -> None:
        """Queue one message, stamped `sent_at` (None: now), as an agent stamps each of its messages."""
        stamp = time.time() if sent_at is None else sent_at
        self.outbox.put(pb.AgentMessage(run_id=RUN_ID, node_id=self.node, sent_at=stamp, **body))

    def relay(self, *items: pb.RelayedMessage) -> None:
        self.send(relayed=pb.RelayedUp(items=list(items)))

    def relayed_commands(self, count: int) -> list[pb.RelayedCommand]:
        """The next `count` relayed command items (heartbeats skipped)."""
        found: list[pb.RelayedCommand] = []
        deadline = time.monotonic() + DEADLINE_S
        while len(found) < count:
            command = self.commands.get(timeout=max(deadline - time.monotonic(), 0.01))
            if command.WhichOneof("body") == "relayed":
                found.extend(command.relayed.items)
        return found

    def close(self) -> None:
        self.outbox.put(END_OF_STREAM)
        self.call.cancel()
        self.channel.close()


def worker_message(stream: int, rank: int, run_id: str = RUN_ID, **body) -> pb.RelayedMessage:
    return pb.RelayedMessage(stream=stream, message=pb.WorkerMessage(run_id=run_id, attempt=1, rank=rank, **body))


def report(stream: int, rank: int, round_: int) -> pb.RelayedMessage:
    return worker_message(stream, rank, report=pb.Report(round=round_, metrics_json=json.dumps({"r": round_})))


@pytest.fixture
def coordinator():
    yield from _serve(lease_timeout_s=60.0)


@pytest.fixture
def short_lease_coordinator():
    yield from _serve(lease_timeout_s=1.0)


def _serve(lease_timeout_s: float):
    events: queue.SimpleQueue = queue.SimpleQueue()
    hub = Hub()
    service = CoordinatorService(RUN_ID, events, hub, _NullLogs(), lease_timeout_s=lease_timeout_s)
    server = CoordinatorServer(service, hub, TOKEN).start()
    agents: list[FakeAgent] = []

    def agent(node: str = NODE, hello_delay_s: float = 0.0) -> FakeAgent:
        agents.append(FakeAgent(server.address, node, hello_delay_s))
        return agents[-1]

    try:
        yield events, hub, agent
    finally:
        for a in agents:
            a.close()
        server.stop()


def next_events(events: queue.SimpleQueue, count: int, kinds: tuple = (), ignore: tuple = (ev.AgentConnected,)):
    """The next `count` events, skipping `ignore`d kinds."""
    found = []
    deadline = time.monotonic() + DEADLINE_S
    while len(found) < count:
        event = events.get(timeout=max(deadline - time.monotonic(), 0.01))
        if not isinstance(event, ignore):
            found.append(event)
    return found


def test_relayed_messages_become_events_in_each_streams_order(coordinator):
    events, hub, agent = coordinator
    a = agent()
    a.relay(worker_message(1, 0, hello=pb.WorkerHello(pid=10, hostname="h")),
            worker_message(2, 1, hello=pb.WorkerHello(pid=11, hostname="h")),
            report(1, 0, 0), report(2, 1, 0), report(1, 0, 1))
    a.relay(report(2, 1, 1), worker_message(1, 0, done=pb.WorkerDone(reports=2)))
    got = next_events(events, 5)
    # A batch's consecutive reports (of any of its streams) are one event, in the order relayed.
    assert [type(e).__name__ for e in got] == ["WorkerConnected", "WorkerConnected", "ReportsReceived",
                                               "ReportsReceived", "WorkerDone"]
    assert (got[0].rank, got[0].pid) == (0, 10) and (got[1].rank, got[1].pid) == (1, 11)
    assert [len(e.reports) for e in got[2:4]] == [3, 1]
    rounds = [(r.rank, r.round, r.metrics) for e in got[2:4] for r in e.reports]
    assert rounds == [(0, 0, {"r": 0}), (1, 0, {"r": 0}), (0, 1, {"r": 1}), (1, 1, {"r": 1})]
    assert got[4].reports == 2


def test_a_batchs_reports_keep_their_place_around_other_messages(coordinator):
    """Reports batched into one event never overtake, nor fall behind, the other messages of the batch:
    a telemetry sample, a phase change or a stream's end between them splits the batch."""
    events, hub, agent = coordinator
    a = agent()
    a.relay(worker_message(1, 0, hello=pb.WorkerHello(pid=10, hostname="h")),
            worker_message(2, 1, hello=pb.WorkerHello(pid=11, hostname="h")))
    next_events(events, 2)
    a.relay(report(1, 0, 0), report(2, 1, 0), worker_message(1, 0, telemetry=pb.Telemetry(reports=1)),
            report(1, 0, 1), worker_message(2, 1, phase=pb.PhaseChange(phase=pb.PHASE_FINISHING)),
            report(2, 1, 1), pb.RelayedMessage(stream=2, closed=True), report(1, 0, 2))
    got = next_events(events, 7)
    assert [type(e).__name__ for e in got] == ["ReportsReceived", "TelemetryReceived", "ReportsReceived",
                                               "WorkerPhaseChanged", "ReportsReceived", "WorkerStreamClosed",
                                               "ReportsReceived"]
    assert [[(r.rank, r.round) for r in e.reports] for e in got if isinstance(e, ev.ReportsReceived)] == [
        [(0, 0), (1, 0)], [(0, 1)], [(1, 1)], [(0, 2)]]
    assert (got[5].attempt, got[5].rank) == (1, 1)


def test_commands_for_a_relayed_worker_come_down_its_agents_stream(coordinator):
    events, hub, agent = coordinator
    a = agent()
    a.relay(worker_message(7, 3, hello=pb.WorkerHello(pid=1, hostname="h")))
    next_events(events, 1)
    for round_ in range(3):
        assert hub.to_worker(1, 3, ReportAck(round_))
    items = a.relayed_commands(3)
    assert [(i.stream, i.command.report_ack.round, i.close) for i in items] == [(7, 0, False), (7, 1, False),
                                                                                (7, 2, False)]
    hub.close_worker(1, 3)
    (closing,) = a.relayed_commands(1)
    assert closing.stream == 7 and closing.close and not closing.HasField("command")


def test_a_closed_relayed_stream_is_one_stream_closed_and_takes_no_more_commands(coordinator):
    events, hub, agent = coordinator
    a = agent()
    a.relay(worker_message(1, 0, hello=pb.WorkerHello(pid=1, hostname="h")), pb.RelayedMessage(stream=1, closed=True),
            report(1, 0, 5))  # a late item of an ended stream is dropped
    connected, closed = next_events(events, 2)
    assert isinstance(connected, ev.WorkerConnected) and isinstance(closed, ev.WorkerStreamClosed)
    assert (closed.attempt, closed.rank) == (1, 0)
    assert not hub.to_worker(1, 0, ReportAck(0))
    a.relay(worker_message(2, 1, hello=pb.WorkerHello(pid=2, hostname="h")))
    (later,) = next_events(events, 1)
    assert isinstance(later, ev.WorkerConnected) and later.rank == 1  # nothing from the dropped report


def test_a_message_of_another_run_ends_that_relayed_stream_only(coordinator):
    events, hub, agent = coordinator
    a = agent()
    a.relay(worker_message(1, 0, hello=pb.WorkerHello(pid=1, hostname="h")),
            worker_message(2, 1, hello=pb.WorkerHello(pid=2, hostname="h")),
            worker_message(1, 0, run_id="another-run", report=pb.Report(round=0, metrics_json="{}")),
            report(2, 1, 0))
    got = next_events(events, 4)
    assert [type(e).__name__ for e in got] == ["WorkerConnected", "WorkerConnected", "WorkerStreamClosed",
                                               "ReportsReceived"]
    assert got[2].rank == 0 and [r.rank for r in got[3].reports] == [1]
    (closing,) = a.relayed_commands(1)
    assert closing.stream == 1 and closing.close


def test_the_agents_stream_ending_closes_its_relayed_streams_before_the_node_is_lost(coordinator):
    events, hub, agent = coordinator
    a = agent()
    a.relay(worker_message(1, 0, hello=pb.WorkerHello(pid=1, hostname="h")),
            worker_message(2, 1, hello=pb.WorkerHello(pid=2, hostname="h")))
    next_events(events, 2)
    a.close()
    got = next_events(events, 3)
    assert [type(e).__name__ for e in got] == ["WorkerStreamClosed", "WorkerStreamClosed", "AgentLost"]
    assert sorted(e.rank for e in got[:2]) == [0, 1] and got[2].node_id == NODE
    assert not hub.to_worker(1, 0, ReportAck(0))


def _own(**body) -> pb.AgentMessage:
    return pb.AgentMessage(run_id=RUN_ID, node_id=NODE, sent_at=time.time(), **body)


def test_an_agent_batch_becomes_the_events_of_its_messages_one_by_one_in_order(coordinator):
    """An AgentBatch (what an agent queued together: minitrain.agent.transport.relay.coalesce) is read as if each
    of its messages had come alone: the same events, in the same order, as sending them one by one."""
    events, hub, agent = coordinator
    a = agent("node-a")
    b = agent("node-b")
    sequence = lambda node: [  # noqa: E731
        pb.AgentMessage(run_id=RUN_ID, node_id=node, sent_at=time.time(), spawned=pb.WorkerSpawned(attempt=1, rank=0, pid=5)),
        pb.AgentMessage(run_id=RUN_ID, node_id=node, sent_at=time.time(), relayed=pb.RelayedUp(items=[
            worker_message(1, 0, hello=pb.WorkerHello(pid=5, hostname="h")), report(1, 0, 0)])),
        pb.AgentMessage(run_id=RUN_ID, node_id=node, sent_at=time.time(), relayed=pb.RelayedUp(items=[
            pb.RelayedMessage(stream=1, closed=True)])),
        pb.AgentMessage(run_id=RUN_ID, node_id=node, sent_at=time.time(), exited=pb.WorkerExited(
            attempt=1, rank=0, pid=5, exit_code=0))]
    a.outbox.put(pb.AgentMessage(run_id=RUN_ID, node_id="node-a", sent_at=time.time(),
                                 batch=pb.AgentBatch(messages=sequence("node-a"))))
    batched = next_events(events, 5)
    for message in sequence("node-b"):
        b.outbox.put(message)
    alone = next_events(events, 5)
    describe = lambda got: [(type(e).__name__, getattr(e, "rank", None)) for e in got]  # noqa: E731
    assert describe(batched) == describe(alone) == [
        ("WorkerSpawned", 0), ("WorkerConnected", 0), ("ReportsReceived", None), ("WorkerStreamClosed", 0),
        ("WorkerExited", 0)]
    assert batched[2].reports == alone[2].reports


def test_a_batch_in_a_batch_is_not_read_and_a_batched_message_of_another_run_ends_the_stream(coordinator):
    events, hub, agent = coordinator
    a = agent()
    nested = _own(batch=pb.AgentBatch(messages=[_own(spawned=pb.WorkerSpawned(attempt=1, rank=7, pid=7))]))
    a.outbox.put(_own(batch=pb.AgentBatch(messages=[nested, _own(spawned=pb.WorkerSpawned(attempt=1, rank=1, pid=1))])))
    [got] = next_events(events, 1)
    assert (type(got).__name__, got.rank) == ("WorkerSpawned", 1)  # rank 7's, inside the nested batch, never
    stranger = pb.AgentMessage(run_id="another-run", node_id=NODE, spawned=pb.WorkerSpawned(attempt=1, rank=2))
    a.outbox.put(_own(batch=pb.AgentBatch(messages=[stranger, _own(spawned=pb.WorkerSpawned(attempt=1, rank=3))])))
    [lost] = next_events(events, 1)
    assert isinstance(lost, ev.AgentLost) and "another-run" in lost.reason  # nothing after the stranger read


def test_an_agent_message_this_coordinator_does_not_know_ends_the_stream_with_the_fix(coordinator):
    """A newer agent's message kind is not dropped in silence (the run would wait for what it said):
    its stream ends, and the node's loss says why and what to do."""
    events, hub, agent = coordinator
    a = agent()
    a.outbox.put(_own())  # no body: what a coordinator sees of a kind its proto does not have
    [lost] = next_events(events, 1)
    assert isinstance(lost, ev.AgentLost)
    assert "does not know (empty)" in lost.reason and "same version on every host" in lost.reason


def test_an_agent_message_without_its_send_time_ends_the_stream_as_another_version(coordinator):
    """Every agent of this version stamps each message (`sent_at`, the lease's measure of its delay): an
    unstamped one comes from another version, refused like an unknown kind, heartbeats included."""
    events, hub, agent = coordinator
    a = agent()
    a.outbox.put(pb.AgentMessage(run_id=RUN_ID, node_id=NODE, heartbeat=pb.Heartbeat(sent_at=time.time())))
    [lost] = next_events(events, 1)
    assert isinstance(lost, ev.AgentLost)
    assert "without its send time (heartbeat)" in lost.reason and "same version on every host" in lost.reason


def test_relayed_commands_queued_together_go_down_as_one_message(coordinator):
    events, hub, agent = coordinator
    a = agent()
    a.relay(*[worker_message(n, n - 1, hello=pb.WorkerHello(pid=n, hostname="h")) for n in range(1, 5)])
    next_events(events, 4)
    # The hub hands commands sent before its scheduled flush runs to the loop in that one flush. The loop
    # is held while the four are sent, so they are in one flush whatever the scheduler does (sent freely,
    # a busy machine could let the loop flush each one alone: a flaky test).
    held, release = threading.Event(), threading.Event()
    hub._loop.call_soon_threadsafe(lambda: (held.set(), release.wait(DEADLINE_S)))
    assert held.wait(DEADLINE_S)
    try:
        for rank in range(4):
            hub.to_worker(1, rank, ReportAck(rank))
    finally:
        release.set()
    messages = []
    deadline = time.monotonic() + DEADLINE_S
    while sum(len(m.relayed.items) for m in messages) < 4:
        command = a.commands.get(timeout=max(deadline - time.monotonic(), 0.01))
        if command.WhichOneof("body") == "relayed":
            messages.append(command)
    items = [i for m in messages for i in m.relayed.items]
    assert [(i.stream, i.command.report_ack.round) for i in items] == [(1, 0), (2, 1), (3, 2), (4, 3)]
    assert len(messages) == 1  # the four queued together went down as one


# ---------------------------------------------------------------------------------- MINITRAIN_RELAY

@pytest.mark.parametrize("value, relayed", [
    (None, True), ("auto", True), ("AUTO", True), ("1", True), ("on", True), ("0", False), ("off", False),
    (" no ", False)])
def test_minitrain_relay_decides_who_relays(monkeypatch, value, relayed):
    """The run's size plays no part: MINITRAIN_RELAY alone decides."""
    from minitrain.driver.trainer import relays_workers

    if value is None:
        monkeypatch.delenv("MINITRAIN_RELAY", raising=False)
    else:
        monkeypatch.setenv("MINITRAIN_RELAY", value)
    assert relays_workers() is relayed


def test_an_unknown_minitrain_relay_value_is_refused_with_the_fix(monkeypatch, tmp_path):
    from minitrain import RunConfig, ScalingConfig
    from minitrain.errors import ConfigError
    from minitrain.torch import TorchTrainer

    monkeypatch.setenv("MINITRAIN_RELAY", "sometimes")
    trainer = TorchTrainer(lambda: None, scaling_config=ScalingConfig(num_workers=2),
                           run_config=RunConfig(name="r", storage_path=str(tmp_path)))
    with pytest.raises(ConfigError, match=r"MINITRAIN_RELAY='sometimes'.*1 \(relay, the default.*or 0"):
        trainer.fit()
    assert list(tmp_path.iterdir()) == []  # refused before anything was created


def _two_agents_lost(events) -> dict:
    """{node: (seconds from now until its AgentLost, the reason)} of the next two agents lost, in order."""
    started = time.monotonic()
    lost = {}
    deadline = started + DEADLINE_S
    while len(lost) < 2 and time.monotonic() < deadline:
        try:
            event = events.get(timeout=0.05)
        except queue.Empty:
            continue
        if isinstance(event, ev.AgentLost):
            lost[event.node_id] = (time.monotonic() - started, event.reason)
    return lost


def test_a_silent_agent_is_found_at_the_next_lease_check_not_the_next_heartbeat(monkeypatch):
    """The coordinator looks at its leases every LEASE_CHECK_INTERVAL_S and heartbeats its agents every
    HEARTBEAT_INTERVAL_S (a silent host is found within 5 s; LEASE_TIMEOUT_S is 4 s). Here leases are
    checked every 50 ms and heartbeats go once a second: an agent that says hello and then nothing, its
    connection held open, is found within a few checks of its 1 s lease (a check once a heartbeat would
    find it up to a second later), and until then it got at most one heartbeat a second."""
    monkeypatch.setattr(server_module, "LEASE_CHECK_INTERVAL_S", 0.05)
    for events, hub, agent in _serve(lease_timeout_s=1.0):
        silent = agent("node-silent")
        lost = None
        deadline = time.monotonic() + DEADLINE_S
        while lost is None and time.monotonic() < deadline:
            try:
                event = events.get(timeout=0.05)
            except queue.Empty:
                continue
            if isinstance(event, ev.AgentLost):
                lost = event
        assert lost is not None and lost.node_id == "node-silent"
        silent_s = float(lost.reason.split("nothing for ")[1].split(" s")[0])
        assert 1.0 <= silent_s < 1.5, lost.reason
        heartbeats = 0
        while True:
            try:
                command = silent.commands.get(timeout=0.5)
            except queue.Empty:
                break
            heartbeats += command.WhichOneof("body") == "heartbeat"
        assert heartbeats <= 2, f"{heartbeats} heartbeats in {silent_s} s: one per lease check?"


def test_an_agent_whose_heartbeats_arrive_late_keeps_its_lease_that_much_longer(short_lease_coordinator):
    """The coordinator's lease on an agent allows its latest message's delay: heartbeats queue behind the
    agent's relayed reports in one stream, and a coordinator that reads them late (saturated) declared
    healthy nodes lost. Here the 1 s lease ends for an agent whose heartbeat came on time, and only about
    3 s later for one whose heartbeat was read 3 s after it was stamped; each AgentLost says why. (The late
    agent's hello was read 5 s late: its quickest message is its offset, so the coordinator is not judged
    behind on everyone (`lease.reader_lag_s`), and the allowance is the heartbeat's 3 s, not the hello's.)"""
    events, hub, agent = short_lease_coordinator
    late, prompt = agent("node-late", hello_delay_s=5.0), agent("node-prompt")
    late.send(heartbeat=pb.Heartbeat(), sent_at=time.time() - 3.0)
    prompt.send(heartbeat=pb.Heartbeat(), sent_at=time.time())
    lost = _two_agents_lost(events)
    assert list(lost) == ["node-prompt", "node-late"], lost
    assert lost["node-prompt"][0] < 3.0 <= lost["node-late"][0]
    assert "lease 1 s, plus 0.0 s" in lost["node-prompt"][1]
    assert "lease 1 s, plus 3.0 s" in lost["node-late"][1] and lost["node-late"][1].startswith("it sent nothing for")


def test_an_agent_s_stamped_data_message_extends_its_lease_as_a_heartbeat_would(short_lease_coordinator):
    """An agent sends heartbeats only when it queued nothing else, so its other messages carry the stamp
    the lease's allowance is measured from: a relayed batch read 3 s after it was queued (and no
    heartbeat at all) keeps the 1 s lease about 3 s longer, like the late heartbeat above (the hello 5 s
    late, as there)."""
    events, hub, agent = short_lease_coordinator
    late, prompt = agent("node-late", hello_delay_s=5.0), agent("node-prompt")
    late.outbox.put(pb.AgentMessage(run_id=RUN_ID, node_id="node-late", sent_at=time.time() - 3.0,
                                    relayed=pb.RelayedUp(items=[report(1, 0, 0)])))
    prompt.outbox.put(pb.AgentMessage(run_id=RUN_ID, node_id="node-prompt", sent_at=time.time(),
                                      relayed=pb.RelayedUp(items=[report(1, 1, 0)])))
    lost = _two_agents_lost(events)
    assert list(lost) == ["node-prompt", "node-late"], lost
    assert lost["node-prompt"][0] < 3.0 <= lost["node-late"][0]
    assert "lease 1 s, plus 3.0 s" in lost["node-late"][1]


def test_a_coordinator_that_reads_late_judges_no_agent_silent_for_its_own_delay(short_lease_coordinator):
    """When the coordinator reads one agent 3 s later than that agent's messages can come (its own
    quickest one was read at once), it is behind on everyone: another agent, read on time once and then
    silent, keeps its 1 s lease about 3 s longer too, and the reason says the coordinator was late."""
    events, hub, agent = short_lease_coordinator
    behind, quiet = agent("node-behind"), agent("node-quiet")
    behind.send(heartbeat=pb.Heartbeat(), sent_at=time.time())  # its quickest: read at once
    behind.send(heartbeat=pb.Heartbeat(), sent_at=time.time() - 3.0)  # then one read 3 s late
    quiet.send(heartbeat=pb.Heartbeat(), sent_at=time.time())
    lost = _two_agents_lost(events)
    assert set(lost) == {"node-behind", "node-quiet"}, lost
    assert lost["node-quiet"][0] >= 3.0, lost  # 1 s alone without the coordinator's lag
    assert "the coordinator read its agents 3.0 s late" in lost["node-quiet"][1]
