"""A worker's stream with the coordinator, whatever carries it: the worker's transport edge.

`WorkerClient` is what the rest of the worker holds: typed `send_*` methods, `report_message`/`put` for
reports, and waits with deadlines for the commands that come back (the assignment, the rendezvous,
acknowledgements, receipts), which are converted to the records of `minitrain.commands`. The rest of the
worker never sees protobuf. Two transports carry it:
- `minitrain.worker.transport.grpc_client.GrpcWorkerClient`: a gRPC stream to the coordinator (a direct stream);
- `minitrain.worker.transport.local_client.LocalWorkerClient`: a local socket to the node agent's relay, which
  carries the host's streams up together (a relayed stream, `minitrain.rpc.local_stream`).
The worker's bootstrap picks one by the address its agent gave it. No `send_*` or `put` waits on the
network; a transport calls `_take(command)` for each command it receives and `_end(reason)` once, when
the stream ended.
"""

from __future__ import annotations

import threading
import time
from typing import Callable, Optional

from minitrain import commands as cmd
from minitrain.records import Phase, TelemetrySample, WorkerFailure
from minitrain.rpc import convert, report_window
from minitrain.rpc._gen import minitrain_pb2 as pb


class QueuedReport:
    """One report as `report()` queues it: its fields, no protobuf yet (built by the sender)."""

    __slots__ = ("round", "metrics_json", "reported_at", "dir_name", "staged", "in_tier", "wants_receipt")

    def __init__(self, round_: int, metrics_json: str, dir_name: str, staged: bool, in_tier: bool = False) -> None:
        self.round = round_
        self.metrics_json = metrics_json
        self.reported_at = time.time()
        self.dir_name = dir_name
        self.staged = staged
        self.in_tier = in_tier
        self.wants_receipt = report_window.wants_receipt(round_)

    @property
    def awaited(self) -> bool:
        """Whether the worker will wait for an answer to it (a commit acknowledgement or a receipt)."""
        return bool(self.dir_name) or self.wants_receipt

    def to_message(self) -> pb.Report:
        """Its protobuf form; a checkpoint (`dir_name`) asks for the commit acknowledgement. A plain report
        (every step's) sets only the fields that differ from their defaults: each one set costs report()."""
        if self.dir_name or self.staged:
            return pb.Report(round=self.round, metrics_json=self.metrics_json, reported_at=self.reported_at,
                             checkpoint_dir_name=self.dir_name, wants_ack=bool(self.dir_name), staged=self.staged,
                             wants_receipt=self.wants_receipt, in_tier=self.in_tier)
        if self.wants_receipt:
            return pb.Report(round=self.round, metrics_json=self.metrics_json, reported_at=self.reported_at,
                             wants_receipt=True)
        return pb.Report(round=self.round, metrics_json=self.metrics_json, reported_at=self.reported_at)


class StreamClosed(RuntimeError):
    """The coordinator ended this worker's stream (the run or attempt is over)."""


class WorkerClient:
    """One worker's stream, any transport; every message carries run_id, attempt and rank.

    `recorded_round`: the highest round of this worker's reports the coordinator is known to have
    recorded (-1 before any), as its receipts and commit acknowledgements say; read by report()'s window.
    A transport implements `_queue(item, urgent)` (send `item`, a `pb.WorkerMessage`, a `QueuedReport` or
    END_OF_STREAM, in order, without waiting on the network; `urgent`: someone will wait for an answer)
    and `close`.

    `hands_off_on_put`: a message is out of this process when `put`/`_queue` returns (written to a
    socket the agent reads even after this process dies), not queued for a sender thread.
    """

    hands_off_on_put = False

    def __init__(self, run_id: str, attempt: int, rank: int):
        self.run_id, self.attempt, self.rank = run_id, attempt, rank
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
        self._rounds_reported: Callable[[], int] = lambda: 0  # see count_reports_with
        self._preemption_round: Optional[cmd.PreemptionRound] = None
        self._closed = False
        self._close_reason = ""

    def count_reports_with(self, rounds_reported: Callable[[], int]) -> None:
        """How to count this rank's report() calls so far (the session's count, read on the stream's
        thread), for the answer to a PreemptionNotice. Until it is given, the count is 0 (no session yet,
        no reports)."""
        self._rounds_reported = rounds_reported

    # ------------------------------------------------------------------ what a transport implements

    def _queue(self, item, urgent: bool) -> None:
        raise NotImplementedError

    def close(self, timeout_s: float = 10.0) -> bool:
        """Flush every queued message, end the stream, and wait for the coordinator to close its side.

        Returns True when the coordinator acknowledged the end within the timeout: everything sent
        before was received.
        """
        raise NotImplementedError

    def _take(self, message: pb.WorkerCommand) -> None:
        """A transport's reader hands in each command it received, in order."""
        command = convert.worker_command_from_message(message)
        with self._cond:
            self._apply(command)
            self._cond.notify_all()

    def _end(self, reason: str) -> None:
        """A transport's reader says the stream ended (once), and why."""
        with self._cond:
            self._closed = True
            self._close_reason = reason
            self._cond.notify_all()

    # ------------------------------------------------------------------ commands and waits

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
            # without waiting for the round (coordinator/facts/preemption.py's agreed_round).
            self.preemption_noticed = True
            self._send(preemption_seen=pb.PreemptionSeen(rounds=self._rounds_reported()))
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

    def report_message(self, round_: int, metrics_json: str, dir_name: str, staged: bool,
                       in_tier: bool = False) -> QueuedReport:
        """This worker's report `round_` (sent with `put`, maybe later, in order): it waits for a commit
        acknowledgement when it carries a checkpoint (`dir_name`), and for a receipt when the report
        window asks for one. `staged`/`in_tier`: where the checkpoint's files wait (the run's staging
        area, or the node's memory tier)."""
        return QueuedReport(round_, metrics_json, dir_name, staged, in_tier)

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
