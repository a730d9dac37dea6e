"""A worker's stream at the coordinator, direct or relayed by its node's agent: its messages become
controller events (transport edge: protobuf in, events out).

One `WorkerIntake` per stream. A direct stream is read by the servicer's `WorkerStream`; a relayed one
arrives as `RelayedUp` items on its agent's `AgentStream` (`minitrain.agent.transport.relay`), which
`RelayedStreams` sorts by the agent's stream number, and its commands go down the agent's stream as
`RelayedDown` items (`RelayOutbox`). A relayed stream ends when the agent says it closed, or when the
agent's own stream ends (before the agent is reported lost).
"""

from __future__ import annotations

import asyncio
import logging
import queue
from typing import Callable, Optional, Protocol

from minitrain.coordinator.facts import events as ev
from minitrain.records import Phase
from minitrain.rpc import convert
from minitrain.rpc._gen import minitrain_pb2 as pb

logger = logging.getLogger("minitrain.coordinator")

CLOSE = object()  # on an outbox: end the response stream


class WorkerRoutes(Protocol):
    """Where a worker stream's commands are routed (the coordinator's `Hub`)."""

    def register_worker(self, attempt: int, rank: int, outbox) -> None:
        """Route commands for (attempt, rank) to `outbox`."""

    def unregister_worker(self, attempt: int, rank: int, outbox) -> None:
        """Forget (attempt, rank) if `outbox` is still its stream."""


class WorkerIntake:
    """One worker stream, direct or relayed: its messages become controller events.

    The stream's hello registers its (attempt, rank) in the hub with `outbox` (where its commands
    go); `closed()` reports the stream's end once (WorkerStreamClosed, if it said hello) and ends the
    response stream; `unregister()` forgets the outbox (if it is still the one registered)."""

    __slots__ = ("_put", "_hub", "_run_id", "_outbox", "key", "_closed")

    def __init__(self, events: "queue.SimpleQueue[ev.RunEvent]", hub: WorkerRoutes, run_id: str, outbox) -> None:
        self._put = events.put
        self._hub = hub
        self._run_id = run_id
        self._outbox = outbox
        self.key: Optional[tuple[int, int]] = None
        self._closed = False

    def handle(self, message: pb.WorkerMessage, reports: Optional[list] = None) -> bool:
        """Turn one message into its event; False when it belongs to another run (read no further).

        `reports`: a relayed batch's consecutive reports so far (see `RelayedStreams.receive`): a
        report joins it, and any other message first sends it as one ReportsReceived (so every event
        keeps its place). Without it, a report is an event of its own."""
        if message.run_id != self._run_id:
            return False
        attempt, rank = message.attempt, message.rank
        kind = message.WhichOneof("body")
        if kind == "report" or kind == "report_batch":
            records = convert.report_records(
                attempt, rank, (message.report,) if kind == "report" else message.report_batch.reports)
            if reports is None:
                self._put(ev.ReportsReceived(tuple(records)))
            else:
                reports.extend(records)
            return True
        put = self._put
        send_reports(put, reports)
        if kind == "telemetry":
            put(ev.TelemetryReceived(attempt, convert.telemetry_from_message(attempt, rank, message.telemetry)))
        elif kind == "hello" and self.key is None:
            self.key = (attempt, rank)
            self._hub.register_worker(attempt, rank, self._outbox)
            put(ev.WorkerConnected(attempt, rank, message.hello.pid, message.hello.hostname))
        elif kind == "phase":
            put(ev.WorkerPhaseChanged(attempt, rank, Phase(message.phase.phase)))
        elif kind == "store_ready":
            put(ev.StoreReady(attempt, message.store_ready.address, message.store_ready.port))
        elif kind == "done":
            done = message.done
            put(ev.WorkerDone(attempt, rank, done.reports, done.return_value))
        elif kind == "list_checkpoints":
            request = message.list_checkpoints
            put(ev.CheckpointsRequested(attempt, rank, request.request_id, request.rounds))
        elif kind == "failure":
            failure = convert.failure_from_message(rank, "", 0, message.failure)
            put(ev.WorkerFailed(attempt, failure, message.failure.exc_pickle))
        elif kind == "preemption_seen":
            put(ev.PreemptionSeen(attempt, rank, message.preemption_seen.rounds))
        elif kind not in ("hello", "heartbeat"):
            # A message this coordinator cannot read: a worker from another minitrain version. Dropping
            # it in silence once hung a run whose reports all came in a newer message kind.
            put(ev.WorkerFailed(attempt, convert.unknown_message_failure(rank, kind), b""))
        return True

    def closed(self, reports: Optional[list] = None) -> None:
        """The stream ended (idempotent); `reports` as for `handle` (sent first, in any case)."""
        send_reports(self._put, reports)
        if self._closed:
            return
        self._closed = True
        if self.key is not None:
            self._put(ev.WorkerStreamClosed(*self.key))
        self._outbox.put_nowait(CLOSE)

    def unregister(self) -> None:
        """Stop routing commands to this stream."""
        if self.key is not None:
            self._hub.unregister_worker(*self.key, self._outbox)


