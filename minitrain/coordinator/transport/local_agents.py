"""The coordinator's local socket for the node agent on its own machine (L2): an agent stream without gRPC.

An agent started on the driver's machine (a local host of `minitrain.hosts.launcher`) opens its stream
here instead of over gRPC on loopback. gRPC costs every message wake-ups of several threads on both
ends (beside a 2-rank loop reporting every step, about 10 ms of the agent's CPU a second and 4 of the
driver's, docs/benchmarks/index.md), and on a CPU-bound host that CPU comes out of the training. The
wire is `minitrain.rpc.local_stream`'s: frames; first a hello with AGENT_HELLO_MAGIC and the run token,
compared in constant time before anything else is read, within HELLO_TIMEOUT_S; then `AgentMessage`s
up and `AgentCommand`s down. The stream itself is served by `CoordinatorService.AgentStream`, as a gRPC
one is: the same checks, events, lease, relayed worker streams and commands. When the service refuses
the stream (another run's agent), the listener logs why and closes the connection.

The socket lives in a private directory (`minitrain.rpc.socket_directory`: mode 0700, swept when its
owner died). Everything runs on the coordinator server's asyncio loop (`minitrain.coordinator.transport.server`).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Optional

from minitrain.rpc import local_stream
from minitrain.rpc._gen import minitrain_pb2 as pb
from minitrain.rpc.socket_directory import SocketDirectory

logger = logging.getLogger("minitrain.coordinator")

DIRECTORY_PREFIX = "minitrain-coordinator-"
SOCKET_NAME = "agents.sock"
RECEIVE_BYTES = 1 << 18
# Commands written to an agent that has not read them. Writes never wait for the agent (a frozen agent must
# not hold its stream's end: the lease closes it through the same queue the commands take); an agent this
# far behind is taken as stuck, and its stream ends as broken.
MAX_UNREAD_BYTES = 64 << 20


class _LocalContext:
    """What `CoordinatorService.AgentStream` asks of a gRPC call's context, for a local stream. The peer is
    this machine (the node's address is the one its hello reports; this is only the fallback)."""

    def __init__(self):
        self.code = None
        self.details = ""

    def peer(self) -> str:
        return "ipv4:127.0.0.1:0"

    def set_code(self, code) -> None:
        self.code = code

    def set_details(self, details: str) -> None:
        self.details = details


class LocalAgentListener:
    """Serves `service`'s agent streams on a Unix socket; see the module docstring.

    On the server's loop: `await start()` (raises OSError, leaving nothing behind, when it cannot listen),
    then `address` ("local:<socket path>") is what a local agent is given; `await stop()` ends every
    stream (as a stopping gRPC server does) and removes the directory.
    """

    def __init__(self, service, token: str):
        self._service = service
        self._token = token.encode()
        self._directory = SocketDirectory(DIRECTORY_PREFIX, SOCKET_NAME)
        self._server: Optional[asyncio.AbstractServer] = None
        self._connections: set[asyncio.Task] = set()
        self._stopping = False  # set by stop(): a connection served from then on is closed at once

    @property
    def address(self) -> str:
        """What a local agent dials: "local:<directory>/agents.sock" (after `start()`)."""
        return local_stream.address(self._directory.socket_path)

    async def start(self) -> None:
        """Create the directory and listen."""
        path = self._directory.create()
        try:
            self._server = await asyncio.start_unix_server(self._serve, path=path)
        except BaseException:
            self._directory.remove()
            raise

    async def stop(self) -> None:
        """Stop listening, end every stream, remove the directory (idempotent). Connections still open,
        a pending hello or a half-open one included, are closed quietly: one debug line for them all."""
        self._stopping = True
        if self._server is not None:
            self._server.close()
            self._server = None
        connections = list(self._connections)
        for task in connections:
            task.cancel()
        if connections:
            await asyncio.gather(*connections, return_exceptions=True)
            logger.debug("closed %d local agent connection(s) still open at stop", len(connections))
        self._directory.remove()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._stopping:  # accepted just before the listener closed: nothing is served any more
            writer.close()
            return
        task = asyncio.current_task()
        self._connections.add(task)
        try:
            try:
                hello = await asyncio.wait_for(_read_hello(reader), local_stream.HELLO_TIMEOUT_S)
            except (asyncio.TimeoutError, asyncio.IncompleteReadError, local_stream.FrameError, OSError) as exc:
                logger.warning("refused a local agent stream: no valid hello within %g s (%s)",
                               local_stream.HELLO_TIMEOUT_S, type(exc).__name__)
                return
            if not local_stream.hello_matches(hello, local_stream.AGENT_HELLO_MAGIC, self._token):
                logger.warning("refused a local agent stream: it did not present the run's token")
                return
            context = _LocalContext()
            commands = self._service.AgentStream(_messages(reader), context)
            try:
                async for command in commands:
                    writer.write(local_stream.frame(command.SerializeToString()))
                    if writer.transport.get_write_buffer_size() > MAX_UNREAD_BYTES:
                        logger.warning("ended a local agent stream: the agent left %d bytes of commands unread",
                                       writer.transport.get_write_buffer_size())
                        writer.transport.abort()
                        return
            finally:
                await commands.aclose()
            if context.details:
                logger.warning("ended a local agent stream: %s", context.details)
            writer.write_eof()
        except (ConnectionError, OSError):
            pass  # the agent went: its stream's end was reported by AgentStream
        except asyncio.CancelledError:
            # stop() ends every connection by cancelling its task. The task must still end normally:
            # asyncio's streams (3.11) log a traceback for a connection task that ends cancelled.
            if not self._stopping:
                raise
        finally:
            writer.close()
            self._connections.discard(task)


async def _read_hello(reader: asyncio.StreamReader) -> bytes:
    """The hello frame's payload; FrameError for one over MAX_HELLO_BYTES (refused before it is read)."""
    size = int.from_bytes(await reader.readexactly(4), "big")
    if 4 + size > local_stream.MAX_HELLO_BYTES:
        raise local_stream.FrameError(f"a hello of {size} bytes")
    return await reader.readexactly(size)


async def _messages(reader: asyncio.StreamReader):
    """The agent's messages, in order, until it ends its side. Raises FrameError for bytes that are not
    frames (an oversized frame, an end inside one) and DecodeError for a frame that is not an
    AgentMessage: the service then ends the stream as broken."""
    frames = local_stream.FrameReader()
    while True:
        data = await reader.read(RECEIVE_BYTES)
        if not data:
            if frames.pending:
                raise local_stream.FrameError("the stream ended inside a frame")
            return
        for payload in frames.feed(data):
            yield pb.AgentMessage.FromString(payload)
