"""The worker's sender packs consecutive reports into one message (minitrain.worker.transport.client): order kept
across batches and other messages, batches bounded, nothing after END_OF_STREAM, a plain report waits
REPORT_LINGER_S for company while an awaited one and every other message go at once, and a sender
that blocked after a quiet spell is woken by the next report (no report is left behind)."""

from __future__ import annotations

import collections
import threading
import time
from types import SimpleNamespace

from minitrain.rpc import report_window
from minitrain.rpc._gen import minitrain_pb2 as pb
from minitrain.rpc.channel import END_OF_STREAM
from minitrain.worker.transport import grpc_client as client_module
from minitrain.worker.transport.client import QueuedReport
from minitrain.worker.transport.grpc_client import GrpcWorkerClient as WorkerClient


def _sender():
    """The parts of a WorkerClient its sender uses, with its real queue (no channel)."""
    stub = SimpleNamespace(run_id="run-1", attempt=3, rank=1, _pending=collections.deque(),
                           _wake=threading.Event(), _sender_blocked=False, _urgent=False)
    stub._reports_message = lambda reports: WorkerClient._reports_message(stub, reports)
    stub._pack = lambda items: WorkerClient._pack(stub, items)
    stub.put = lambda item, urgent=None: WorkerClient._queue(
        stub, item, urgent if urgent is not None else not isinstance(item, QueuedReport) or item.awaited)
    return stub


def _rounds(messages) -> list:
    """Per message: the rounds it carries, or the kind of a non-report message."""
    out = []
    for message in messages:
        kind = message.WhichOneof("body")
        if kind == "report":
            out.append([message.report.round])
        elif kind == "report_batch":
            out.append([r.round for r in message.report_batch.reports])
        else:
            out.append(kind)
    return out


def _phase() -> pb.WorkerMessage:
    return pb.WorkerMessage(run_id="run-1", attempt=3, rank=1, phase=pb.PhaseChange(phase=2))


def test_consecutive_reports_share_a_message_and_other_messages_keep_their_place():
    stub = _sender()
    items = [QueuedReport(0, '{"a": 0}', "", False), QueuedReport(1, '{"a": 1}', "", False), _phase(),
             QueuedReport(2, '{"a": 2}', "", False), QueuedReport(3, '{"a": 3}', "ckpt", True)]
    messages = list(WorkerClient._pack(stub, items))
    assert _rounds(messages) == [[0, 1], "phase", [2, 3]]
    for message in messages:
        assert (message.run_id, message.attempt, message.rank) == ("run-1", 3, 1)
    last = messages[-1].report_batch.reports[-1]
    assert (last.checkpoint_dir_name, last.wants_ack, last.staged) == ("ckpt", True, True)
    assert messages[0].report_batch.reports[1].metrics_json == '{"a": 1}'


def test_a_batch_is_bounded_by_count_and_by_bytes(monkeypatch):
    stub = _sender()
    monkeypatch.setattr(client_module, "BATCH_REPORTS", 3)
    messages = list(WorkerClient._pack(stub, [QueuedReport(i, "{}", "", False) for i in range(7)]))
    assert _rounds(messages) == [[0, 1, 2], [3, 4, 5], [6]]
    monkeypatch.setattr(client_module, "BATCH_BYTES", 25)
    big = '{"x": "' + "y" * 10 + '"}'  # 17 bytes: two do not fit in 25
    messages = list(WorkerClient._pack(stub, [QueuedReport(i, big, "", False) for i in range(3)]))
    assert _rounds(messages) == [[0], [1], [2]]


def test_receipts_are_asked_for_on_the_window_s_rounds_inside_batches():
    stub = _sender()
    total = 3 * report_window.RECEIPT_EVERY
    messages = list(WorkerClient._pack(stub, [QueuedReport(i, "{}", "", False) for i in range(total)]))
    wanted = [r.round for m in messages for r in m.report_batch.reports if r.wants_receipt]
    assert wanted == [r for r in range(total) if report_window.wants_receipt(r)]