class RelayOutbox:
    """A relayed worker stream's outbox: each command (or the close) goes down its agent's stream as
    a RelayedDown item. Used on the server loop, like an asyncio.Queue outbox."""

    __slots__ = ("_agent_outbox", "_stream")

    def __init__(self, agent_outbox: asyncio.Queue, stream: int) -> None:
        self._agent_outbox = agent_outbox
        self._stream = stream

    def put_nowait(self, item) -> None:
        if item is CLOSE:
            relayed = pb.RelayedCommand(stream=self._stream, close=True)
        else:
            relayed = pb.RelayedCommand(stream=self._stream, command=item)
        self._agent_outbox.put_nowait(pb.AgentCommand(relayed=pb.RelayedDown(items=[relayed])))


class RelayedStreams:
    """The worker streams one agent stream relays, by the agent's stream number (server loop only)."""

    def __init__(self, events: "queue.SimpleQueue[ev.RunEvent]", hub: WorkerRoutes, run_id: str,
                 agent_outbox: asyncio.Queue) -> None:
        self._events, self._hub, self._run_id = events, hub, run_id
        self._agent_outbox = agent_outbox
        self._open: dict[int, WorkerIntake] = {}
        self._ended: set[int] = set()  # numbers are never reused: late items of an ended stream are dropped
        self._all_ended = False

    def receive(self, relayed: pb.RelayedUp) -> None:
        """Handle a batch of relayed items, in order. Consecutive reports (of any of its streams) go to
        the controller as one ReportsReceived: at thousands of ranks a batch holds a report of each of
        the agent's workers, and one event per report was most of the controller's cost per report.
        A digest item (stream 0, `minitrain.rpc.digest`) adds its reports to that batch in its place."""
        reports: list = []
        for item in relayed.items:
            number = item.stream
            if not number:
                if item.HasField("digest"):
                    self._digest(item.digest, reports)
                continue
            intake = self._open.get(number)
            if intake is None:
                if number in self._ended or self._all_ended:
                    continue
                intake = WorkerIntake(self._events, self._hub, self._run_id,
                                      RelayOutbox(self._agent_outbox, number))
                self._open[number] = intake
            if item.closed or not item.HasField("message") or not intake.handle(item.message, reports):
                self._end(number, reports)
        send_reports(self._events.put, reports)

    def _digest(self, digest: pb.ReportDigest, reports: list) -> None:
        """A digest's reports join `reports`, as each one's own item would: a stream not seen before gets
        its intake, the reports of an ended stream are dropped. The checks are per stream, the decoding
        one `map` over the columns (the point of the digest: no Python per report and field here)."""
        try:
            records = convert.reports_from_digest(digest)
        except ValueError as exc:
            logger.warning("dropped a relayed report digest: %s", exc)
            return
        open_streams = self._open
        ended = set()
        for number in set(digest.stream):
            if number in open_streams:
                continue
            if number in self._ended or self._all_ended or number <= 0:
                ended.add(number)
                continue
            open_streams[number] = WorkerIntake(self._events, self._hub, self._run_id,
                                                RelayOutbox(self._agent_outbox, number))
        if ended:
            records = [r for r, number in zip(records, digest.stream) if number not in ended]
        reports.extend(records)

    def _end(self, number: int, reports: Optional[list] = None) -> None:
        intake = self._open.pop(number)
        self._ended.add(number)
        intake.unregister()
        intake.closed(reports)  # (tells the agent to end the worker's stream, if it has not ended)

    def end_all(self) -> None:
        """The agent's stream ended: so did every stream it relayed (idempotent)."""
        self._all_ended = True
        for number in list(self._open):
            self._end(number)


def send_reports(put: Callable[[ev.RunEvent], None], reports: Optional[list]) -> None:
    """Hand a batch's reports gathered so far to the controller as one event, and start a new batch."""
    if reports:
        put(ev.ReportsReceived(tuple(reports)))
        reports.clear()

