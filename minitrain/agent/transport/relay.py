"""The agent's relay of its workers' streams: one connection and batched messages per host (L2).

A worker on this node does not dial the coordinator: it opens its stream on the agent's relay, a Unix
socket in a fresh directory only the agent's user can enter (0700), and speaks the local stream
protocol of `minitrain.rpc.local_stream` (not gRPC: a plain report is one write on the worker's side
and wakes nobody here). The relay refuses a connection whose hello does not carry the run token
(compared in constant time before anything else is parsed) or does not come within HELLO_TIMEOUT_S.

Each accepted stream gets a number (1, 2, ... never reused). The relay reads what its workers wrote
when `minitrain.rpc.local_stream` says (every READ_INTERVAL_S while reports flow, LINGER_S after a plain
ring, at once after an urgent one, not at all on a quiet host), while a frame it was rung for is half
read, and when
`drain()` asks. Upward, every message a
worker sent becomes `RelayedMessage(stream=n, message=m)`, in the worker's order; what one read finds on
every stream is handed to `send_up` as one list, so the agent's stream carries it up as one message for
the whole host. When the stream ends for any reason (the worker half-closed, was
killed, its bytes were not frames, the coordinator closed it, the relay stopped) one
`RelayedMessage(stream=n, closed=True)` follows, exactly once. The agent's stream
(minitrain.agent.transport.stream) puts these on the same FIFO as the agent's own messages, and asks `drain()`
before it reports a worker's exit, so a worker's last messages (its Done, or the reports of a worker
killed outright, which the kernel kept) go up before its WorkerExited.
`coalesced_requests` then merges consecutive relayed items into one `RelayedUp`.

Downward, `deliver(RelayedDown)` routes each item: a command to that stream's socket, `close` ends
the relay's side of it after what was routed before (and `closed` goes up); an item for a stream that
is gone is dropped. When the worker half-closes, the relay ends its side itself after the commands
already routed to it, as the coordinator does for a direct stream: the worker's `close()` never waits
on a round trip to the coordinator, and the coordinator learns of the end from the `closed` item.

Each worker holds a lease on its agent through its stream: the relay sends `local_stream.HEARTBEAT` to a
stream it sent nothing else for `heartbeat_interval_s` (`minitrain.lease.HEARTBEAT_INTERVAL_S`), so a
worker hears from a live agent at least that often, and one that hears nothing for LEASE_TIMEOUT_S takes
its agent for frozen and ends itself (`minitrain.worker.transport.local_client`). Commands flowing down
need no heartbeat. A round of heartbeats serves every stream quiet for half an interval or more, so the
relay wakes for them at most twice an interval, once on a quiet host (one `send` per worker).

The socket lives in a private directory (`minitrain.rpc.socket_directory`: mode 0700, an owner lock held
for the agent's life, so `start()` first removes the relay directories of this user's dead agents).

The relay runs on a thread of its own (one selector for every stream, no thread per worker);
`send_up` is called on that thread and must not block.
"""

from __future__ import annotations

import itertools
import logging
import os
import queue
import selectors
import socket
import threading
import time
from typing import Callable, Iterator, Optional

from google.protobuf.message import DecodeError

from minitrain.lease import HEARTBEAT_INTERVAL_S
from minitrain.rpc import local_stream, socket_directory
from minitrain.rpc._gen import minitrain_pb2 as pb
from minitrain.rpc.channel import END_OF_STREAM

logger = logging.getLogger("minitrain.agent")

DIRECTORY_PREFIX = "minitrain-relay-"
SOCKET_NAME = "relay.sock"
START_TIMEOUT_S = 30.0
DRAIN_TIMEOUT_S = 2.0
RECEIVE_BYTES = 1 << 18
LISTEN_BACKLOG = 1024
# A batch of relayed items sent up as one AgentMessage stays below these (one larger item goes alone).
MAX_BATCH_BYTES = 4 << 20
MAX_BATCH_ITEMS = 10_000

_STREAM_FIELD = pb.RelayedMessage.DESCRIPTOR.fields_by_name["stream"].number
_MESSAGE_FIELD = pb.RelayedMessage.DESCRIPTOR.fields_by_name["message"].number