def test_the_sender_stops_at_the_end_of_stream_and_sends_what_came_before_it():
    stub = _sender()
    for item in (QueuedReport(0, "{}", "", False), _phase(), END_OF_STREAM, QueuedReport(1, "{}", "", False)):
        stub.put(item)
    assert _rounds(WorkerClient._requests(stub)) == [[0], "phase"]


def test_a_plain_report_lingers_for_company_an_awaited_one_does_not(monkeypatch):
    """A plain report waits REPORT_LINGER_S, so reports put meanwhile join its message; a checkpoint's
    report goes as soon as the sender takes it."""
    monkeypatch.setattr(client_module, "REPORT_LINGER_S", 0.5)
    stub = _sender()
    messages = WorkerClient._requests(stub)
    taken = threading.Event()
    stub.put(QueuedReport(0, "{}", "", False))
    got: list = []

    def consume():
        got.append(next(messages))
        taken.set()

    thread = threading.Thread(target=consume)
    thread.start()
    stub.put(QueuedReport(1, "{}", "", False))  # well inside the 0.5 s linger
    thread.join(10.0)
    assert taken.is_set() and _rounds(got) == [[0, 1]]
    stub.put(QueuedReport(2, "{}", "ckpt", False))
    assert _rounds([next(messages)]) == [[2]]  # would block 0.5 s more if it lingered; no timing asserted
    stub.put(END_OF_STREAM)
    assert list(messages) == []


def test_a_sender_blocked_after_a_quiet_spell_is_woken_by_a_plain_report(monkeypatch):
    """After QUIET_POLLS empty polls the sender blocks; the next plain report must wake it (a lost
    wake-up would hold the report until something else came)."""
    monkeypatch.setattr(client_module, "REPORT_LINGER_S", 0.01)
    stub = _sender()
    messages = WorkerClient._requests(stub)
    got: list = []
    done = threading.Event()

    def consume():
        for message in messages:
            got.append(message)
            done.set()

    thread = threading.Thread(target=consume, daemon=True)
    thread.start()
    for round_ in range(5):
        done.clear()
        assert _wait(lambda: stub._sender_blocked, 10.0), "the sender never blocked after its quiet polls"
        stub.put(QueuedReport(round_, "{}", "", False))
        assert done.wait(10.0), f"report {round_} was not sent: the blocked sender was not woken"
    stub.put(END_OF_STREAM)
    thread.join(10.0)
    assert not thread.is_alive() and _rounds(got) == [[r] for r in range(5)]


