"""The worker's stream with the coordinator: the worker's transport edge.

Outgoing messages are queued and sent by gRPC's own thread, so no `send_*` waits on the network;
that is what keeps `report()` without a checkpoint in the microseconds. Incoming commands (the
assignment, the rendezvous) are picked up by a reader thread, converted to the records of
`minitrain.commands`, and awaited with deadlines. The rest of the worker never sees protobuf: it calls
the typed `send_*` methods, and a report's message is built here (`report_message`) directly, without
an intermediate record, because `report()` is the worker's hot path.
"""

from __future__ import annotations

import queue
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
from minitrain.rpc.channel import END_OF_STREAM, client_channel, queued_requests


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
        self._outbox: "queue.SimpleQueue" = queue.SimpleQueue()
        self._channel = client_channel(address, tls_cert)  # TLS pinned to `tls_cert` unless loopback
        stub = pb_grpc.CoordinatorStub(self._channel)
        # wait_for_ready: a connection refused by a flooded server is retried; the assignment wait
        # (and the agent's parent-death signal) bound it.
        self._call = stub.WorkerStream(queued_requests(self._outbox), metadata=call_metadata(token),
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
        self._outbox.put(pb.WorkerMessage(run_id=self.run_id, attempt=self.attempt, rank=self.rank, **body))

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

    def report_message(self, round_: int, metrics_json: str, dir_name: str, staged: bool) -> pb.WorkerMessage:
        """The message of this worker's report `round_` (sent with `put`, maybe later, in order): it waits
        for a commit acknowledgement when it carries a checkpoint (`dir_name`), and for a receipt when
        the report window asks for one."""
        return pb.WorkerMessage(
            run_id=self.run_id, attempt=self.attempt, rank=self.rank,
            report=pb.Report(round=round_, metrics_json=metrics_json, reported_at=time.time(),
                             checkpoint_dir_name=dir_name, wants_ack=bool(dir_name), staged=staged,
                             wants_receipt=report_window.wants_receipt(round_)))

    def put(self, message: pb.WorkerMessage) -> None:
        """Queue a message made by `report_message`; returns at once."""
        self._outbox.put(message)

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
        self._outbox.put(END_OF_STREAM)
        with self._cond:
            closed = self._cond.wait_for(lambda: self._closed, timeout=timeout_s)
        self._channel.close()
        return closed
