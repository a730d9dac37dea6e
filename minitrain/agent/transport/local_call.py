"""The node agent's stream on its coordinator's local socket (L2): for an agent on the coordinator's own
machine, what the `Coordinator.AgentStream` gRPC call is for the others, without gRPC's threads and
wake-ups (why: `minitrain.coordinator.transport.local_agents`; the wire: `minitrain.rpc.local_stream`).

`LocalAgentCall` has the shape of the gRPC call `minitrain.agent.transport.stream.CoordinatorStream` holds: it
is opened with the iterator of upward messages, iterating it gives the coordinator's commands, and
`cancel()` ends it from any thread.
"""

from __future__ import annotations

import socket
import threading
from typing import Iterator

from google.protobuf.message import DecodeError

from minitrain.rpc import local_stream
from minitrain.rpc._gen import minitrain_pb2 as pb

RECEIVE_BYTES = 1 << 18


class LocalStreamBroken(Exception):
    """The local stream with the coordinator broke; the message says how."""


class LocalAgentCall:
    """An agent's stream on the coordinator's local socket at `address` ("local:<path>").

    Opening it connects and sends the hello with `token` (LocalStreamBroken when it cannot). `requests`
    (the upward `pb.AgentMessage`s, ending when the agent's stream ends) is consumed on a sender thread
    of its own, each message written as one frame; its end ends our side of the connection. Iterating
    the call gives the coordinator's `pb.AgentCommand`s in order and returns when the coordinator ended
    its side; it raises LocalStreamBroken when the connection breaks, carries what is not a command, or
    was cancelled. `close(timeout_s)` waits that long for the sender to write what was queued before
    the requests' end, then cancels.
    """

    def __init__(self, address: str, token: str, requests: Iterator[pb.AgentMessage]):
        path = local_stream.socket_path(address)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            sock.connect(path)
            sock.sendall(local_stream.hello(token, local_stream.AGENT_HELLO_MAGIC))
        except OSError as exc:
            sock.close()
            raise LocalStreamBroken(f"could not open the coordinator's local stream at {path}: {exc}") from exc
        self._socket = sock
        self._requests = requests
        self._cancelled = False
        self._sender = threading.Thread(target=self._send, name="agent-send", daemon=True)
        self._sender.start()

    def _send(self) -> None:
        try:
            for message in self._requests:
                self._socket.sendall(local_stream.frame(message.SerializeToString()))
            self._socket.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # the connection broke or was cancelled: the reader reports it

    def __iter__(self) -> Iterator[pb.AgentCommand]:
        frames = local_stream.FrameReader()
        while True:
            try:
                data = self._socket.recv(RECEIVE_BYTES)
            except OSError as exc:
                raise LocalStreamBroken(f"the local stream broke: {exc}") from exc
            if self._cancelled:
                raise LocalStreamBroken("the local stream was cancelled")
            if not data:
                if frames.pending:
                    raise LocalStreamBroken("the coordinator's side ended inside a frame")
                return
            try:
                payloads = frames.feed(data)
                commands = [pb.AgentCommand.FromString(payload) for payload in payloads]
            except (local_stream.FrameError, DecodeError) as exc:
                raise LocalStreamBroken(f"the coordinator sent what is not a command ({exc})") from exc
            yield from commands

    def cancel(self) -> None:
        """End the stream both ways now (from any thread): the sender and the reader stop."""
        self._cancelled = True
        try:
            self._socket.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def close(self, timeout_s: float) -> None:
        """After the requests were told to end: let the sender finish for up to `timeout_s`, then
        cancel and close the socket."""
        self._sender.join(timeout_s)
        self.cancel()
        self._sender.join(timeout_s)
        self._socket.close()