class _Stream:
    """One worker's stream on the relay (the relay's thread only)."""

    __slots__ = ("number", "socket", "doorbell", "frames", "out", "prefix", "up_closed", "down_closing",
                 "rung", "events", "sent_at")

    def __init__(self, number: int, sock: socket.socket, doorbell: int):
        self.number = number
        self.socket = sock
        self.doorbell = doorbell
        self.frames = local_stream.FrameReader()
        self.out = bytearray()  # commands not yet taken by the worker's socket
        # Each upward item is this prefix plus the worker's message as a field: parsed once, not copied.
        self.prefix = local_stream.varint(_STREAM_FIELD << 3) + local_stream.varint(number)
        self.up_closed = False  # its `closed` went up: nothing more of it goes up
        self.down_closing = False  # the coordinator closed it: end our side once `out` is sent
        # Rung urgently and a frame is still half read: the worker waits on it (or on its send, which
        # rings when the socket's buffer is full), so the socket is watched until the frame's end.
        self.rung = False
        self.events = 0  # what the selector watches its socket for (0: not registered)
        self.sent_at = time.monotonic()  # when a command or a heartbeat was last routed to it


class _Hello:
    """A connection whose hello has not come in full yet."""

    __slots__ = ("socket", "deadline", "data", "fds")

    def __init__(self, sock: socket.socket):
        self.socket = sock
        self.deadline = time.monotonic() + local_stream.HELLO_TIMEOUT_S
        self.data = bytearray()
        self.fds: list[int] = []


