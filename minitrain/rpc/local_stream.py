"""The local stream between a worker and its node agent's relay (L1): one owner for its wire format.

A relayed worker does not speak gRPC to its agent: gRPC costs every message a wake-up of several
threads on both ends, and on a CPU-bound host that CPU comes out of the training. Instead the worker
writes each message, as it is made, to a Unix stream socket in the relay's private directory, and the
agent reads what its workers wrote once every READ_INTERVAL_S (or at once when a worker rings its
doorbell), and sends it up as one message for the whole host (`minitrain.agent.transport.relay`). A plain
report() is one write: no thread wakes, and what was written survives the worker (a SIGKILLed worker's
reports are still read from the socket).

The exchange, on one `SOCK_STREAM` connection per worker stream:
1. the worker sends the *hello*: one frame holding HELLO_MAGIC and the run token, with its doorbell
   (an eventfd) attached as SCM_RIGHTS. The relay compares the token in constant time before it
   parses anything else, and closes a connection whose hello is wrong or late (HELLO_TIMEOUT_S);
2. upward, frames holding serialized `WorkerMessage`s, in the worker's order; after writing one the
   worker waits on (a commit acknowledgement, a receipt, anything but a plain report) it rings its
   doorbell URGENT_RING and the relay reads at once, and after a plain report that follows RING_AFTER_S
   without a write, RING (see READ_INTERVAL_S below for when the relay reads);
3. downward, frames holding serialized `WorkerCommand`s, and HEARTBEAT (an empty frame) whenever the
   relay sent a stream nothing else for a heartbeat interval (`minitrain.lease`): the worker's lease on
   its agent. A worker that reads nothing from its relay for LEASE_TIMEOUT_S takes its agent for frozen
   and ends itself (`minitrain.worker.transport.local_client`);
4. the worker ends its side with `shutdown(SHUT_WR)` (the relay reads everything before that end, then
   ends its own side), and the relay ends its side when the coordinator closes the stream.

A frame is a 4-byte big-endian length and that many bytes (at most MAX_FRAME_BYTES, gRPC's own limit).

The node agent on the coordinator's own machine speaks the same framing to the coordinator
(`minitrain.coordinator.transport.local_agents`, `minitrain.agent.transport.local_call`) instead of gRPC on loopback: its hello
holds AGENT_HELLO_MAGIC and the run token (no doorbell), then serialized `AgentMessage`s go up and
serialized `AgentCommand`s come down, each side ending its writes with `shutdown(SHUT_WR)`.
"""

from __future__ import annotations

import hmac
import struct

from minitrain.rpc.channel import MAX_MESSAGE_BYTES

SCHEME = "local:"  # a relayed worker's address: "local:<socket path>"
HELLO_MAGIC = b"minitrain-local-stream-1\n"  # a worker's stream on its agent's relay
AGENT_HELLO_MAGIC = b"minitrain-agent-stream-1\n"  # an agent's stream on its coordinator's local socket
HELLO_TIMEOUT_S = 10.0
MAX_HELLO_BYTES = 4096
MAX_FRAME_BYTES = MAX_MESSAGE_BYTES
# When the relay reads, so that a fast loop's reports leave together and a slow loop's at once, with no
# wake-up per report and none on a quiet host (the same timing as a direct stream's sender,
# minitrain.worker.transport.grpc_client):
# - while reports flow, every READ_INTERVAL_S: a loop that reports faster sends what it reported meanwhile
#   as one message (with its host's other workers'), and rings nothing;
# - a worker rings for a plain report written RING_AFTER_S or more after its previous write (a slower
#   loop, or the first report after a pause): the relay reads LINGER_S later, so the host's other
#   workers' reports of the same step go along;
# - a worker rings URGENT for a message it will wait for (anything but a plain report): read at once;
# - the relay stops reading on the interval once a read that began QUIET_AFTER_S after the last bytes it
#   found finds nothing. Safe because RING_AFTER_S < QUIET_AFTER_S: a report that does not ring follows a
#   write less than RING_AFTER_S old, which a read either found (and the relay reads on for
#   QUIET_AFTER_S after it) or will find.
# 100 ms: a plain report reaches the coordinator at most about 0.1 s after report() returned, and a
# fast loop's host sends 10 messages a second. Each message wakes several threads on both ends, and a
# cold wake-up costs about 0.1 ms of CPU on a 2-core VM: at 50 ms (the direct stream's REPORT_INTERVAL_S,
# which bounds what a SIGKILL loses and so stays 50 ms; the relay's bound is only latency) the driver and
# the agent took 31 and 26 ms of CPU a second beside a 2-rank loop reporting 85 times a second, at
# 100 ms 25 and 19 (docs/benchmarks/index.md).
READ_INTERVAL_S = 0.1
RING_AFTER_S = 0.1
LINGER_S = 0.005
QUIET_AFTER_S = 0.2
assert RING_AFTER_S < QUIET_AFTER_S, "the relay could go quiet with a report unread (see above)"
# What a ring adds to the doorbell (an eventfd counter, summed until the relay reads it).
RING = 1
URGENT_RING = 1 << 32


