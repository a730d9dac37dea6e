"""The agent's relay of its workers' streams: one connection and batched messages per host (L2).

A worker on this node opens its `Coordinator.WorkerStream` on the agent instead of the coordinator:
`RelayServer` serves that one RPC on a Unix socket in a fresh directory only the agent's user can
enter (0700), plaintext (it never leaves the machine), and refuses every call without the run token
before its first message is parsed (the coordinator's own interceptor, `minitrain.rpc.auth`). The
worker is unchanged: it only dials another address.

Each accepted stream gets a number (1, 2, ... never reused). Upward, every message the worker sends
becomes `RelayedMessage(stream=n, message=m)`, handed in the worker's order to `send_up`, and when the
stream ends for any reason (the worker half-closed, was killed, cancelled, the coordinator closed it,
the relay stopped) one `RelayedMessage(stream=n, closed=True)` follows, exactly once. The agent's
stream (minitrain.agent.stream) puts these on the same FIFO as the agent's own messages, so a worker's
Done goes up before its WorkerExited.
`coalesced_requests` then merges consecutive relayed items into one `RelayedUp` ("Nagle without a
timer": an idle queue sends an item at once; under load batches grow by themselves).

Downward, `deliver(RelayedDown)` routes each item: a command to that stream's response stream (the
worker reads it), `close` ends that response stream; an item for a stream that is gone is dropped.
When the worker half-closes, the relay ends its response stream itself after the commands already
routed to it, as the coordinator does for a direct stream: the worker's `close()` never waits on a
round trip to the coordinator, and the coordinator learns of the end from the `closed` item.

An agent killed outright (SIGKILL, the OOM killer) cannot remove its directory. Each directory holds
an `owner.lock` file that its agent keeps flock'ed for its life (the kernel drops the lock when the
process dies, whatever kills it), so `start()` first removes the relay directories of this user whose
lock is free: those of dead agents, and only their socket, lock file and the then empty directory.

The server runs grpc.aio on a thread of its own (one event loop for all streams, no thread per
worker); `send_up` is called on that thread and must not block.
"""

from __future__ import annotations

import asyncio
import fcntl
import itertools
import logging
import os
import queue
import tempfile
import threading
from typing import Callable, Iterator, Optional

from grpc import aio

from minitrain.rpc._gen import minitrain_pb2 as pb
from minitrain.rpc._gen import minitrain_pb2_grpc as pb_grpc
from minitrain.rpc.auth import AioTokenAuthInterceptor
from minitrain.rpc.channel import END_OF_STREAM, server_options

logger = logging.getLogger("minitrain.agent")

DIRECTORY_PREFIX = "minitrain-relay-"
SOCKET_NAME = "relay.sock"
LOCK_NAME = "owner.lock"  # flock'ed by the owning agent for its life: free means the owner is gone
MAX_SOCKET_PATH = 107  # sun_path holds 108 bytes, the last one a NUL
STOP_GRACE_S = 0.5
START_TIMEOUT_S = 30.0
# A batch of relayed items sent up as one AgentMessage stays below these (one larger item goes alone).
MAX_BATCH_BYTES = 4 << 20
MAX_BATCH_ITEMS = 10_000

_CLOSE = object()  # on a stream's queue: end its response stream after what is queued before


class _Servicer(pb_grpc.CoordinatorServicer):
    """Serves WorkerStream for the relay; every other RPC of the service is UNIMPLEMENTED here."""

    def __init__(self, relay: "RelayServer"):
        # The relay's async generator itself: gRPC tells a streaming handler by its function kind.
        self.WorkerStream = relay._serve_stream


