"""A worker's stream as a gRPC stream straight to the coordinator (a direct stream).

Outgoing messages are queued and sent by gRPC's own thread, so no `send_*` waits on the network;
that is what keeps `report()` without a checkpoint in the microseconds. Incoming commands are read by
a reader thread and handed to `WorkerClient`. `report()` queues a `QueuedReport`, a plain record whose
protobuf is built on the sender's thread.

Reports are batched, and queuing one makes no system call. Each gRPC message costs the worker tens of
microseconds of CPU on threads that share the training loop's GIL, and waking a thread is a system call
(on a virtual machine, a report() that woke the sender cost 45 us and a 1-rank H200 loop lost 0.2 ms a
step to it). So `put` appends to a deque and wakes nobody while the sender is polling: the sender
wakes every REPORT_LINGER_S while reports flow and sends everything queued by then as one message
(consecutive reports become one `ReportBatch`); after QUIET_POLLS polls that found nothing it blocks,
and then the first report wakes it (and it lingers REPORT_LINGER_S for company). A report that someone
waits for (a checkpoint's commit acknowledgement, a receipt of the report window) and every other
message wake the sender at once and go without lingering.
"""

from __future__ import annotations

import collections
import threading
import time

import grpc

from minitrain.rpc._gen import minitrain_pb2 as pb
from minitrain.rpc._gen import minitrain_pb2_grpc as pb_grpc
from minitrain.rpc.auth import call_metadata
from minitrain.rpc.channel import END_OF_STREAM, client_channel
from minitrain.worker.transport.client import QueuedReport, WorkerClient

# How long the sender waits after a plain report for more to join its message. It bounds the extra
# latency of a metric (the console, trackers and the hang clock see it up to this much later) and
# divides the per-message cost of a loop faster than 1/REPORT_LINGER_S reports a second by the batch.
REPORT_LINGER_S = 0.005
# Plain reports leave at most this often: a loop faster than 1/REPORT_INTERVAL_S reports a second sends
# what it reported meanwhile as one message every REPORT_INTERVAL_S. Each message costs the coordinator
# about 0.3 ms of CPU whatever it carries (gRPC's read, a loop turn of the controller) and the worker a
# wake-up of its sender: a 2-rank DDP loop at 135 steps/s reporting every step sent 270 messages a
# second, which cost the driver 0.39 ms of CPU a report and the loop 8% of its speed against torchrun
# on 2 shared cores. A loop slower than that still sends each report after REPORT_LINGER_S. The price:
# a rank that dies by SIGKILL sooner than this after a plain report() returned can lose that report
# (docs/guarantees.md).
REPORT_INTERVAL_S = 0.05
# Empty polls in a row after which the sender blocks until woken (a loop slower than this many lingers
# a report costs one wake-up per report instead of a poll every REPORT_LINGER_S).
QUIET_POLLS = 2
# A batch ends at this many reports (the report window bounds what can be queued anyway) or bytes of
# metrics, so one message stays small next to gRPC's limits.
BATCH_REPORTS = 256
BATCH_BYTES = 4 << 20


class GrpcWorkerClient(WorkerClient):
    """A worker's direct gRPC stream to the coordinator at `address` (see the module docstring)."""

    def __init__(self, address: str, token: str, run_id: str, attempt: int, rank: int,
                 tls_cert: bytes = b""):
        super().__init__(run_id, attempt, rank)
        # The sender's queue (see the module doc): appended to by any thread, drained by the sender.
        self._pending: collections.deque = collections.deque()
        self._wake = threading.Event()
        self._sender_blocked = False  # the sender waits for a wake-up: a plain report must give it one
        self._urgent = False  # something queued must go without lingering
        self._channel = client_channel(address, tls_cert)  # TLS pinned to `tls_cert` unless loopback
        stub = pb_grpc.CoordinatorStub(self._channel)
        # wait_for_ready: a connection refused by a flooded server is retried; the assignment wait
        # (and the agent's parent-death signal) bound it.
        self._call = stub.WorkerStream(self._requests(), metadata=call_metadata(token),
                                       wait_for_ready=True)
        self._reader = threading.Thread(target=self._read, name="minitrain-stream", daemon=True)
        self._reader.start()

    def _requests(self):
        """The stream's request iterator, run by gRPC's thread: everything queued, in order, consecutive
        reports packed into one message (see the module doc), until END_OF_STREAM."""
        pending, wake = self._pending, self._wake
        quiet = 0
        last_sent = -REPORT_INTERVAL_S  # when the previous reports left (monotonic)
        while True:
            if not pending:
                # What made the queue urgent went out with the last message. (An urgent item queued
                # between the look above and this line loses its urgency: it waits one linger at most.)
                self._urgent = False
                quiet += 1
                if quiet > QUIET_POLLS:
                    self._sender_blocked = True  # published before the last look: no wake-up is lost
                    if not pending:
                        wake.wait()
                    self._sender_blocked = False
                wake.clear()
            if not self._urgent:
                # Polling: reports gather for REPORT_LINGER_S, and at least until REPORT_INTERVAL_S after
                # the previous reports left; only an urgent item cuts it short.
                wake.wait(max(REPORT_LINGER_S, last_sent + REPORT_INTERVAL_S - time.monotonic()))
                wake.clear()
            if not pending:
                continue
            quiet = 0
            items = []
            while pending:
                items.append(pending.popleft())
            # Only reports start an interval: telemetry (once a second) or a phase change must not hold
            # back a slow loop's next report.
            if any(type(item) is QueuedReport for item in items):
                last_sent = time.monotonic()
            for message in self._pack(items):
                if message is END_OF_STREAM:
                    return
                yield message

    def _queue(self, item, urgent: bool) -> None:
        """Queue `item` for the sender; wake it when `urgent`, or when it is blocked."""
        self._pending.append(item)
        if urgent:
            self._urgent = True
            self._wake.set()
        elif self._sender_blocked:
            self._wake.set()

    def _pack(self, items: list):
        """`items` as messages in order: runs of QueuedReports become `report` or `report_batch` messages
        (at most BATCH_REPORTS reports or BATCH_BYTES of metrics each); the rest as they are."""
        run: list = []
        size = 0
        for item in items:
            if isinstance(item, QueuedReport):
                if run and (len(run) >= BATCH_REPORTS or size + len(item.metrics_json) > BATCH_BYTES):
                    yield self._reports_message(run)
                    run, size = [], 0
                run.append(item)
                size += len(item.metrics_json)
                continue
            if run:
                yield self._reports_message(run)
                run, size = [], 0
            yield item
        if run:
            yield self._reports_message(run)

    def _reports_message(self, reports: list) -> pb.WorkerMessage:
        header = {"run_id": self.run_id, "attempt": self.attempt, "rank": self.rank}
        if len(reports) == 1:
            return pb.WorkerMessage(report=reports[0].to_message(), **header)
        return pb.WorkerMessage(report_batch=pb.ReportBatch(reports=[r.to_message() for r in reports]), **header)

    def _read(self) -> None:
        try:
            for message in self._call:
                self._take(message)
            reason = "the coordinator closed the stream"
        except grpc.RpcError as exc:
            reason = f"the stream broke: {exc.code().name} {exc.details()}"
        self._end(reason)

    def close(self, timeout_s: float = 10.0) -> bool:
        """See `WorkerClient.close`."""
        self._queue(END_OF_STREAM, True)
        with self._cond:
            closed = self._cond.wait_for(lambda: self._closed, timeout=timeout_s)
        self._channel.close()
        return closed