class RelayServer:
    """The relay of this node's worker streams; see the module docstring.

    `token` is the run token every worker must present; `send_up(items)` receives the
    `pb.RelayedMessage`s, in order, a list at a time, on the relay's own thread (it must return at once:
    a queue put). `heartbeat_interval_s` (> 0): how often a stream sent nothing else gets a heartbeat
    (the workers' lease on this agent; shorter only in tests).
    `start()` then `address` ("local:/..."), `deliver()` and `drain()` from any thread, `stop()` once at
    the end.
    """

    def __init__(self, token: str, send_up: Callable[[list], None],
                 heartbeat_interval_s: float = HEARTBEAT_INTERVAL_S):
        if not heartbeat_interval_s > 0:
            raise ValueError(f"heartbeat_interval_s={heartbeat_interval_s!r} must be a number of seconds "
                             "above 0 (the default is minitrain.lease.HEARTBEAT_INTERVAL_S)")
        self._token = token.encode()
        self._heartbeat_interval_s = heartbeat_interval_s
        self._send_up = send_up
        self._up: list = []  # what the relay's thread read and has not handed to send_up yet
        self._numbers = itertools.count(1)
        self._directory = socket_directory.SocketDirectory(DIRECTORY_PREFIX, SOCKET_NAME)
        self._socket_path: Optional[str] = None
        self._thread: Optional[threading.Thread] = None
        self._listener: Optional[socket.socket] = None
        self._wake_read = self._wake_write = -1
        # Handed from other threads to the relay's, under the condition's lock.
        self._cond = threading.Condition()
        self._down: list = []
        self._drains_asked = 0
        self._drains_done = 0
        self._stopping = False
        self._running = False
        # The relay's thread only.
        self._selector: Optional[selectors.BaseSelector] = None
        self._streams: dict[int, _Stream] = {}
        self._hellos: dict[int, _Hello] = {}  # by socket fd
        # Monotonic: when a read last found bytes (or an end), taken after it; when the latest read of
        # every stream began. Quiet (no reading on the interval) once a read that began QUIET_AFTER_S
        # after the last bytes found nothing: a starved relay reads once more before it goes quiet.
        self._last_data = 0.0
        self._last_read = 0.0

    @property
    def address(self) -> str:
        """What a worker dials: "local:<directory>/relay.sock" (only after `start()`)."""
        if self._socket_path is None:
            raise RuntimeError("the relay has not been started")
        return local_stream.address(self._socket_path)

    @property
    def directory(self) -> Optional[str]:
        """The private directory holding the socket (None before `start()` and after `stop()`)."""
        return self._directory.path

    def start(self) -> "RelayServer":
        """Create the directory (0700), bind the socket, serve; returns once the socket listens.

        Raises (and leaves nothing behind) when it cannot bind. Call once.
        """
        if self._thread is not None:
            raise RuntimeError("the relay was started already")
        self._socket_path = self._directory.create()
        try:
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
            try:
                listener.bind(self._socket_path)
                listener.listen(LISTEN_BACKLOG)
                listener.setblocking(False)
            except BaseException:
                listener.close()
                raise
        except OSError as exc:
            self._remove_directory()
            raise OSError(f"the relay could not listen on {self._socket_path}: {exc}") from exc
        self._listener = listener
        self._wake_read, self._wake_write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._selector = selectors.DefaultSelector()
        self._selector.register(listener, selectors.EVENT_READ, ("accept", None))
        self._selector.register(self._wake_read, selectors.EVENT_READ, ("wake", None))
        self._running = True
        self._thread = threading.Thread(target=self._run, name="agent-relay", daemon=True)
        self._thread.start()
        return self

    def deliver(self, down: pb.RelayedDown) -> None:
        """Route the coordinator's items, in order, to their worker streams (from any thread).

        `command` goes to that stream's socket; `close` ends the relay's side of it after what was
        routed before. Items for a stream that ended (or never existed) are dropped, as is everything
        once the relay stopped.
        """
        if not down.items:
            return
        with self._cond:
            if not self._running:
                return
            self._down.extend(down.items)
        self._poke()

    def drain(self, timeout_s: float = DRAIN_TIMEOUT_S) -> bool:
        """Have the relay read what every worker wrote so far and hand it to `send_up`; returns once it
        did (True), or False after `timeout_s` or when the relay is not running (nothing to read)."""
        with self._cond:
            if not self._running or threading.current_thread() is self._thread:
                return False
            self._drains_asked += 1
            ticket = self._drains_asked
        self._poke()
        with self._cond:
            return self._cond.wait_for(lambda: self._drains_done >= ticket or not self._running, timeout_s) \
                and self._drains_done >= ticket

    def stop(self) -> None:
        """Read what the workers wrote, end every stream (each sends its `closed` item), join the
        thread, and remove the socket and the directory `start()` made (nothing else). Idempotent."""
        with self._cond:
            self._stopping = True
        if self._thread is not None:
            self._poke()
            self._thread.join(timeout=START_TIMEOUT_S)
        self._remove_directory()

    def _poke(self) -> None:
        with self._cond:  # the relay's end closes the pipe under this lock: never a reused descriptor
            if self._wake_write < 0:
                return
            try:
                os.write(self._wake_write, b"!")
            except BlockingIOError:
                pass  # the pipe is full: a wake-up is pending anyway

    # ------------------------------------------------------------------ the relay's thread

    def _run(self) -> None:
        selector = self._selector
        interval_due: Optional[float] = None  # the next read on the interval (None: quiet, or no streams)
        linger_due: Optional[float] = None  # the read a plain ring asked for
        self._last_data = self._last_read = time.monotonic()
        heartbeat_due = self._last_read  # the next round of heartbeats, while there are streams
        try:
            while True:
                now = time.monotonic()
                if self._streams and self._last_read - self._last_data < local_stream.QUIET_AFTER_S:
                    if interval_due is None:
                        interval_due = now + local_stream.READ_INTERVAL_S
                else:
                    interval_due = None  # quiet: the next write rings (minitrain.rpc.local_stream)
                dues = [due for due in (interval_due, linger_due) if due is not None]
                dues += [hello.deadline for hello in self._hellos.values()]
                if self._streams:
                    dues.append(heartbeat_due)
                timeout = max(0.0, min(dues) - now) if dues else None
                read_now = False
                for key, mask in selector.select(timeout):
                    kind, target = key.data
                    if kind == "stream":
                        self._on_stream_event(target, mask)
                    elif kind == "doorbell":
                        rings = _take_rings(target.doorbell)
                        if local_stream.is_urgent(rings):
                            read_now = True
                            target.rung = True
                        elif rings and linger_due is None:  # plain: the host's other reports may follow
                            linger_due = time.monotonic() + local_stream.LINGER_S
                    elif kind == "hello":
                        self._on_hello(target)
                    elif kind == "accept":
                        self._accept()
                    else:  # wake
                        _clear_pipe(self._wake_read)
                with self._cond:
                    down, self._down = self._down, []
                    stopping = self._stopping
                    drain_ticket = self._drains_asked if self._drains_asked > self._drains_done else 0
                for item in down:
                    self._route(item)
                now = time.monotonic()
                due = min((d for d in (interval_due, linger_due) if d is not None), default=None)
                if read_now or drain_ticket or stopping or (due is not None and now >= due):
                    self._read_all()
                    linger_due = None
                    interval_due = now + local_stream.READ_INTERVAL_S if self._streams else None
                self._hand_up()
                if now >= heartbeat_due:
                    heartbeat_due = self._heartbeat(now)
                if drain_ticket:
                    with self._cond:
                        self._drains_done = max(self._drains_done, drain_ticket)
                        self._cond.notify_all()
                if stopping:
                    return
                if self._hellos:
                    self._expire_hellos(now)
        except BaseException:  # a bug here must not leave workers waiting in silence
            logger.exception("the relay failed; its streams end")
        finally:
            self._shut_down()

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # out of descriptors: the worker's connect fails; not ours to die of
                logger.warning("the relay could not accept a worker's stream: %s", exc)
                return
            sock.setblocking(False)
            hello = _Hello(sock)
            self._hellos[sock.fileno()] = hello
            self._selector.register(sock, selectors.EVENT_READ, ("hello", hello))

    def _on_hello(self, hello: _Hello) -> None:
        try:
            data, fds, _, _ = socket.recv_fds(hello.socket, local_stream.MAX_HELLO_BYTES, 1)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data, fds = b"", []
        hello.fds.extend(fds)
        if not data:
            self._refuse(hello, "it closed before its hello")
            return
        hello.data += data
        if len(hello.data) < 4:
            return
        size = int.from_bytes(hello.data[:4], "big")
        if 4 + size > local_stream.MAX_HELLO_BYTES:  # refused before it is buffered
            self._refuse(hello, "its hello is too long")
            return
        if len(hello.data) < 4 + size:
            return
        payload, rest = bytes(hello.data[4:4 + size]), bytes(hello.data[4 + size:])
        if not local_stream.hello_matches(payload, local_stream.HELLO_MAGIC, self._token):
            self._refuse(hello, "it did not present the run's token")
            return
        if len(hello.fds) != 1:
            self._refuse(hello, "it sent no doorbell with its hello")
            return
        del self._hellos[hello.socket.fileno()]
        self._selector.unregister(hello.socket)
        stream = _Stream(next(self._numbers), hello.socket, hello.fds[0])
        self._streams[stream.number] = stream
        self._last_data = time.monotonic()  # a new stream: read on the interval again
        self._selector.register(stream.doorbell, selectors.EVENT_READ, ("doorbell", stream))
        if rest:
            self._take(stream, rest)
        self._read(stream)

    def _refuse(self, hello: _Hello, why: str) -> None:
        logger.warning("the relay refused a worker's stream: %s", why)
        self._hellos.pop(hello.socket.fileno(), None)
        self._selector.unregister(hello.socket)
        hello.socket.close()
        for fd in hello.fds:
            os.close(fd)

    def _expire_hellos(self, now: float) -> None:
        for hello in [h for h in self._hellos.values() if h.deadline <= now]:
            self._refuse(hello, f"no hello within {local_stream.HELLO_TIMEOUT_S:g} s")

    def _read_all(self) -> None:
        self._last_read = time.monotonic()
        for stream in list(self._streams.values()):
            self._read(stream)

    def _read(self, stream: _Stream) -> None:
        """Read what `stream`'s worker wrote and send it up; end the stream at its end."""
        while stream.number in self._streams:
            try:
                data = stream.socket.recv(RECEIVE_BYTES)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                data = b""  # reset: the worker is gone, as at its end
            self._last_data = time.monotonic()
            if not data:
                if stream.frames.pending and not stream.up_closed:
                    logger.warning("relayed stream %d ended inside a message; that message is dropped",
                                   stream.number)
                self._end(stream)
                return
            self._take(stream, data)
        if not stream.frames.pending:
            stream.rung = False
        self._watch(stream)

    def _take(self, stream: _Stream, data: bytes) -> None:
        """Send up the messages `data` completes (nothing, once the stream's `closed` went up)."""
        try:
            frames = stream.frames.feed(data)
        except local_stream.FrameError as exc:
            logger.warning("relayed stream %d sent bytes that are not frames (%s); it ends", stream.number, exc)
            self._end(stream)
            return
        if stream.up_closed:
            return
        up, prefix = self._up, stream.prefix
        for payload in frames:
            try:
                item = pb.RelayedMessage.FromString(prefix + local_stream.message_field(_MESSAGE_FIELD, payload))
            except DecodeError:
                logger.warning("relayed stream %d sent a message that does not parse; it ends", stream.number)
                self._end(stream)
                return
            up.append(item)

    def _route(self, item: pb.RelayedCommand) -> None:
        stream = self._streams.get(item.stream)
        if stream is None or stream.down_closing:
            return
        if item.close:
            stream.down_closing = True
            self._close_up(stream)  # nothing of it goes up after the coordinator's close
        else:
            stream.out += local_stream.frame(item.command.SerializeToString())
            stream.sent_at = time.monotonic()
        self._flush(stream)

    def _heartbeat(self, now: float) -> float:
        """Send HEARTBEAT to every stream routed nothing for half an interval or more; returns when the
        next round is due: an interval after the longest-quiet stream's last message, so that none goes
        a whole interval without one (see the module docstring), and at least half an interval away."""
        interval = self._heartbeat_interval_s
        next_due = now + interval
        for stream in self._streams.values():
            if stream.down_closing:
                continue  # its end is under way: the worker reads it
            if now - stream.sent_at >= interval / 2:
                stream.out += local_stream.HEARTBEAT
                stream.sent_at = now
                self._flush(stream)
            next_due = min(next_due, stream.sent_at + interval)
        return next_due

    def _flush(self, stream: _Stream) -> None:
        """Send what the worker's socket takes now; end our side once a closing stream's out is sent."""
        while stream.out:
            try:
                sent = stream.socket.send(stream.out)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                stream.out.clear()  # the worker is gone; its end is read next
                break
            del stream.out[:sent]
        if stream.down_closing and not stream.out:
            try:
                stream.socket.shutdown(socket.SHUT_WR)
            except OSError:
                pass
        self._watch(stream)

    def _on_stream_event(self, stream: _Stream, mask: int) -> None:
        if mask & selectors.EVENT_WRITE:
            self._flush(stream)
        if mask & selectors.EVENT_READ and stream.number in self._streams:
            self._read(stream)

    def _watch(self, stream: _Stream) -> None:
        """Watch the socket for reading while a frame the worker rang for is half read or the coordinator
        closed the stream (until the worker's end), and for writing while commands wait; not at all
        otherwise. A frame half read without a ring (a read met a tight loop mid-send) is read to its end
        on the next interval: the relay is not quiet, having just found bytes; watching it made every
        later send of that loop wake the relay."""
        if stream.number not in self._streams:
            return
        events = 0
        if (stream.frames.pending and stream.rung) or stream.down_closing:
            events |= selectors.EVENT_READ
        if stream.out:
            events |= selectors.EVENT_WRITE
        if events == stream.events:
            return
        if not events:
            self._selector.unregister(stream.socket)
        elif not stream.events:
            self._selector.register(stream.socket, events, ("stream", stream))
        else:
            self._selector.modify(stream.socket, events, ("stream", stream))
        stream.events = events

    def _close_up(self, stream: _Stream) -> None:
        if not stream.up_closed:
            stream.up_closed = True
            self._up.append(pb.RelayedMessage(stream=stream.number, closed=True))

    def _hand_up(self) -> None:
        """Hand what was read to `send_up`, as one list (one wake-up of the agent's sender)."""
        if self._up:
            up, self._up = self._up, []
            self._send_up(up)

    def _end(self, stream: _Stream) -> None:
        """The worker's side ended (or broke): `closed` goes up, then our side ends and the stream goes.
        Commands the worker's socket did not take are dropped."""
        self._close_up(stream)
        if stream.out:
            self._flush(stream)  # a half-closed worker still reads: what was routed before reaches it
        del self._streams[stream.number]
        if stream.events:
            self._selector.unregister(stream.socket)
        self._selector.unregister(stream.doorbell)
        try:
            stream.socket.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        stream.socket.close()
        os.close(stream.doorbell)

    def _shut_down(self) -> None:
        """The relay's thread ends: every stream ends, every descriptor closes."""
        with self._cond:
            self._running = False
            self._down = []
            self._cond.notify_all()
        try:
            self._read_all()
        except BaseException:
            logger.exception("the relay could not read its streams' last messages")
        for stream in list(self._streams.values()):
            self._end(stream)
        self._hand_up()
        for hello in list(self._hellos.values()):
            self._refuse(hello, "the relay stopped")
        self._selector.close()
        self._listener.close()
        with self._cond:
            os.close(self._wake_read)
            os.close(self._wake_write)
            self._wake_read = self._wake_write = -1

    def _remove_directory(self) -> None:
        self._directory.remove()


