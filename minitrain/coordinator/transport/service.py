"""The coordinator's gRPC servicer and the hub that routes commands to open streams.

Handlers run on the server's asyncio loop. They only translate messages into events for the
controller (or hand log lines to the log sink); they never decide anything. The controller, on its
own thread, sends commands through the `Hub`, which hops onto the loop thread-safely.

A worker's stream comes either directly (`WorkerStream`) or relayed by its node's agent (`RelayedUp`
items on the agent's `AgentStream`, see `minitrain.agent.transport.relay`):
`minitrain.coordinator.transport.worker_streams` turns either into events (one `WorkerIntake` per stream).
An agent's stream is read message by message, each kind by its handler (`_AGENT_HANDLERS`), with what the
handlers share about the stream in its `AgentLink`.

One stream serves a node at a time: an agent's hello for a node whose agent's stream is still open is
refused (FAILED_PRECONDITION, saying which agent holds the node), and that first agent keeps the node, its
routes and its lease. A stream is reported lost (`AgentLost`) when it ends, before a new agent for its node
can be accepted, so the controller always learns that the node's workers went with it. A stream speaks for
the node its hello named and for nothing before its hello.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import queue
import threading
import time
from typing import Callable, Optional, Protocol

import grpc

from minitrain.commands import AgentCommand, WorkerCommand
from minitrain.coordinator.facts import events as ev
from minitrain.coordinator.transport.worker_streams import CLOSE, RelayedStreams, WorkerIntake
from minitrain.lease import Lease, reader_lag_s
from minitrain.rpc import convert
from minitrain.rpc._gen import minitrain_pb2 as pb
from minitrain.rpc._gen import minitrain_pb2_grpc as pb_grpc


logger = logging.getLogger("minitrain.coordinator")



class LogSinkProtocol(Protocol):
    """Where forwarded worker output goes (see minitrain.driver.logs.LogSink)."""

    def write(self, attempt: int, rank: int, node: str, stderr: bool, lines: list[str]) -> None:
        """Show and store lines of one worker's output."""

    def open(self, attempt: int, rank: int) -> None:
        """Create the (possibly empty) log of a worker that was just started."""


class Hub:
    """Thread-safe routing of commands to the open agent and worker streams: the gRPC `Outbox`
    (`minitrain.coordinator.facts.outbox`), which converts each command record to its message.

    Each stream registers an asyncio queue (its outbox) on the server loop; `send_*` may be called from
    any thread. Sending to a stream that is gone returns False. Commands reach each outbox in the
    order they were sent.

    Commands sent from other threads are handed to the loop in batches: the first one of a batch
    schedules one `_flush` on the loop (one wake-up, a write to the loop's self-pipe); the ones sent
    before that flush ran join it. With thousands of workers the controller acknowledges reports
    faster than the loop wakes, so a wake-up per command cost more than the commands.
    """

    def __init__(self) -> None:
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._lock = threading.Lock()
        self._agents: dict[str, asyncio.Queue] = {}
        self._workers: dict[tuple[int, int], asyncio.Queue] = {}
        self._batch_lock = threading.Lock()
        self._batch: list[tuple[asyncio.Queue, object]] = []  # waiting for the scheduled _flush

    def bind_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        """Called once by the server thread with its loop."""
        self._loop = loop

    def _put(self, outbox: Optional[asyncio.Queue], item) -> bool:
        loop = self._loop
        if outbox is None or loop is None or loop.is_closed():
            return False
        with self._batch_lock:
            self._batch.append((outbox, item))
            if len(self._batch) > 1:
                return True  # a flush is scheduled and has not taken the batch yet
            try:
                loop.call_soon_threadsafe(self._flush)
            except RuntimeError:  # loop closed between the check and the call
                self._batch.clear()
                return False
        return True

    def _flush(self) -> None:
        """On the loop: move every batched command into its outbox, in the order sent."""
        with self._batch_lock:
            batch, self._batch = self._batch, []
        for outbox, item in batch:
            outbox.put_nowait(item)

    def register_agent(self, node_id: str, outbox: asyncio.Queue) -> bool:
        """Route commands for `node_id` to `outbox`; False (nothing changes) when another stream's outbox
        is registered for it: one stream serves a node until it is unregistered."""
        with self._lock:
            held = self._agents.get(node_id)
            if held is not None and held is not outbox:
                return False
            self._agents[node_id] = outbox
            return True

    def unregister_agent(self, node_id: str, outbox: asyncio.Queue) -> None:
        """Forget `node_id` if `outbox` is still its stream."""
        with self._lock:
            if self._agents.get(node_id) is outbox:
                del self._agents[node_id]

    def to_agent(self, node_id: str, command: AgentCommand) -> bool:
        """Queue a command record for an agent, as its message; False when its stream is gone."""
        return self._queue_for_agent(node_id, convert.agent_command_message(command))

    def _queue_for_agent(self, node_id: str, message) -> bool:
        """Queue a message (or CLOSE) for an agent; False when its stream is gone. The servicer's own
        messages (heartbeats, the close of an expired lease) take this way: they are not commands."""
        with self._lock:
            outbox = self._agents.get(node_id)
        return self._put(outbox, message)

    def agent_ids(self) -> list[str]:
        """The node ids with an open stream."""
        with self._lock:
            return list(self._agents)

    def register_worker(self, attempt: int, rank: int, outbox: asyncio.Queue) -> None:
        """Route commands for (attempt, rank) to `outbox`."""
        with self._lock:
            self._workers[(attempt, rank)] = outbox

    def unregister_worker(self, attempt: int, rank: int, outbox: asyncio.Queue) -> None:
        """Forget (attempt, rank) if `outbox` is still its stream."""
        with self._lock:
            if self._workers.get((attempt, rank)) is outbox:
                del self._workers[(attempt, rank)]

    def to_worker(self, attempt: int, rank: int, command: WorkerCommand) -> bool:
        """Queue a command record for a worker, as its message; False when its stream is gone. The
        message is built here, on the caller's thread, so the loop only moves it."""
        message = convert.worker_command_message(command)
        with self._lock:
            outbox = self._workers.get((attempt, rank))
        return self._put(outbox, message)

    def close_worker(self, attempt: int, rank: int) -> None:
        """End a worker's response stream (it sees the stream finish)."""
        with self._lock:
            outbox = self._workers.get((attempt, rank))
        self._put(outbox, CLOSE)