class RelayServer:
    """The relay of this node's worker streams; see the module docstring.

    `token` is the run token every caller must present; `send_up(item)` receives each
    `pb.RelayedMessage`, in order, on the relay's own thread (it must return at once: a queue put).
    `start()` then `address` ("unix:/..."), `deliver()` from any thread, `stop()` once at the end.
    """

    def __init__(self, token: str, send_up: Callable[[pb.RelayedMessage], None]):
        self._token = token
        self._send_up = send_up
        self._numbers = itertools.count(1)
        self._streams: dict[int, asyncio.Queue] = {}  # touched on the loop's thread only
        self._directory: Optional[str] = None
        self._lock_fd = -1
        self._socket_path: Optional[str] = None
        self._thread: Optional[threading.Thread] = None
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._stopping: Optional[asyncio.Event] = None
        self._ready = threading.Event()
        self._startup_error: Optional[BaseException] = None

    @property
    def address(self) -> str:
        """What a worker dials: "unix:<directory>/relay.sock" (only after `start()`)."""
        if self._socket_path is None:
            raise RuntimeError("the relay has not been started")
        return f"unix:{self._socket_path}"

    @property
    def directory(self) -> Optional[str]:
        """The private directory holding the socket (None before `start()` and after `stop()`)."""
        return self._directory

    def start(self) -> "RelayServer":
        """Create the directory (0700), bind the socket, serve; returns once the server listens.

        Raises (and leaves nothing behind) when it cannot bind. Call once.
        """
        if self._thread is not None:
            raise RuntimeError("the relay was started already")
        remove_stale_directories(tempfile.gettempdir())
        self._directory = tempfile.mkdtemp(prefix=DIRECTORY_PREFIX)  # mode 0700, ours alone
        self._lock_fd = _hold_owner_lock(self._directory)
        self._socket_path = os.path.join(self._directory, SOCKET_NAME)
        if len(self._socket_path.encode()) > MAX_SOCKET_PATH:
            path = self._socket_path
            self._remove_directory()
            raise OSError(f"the relay's socket path {path!r} is longer than a Unix socket allows "
                          f"({MAX_SOCKET_PATH} bytes); set TMPDIR to a shorter directory")
        self._thread = threading.Thread(target=self._run, name="agent-relay", daemon=True)
        self._thread.start()
        if not self._ready.wait(START_TIMEOUT_S):
            self._startup_error = TimeoutError(f"the relay did not start within {START_TIMEOUT_S:g} s")
        if self._startup_error is not None:
            self.stop()
            raise self._startup_error
        return self

    def deliver(self, down: pb.RelayedDown) -> None:
        """Route the coordinator's items, in order, to their worker streams (from any thread).

        `command` goes to that stream's response stream; `close` ends it after what was routed
        before. Items for a stream that ended (or never existed) are dropped, as is everything once
        the relay stopped.
        """
        loop = self._loop
        if loop is None or not down.items:
            return
        try:
            loop.call_soon_threadsafe(self._route, list(down.items))
        except RuntimeError:
            pass  # the loop is closed: the relay stopped, every stream ended

    def stop(self) -> None:
        """End every stream (each sends its `closed` item), stop the server, join its thread, and
        remove the socket and the directory `start()` made (nothing else). Idempotent."""
        loop, stopping = self._loop, self._stopping
        if loop is not None and stopping is not None:
            try:
                loop.call_soon_threadsafe(stopping.set)
            except RuntimeError:
                pass  # the loop ended already
        if self._thread is not None:
            self._thread.join(timeout=START_TIMEOUT_S)
        self._remove_directory()

    # ------------------------------------------------------------------ the loop's thread

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        try:
            loop.run_until_complete(self._serve())
        finally:
            loop.close()

    async def _serve(self) -> None:
        try:
            self._stopping = asyncio.Event()
            server = aio.server(interceptors=[AioTokenAuthInterceptor(self._token)], options=server_options())
            pb_grpc.add_CoordinatorServicer_to_server(_Servicer(self), server)
            if not server.add_insecure_port(f"unix:{self._socket_path}"):
                raise OSError(f"the relay could not bind unix:{self._socket_path}")
            await server.start()
            self._loop = asyncio.get_running_loop()
        except BaseException as exc:  # surfaced by start()
            self._startup_error = exc
            self._ready.set()
            return
        self._ready.set()
        await self._stopping.wait()
        for stream in self._streams.values():
            stream.put_nowait(_CLOSE)
        await server.stop(grace=STOP_GRACE_S)
        self._loop = None  # deliver() drops from now on

    def _route(self, items: list) -> None:
        for item in items:
            stream = self._streams.get(item.stream)
            if stream is not None:
                stream.put_nowait(_CLOSE if item.close else item.command)

    async def _serve_stream(self, request_iterator, _context):
        number = next(self._numbers)
        responses: asyncio.Queue = asyncio.Queue()
        self._streams[number] = responses
        reader = asyncio.ensure_future(self._read(number, request_iterator, responses))
        try:
            while True:
                command = await responses.get()
                if command is _CLOSE:
                    return
                yield command
        finally:
            # Runs on every end (returned, cancelled, broken). The reader calls send_up synchronously
            # right after each message it reads, so once it is cancelled nothing of this stream can
            # follow the closing item.
            reader.cancel()
            del self._streams[number]
            self._send_up(pb.RelayedMessage(stream=number, closed=True))

    async def _read(self, number: int, request_iterator, responses: asyncio.Queue) -> None:
        send_up = self._send_up
        try:
            async for message in request_iterator:
                send_up(pb.RelayedMessage(stream=number, message=message))
        except asyncio.CancelledError:
            raise
        except Exception:  # a broken connection: the stream ends like a half-closed one
            pass
        responses.put_nowait(_CLOSE)

    def _remove_directory(self) -> None:
        directory, self._directory = self._directory, None
        if directory is not None:
            _remove_relay_directory(directory)
        if self._lock_fd >= 0:
            os.close(self._lock_fd)  # after the removal: a sweeper never sees our directory ownerless
            self._lock_fd = -1


