"""Backpressure of report(): a rank keeps at most REPORT_WINDOW reports in flight that the coordinator
has not recorded (minitrain.rpc.report_window, applied by minitrain.worker.session), and the coordinator
sends a receipt for each report that asks for one as soon as it recorded it (minitrain.coordinator.facts.commits).

The worker side runs the real WorkerSession and its LocalWorkerClient on the agent's real
relay on its Unix socket; the test plays the coordinator (it sees what the relay sends up, and sends
receipts down). The coordinator side runs the real controller and Hub with a real asyncio loop.
"""

from __future__ import annotations

import asyncio
import threading

import pytest

from minitrain.agent.transport.relay import RelayServer
from minitrain.config import FailureConfig
from minitrain.context import TrainContext
from minitrain.coordinator.facts import events as ev
from minitrain.records import Phase, ReportRecord
from minitrain.rpc import report_window
from minitrain.rpc._gen import minitrain_pb2 as pb
from minitrain.storage.filesystem import Storage
from minitrain.worker.session import WorkerSession
from minitrain.worker.transport.client import StreamClosed
from minitrain.worker.transport.local_client import LocalWorkerClient

from controller_support import training_controller

TOKEN = "the-run-token"
DEADLINE_S = 30.0
WINDOW, EVERY = 8, 4  # small, so the test is quick; the product's are 256 and 64
STILL_S = 0.5  # how long a blocked report() must stay blocked to count as blocked


class Upward:
    """The reports the relay sends up, with a wait on a condition."""

    def __init__(self):
        self.reports: list[pb.Report] = []
        self.stream = 0
        self._cond = threading.Condition()

    def send_up(self, items: list) -> None:
        with self._cond:
            for item in items:
                kind = None if item.closed else item.message.WhichOneof("body")
                if kind in ("report", "report_batch"):  # a batch: consecutive reports of one worker
                    batch = [item.message.report] if kind == "report" else item.message.report_batch.reports
                    self.reports.extend(batch)
                    self.stream = item.stream
            self._cond.notify_all()

    def wait_count(self, count: int) -> None:
        with self._cond:
            assert self._cond.wait_for(lambda: len(self.reports) >= count, timeout=DEADLINE_S), \
                f"{count} reports within {DEADLINE_S} s; got {len(self.reports)}"

    def stays_at(self, count: int) -> bool:
        """True when no report beyond `count` arrives within STILL_S (report() is blocked)."""
        with self._cond:
            return not self._cond.wait_for(lambda: len(self.reports) > count, timeout=STILL_S)


class Reporter:
    """A training loop in a thread: `total` metrics-only reports through a real session."""

    def __init__(self, relay: RelayServer, tmp_path, total: int):
        self.client = LocalWorkerClient(relay.address, TOKEN, "run-1", 0, 0)
        storage = Storage.for_run(str(tmp_path / "results"), "run")
        storage.makedirs()
        self.session = WorkerSession(self.client, TrainContext(experiment_name="run"), storage)
        self.error: BaseException | None = None
        self._total = total
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            for step in range(self._total):
                self.session.report({"step": step})
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            self.error = exc


@pytest.fixture
def window(monkeypatch):
    monkeypatch.setattr(report_window, "REPORT_WINDOW", WINDOW)
    monkeypatch.setattr(report_window, "RECEIPT_EVERY", EVERY)


@pytest.fixture
def upward():
    return Upward()


def _down(relay: RelayServer, stream: int, command: pb.WorkerCommand) -> None:
    relay.deliver(pb.RelayedDown(items=[pb.RelayedCommand(stream=stream, command=command)]))


def _receipt(round_: int) -> pb.WorkerCommand:
    return pb.WorkerCommand(report_receipt=pb.ReportReceipt(round=round_))


def test_report_waits_past_the_window_and_goes_on_as_receipts_come(window, relay, upward, tmp_path):
    """A coordinator that records nothing (saturated, or frozen) holds a rank to WINDOW reports in
    flight; each receipt lets exactly the reports it covers be replaced, in order, none lost."""
    reporter = Reporter(relay, tmp_path, total=3 * WINDOW)
    upward.wait_count(WINDOW)
    assert upward.stays_at(WINDOW), "report() went past its window with nothing recorded"
    assert reporter.thread.is_alive() and reporter.session.rounds_reported == WINDOW

    _down(relay, upward.stream, _receipt(EVERY - 1))  # rounds 0..3 recorded: 4 more may go
    upward.wait_count(WINDOW + EVERY)
    assert upward.stays_at(WINDOW + EVERY)

    _down(relay, upward.stream, _receipt(3 * WINDOW - 1))  # everything: the loop runs to its end
    reporter.thread.join(DEADLINE_S)
    assert not reporter.thread.is_alive() and reporter.error is None
    upward.wait_count(3 * WINDOW)
    assert [r.round for r in upward.reports] == list(range(3 * WINDOW))
    assert [r.round for r in upward.reports if r.wants_receipt] == list(range(EVERY - 1, 3 * WINDOW, EVERY))
    assert reporter.session.phase_seconds["window_wait_s"] >= 2 * STILL_S
    assert reporter.client.close(DEADLINE_S)