def _peer_host(peer: str) -> str:
    """'ipv4:127.0.0.1:5000' -> '127.0.0.1'; 'ipv6:[::1]:5000' -> '::1'."""
    _, _, rest = peer.partition(":")
    host = rest.rsplit(":", 1)[0]
    return host.strip("[]")


class AgentLink:
    """One agent's stream as the servicer reads it: what its handlers share, on the server loop.

    `number`: the stream's number (the coordinator counts its agent streams, so a node's events tell its
    streams apart); `outbox`: where its commands are queued; `relayed`: the worker streams it relays;
    `node_id`: the node it serves, set by its accepted hello ("" before: nothing else of it is acted on
    until then); `lease`: its agent's lease, from that hello on (every message of the stream renews it);
    `end_reason`: why the stream ended, for the node's AgentLost (what the reader found last)."""

    __slots__ = ("number", "outbox", "relayed", "node_id", "lease", "end_reason")

    def __init__(self, number: int, outbox: asyncio.Queue, relayed: RelayedStreams) -> None:
        self.number = number
        self.outbox = outbox
        self.relayed = relayed
        self.node_id = ""
        self.lease: Optional[Lease] = None
        self.end_reason = ("its stream ended (the agent exited, or its host stopped answering the keepalive "
                           "pings)")