def _wait(condition, timeout_s: float) -> bool:
    """Poll `condition` until it holds or `timeout_s` passes; whether it held."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.001)
    return True


def test_an_urgent_item_sent_in_the_same_drain_leaves_no_urgency_behind(monkeypatch):
    """An urgent item drained with the batch must not leave the sender believing something urgent is
    still queued: it would skip its lingers and never block, spinning on an empty queue."""
    monkeypatch.setattr(client_module, "REPORT_LINGER_S", 0.01)
    stub = _sender()
    messages = WorkerClient._requests(stub)
    stub.put(_phase())  # urgent
    assert _rounds([next(messages)]) == ["phase"]
    got: list = []
    thread = threading.Thread(target=lambda: got.extend(messages), daemon=True)
    thread.start()
    assert _wait(lambda: stub._sender_blocked, 10.0), "the sender kept polling (or spinning) on an empty queue"
    assert stub._urgent is False
    stub.put(END_OF_STREAM)
    thread.join(10.0)
    assert not thread.is_alive() and got == []


def test_the_coordinator_takes_a_batch_as_its_reports_in_order_and_fails_a_message_it_cannot_read():
    """A ReportBatch is the same events as its reports one by one; a body this coordinator does not know
    (a worker of another version) fails the rank with a message that says so, instead of being dropped
    while the worker waits for receipts that never come."""
    import queue as queue_module

    from minitrain.coordinator.facts import events as ev
    from minitrain.coordinator.transport.service import Hub
    from minitrain.coordinator.transport.worker_streams import WorkerIntake

    events: queue_module.SimpleQueue = queue_module.SimpleQueue()
    intake = WorkerIntake(events, Hub(), "run-1", outbox=None)
    stub = _sender()
    batch = WorkerClient._reports_message(stub, [QueuedReport(i, '{"i": %d}' % i, "", False) for i in range(3)])
    assert intake.handle(batch)
    event = events.get_nowait()
    assert isinstance(event, ev.ReportsReceived)
    assert [(r.attempt, r.rank, r.round, r.metrics_json) for r in event.reports] == [
        (3, 1, i, '{"i": %d}' % i) for i in range(3)]
    assert intake.handle(pb.WorkerMessage(run_id="run-1", attempt=3, rank=1))  # no body at all
    failed = events.get_nowait()
    assert isinstance(failed, ev.WorkerFailed) and failed.failure.exc_type == "ProtocolMismatch"
    assert "another minitrain version" in failed.failure.message


def test_a_fast_loops_plain_reports_leave_at_most_once_per_interval_and_none_is_lost(monkeypatch):
    """Reports put every millisecond for 0.6 s with REPORT_INTERVAL_S = 0.2 s go in at most one message
    per interval (plus the first), in order, every one of them; an awaited report still goes at once.
    (Reports that ask for a receipt go at once too: the window's receipts are off here.)"""
    monkeypatch.setattr(report_window, "RECEIPT_EVERY", 10**9)
    monkeypatch.setattr(client_module, "REPORT_LINGER_S", 0.005)
    monkeypatch.setattr(client_module, "REPORT_INTERVAL_S", 0.2)
    stub = _sender()
    messages = WorkerClient._requests(stub)
    got: list = []
    sent_at: list = []

    def consume():
        for message in messages:
            got.append(message)
            sent_at.append(time.monotonic())

    thread = threading.Thread(target=consume, daemon=True)
    thread.start()
    started = time.monotonic()
    round_ = 0
    while time.monotonic() - started < 0.6:
        stub.put(QueuedReport(round_, "{}", "", False))
        round_ += 1
        time.sleep(0.001)
    took = time.monotonic() - started
    assert _wait(lambda: sum(len(r) for r in _rounds(got)) == round_, 10.0), "a queued report was never sent"
    # The sender may start 0.2 s late on a loaded machine, never early: at most one message per interval.
    assert len(got) <= 1 + took / 0.2 + 1, f"{len(got)} messages in {took:.2f} s"
    assert [r for batch in _rounds(got) for r in batch] == list(range(round_))
    gaps = [b - a for a, b in zip(sent_at, sent_at[1:])]
    assert all(gap > 0.15 for gap in gaps), gaps  # Event.wait never returns early by more than the clock's grain
    before = len(got)
    stub.put(QueuedReport(round_, "{}", "ckpt", False))  # awaited: not held back by the interval
    assert _wait(lambda: len(got) == before + 1, 10.0)
    stub.put(END_OF_STREAM)
    thread.join(10.0)
    assert not thread.is_alive()


def test_a_message_that_is_no_report_does_not_hold_back_the_next_plain_report(monkeypatch):
    """Telemetry (once a second) and phase changes go at once and must not start a report interval: a slow
    loop's plain report after one still goes after the linger, not an interval later (10 s here; the
    deadline below is half of it)."""
    monkeypatch.setattr(client_module, "REPORT_LINGER_S", 0.005)
    monkeypatch.setattr(client_module, "REPORT_INTERVAL_S", 10.0)
    stub = _sender()
    messages = WorkerClient._requests(stub)
    got: list = []
    thread = threading.Thread(target=lambda: got.extend(messages), daemon=True)
    thread.start()
    stub.put(_phase())  # urgent: goes at once
    assert _wait(lambda: len(got) == 1, 5.0)
    stub.put(QueuedReport(0, "{}", "", False))
    assert _wait(lambda: len(got) == 2, 5.0), "a plain report waited for an interval started by a phase message"
    assert _rounds(got) == ["phase", [0]]
    stub.put(END_OF_STREAM)
    thread.join(10.0)
    assert not thread.is_alive()
