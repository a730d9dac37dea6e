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

The reader also holds the worker's lease on its agent (`minitrain.lease`): the relay sends a heartbeat to
a stream it sent nothing else for HEARTBEAT_INTERVAL_S, and a reader that reads nothing at all for
LEASE_TIMEOUT_S calls `on_agent_lost` with the reason and ends the stream. A frozen agent (SIGSTOPped, a
hung host process) reads no reports, sends no receipts, and cannot stop its workers, which would
otherwise wait for it forever (in the report window, in a send the full socket holds, in a collective
whose peers the next attempt replaced), holding their GPU memory; the worker process's `on_agent_lost`
ends it (`minitrain.worker.bootstrap`). An agent that is gone closes the socket, which ends the stream at
once. The lease costs report() nothing: the reader's clock runs on its own thread, between receives.
"""

from __future__ import annotations

import os
import select
import socket
import threading
import time
from typing import Callable, Optional

from minitrain.lease import LEASE_TIMEOUT_S, Lease
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
    `token`. Raises OSError when the relay cannot be reached. Every message is written when it is put
    (`hands_off_on_put`): what the kernel holds, the agent reads even after this worker died.

    `on_agent_lost(reason)` is called once, on the reader thread, when nothing came from the relay for
    `lease_timeout_s` (> 0; minitrain.lease's LEASE_TIMEOUT_S, shorter only in tests); the stream then
    ends with that reason (every wait raises StreamClosed). None: the stream only ends. The worker process
    passes what ends it (`minitrain.worker.bootstrap`).
    """

    hands_off_on_put = True

    def __init__(self, address: str, token: str, run_id: str, attempt: int, rank: int, *,
                 on_agent_lost: Optional[Callable[[str], None]] = None,
                 lease_timeout_s: float = LEASE_TIMEOUT_S):
        if not lease_timeout_s > 0:
            raise ValueError(f"lease_timeout_s={lease_timeout_s!r} must be a number of seconds above 0 "
                             "(the default is minitrain.lease.LEASE_TIMEOUT_S)")
        super().__init__(run_id, attempt, rank)
        self._on_agent_lost = on_agent_lost
        self._lease = Lease(lease_timeout_s)  # renewed by the reader at every receive
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
        lease = self._lease
        poller = select.poll()
        poller.register(self._socket, select.POLLIN)
        lease.heard()  # the lease runs from the reader's start: the relay heartbeats a stream once it took its hello
        try:
            while True:
                if not poller.poll(max(0.0, lease.timeout_s - lease.silent_s()) * 1000.0):
                    # Looked at again once this thread holds the GIL: bytes that came while a busy
                    # training thread kept it waiting are the agent's, not its silence.
                    if lease.expired() and not poller.poll(0):
                        reason = self._agent_lost(lease)
                        break
                    continue
                data = self._socket.recv(RECEIVE_BYTES)
                if not data:
                    break
                lease.heard()  # any bytes: a large command read in parts renews it at each part
                for payload in frames.feed(data):
                    if payload:  # an empty frame is the relay's heartbeat (local_stream.HEARTBEAT)
                        self._take(pb.WorkerCommand.FromString(payload))
        except (OSError, ValueError) as exc:  # ValueError: FrameError, or a command that does not parse
            reason = f"the stream broke: {exc}"
        self._end(reason)

    def _agent_lost(self, lease: Lease) -> str:
        """The lease ran out: say so to `on_agent_lost` (which ends the worker process), and return the
        stream's end reason."""
        reason = (f"nothing from this worker's node agent for {lease.silent_s():.1f} s (its lease is "
                  f"{lease.timeout_s:g} s): the agent is frozen or stalled")
        if self._on_agent_lost is not None:
            self._on_agent_lost(reason)
        return reason

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