class CoordinatorService(pb_grpc.CoordinatorServicer):
    """Turns stream messages into controller events; see the module docstring.

    `lease_timeout_s`: an agent silent for this long (plus its heartbeats' delay, see `minitrain.lease`)
    is reported lost (its stream is closed too).
    """

    def __init__(self, run_id: str, events: "queue.SimpleQueue[ev.RunEvent]", hub: Hub,
                 log_sink: LogSinkProtocol, lease_timeout_s: float,
                 clock: Callable[[], float] = time.monotonic, node_ids: tuple = ()):
        self._run_id = run_id
        self._node_ids = frozenset(node_ids)  # the run's hosts; empty: any (an agent that joins names one)
        self._events = events
        self._hub = hub
        self._log_sink = log_sink
        self._lease_timeout_s = lease_timeout_s
        self._clock = clock
        self._leases: dict[str, Lease] = {}  # node_id -> its connected agent's lease (see minitrain.lease)
        self._verdicts: dict[str, str] = {}  # node_id -> why its lease ended, for its AgentLost
        self._node_names: dict[str, str] = {}
        self._streams = itertools.count(1)

    # ------------------------------------------------------------------ agents

    async def AgentStream(self, request_iterator, context):
        outbox: asyncio.Queue = asyncio.Queue()
        link = AgentLink(next(self._streams), outbox, RelayedStreams(self._events, self._hub, self._run_id, outbox))
        reader = asyncio.ensure_future(self._read_agent(request_iterator, context, link))
        try:
            async for command in _drain_agent(outbox):
                yield command
        finally:
            reader.cancel()
            # Its workers' relayed streams end with it, before the node is reported lost (as their
            # own connections would have broken with the host).
            link.relayed.end_all()
            node_id = link.node_id
            if node_id:  # (a refused stream never had a node: the node's agent is another one)
                self._hub.unregister_agent(node_id, outbox)
                self._leases.pop(node_id, None)
                reason = self._verdicts.pop(node_id, link.end_reason)
                self._events.put(ev.AgentLost(node_id, reason, link.number))

    async def _read_agent(self, request_iterator, context, link: AgentLink) -> None:
        try:
            async for received in request_iterator:
                if received.WhichOneof("body") == "batch":
                    # Messages the agent queued together, each handled as if it had come alone; a
                    # batch inside a batch is not read (the agent never makes one).
                    if not self._check_agent(received, context, link):
                        break
                    messages = [m for m in received.batch.messages if m.WhichOneof("body") != "batch"]
                else:
                    messages = (received,)
                if not all(self._from_agent(message, context, link) for message in messages):
                    break
        except Exception as exc:  # the stream broke: the agent or its host is gone
            link.end_reason = f"its connection broke ({type(exc).__name__})"
        finally:
            link.outbox.put_nowait(CLOSE)

    def _check_agent(self, message: pb.AgentMessage, context, link: AgentLink) -> bool:
        """False (and the call's status set) when `message` is not of this run or its node is not one
        of the run's hosts: nothing more of that stream is read."""
        if message.run_id != self._run_id:
            link.end_reason = f"the agent belongs to run {message.run_id!r}"
            # FAILED_PRECONDITION ends the agent's call: a joiner says why it was refused (minitrain.hosts.joining).
            context.set_code(grpc.StatusCode.FAILED_PRECONDITION)
            context.set_details(f"this coordinator serves run {self._run_id!r}, "
                                f"not {message.run_id!r} (that run is over, or the agent was "
                                f"started for another one)")
            return False
        node_id = message.node_id
        if self._node_ids and node_id not in self._node_ids:
            link.end_reason = f"{node_id!r} is not one of the run's hosts"
            context.set_code(grpc.StatusCode.FAILED_PRECONDITION)
            context.set_details(f"{node_id!r} is not one of this run's hosts "
                                f"({', '.join(sorted(self._node_ids))}): give --node-id one of them")
            return False
        if link.node_id and node_id != link.node_id:
            # What a stream reports is its node's (a worker's exit, its logs): one that spoke for
            # another node could report that node's workers as its own.
            link.end_reason = f"it spoke for node {node_id!r} on the stream of node {link.node_id!r}"
            context.set_code(grpc.StatusCode.FAILED_PRECONDITION)
            context.set_details(f"this stream said hello as node {link.node_id!r} and then sent a message of "
                                f"node {node_id!r}: an agent's stream serves the one node its hello named")
            return False
        return True

    def _from_agent(self, message: pb.AgentMessage, context, link: AgentLink) -> bool:
        """Handle one message of an agent's stream; False when nothing more of the stream is read.

        A message of a kind this coordinator does not know, or without its send time (`sent_at`, which every
        agent of this version stamps), comes from an agent of another minitrain version: dropped in silence,
        it could leave the run waiting for what it said (a start's WorkerSpawned in a newer kind), so the
        stream ends and the node's loss says why."""
        if not self._check_agent(message, context, link):
            return False
        kind = message.WhichOneof("body")
        if not message.sent_at:
            return _another_version(link, f"a message without its send time ({kind or 'empty'})")
        if kind not in _AGENT_MESSAGE_KINDS:
            return _another_version(link, f"a message this coordinator does not know ({kind or 'empty'})")
        if not link.node_id and kind != "hello":
            # Every agent says hello first; what came before it would be facts of a node no stream
            # serves yet (another agent may serve it).
            link.end_reason = f"it sent {kind} before its hello"
            context.set_code(grpc.StatusCode.FAILED_PRECONDITION)
            context.set_details(f"an agent says hello first; this stream sent {kind} before")
            return False
        handle = _AGENT_HANDLERS.get(kind)  # (none for a heartbeat: the lease hearing it is all it does)
        if handle is not None and handle(self, message, context, link) is False:
            return False
        link.lease.heard(message.sent_at)
        return True

    # One handler per kind of agent message, by the name of its oneof field; each but the hello is read only
    # after the stream's hello was accepted. A handler that returns False ends the stream (a refused hello).

    def _hello(self, message: pb.AgentMessage, context, link: AgentLink) -> bool:
        if link.node_id:
            return True  # one hello per stream
        node_id = message.node_id
        if not self._hub.register_agent(node_id, link.outbox):
            return self._refuse_second_agent(node_id, context, link)
        link.node_id = node_id
        link.lease = self._leases[node_id] = Lease(self._lease_timeout_s, self._clock)
        node = convert.node_from_hello(node_id, message.hello, _peer_host(context.peer()))
        self._node_names[node_id] = node.hostname
        self._events.put(ev.AgentConnected(node, link.number))
        return True

    def _refuse_second_agent(self, node_id: str, context, link: AgentLink) -> bool:
        """Refuse a hello for a node whose agent's stream is open (False: read no further). Replacing that
        agent instead would stop a node that works, and two processes sharing one Secret (or one
        --node-id given twice) would take the node from each other in turn; an agent that is really gone
        is lost within its lease, and the next one for its node is accepted then."""
        held = self._leases.get(node_id)
        heard = f", heard from {held.silent_s():.1f} s ago" if held is not None else ""
        holder = f"the agent on host {self._node_name(node_id)!r}{heard}"
        link.end_reason = f"node {node_id!r} is served by {holder}"
        logger.warning("node %s: refused a second agent for it (from %s): it is served by %s", node_id,
                       _peer_host(context.peer()), holder)
        context.set_code(grpc.StatusCode.FAILED_PRECONDITION)
        context.set_details(
            f"node {node_id!r} is already served by {holder}: one agent serves a node. Give this agent the "
            f"--node-id of a host that has none, or stop the other one; once that agent is lost (its stream "
            f"ends, or it is silent for {self._lease_timeout_s:g} s) a new agent for the node is accepted")
        return False

    def _relayed(self, message: pb.AgentMessage, context, link: AgentLink) -> None:
        link.relayed.receive(message.relayed)

    def _logs(self, message: pb.AgentMessage, context, link: AgentLink) -> None:
        logs = message.logs
        self._log_sink.write(logs.attempt, logs.rank, self._node_name(message.node_id), logs.stderr,
                             list(logs.lines))

    def _spawned(self, message: pb.AgentMessage, context, link: AgentLink) -> None:
        s = message.spawned
        self._log_sink.open(s.attempt, s.rank)
        self._events.put(ev.WorkerSpawned(message.node_id, s.attempt, s.rank, s.pid))

    def _exited(self, message: pb.AgentMessage, context, link: AgentLink) -> None:
        self._events.put(ev.WorkerExited(message.node_id, **convert.exited_fields(message.exited)))

    def _preemption(self, message: pb.AgentMessage, context, link: AgentLink) -> None:
        signalled = message.preemption
        self._events.put(ev.PreemptionSignalled(message.node_id, signalled.signal, signalled.received_at))

    def _persisted(self, message: pb.AgentMessage, context, link: AgentLink) -> None:
        p = message.persisted
        self._events.put(ev.ShardsPersisted(message.node_id, p.attempt, p.dir_name, tuple(p.ranks), p.error,
                                            p.to_peer))

    def _replica(self, message: pb.AgentMessage, context, link: AgentLink) -> None:
        self._events.put(ev.ReplicaReady(message.node_id, message.replica.port))

    def _warmed(self, message: pb.AgentMessage, context, link: AgentLink) -> None:
        warmed = message.warmed
        self._events.put(ev.NodeWarmed(message.node_id, link.number, warmed.ready, warmed.detail))

    def _stack_dump(self, message: pb.AgentMessage, context, link: AgentLink) -> None:
        dump = message.stack_dump
        header = (f"minitrain: every thread's stack of rank {dump.rank} (asked for by the hang "
                  "detection or the dashboard):")
        text = dump.text or "(no answer: the process is stopped or blocked in the kernel)"
        self._log_sink.write(dump.attempt, dump.rank, self._node_name(message.node_id), True,
                             [header, *text.rstrip().splitlines()])
        self._events.put(ev.StackDumped(dump.attempt, dump.rank, dump.text))

    def _node_name(self, node_id: str) -> str:
        """The hostname a node's agent said hello with (its id until then), for its log lines."""
        return self._node_names.get(node_id, node_id)

    async def watch_leases(self, heartbeat_interval_s: float, check_interval_s: float) -> None:
        """Every `check_interval_s`, report the agents that went silent; every `heartbeat_interval_s`,
        heartbeat every agent. Runs on the server loop."""
        lag_s, since = 0.0, self._clock()
        next_heartbeat = since + heartbeat_interval_s
        while True:
            await asyncio.sleep(check_interval_s)
            now = self._clock()
            heartbeat = None
            if now >= next_heartbeat:
                next_heartbeat = now + heartbeat_interval_s
                # How far behind this loop reads its agents, from the agents read since the last heartbeat
                # (when none was, it is as behind as before): no agent is judged silent for the reader's
                # own delay. Once a heartbeat, so that each figure covers every agent's last message.
                latest = reader_lag_s(self._leases.values(), since)
                lag_s, since = (lag_s if latest is None else latest), now
                # One message a heartbeat, never changed once queued: an agent judges the coordinator's
                # backlog from its sent_at (a stamp rewritten while the message waited would hide the wait).
                heartbeat = pb.AgentCommand(heartbeat=pb.Heartbeat(sent_at=time.time()))
            for node_id in self._hub.agent_ids():
                lease = self._leases.get(node_id)
                if lease is not None and lease.expired(lag_s):
                    verdict = f"it sent {lease.describe(lag_s)}"
                    logger.warning("node %s: %s; treating it as lost", node_id, verdict)
                    self._verdicts[node_id] = verdict
                    self._leases.pop(node_id, None)
                    self._hub._queue_for_agent(node_id, CLOSE)
                elif heartbeat is not None:
                    self._hub._queue_for_agent(node_id, heartbeat)

    # ------------------------------------------------------------------ workers

    async def WorkerStream(self, request_iterator, context):
        outbox: asyncio.Queue = asyncio.Queue()
        intake = WorkerIntake(self._events, self._hub, self._run_id, outbox)
        reader = asyncio.ensure_future(self._read_worker(request_iterator, intake))
        try:
            async for command in _drain(outbox):
                yield command
        finally:
            reader.cancel()
            intake.unregister()

    async def _read_worker(self, request_iterator, intake: WorkerIntake) -> None:
        try:
            async for message in request_iterator:
                if not intake.handle(message):
                    break
        except Exception:  # the worker died mid-stream; its agent reports the exit
            pass
        finally:
            intake.closed()


