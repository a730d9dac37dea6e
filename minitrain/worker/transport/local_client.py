"""A worker's stream as a local socket to its node agent's relay (a relayed stream).

The protocol is `minitrain.rpc.local_stream`'s. Every message is written to the socket when it is made,
on the caller's thread: a plain report costs its protobuf and one `send` (a few microseconds; no thread
wakes: the relay reads every READ_INTERVAL_S), and what was written is the kernel's, so a worker killed
outright loses nothing it reported. A message someone will wait for (anything but a plain report)
rings the doorbell urgently, and the relay reads at once; a report after RING_AFTER_S without a write
(a slow loop, or the relay may have gone quiet) rings it plainly, and the relay reads a linger later. A reader thread takes in the commands that come back.

A send that finds the socket's buffer full rings (the relay may be quiet) and waits until the relay has
read it (backpressure, as the report window's); one that fails because the relay is gone is dropped: the reader sees the end too, and every
wait then raises StreamClosed.
"""

from __future__ import annotations

import os
import socket
import threading
import time

from minitrain.rpc import local_stream
from minitrain.rpc._gen import minitrain_pb2 as pb
from minitrain.rpc.channel import END_OF_STREAM
from minitrain.worker.transport.client import QueuedReport, WorkerClient

RECEIVE_BYTES = 1 << 16
SEND_BUFFER_BYTES = 1 << 20  # a burst of reports between two reads of the relay fits without waiting
# The WorkerMessage field that carries one report (appended to the stream's constant header).
_REPORT_FIELD = pb.WorkerMessage.DESCRIPTOR.fields_by_name["report"].number


class LocalWorkerClient(WorkerClient):
    """A worker's stream on its agent's relay at `address` ("local:<socket path>"), authenticated with
    `token`. Raises OSError when the relay cannot be reached."""

    def __init__(self, address: str, token: str, run_id: str, attempt: int, rank: int):
        super().__init__(run_id, attempt, rank)
        self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        self._doorbell = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
        try:
            self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER_BYTES)
            self._socket.connect(local_stream.socket_path(address))
            socket.send_fds(self._socket, [local_stream.hello(token)], [self._doorbell])
        except BaseException:
            self._socket.close()
            os.close(self._doorbell)
            raise
        # Sends come from the training thread, the telemetry thread and the reader (a preemption's
        # answer); reentrant, as the SIGTERM flush (bootstrap) may run on a thread that is sending.
        self._send_lock = threading.RLock()
        self._write_ended = False
        self._last_write = time.monotonic()  # after the hello
        # run_id, attempt and rank, serialized once: a report's message is this plus its own field.
        self._header = pb.WorkerMessage(run_id=run_id, attempt=attempt, rank=rank).SerializeToString()
        self._reader = threading.Thread(target=self._read, name="minitrain-stream", daemon=True)
        self._reader.start()

    def _queue(self, item, urgent: bool) -> None:
        if item is END_OF_STREAM:
            with self._send_lock:
                if not self._write_ended:
                    self._write_ended = True
                    try:
                        self._socket.shutdown(socket.SHUT_WR)
                    except OSError:
                        pass  # the relay is gone: the reader saw it or will
            self._ring(local_stream.URGENT_RING)
            return
        if type(item) is QueuedReport:
            payload = self._header + local_stream.message_field(_REPORT_FIELD,
                                                                item.to_message().SerializeToString())
        else:
            payload = item.SerializeToString()
        data = local_stream.frame(payload)
        with self._send_lock:
            if self._write_ended:
                return
            try:
                sent = self._socket.send(data, socket.MSG_DONTWAIT)
                if sent < len(data):
                    # The buffer is full: the relay may not read on its own (quiet, or not until its
                    # interval), so ring first; a half-read frame keeps it reading until the end.
                    self._ring(local_stream.URGENT_RING)
                    self._socket.sendall(memoryview(data)[sent:])
            except BlockingIOError:
                self._ring(local_stream.URGENT_RING)
                try:
                    self._socket.sendall(data)
                except OSError:
                    self._write_ended = True
                    return
            except OSError:
                self._write_ended = True  # the relay is gone; the reader ends the stream
                return
            now = time.monotonic()  # once the bytes are the kernel's (see local_stream.RING_AFTER_S)
            after_quiet = now - self._last_write > local_stream.RING_AFTER_S
            self._last_write = now
        if urgent:
            self._ring(local_stream.URGENT_RING)
        elif after_quiet:
            self._ring(local_stream.RING)

    def _ring(self, value: int) -> None:
        with self._send_lock:
            if self._doorbell < 0:
                return  # closed
            try:
                os.eventfd_write(self._doorbell, value)
            except OSError:
                pass  # the counter is full (the relay has not read it for 2**64 rings): it reads anyway

    def _read(self) -> None:
        frames = local_stream.FrameReader()
        reason = "the coordinator closed the stream"
        try:
            while True:
                data = self._socket.recv(RECEIVE_BYTES)
                if not data:
                    break
                for payload in frames.feed(data):
                    self._take(pb.WorkerCommand.FromString(payload))
        except (OSError, ValueError) as exc:  # ValueError: FrameError, or a command that does not parse
            reason = f"the stream broke: {exc}"
        self._end(reason)

    def close(self, timeout_s: float = 10.0) -> bool:
        """See `WorkerClient.close`."""
        self._queue(END_OF_STREAM, True)
        with self._cond:
            closed = self._cond.wait_for(lambda: self._closed, timeout=timeout_s)
        with self._send_lock:
            self._write_ended = True
            try:
                self._socket.shutdown(socket.SHUT_RDWR)  # wakes the reader if it still waits
            except OSError:
                pass
        self._reader.join(timeout=1.0)
        with self._send_lock:
            self._socket.close()
            if self._doorbell >= 0:  # a second close (the SIGTERM flush after the normal one) is a no-op
                os.close(self._doorbell)
                self._doorbell = -1
        return closed
