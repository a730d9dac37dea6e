"""One agent serves a node at a time (minitrain.coordinator.transport.service).

A second agent's hello for a node whose agent's stream is open is refused: the second agent's stream ends
saying which agent holds the node (a joiner exits EXIT_REFUSED with that line), and the first agent keeps its
node, its routes and its lease. When the first agent's stream then ends with its workers' exits never
reported, the node is lost and the controller loses its ranks: the run restarts or fails, it never sits in
RUNNING. Before, the second hello took the node's routes: the first agent heard no more heartbeats, its
lease lapsed, it stopped its workers, and the end of its stream was attributed to nobody.

The real CoordinatorServer on loopback; agents played by gRPC streams from the test (and by the agent's own
`CoordinatorStream` for the refused one); the real `Controller` stepped by the test on its events.
"""

from __future__ import annotations

import queue
import threading
import time

import grpc
import pytest

from controller_support import FakeAgents, FakeClock, RecordingOutbox, make_controller

from minitrain.agent import join
from minitrain.agent.transport.stream import CoordinatorStream
from minitrain.config import FailureConfig
from minitrain.coordinator.facts import events as ev
from minitrain.coordinator.transport.server import CoordinatorServer
from minitrain.coordinator.transport.service import CoordinatorService, Hub
from minitrain.records import NodeInfo, Phase
from minitrain.rpc import auth
from minitrain.rpc._gen import minitrain_pb2 as pb
from minitrain.rpc._gen import minitrain_pb2_grpc as pb_grpc
from minitrain.rpc.channel import END_OF_STREAM, client_channel
from minitrain.run_state import RunState

RUN_ID, TOKEN = "run-nodes", "n" * 43
DEADLINE_S = 20.0


class _NullLogs:
    def write(self, *args) -> None:
        pass

    def open(self, *args) -> None:
        pass


def _requests(outbox: "queue.SimpleQueue"):
    while True:
        item = outbox.get()
        if item is END_OF_STREAM:
            return
        yield item


class PlayedAgent:
    """An agent's stream to the coordinator, played by the test: it says hello as `node` on `hostname`
    (one CPU, 1 GiB; not with `hello=False`) and keeps what comes down (`commands`); `ended` is set when the call ends, `code` is
    its status then (None while it lasts, or when it ended without an error)."""

    def __init__(self, address: str, node: str, hostname: str, hello: bool = True) -> None:
        self.node = node
        self.channel = client_channel(address)
        self.outbox: queue.SimpleQueue = queue.SimpleQueue()
        self.commands: queue.SimpleQueue = queue.SimpleQueue()
        self.ended = threading.Event()
        self.code = None
        if hello:
            self.send(hello=pb.AgentHello(hostname=hostname, pid=7, cpus=1, memory_bytes=1 << 30))
        self.call = pb_grpc.CoordinatorStub(self.channel).AgentStream(
            _requests(self.outbox), metadata=auth.call_metadata(TOKEN), wait_for_ready=True)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        try:
            for command in self.call:
                self.commands.put(command)
        except grpc.RpcError as error:
            self.code = error.code()
        finally:
            self.ended.set()

    def send(self, **body) -> None:
        self.outbox.put(pb.AgentMessage(run_id=RUN_ID, node_id=self.node, sent_at=time.time(), **body))

    def next_heartbeat(self) -> pb.AgentCommand:
        """The next heartbeat the coordinator sends down (other commands skipped)."""
        deadline = time.monotonic() + DEADLINE_S
        while True:
            command = self.commands.get(timeout=max(deadline - time.monotonic(), 0.01))
            if command.WhichOneof("body") == "heartbeat":
                return command

    def close(self) -> None:
        self.outbox.put(END_OF_STREAM)
        self.call.cancel()
        self.channel.close()


@pytest.fixture
def coordinator():
    """(the service's event queue, its hub, a function that starts a PlayedAgent on it, its address)."""
    events: queue.SimpleQueue = queue.SimpleQueue()
    hub = Hub()
    server = CoordinatorServer(CoordinatorService(RUN_ID, events, hub, _NullLogs(), lease_timeout_s=60.0),
                               hub, TOKEN).start()
    agents: list[PlayedAgent] = []

    def agent(node: str, hostname: str, hello: bool = True) -> PlayedAgent:
        agents.append(PlayedAgent(server.address, node, hostname, hello))
        return agents[-1]

    try:
        yield events, hub, agent, server.address
    finally:
        for played in agents:
            played.close()
        server.stop()