async def _drain(outbox: asyncio.Queue):
    """The commands queued for one stream, until the stream is closed."""
    while True:
        command = await outbox.get()
        if command is CLOSE:
            return
        yield command


async def _drain_agent(outbox: asyncio.Queue):
    """An agent stream's commands until it is closed; RelayedDown commands queued one after the
    other go down as one (the order of all commands is kept)."""
    pending = None
    while True:
        command = pending if pending is not None else await outbox.get()
        pending = None
        if command is CLOSE:
            return
        if command.WhichOneof("body") == "relayed":
            merged = None
            while not outbox.empty():
                following = outbox.get_nowait()
                if following is CLOSE or following.WhichOneof("body") != "relayed":
                    pending = following
                    break
                if merged is None:
                    merged = pb.AgentCommand()
                    merged.relayed.items.extend(command.relayed.items)
                merged.relayed.items.extend(following.relayed.items)
            if merged is not None:
                command = merged
        yield command


# What an agent may send: every kind of AgentMessage's body in the proto this coordinator was built with.
_AGENT_MESSAGE_KINDS = frozenset(field.name for field in pb.AgentMessage.DESCRIPTOR.oneofs_by_name["body"].fields)


def _another_version(link: AgentLink, what: str) -> bool:
    """End an agent's stream that sent `what`, a message only another minitrain version sends (False: read
    no further), with the reason its AgentLost gives."""
    link.end_reason = (f"it sent {what}: the agent runs another minitrain version than the driver; install the "
                       "same version on every host")
    return False


# What each kind of agent message does (CoordinatorService._from_agent); a heartbeat only renews the lease,
# and a batch is unpacked before (CoordinatorService._read_agent). False from a handler ends the stream.
_AGENT_HANDLERS: dict[str, Callable[[CoordinatorService, pb.AgentMessage, object, AgentLink], Optional[bool]]] = {
    "hello": CoordinatorService._hello,
    "relayed": CoordinatorService._relayed,
    "logs": CoordinatorService._logs,
    "spawned": CoordinatorService._spawned,
    "exited": CoordinatorService._exited,
    "preemption": CoordinatorService._preemption,
    "warmed": CoordinatorService._warmed,
    "persisted": CoordinatorService._persisted,
    "replica": CoordinatorService._replica,
    "stack_dump": CoordinatorService._stack_dump,
}