def _take_rings(eventfd: int) -> int:
    """The doorbell's summed rings since the last take (0 when none)."""
    try:
        return os.eventfd_read(eventfd)
    except (BlockingIOError, InterruptedError):
        return 0


def _clear_pipe(fd: int) -> None:
    try:
        while os.read(fd, 4096):
            pass
    except (BlockingIOError, InterruptedError):
        pass


NOTHING_QUEUED = object()  # what a `coalesce` caller's take_next() returns when its queue is empty


def coalesce(first, take_next: Callable[[], object], batch: Callable[[list, float], object],
             bundle: Callable[[list], object]) -> tuple[object, object, int]:
    """One upward message of an agent: `first` (an entry taken from its queue) and every entry
    `take_next()` gives right behind it, up to MAX_BATCH_ITEMS items and MAX_BATCH_BYTES (serialized; an
    entry over them goes alone). Returns (the message, the entry taken but left for the next message or
    None, how many items the message carries).

    Entries are the agent's own messages (`pb.AgentMessage`) and relayed items, queued as
    `(queued_at, [pb.RelayedMessage, ...])` (`queued_at`: the wall clock when they were queued).
    `take_next()` returns the next entry without waiting, or NOTHING_QUEUED; an entry that is neither
    (the queue's end marker) ends the message and is left for the caller. Each run of consecutive
    relayed entries becomes `batch(items, queued_at)` (their items in order; the run's first
    `queued_at`: how long it waited, for the peer's lease); when that leaves one message, it is the
    message; several go as `bundle(messages)` (an `AgentBatch`), in their order. Nothing is reordered,
    and nothing waits for more entries to come: an idle queue sends an entry at once. A bundle saves the
    coordinator a message's wake-ups per entry: at a start or a stop, every host queues a spawned or an
    exited message per worker between its relayed streams' items.
    """
    messages: list = []
    run_items: Optional[list] = None
    run_queued_at = 0.0
    count = size = 0
    entry, held = first, None
    while True:
        relayed = type(entry) is tuple
        if relayed:
            entry_count, entry_size = len(entry[1]), sum(item.ByteSize() for item in entry[1])
        else:
            entry_count, entry_size = 1, entry.ByteSize()
        if count and (count + entry_count > MAX_BATCH_ITEMS or size + entry_size > MAX_BATCH_BYTES):
            held = entry
            break
        count, size = count + entry_count, size + entry_size
        if relayed:
            if run_items is None:
                run_queued_at, run_items = entry[0], list(entry[1])
            else:
                run_items.extend(entry[1])
        else:
            if run_items is not None:
                messages.append(batch(run_items, run_queued_at))
                run_items = None
            messages.append(entry)
        entry = take_next()
        if entry is NOTHING_QUEUED:
            break
        if type(entry) is not tuple and not isinstance(entry, pb.AgentMessage):
            held = entry  # the end marker
            break
    if run_items is not None:
        messages.append(batch(run_items, run_queued_at))
    return (messages[0] if len(messages) == 1 else bundle(messages)), held, count


def coalesced_requests(outbox: "queue.SimpleQueue", batch: Callable[[list, float], object],
                       bundle: Callable[[list], object]) -> Iterator[object]:
    """The agent's request iterator: what is put into `outbox`, until END_OF_STREAM, as `coalesce`
    makes it (what is queued together goes as one message, in order)."""

    def take_next():
        try:
            return outbox.get_nowait()
        except queue.Empty:
            return NOTHING_QUEUED

    held = None
    while True:
        entry = held if held is not None else outbox.get()
        if entry is END_OF_STREAM:
            return
        message, held, _ = coalesce(entry, take_next, batch, bundle)
        yield message
