"""How the scale simulation's fake workers' streams reach the coordinator (`transport` in the
configuration of `bench.scale.clients`):
- "relayed" (the default, as the product runs): the worker's stream is carried by its node's agent,
  as `minitrain.agent.transport.relay` carries a real worker's (one connection per host). The agent numbers
  each worker stream it carries (1, 2, ..., never reused) and puts one `RelayedMessage` per worker
  message on its upward FIFO, the same FIFO as its own messages, then `closed` when the worker's stream
  ends. It coalesces with the real agent's code (`minitrain.agent.transport.relay.coalesce`): having taken an
  item, its request iterator also takes everything already queued behind it (at most MAX_BATCH_ITEMS
  and MAX_BATCH_BYTES), runs of relayed items as one `AgentMessage(relayed=RelayedUp)`, several messages
  as one `AgentBatch`. An item put while the iterator waits goes at once, alone; items put while gRPC
  writes the previous message go together in the next, its runs of plain reports folded into progress digests
  (`minitrain.rpc.digest`) as the real agent's are (`digest` false in the configuration: not folded,
  the figures before progress digests). Each batch is stamped (`sent_at`) with the time its first item was
  queued, and the agent's own messages when they were, as the real agent's. Commands come down as
  `RelayedDown` items, which the agent's reader routes to the worker by stream number (`close` ends the
  worker's stream; items for a stream gone are dropped).
- "direct" (workers without an agent, and the figures before the relay): each fake worker opens its
  own channel and connection and its own WorkerStream, as a worker process dialing the coordinator does.
"""

from __future__ import annotations

import asyncio
import collections
import time
from typing import TYPE_CHECKING

from grpc import aio

from minitrain.agent.transport.relay import NOTHING_QUEUED, coalesce
from minitrain.rpc._gen import minitrain_pb2 as pb
from minitrain.rpc._gen import minitrain_pb2_grpc as pb_grpc
from minitrain.rpc.channel import CLIENT_OPTIONS
from minitrain.rpc.digest import fold_reports

if TYPE_CHECKING:
    from bench.scale.client_stats import Stats
    from bench.scale.clients import FakeAgent
    from bench.scale.fake_worker import FakeWorker

# A channel of its own per worker: without this, gRPC shares one connection among identical channels.
OPTIONS = CLIENT_OPTIONS + (("grpc.use_local_subchannel_pool", 1),)
_END = object()  # on a queue: the stream's requests end (a half-close)


async def _direct_requests(outbox: asyncio.Queue, worker: "FakeWorker", stats: "Stats"):
    """A direct worker stream's request iterator: what is put into `outbox`, until _END. A report is
    stamped here, as gRPC takes it to write: its `reported_at` (wall clock) and the worker's send time
    (perf_counter), so time the client spent before handing it over never counts as latency."""
    while True:
        item = await outbox.get()
        if item is _END:
            return
        if item.WhichOneof("body") == "report":
            item.report.reported_at = time.time()
            worker.sent_at[item.report.round] = time.perf_counter()
        stats.sent_message(1)
        yield item


class AgentUpstream:
    """A fake agent's upward FIFO: its own AgentMessages and, in order with them, the `RelayedMessage`
    items of its workers' streams. `requests()` is the AgentStream's request iterator and coalesces as
    the real agent's (`minitrain.agent.transport.relay.coalesced_requests`, with its caps) does."""

    def __init__(self, run_id: str, node_id: str, stats: "Stats", digest: bool = True):
        self._run_id, self._node_id, self._stats, self._digest = run_id, node_id, stats, digest
        self._items: collections.deque = collections.deque()
        self._ready = asyncio.Event()
        self.silent = False
        self.last_queued = time.monotonic()  # the fake agent's heartbeats skip while things are queued

    def put(self, item, queued_at: float | None = None) -> None:
        """Queue an AgentMessage (stamped by its maker), a RelayedMessage (stamped `queued_at`, None:
        now), or _END (the agent's half-close); nothing but _END once `silence()` was called."""
        if self.silent and item is not _END:
            return
        self.last_queued = time.monotonic()
        if isinstance(item, pb.RelayedMessage):
            item = (time.time() if queued_at is None else queued_at, [item])  # as the real agent queues it
        self._items.append(item)
        self._ready.set()

    def queued(self) -> list:
        """What is queued now, in order, as it was put (relayed items without their time)."""
        return [item[1][0] if type(item) is tuple else item for item in self._items]

    def silence(self) -> None:
        """The "silent" fault: from now on this agent sends nothing (no heartbeat, none of its workers'
        messages) while its connection stays open, as a host whose agent hangs or whose network drops
        its traffic; only the coordinator's lease can find it. Records when (`Stats.silenced_at`)."""
        self.silent = True
        self._items.clear()
        self._stats.silenced_at.append(time.time())

    async def requests(self):
        """Yield the queue's messages until _END, each as the real agent's request iterator makes it
        (`minitrain.agent.transport.relay.coalesce`: what is queued together goes as one message). Nothing waits
        for more items to come."""
        queued, stats = self._items, self._stats

        def take_next():
            return queued.popleft() if queued else NOTHING_QUEUED

        held = None
        while True:
            if held is None:
                while not queued:
                    self._ready.clear()
                    await self._ready.wait()
                held = queued.popleft()
            if held is _END:
                return
            message, held, count = coalesce(held, take_next, self._batch, self._bundle)
            stats.sent_message(count)
            yield message

    def _batch(self, items: list, queued_at: float) -> pb.AgentMessage:
        if self._digest:  # as the real agent does (minitrain.agent.transport.stream)
            items = fold_reports(items, self._run_id)
        return pb.AgentMessage(run_id=self._run_id, node_id=self._node_id, sent_at=queued_at,
                               relayed=pb.RelayedUp(items=items))

    def _bundle(self, messages: list) -> pb.AgentMessage:
        return pb.AgentMessage(run_id=self._run_id, node_id=self._node_id, sent_at=messages[0].sent_at,
                               batch=pb.AgentBatch(messages=messages))