def test_a_commit_acknowledgement_also_opens_the_window(window, relay, upward, tmp_path):
    """A round's commit comes only after each of its reports was recorded, so its ReportAck counts."""
    reporter = Reporter(relay, tmp_path, total=WINDOW + 2)
    upward.wait_count(WINDOW)
    assert upward.stays_at(WINDOW)
    _down(relay, upward.stream, pb.WorkerCommand(report_ack=pb.ReportAck(round=1)))
    reporter.thread.join(DEADLINE_S)
    assert not reporter.thread.is_alive() and reporter.error is None
    upward.wait_count(WINDOW + 2)
    assert reporter.client.close(DEADLINE_S)


def test_report_waiting_on_a_stream_that_ends_raises_stream_closed(window, relay, upward, tmp_path):
    """The coordinator closing the stream (the attempt is over) ends the wait with an error naming it,
    instead of leaving the training loop blocked."""
    reporter = Reporter(relay, tmp_path, total=2 * WINDOW)
    upward.wait_count(WINDOW)
    relay.deliver(pb.RelayedDown(items=[pb.RelayedCommand(stream=upward.stream, close=True)]))
    reporter.thread.join(DEADLINE_S)
    assert not reporter.thread.is_alive()
    assert isinstance(reporter.error, StreamClosed) and "receipt for report 0" in str(reporter.error)
    assert len(upward.reports) == WINDOW
    reporter.client.close(DEADLINE_S)


def test_which_reports_ask_for_a_receipt_and_which_wait():
    assert [r for r in range(300) if report_window.wants_receipt(r)] == [63, 127, 191, 255]
    assert not report_window.must_wait(255, -1) and report_window.must_wait(256, -1)
    assert report_window.oldest_allowed(256) == 0 and not report_window.must_wait(256, 0)
    assert report_window.must_wait(320, 63) and not report_window.must_wait(319, 63)


def test_the_defaults_ask_for_a_receipt_well_inside_the_window():
    # A receipt asked for every EVERY reports, at least two per window: a rank never waits while the
    # coordinator keeps up.
    assert report_window.REPORT_WINDOW % report_window.RECEIPT_EVERY == 0
    assert report_window.REPORT_WINDOW >= 2 * report_window.RECEIPT_EVERY


# ---------------------------------------------------------------------------------- coordinator side


def test_the_controller_sends_a_receipt_once_it_recorded_the_report(tmp_path):
    """A receipt does not wait for the round (another rank has not reported it) and goes to the rank
    that asked only; a report of another attempt is dropped and gets none."""
    controller, tracker = training_controller(tmp_path, 2, FailureConfig(max_failures=0), lambda: 10.0)
    loop = asyncio.new_event_loop()
    try:
        controller._outbox.bind_loop(loop)
        outboxes = {rank: asyncio.Queue() for rank in (0, 1)}
        for rank, outbox in outboxes.items():
            controller._outbox.register_worker(0, rank, outbox)
        for rank in (0, 1):
            controller._handle(ev.WorkerPhaseChanged(0, rank, Phase.TRAINING))

        def report(rank, round_, attempt=0, receipt=False):
            return ReportRecord(attempt, rank, round_, "{}", 9.0, wants_receipt=receipt)

        controller._handle(ev.ReportsReceived((report(0, 0), report(0, 1, receipt=True),
                                               report(1, 0, attempt=3, receipt=True), report(0, 2))))
        loop.run_until_complete(asyncio.sleep(0))  # the hub's flush runs on the loop
        receipts = {rank: [c.report_receipt.round for c in (outbox.get_nowait() for _ in range(outbox.qsize()))
                           if c.WhichOneof("body") == "report_receipt"]
                    for rank, outbox in outboxes.items()}
        assert receipts == {0: [1], 1: []}
        assert controller._commits._rounds.next_round == 0  # rank 1 holds every round back
    finally:
        loop.close()
