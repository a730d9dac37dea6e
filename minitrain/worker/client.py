"""The worker's stream with the coordinator.

Outgoing messages are queued and sent by gRPC's own thread, so `send()` never waits on the network;
that is what keeps `report()` without a checkpoint in the microseconds. Incoming commands (the
assignment, the rendezvous) are picked up by a reader thread and awaited with deadlines.
"""

from __future__ import annotations

import json
import queue
import threading
from typing import Optional

import grpc

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
        self._assignment: Optional[pb.Assignment] = None
        self._rendezvous: Optional[pb.Rendezvous] = None
        self._acked_phase = 0
        self._acked_round = -1
        # The highest round of this worker's reports the coordinator is known to have recorded: a
        # receipt says so, and so does a commit acknowledgement (a round commits only once recorded).
        self.recorded_round = -1
        self._released = False
        self._checkpoint_lists: dict[int, list] = {}
        self._closed = False
        self._close_reason = ""
        self._reader = threading.Thread(target=self._read, name="minitrain-stream", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        try:
            for command in self._call:
                kind = command.WhichOneof("body")
                with self._cond:
                    if kind == "assignment":
                        self._assignment = command.assignment
                    elif kind == "rendezvous":
                        self._rendezvous = command.rendezvous
                    elif kind == "phase_ack":
                        self._acked_phase = max(self._acked_phase, command.phase_ack.phase)
                    elif kind == "release":
                        self._released = True
                    elif kind == "report_ack":
                        self._acked_round = max(self._acked_round, command.report_ack.round)
                        self.recorded_round = max(self.recorded_round, command.report_ack.round)
                    elif kind == "report_receipt":
                        self.recorded_round = max(self.recorded_round, command.report_receipt.round)
                    elif kind == "checkpoint_list":
                        listing = command.checkpoint_list
                        self._checkpoint_lists[listing.request_id] = [
                            (entry.dir_name, json.loads(entry.metrics_json)) for entry in listing.checkpoints]
                    self._cond.notify_all()
            reason = "the coordinator closed the stream"
        except grpc.RpcError as exc:
            reason = f"the stream broke: {exc.code().name} {exc.details()}"
        with self._cond:
            self._closed = True
            self._close_reason = reason
            self._cond.notify_all()

    def message(self, **body) -> pb.WorkerMessage:
        """A message of this worker with the given body field."""
        return pb.WorkerMessage(run_id=self.run_id, attempt=self.attempt, rank=self.rank, **body)

    def send(self, **body) -> None:
        """Queue a message; returns at once."""
        self._outbox.put(pb.WorkerMessage(run_id=self.run_id, attempt=self.attempt, rank=self.rank, **body))

    def put(self, message: pb.WorkerMessage) -> None:
        """Queue a prepared message; returns at once."""
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

    def wait_assignment(self, timeout_s: float) -> pb.Assignment:
        """The assignment sent after hello; StreamClosed / TimeoutError otherwise."""
        return self._wait_for("_assignment", timeout_s, "assignment")

    def wait_rendezvous(self, timeout_s: float) -> pb.Rendezvous:
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

    def list_checkpoints(self, request_id: int, rounds: int, timeout_s: float) -> list[tuple[str, dict]]:
        """Ask for the run's committed checkpoints, [(dir_name, metrics)] in retention order, as they
        are once this rank's first `rounds` reports are processed (the coordinator answers then)."""
        self.send(list_checkpoints=pb.ListCheckpoints(request_id=request_id, rounds=rounds))
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
