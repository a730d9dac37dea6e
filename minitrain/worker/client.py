"""The worker's stream with the coordinator: the worker's transport edge.

Outgoing messages are queued and sent by gRPC's own thread, so no `send_*` waits on the network;
that is what keeps `report()` without a checkpoint in the microseconds. Incoming commands (the
assignment, the rendezvous) are picked up by a reader thread, converted to the records of
`minitrain.commands`, and awaited with deadlines. The rest of the worker never sees protobuf: it calls
the typed `send_*` methods, and `report()` queues a `QueuedReport`, a plain record whose protobuf is
built on the sender's thread.

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
from typing import Optional

import grpc

from minitrain import commands as cmd
from minitrain.records import Phase, TelemetrySample, WorkerFailure
from minitrain.rpc import convert, report_window
from minitrain.rpc._gen import minitrain_pb2 as pb
from minitrain.rpc._gen import minitrain_pb2_grpc as pb_grpc
from minitrain.rpc.auth import call_metadata
from minitrain.rpc.channel import END_OF_STREAM, client_channel

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


class QueuedReport:
    """One report as `report()` queues it: its fields, no protobuf yet (built by the sender)."""

    __slots__ = ("round", "metrics_json", "reported_at", "dir_name", "staged", "wants_receipt")

    def __init__(self, round_: int, metrics_json: str, dir_name: str, staged: bool) -> None:
        self.round = round_
        self.metrics_json = metrics_json
        self.reported_at = time.time()
        self.dir_name = dir_name
        self.staged = staged
        self.wants_receipt = report_window.wants_receipt(round_)

    @property
    def awaited(self) -> bool:
        """Whether the worker will wait for an answer to it (a commit acknowledgement or a receipt)."""
        return bool(self.dir_name) or self.wants_receipt

    def to_message(self) -> pb.Report:
        """Its protobuf form; a checkpoint (`dir_name`) asks for the commit acknowledgement."""
        return pb.Report(round=self.round, metrics_json=self.metrics_json, reported_at=self.reported_at,
                         checkpoint_dir_name=self.dir_name, wants_ack=bool(self.dir_name), staged=self.staged,
                         wants_receipt=self.wants_receipt)


class StreamClosed(RuntimeError):
    """The coordinator ended this worker's stream (the run or attempt is over)."""