class DirectLink:
    """A worker's own channel, connection and WorkerStream to the coordinator."""

    def __init__(self, worker: "FakeWorker"):
        sim = worker.sim
        self._outbox: asyncio.Queue = asyncio.Queue()
        self._channel = aio.insecure_channel(sim.address, options=OPTIONS)
        # wait_for_ready, as the real worker's stream: a connection the server closed (idle before the
        # call started, or refused while flooded) is retried instead of failing the stream.
        call = pb_grpc.CoordinatorStub(self._channel).WorkerStream(
            _direct_requests(self._outbox, worker, sim.stats), metadata=sim.metadata, wait_for_ready=True)
        self.ended: asyncio.Future = asyncio.ensure_future(self._read(call, worker))

    @staticmethod
    async def _read(call, worker: "FakeWorker") -> None:
        async for command in call:
            worker.handle(command)

    def put(self, message: pb.WorkerMessage) -> None:
        """Send one message on the stream."""
        self._outbox.put_nowait(message)

    @staticmethod
    def new_message() -> tuple[pb.WorkerMessage, pb.WorkerMessage]:
        """(what `send` takes, the WorkerMessage in it to fill in)."""
        message = pb.WorkerMessage()
        return message, message

    send = put

    def half_close(self) -> None:
        """End the requests; the coordinator answers by ending the responses (`ended`)."""
        self._outbox.put_nowait(_END)

    def abort(self) -> None:
        """The worker is gone: nothing to do here, `close()` breaks the connection."""

    async def close(self) -> None:
        """Drop the stream and its connection."""
        self.ended.cancel()
        await self._channel.close()


class RelayedLink:
    """A worker stream carried by its agent (`FakeAgent.open_relayed`): messages go up as relayed
    items on the agent's stream, commands come back routed by the agent."""

    def __init__(self, agent: "FakeAgent", worker: "FakeWorker", number: int):
        self._agent, self.worker, self.number = agent, worker, number
        self.ended: asyncio.Future = asyncio.get_running_loop().create_future()
        self._closed = False

    def put(self, message: pb.WorkerMessage) -> None:
        """Hand one message to the agent's queue."""
        self.send(pb.RelayedMessage(stream=self.number, message=message))

    def new_message(self) -> tuple[pb.RelayedMessage, pb.WorkerMessage]:
        """(what `send` takes, the WorkerMessage in it to fill in): built in place, not copied."""
        item = pb.RelayedMessage(stream=self.number)
        return item, item.message

    def send(self, item: pb.RelayedMessage) -> None:
        """Hand one relayed item (from `new_message`) to the agent's queue."""
        if not self._closed:
            self._agent.upstream.put(item)

    def half_close(self) -> None:
        """The worker's stream ends: the agent relays `closed`; the coordinator answers with `close`."""
        if not self._closed:
            self._closed = True
            self._agent.upstream.put(pb.RelayedMessage(stream=self.number, closed=True))

    abort = half_close  # a worker that is gone: its relay stream broke, which the agent relays as `closed`

    def end(self) -> None:
        """The coordinator closed the stream (or the agent's stream ended): the worker sees its stream
        finish, and the relay reports the stream's end as it does for any end (`closed`, exactly once)."""
        self.half_close()
        if not self.ended.done():
            self.ended.set_result(None)

    async def close(self) -> None:
        """The worker is done with the stream (a broken stream if it never half-closed)."""
        self.abort()
        self._agent.relayed.pop(self.number, None)