def _hold_owner_lock(directory: str) -> int:
    """Create `directory`/owner.lock already locked (made under another name, locked, then renamed:
    a sweeper never finds it unlocked while we live) and return its descriptor, held for our life."""
    temporary = os.path.join(directory, LOCK_NAME + ".new")
    fd = os.open(temporary, os.O_CREAT | os.O_EXCL | os.O_RDWR | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.rename(temporary, os.path.join(directory, LOCK_NAME))
    return fd


def _remove_relay_directory(directory: str) -> None:
    """Remove the relay's own files in `directory`, then the directory if that left it empty."""
    for name in (SOCKET_NAME, LOCK_NAME):
        try:
            os.unlink(os.path.join(directory, name))
        except FileNotFoundError:
            pass
    try:
        os.rmdir(directory)  # only an empty one: whatever else is there is not ours to delete
    except FileNotFoundError:
        pass
    except OSError as exc:
        logger.warning("could not remove the relay directory %s: %s", directory, exc)


def remove_stale_directories(parent: str) -> list[str]:
    """Remove the relay directories in `parent` left by dead agents of this user; return them.

    A directory counts only when it is named like ours, is a real directory owned by this user, and
    has an owner.lock that nobody holds (its agent died: the kernel released the lock). A live
    agent's lock is held, so its directory is never touched; a directory without the lock file is
    being created, or is not ours, and is left alone.
    """
    removed = []
    try:
        names = os.listdir(parent)
    except OSError:
        return removed
    for name in names:
        if not name.startswith(DIRECTORY_PREFIX):
            continue
        directory = os.path.join(parent, name)
        try:
            info = os.lstat(directory)
            if not os.path.isdir(directory) or os.path.islink(directory) or info.st_uid != os.getuid():
                continue
            fd = os.open(os.path.join(directory, LOCK_NAME), os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)  # held: its agent lives
            continue
        try:
            _remove_relay_directory(directory)
            removed.append(directory)
        finally:
            os.close(fd)
    return removed


def coalesced_requests(outbox: "queue.SimpleQueue", batch: Callable[[list, float], object]) -> Iterator[object]:
    """The agent's request iterator: what is put into `outbox`, until END_OF_STREAM, with runs of
    relayed items merged.

    A relayed item is queued as `(queued_at, pb.RelayedMessage)` (`queued_at`: the wall clock when it
    was queued). One taken from the queue takes along every relayed item already queued right behind
    it, up to MAX_BATCH_ITEMS and MAX_BATCH_BYTES (serialized), and `batch(items, queued_at)` (their
    messages in order, and the first one's `queued_at`: how long the batch waited, for the peer's
    lease) is yielded in their place. Anything else is yielded as it is, and ends a run: nothing is
    ever reordered. Nothing waits for more items to come: an idle queue sends an item at once.
    """
    held = None  # taken from the queue while filling a batch; goes next
    while True:
        item = held if held is not None else outbox.get()
        held = None
        if item is END_OF_STREAM:
            return
        if type(item) is not tuple:
            yield item
            continue
        queued_at, first = item
        items, size = [first], first.ByteSize()
        while len(items) < MAX_BATCH_ITEMS:
            try:
                following = outbox.get_nowait()
            except queue.Empty:
                break
            if type(following) is not tuple:
                held = following
                break
            following_size = following[1].ByteSize()
            if size + following_size > MAX_BATCH_BYTES:
                held = following
                break
            items.append(following[1])
            size += following_size
        yield batch(items, queued_at)