def test_a_second_agent_for_a_connected_node_is_refused_and_the_first_keeps_the_node_and_its_lease(coordinator):
    events, hub, agent, address = coordinator
    first = agent("pod-1", "host-a")
    connected = events.get(timeout=DEADLINE_S)
    assert isinstance(connected, ev.AgentConnected) and connected.node.hostname == "host-a"

    # The second one is a real agent's stream, as a second pod sharing the first one's Secret opens it.
    second = CoordinatorStream(address, "pod-1", RUN_ID, TOKEN)
    second.open(NodeInfo("pod-1", "host-b", "", agent_pid=8, cpus=1, memory_bytes=1 << 30))
    try:
        deadline = time.monotonic() + DEADLINE_S
        while not second.ended and time.monotonic() < deadline:
            second.next_command(timeout_s=deadline - time.monotonic())
        refused = second.ended
    finally:
        second.close()
    assert refused and second.shutdown is None, "the second agent for pod-1 was accepted"
    assert "FAILED_PRECONDITION" in second.end_reason
    # What a joiner prints as it exits EXIT_REFUSED: who holds the node, and what to do.
    said = join.refusal(second.end_reason)
    assert said is not None and said.startswith(
        "the coordinator refused this agent: node 'pod-1' is already served by the agent on host 'host-a'")
    assert "--node-id" in said and "stop the other one" in said

    # The first agent keeps the node: commands still come down its stream (the heartbeats that hold its
    # lease on the coordinator), what it sends is read as the node's, and no agent connected or was lost.
    first.next_heartbeat()
    first.send(spawned=pb.WorkerSpawned(attempt=0, rank=0, pid=4242))
    assert events.get(timeout=DEADLINE_S) == ev.WorkerSpawned("pod-1", 0, 0, 4242)
    assert hub.agent_ids() == ["pod-1"] and not first.ended.is_set()


def test_a_stream_that_speaks_for_another_node_or_before_its_hello_is_ended(coordinator):
    events, hub, agent, _ = coordinator
    liar = agent("pod-1", "host-a")
    assert isinstance(events.get(timeout=DEADLINE_S), ev.AgentConnected)
    # An exit of pod-2's worker on pod-1's stream would end a rank that pod-2's agent still runs.
    liar.outbox.put(pb.AgentMessage(run_id=RUN_ID, node_id="pod-2", sent_at=time.time(),
                                    exited=pb.WorkerExited(attempt=0, rank=1, pid=9)))
    assert liar.ended.wait(DEADLINE_S) and liar.code is grpc.StatusCode.FAILED_PRECONDITION
    lost = events.get(timeout=DEADLINE_S)
    assert isinstance(lost, ev.AgentLost) and lost.node_id == "pod-1"
    assert lost.reason == "it spoke for node 'pod-2' on the stream of node 'pod-1'"

    # Facts sent before a hello would be a node's that another agent may serve: nothing of them is read.
    nameless = agent("pod-1", "host-a", hello=False)
    nameless.send(exited=pb.WorkerExited(attempt=0, rank=0, pid=9))
    assert nameless.ended.wait(DEADLINE_S) and nameless.code is grpc.StatusCode.FAILED_PRECONDITION
    assert events.empty() and hub.agent_ids() == []


def _step_until(controller, done, what: str) -> None:
    """Step the controller (each turn waits a moment for the service's events) until `done()`."""
    deadline = time.monotonic() + DEADLINE_S
    while not done():
        assert time.monotonic() < deadline, f"the controller never got to {what}; it is {controller.state}"
        controller.step(0.05)


def test_an_agent_stream_that_ends_with_its_workers_unreported_loses_their_ranks(tmp_path, coordinator):
    """The defect as it showed: a second agent says hello as a node whose agent runs a rank, then the first
    agent's stream ends without the rank's exit. The rank must be lost with its node (here the run fails:
    no failure budget); before, the run sat in RUNNING with no progress."""
    events, hub, agent, _ = coordinator
    clock = FakeClock(1000.0)
    controller = make_controller(tmp_path, RecordingOutbox(), FakeAgents(), events=events, clock=clock,
                                 num_workers=2, node_ids=("n0", "n1"), failure_limits=FailureConfig(max_failures=0))
    controller.begin()
    first = agent("n0", "host-n0")
    agent("n1", "host-n1")
    _step_until(controller, lambda: controller.state is RunState.STARTING, "STARTING")
    for rank, node in enumerate(("n0", "n1")):  # what the workers' streams and their agents would say
        events.put(ev.WorkerSpawned(node, 0, rank, 100 + rank))
        events.put(ev.WorkerConnected(0, rank, 100 + rank, f"host-{node}"))
    events.put(ev.StoreReady(0, "127.0.0.1", 29500))
    for phase in (Phase.DIST_INIT, Phase.TRAINING):
        for rank in (0, 1):
            events.put(ev.WorkerPhaseChanged(0, rank, phase))
    _step_until(controller, lambda: controller.state is RunState.RUNNING, "RUNNING")

    second = agent("n0", "host-n0-again")
    second.ended.wait(DEADLINE_S)  # refused at once (accepted, it would stay: the rest of the test shows why)
    first.close()  # its worker's exit is never reported: the stream ends with it
    _step_until(controller, lambda: controller.state is not RunState.RUNNING, "past RUNNING")
    assert controller.state is RunState.STOPPING
    # The other rank is stopped and exits; the run fails with rank 0 lost with its node.
    events.put(ev.WorkerStreamClosed(0, 1))
    events.put(ev.WorkerExited("n1", 0, 1, 101, None, 15, True, clock.now))
    _step_until(controller, lambda: controller.finished, "the run's end")
    outcome = controller.end()
    assert outcome.state is RunState.FAILED
    assert [(f.rank, f.exc_type) for f in outcome.failures][:1] == [(0, "NodeLostError")], outcome.failures
    assert "node host-n0 was lost" in outcome.error_message