class WorkerClient:
    """One worker's bidirectional stream; every message carries run_id, attempt and rank.

    `recorded_round`: the highest round of this worker's reports the coordinator is known to have
    recorded (-1 before any), as its receipts and commit acknowledgements say; read by report()'s window.
    """

    def __init__(self, address: str, token: str, run_id: str, attempt: int, rank: int,
                 tls_cert: bytes = b""):
        self.run_id, self.attempt, self.rank = run_id, attempt, rank
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
        self._cond = threading.Condition()
        self._assignment: Optional[cmd.Assignment] = None
        self._rendezvous: Optional[cmd.Rendezvous] = None
        self._acked_phase = 0
        self._acked_round = -1
        # The highest round of this worker's reports the coordinator is known to have recorded: a
        # receipt says so, and so does a commit acknowledgement (a round commits only once recorded).
        self.recorded_round = -1
        self._released = False
        self._checkpoint_lists: dict[int, list] = {}
        # A preemption (minitrain.worker.preemption): set by the stream thread, read by report().
        self.preemption_noticed = False
        self.rounds_reported = lambda: 0  # the session's report count, answered to a PreemptionNotice
        self._preemption_round: Optional[cmd.PreemptionRound] = None
        self._closed = False
        self._close_reason = ""
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
                command = convert.worker_command_from_message(message)
                with self._cond:
                    self._apply(command)
                    self._cond.notify_all()
            reason = "the coordinator closed the stream"
        except grpc.RpcError as exc:
            reason = f"the stream broke: {exc.code().name} {exc.details()}"
        with self._cond:
            self._closed = True
            self._close_reason = reason
            self._cond.notify_all()

    def _apply(self, command: Optional[cmd.WorkerCommand]) -> None:
        """Take in one command (under the condition's lock)."""
        if isinstance(command, cmd.ReportReceipt):
            self.recorded_round = max(self.recorded_round, command.round)
        elif isinstance(command, cmd.ReportAck):
            self._acked_round = max(self._acked_round, command.round)
            self.recorded_round = max(self.recorded_round, command.round)
        elif isinstance(command, cmd.Assignment):
            self._assignment = command
        elif isinstance(command, cmd.Rendezvous):
            self._rendezvous = command
        elif isinstance(command, cmd.PhaseAck):
            self._acked_phase = max(self._acked_phase, command.phase)
        elif isinstance(command, cmd.Release):
            self._released = True
        elif isinstance(command, cmd.CheckpointList):
            self._checkpoint_lists[command.request_id] = [(e.dir_name, e.metrics) for e in command.checkpoints]
        elif isinstance(command, cmd.PreemptionNotice):
            # First noticed, then counted: a report() that did not see the flag was counted (the
            # training thread adds its report before it looks), so the answer covers every report made
            # without waiting for the round (coordinator/preemption.py's agreed_round).
            self.preemption_noticed = True
            self._send(preemption_seen=pb.PreemptionSeen(rounds=self.rounds_reported()))
        elif isinstance(command, cmd.PreemptionRound):
            self._preemption_round = command

    def _send(self, **body) -> None:
        """Queue a message with the given body field; returns at once."""
        self._queue(pb.WorkerMessage(run_id=self.run_id, attempt=self.attempt, rank=self.rank, **body), True)

    def send_hello(self, pid: int, hostname: str) -> None:
        """Say which process this is (the coordinator answers with the assignment)."""
        self._send(hello=pb.WorkerHello(pid=pid, hostname=hostname))

    def send_phase(self, phase: Phase) -> None:
        """Say this worker entered `phase`."""
        self._send(phase=pb.PhaseChange(phase=int(phase)))

    def send_store_ready(self, address: str, port: int) -> None:
        """(Rank 0) say where its TCPStore listens."""
        self._send(store_ready=pb.StoreReady(address=address, port=port))

    def send_done(self, reports: int, return_value: bytes) -> None:
        """Say the training function returned after `reports` report() calls (`return_value`: rank 0's,
        pickled; b"" on the other ranks)."""
        self._send(done=pb.WorkerDone(finished_at=time.time(), reports=reports, return_value=return_value))

    def send_failure(self, failure: WorkerFailure, exc_pickle: bytes) -> None:
        """Report the exception this worker fails with (`exc_pickle`: b"" when it could not be pickled)."""
        self._send(failure=convert.failure_message(failure, exc_pickle))

    def send_telemetry(self, sample: TelemetrySample) -> None:
        """Send one telemetry sample (built by `minitrain.worker.telemetry`; at most one a second, so
        converting it here costs nothing that matters). Its attempt and rank are this stream's."""
        self._send(telemetry=convert.telemetry_message(sample))

    def report_message(self, round_: int, metrics_json: str, dir_name: str, staged: bool) -> QueuedReport:
        """This worker's report `round_` (sent with `put`, maybe later, in order): it waits for a commit
        acknowledgement when it carries a checkpoint (`dir_name`), and for a receipt when the report
        window asks for one."""
        return QueuedReport(round_, metrics_json, dir_name, staged)

    def put(self, report: QueuedReport) -> None:
        """Queue a report made by `report_message`; returns at once."""
        self._queue(report, report.awaited)

    def _wait_for(self, attribute: str, timeout_s: float, what: str):
        with self._cond:
            ready = self._cond.wait_for(lambda: getattr(self, attribute) is not None or self._closed,
                                        timeout=timeout_s)
            value = getattr(self, attribute)
            if value is not None:
                return value
            if self._closed:
                raise StreamClosed(f"waiting for {what}: {self._close_reason}")
        assert not ready
        raise TimeoutError(f"no {what} from the coordinator within {timeout_s:g} s")

    def wait_assignment(self, timeout_s: float) -> cmd.Assignment:
        """The assignment sent after hello; StreamClosed / TimeoutError otherwise."""
        return self._wait_for("_assignment", timeout_s, "assignment")

    def wait_rendezvous(self, timeout_s: float) -> cmd.Rendezvous:
        """Rank 0's TCPStore address; StreamClosed / TimeoutError otherwise."""
        return self._wait_for("_rendezvous", timeout_s, "rendezvous")

    def wait_phase_ack(self, phase: int, timeout_s: float) -> None:
        """Block until the coordinator recorded `phase` (or later); StreamClosed / TimeoutError."""
        self._wait_until(lambda: self._acked_phase >= phase, timeout_s, f"acknowledgement of phase {phase}")

    def _wait_until(self, ready, timeout_s: float, what: str) -> None:
        with self._cond:
            self._cond.wait_for(lambda: ready() or self._closed, timeout=timeout_s)
            if ready():
                return
            if self._closed:
                raise StreamClosed(f"waiting for {what}: {self._close_reason}")
        raise TimeoutError(f"no {what} from the coordinator within {timeout_s:g} s")

    def wait_release(self, timeout_s: float) -> None:
        """Block until the coordinator says every rank finished (or the stream ends)."""
        try:
            self._wait_until(lambda: self._released, timeout_s, "the release of the attempt")
        except StreamClosed:
            pass

    def wait_report_ack(self, round_: int, timeout_s: float) -> None:
        """Block until the coordinator recorded report `round_` of this worker."""
        self._wait_until(lambda: self._acked_round >= round_, timeout_s, f"acknowledgement of report {round_}")

    def wait_recorded(self, round_: int, timeout_s: float) -> None:
        """Block until `recorded_round` reaches `round_` (the coordinator recorded this worker's
        reports up to it); StreamClosed or TimeoutError otherwise."""
        self._wait_until(lambda: self.recorded_round >= round_, timeout_s, f"receipt for report {round_}")

    def wait_preemption_round(self, timeout_s: float) -> cmd.PreemptionRound:
        """The agreed round of a preemption, once the coordinator sent it; StreamClosed / TimeoutError."""
        return self._wait_for("_preemption_round", timeout_s, "the agreed preemption round")

    def wait_closed(self, timeout_s: float) -> None:
        """Block until the coordinator ends the stream (a preempted rank past its round waits here to be
        stopped); raises StreamClosed then, TimeoutError after `timeout_s`."""
        self._wait_until(lambda: False, timeout_s, "the end of the preempted run")

    def list_checkpoints(self, request_id: int, rounds: int, timeout_s: float) -> list[tuple[str, dict]]:
        """Ask for the run's committed checkpoints, [(dir_name, metrics)] in retention order, as they
        are once this rank's first `rounds` reports are processed (the coordinator answers then)."""
        self._send(list_checkpoints=pb.ListCheckpoints(request_id=request_id, rounds=rounds))
        self._wait_until(lambda: request_id in self._checkpoint_lists, timeout_s, "checkpoint list")
        with self._cond:
            return self._checkpoint_lists.pop(request_id)

    def close(self, timeout_s: float = 10.0) -> bool:
        """Flush every queued message, end the stream, and wait for the coordinator to close its side.

        Returns True when the coordinator acknowledged the end within the timeout: everything sent
        before was received.
        """
        self._queue(END_OF_STREAM, True)
        with self._cond:
            closed = self._cond.wait_for(lambda: self._closed, timeout=timeout_s)
        self._channel.close()
        return closed