def is_urgent(rings: int) -> bool:
    """Whether the doorbell's summed value `rings` holds an urgent ring."""
    return rings >= URGENT_RING


_LENGTH = struct.Struct(">I")


class FrameError(ValueError):
    """The bytes on a local stream are not frames of this protocol."""


def address(socket_path: str) -> str:
    """The address a worker is given for the relay's socket at `socket_path`."""
    return SCHEME + socket_path


def is_local(address_: str) -> bool:
    """True for an address made by `address` (a relayed stream), False for a coordinator's."""
    return address_.startswith(SCHEME)


def socket_path(address_: str) -> str:
    """The socket path of a local address."""
    if not is_local(address_):
        raise ValueError(f"{address_!r} is not a local stream address ({SCHEME}<socket path>)")
    return address_[len(SCHEME):]


def frame(payload: bytes) -> bytes:
    """`payload` as one frame."""
    if len(payload) > MAX_FRAME_BYTES:
        raise FrameError(f"a message of {len(payload)} bytes is over the {MAX_FRAME_BYTES}-byte limit")
    return _LENGTH.pack(len(payload)) + payload


# What the relay sends a worker it sent nothing else for a heartbeat interval (the exchange above): a
# frame of no bytes. No command is empty (each sets its body), so the worker tells them apart by length.
HEARTBEAT = frame(b"")


def hello(token: str, magic: bytes = HELLO_MAGIC) -> bytes:
    """The hello frame a worker (`magic` HELLO_MAGIC: its doorbell goes along as SCM_RIGHTS) or an agent
    (AGENT_HELLO_MAGIC) sends first."""
    return frame(magic + token.encode())


def hello_matches(payload: bytes, magic: bytes, token: bytes) -> bool:
    """Whether a hello frame's `payload` is `magic` and the run's `token` (compared in constant time: the
    check every local stream passes before anything else of it is parsed)."""
    return payload.startswith(magic) and hmac.compare_digest(payload[len(magic):], token)


class FrameReader:
    """Cuts a byte stream into frames: `feed` what was received, then take `frames()`.

    `pending` is True while a frame has begun but not ended (its reader should keep reading).
    Raises FrameError for a frame over `max_bytes`, before buffering it.
    """

    def __init__(self, max_bytes: int = MAX_FRAME_BYTES):
        self._buffer = bytearray()
        self._max = max_bytes

    @property
    def pending(self) -> bool:
        """True while bytes of a frame not yet complete are held (its reader should read on)."""
        return bool(self._buffer)

    def feed(self, data: bytes) -> list[bytes]:
        """Append `data`; return the frames it completed, in order."""
        buffer = self._buffer
        buffer += data
        frames = []
        start = 0
        while len(buffer) - start >= 4:
            (size,) = _LENGTH.unpack_from(buffer, start)
            if size > self._max:
                raise FrameError(f"a frame of {size} bytes is over the {self._max}-byte limit")
            end = start + 4 + size
            if end > len(buffer):
                break
            frames.append(bytes(buffer[start + 4:end]))
            start = end
        if start:
            del buffer[:start]
        return frames


_ONE_BYTE = tuple(bytes((value,)) for value in range(0x80))  # every varint below 128 is its own byte


def varint(value: int) -> bytes:
    """`value` (>= 0) as a protobuf varint (to wrap a serialized message as a field of another without
    parsing it: protobuf merges concatenated fields). Values below 128 (a report's field tag and length)
    come from a table: this runs in every report()."""
    if value < 0x80:
        return _ONE_BYTE[value]
    out = bytearray()
    while True:
        low = value & 0x7F
        value >>= 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def message_field(number: int, payload: bytes) -> bytes:
    """Field `number` holding the serialized message `payload`, in protobuf's wire format."""
    return varint((number << 3) | 2) + varint(len(payload)) + payload
