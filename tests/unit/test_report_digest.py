"""Progress digests (minitrain.rpc.digest): an agent's runs of plain reports folded into columns, and the
coordinator's intake of them (`worker_streams.RelayedStreams`). The fold must be invisible to the controller: the same
events, with the same reports in the same order, as the unfolded items; nothing lost, nothing merged,
receipts and acks asked for per report, every other message in its place."""

from __future__ import annotations

import asyncio
import queue

import pytest

from minitrain.coordinator.facts import events as ev
from minitrain.coordinator.transport import worker_streams
from minitrain.records import ReportRecord
from minitrain.rpc._gen import minitrain_pb2 as pb
from minitrain.rpc.convert import reports_from_digest
from minitrain.rpc.digest import fold_reports

RUN = "run-1"


def _report(stream: int, round_: int, rank: int = -1, run: str = RUN, checkpoint: str = "", receipt=False,
            ack=False) -> pb.RelayedMessage:
    report = pb.Report(round=round_, metrics_json=f'{{"step": {round_}}}', reported_at=1000.0 + round_,
                       checkpoint_dir_name=checkpoint, wants_receipt=receipt, wants_ack=ack)
    return pb.RelayedMessage(stream=stream, message=pb.WorkerMessage(
        run_id=run, attempt=2, rank=stream * 10 if rank < 0 else rank, report=report))


def _batch(stream: int, rounds: list[int]) -> pb.RelayedMessage:
    reports = [pb.Report(round=r, metrics_json="{}", reported_at=5.0 + r) for r in rounds]
    return pb.RelayedMessage(stream=stream, message=pb.WorkerMessage(
        run_id=RUN, attempt=2, rank=stream, report_batch=pb.ReportBatch(reports=reports)))


def _phase(stream: int) -> pb.RelayedMessage:
    return pb.RelayedMessage(stream=stream, message=pb.WorkerMessage(
        run_id=RUN, attempt=2, rank=stream * 10, phase=pb.PhaseChange(phase=pb.PHASE_TRAINING)))


def _shape(items) -> list:
    return [("digest", list(i.digest.stream), list(i.digest.round)) if not i.stream else i.stream for i in items]


def test_runs_of_plain_reports_fold_and_everything_else_keeps_its_place():
    items = [_report(1, 0), _report(2, 0, receipt=True), _phase(3), _report(1, 1, checkpoint="ckpt"),
             _report(2, 1, ack=True), _report(4, 0, run="another-run"), _batch(5, [3, 4]),
             pb.RelayedMessage(stream=2, closed=True), _report(1, 2)]
    folded = fold_reports(items, RUN)
    assert _shape(folded) == [("digest", [1, 2], [0, 0]), 3, 1, ("digest", [2], [1]), 4, ("digest", [5, 5], [3, 4]),
                              2, ("digest", [1], [2])]
    # The items that were not folded are the very same messages.
    assert folded[1] is items[2] and folded[2] is items[3] and folded[4] is items[5] and folded[6] is items[7]
    first = reports_from_digest(folded[0].digest)
    assert first == [ReportRecord(2, 10, 0, '{"step": 0}', 1000.0), ReportRecord(2, 20, 0, '{"step": 0}', 1000.0,
                                                                              wants_receipt=True)]
    assert reports_from_digest(folded[3].digest)[0].wants_ack
    assert [r.reported_at for r in reports_from_digest(folded[5].digest)] == [8.0, 9.0]


def test_a_digest_with_columns_of_different_lengths_is_refused():
    digest = fold_reports([_report(1, 0), _report(2, 0)], RUN)[0].digest
    del digest.round[1]
    with pytest.raises(ValueError, match="columns differ in length"):
        reports_from_digest(digest)


class _Hub:
    def __init__(self):
        self.registered = []

    def register_worker(self, attempt, rank, outbox):
        self.registered.append((attempt, rank))

    def unregister_worker(self, attempt, rank, outbox):
        pass


def _events(items: list, fold: bool) -> list:
    events = queue.SimpleQueue()
    streams = worker_streams.RelayedStreams(events, _Hub(), RUN, asyncio.Queue())
    streams.receive(pb.RelayedUp(items=fold_reports(items, RUN) if fold else items))
    out = []
    while not events.empty():
        out.append(events.get())
    return out


def test_the_coordinator_makes_the_same_events_of_a_digest_as_of_the_reports_it_folds():
    hello = pb.RelayedMessage(stream=1, message=pb.WorkerMessage(run_id=RUN, attempt=2, rank=10,
                                                                 hello=pb.WorkerHello(pid=7, hostname="h")))
    items = [hello, _report(1, 0), _report(2, 0, receipt=True), _phase(1), _report(1, 1, checkpoint="c"),
             _batch(2, [1, 2]), pb.RelayedMessage(stream=1, closed=True), _report(1, 5), _report(3, 0)]
    plain, folded = _events(items, fold=False), _events(items, fold=True)
    assert plain == folded
    kinds = [type(e).__name__ for e in folded]
    assert kinds == ["WorkerConnected", "ReportsReceived", "WorkerPhaseChanged", "ReportsReceived",
                     "WorkerStreamClosed", "ReportsReceived"]
    reports = [r for e in folded if isinstance(e, ev.ReportsReceived) for r in e.reports]
    # Stream 1's report after its close is dropped (its number is never reused); stream 3 is new.
    assert [(r.rank, r.round) for r in reports] == [(10, 0), (20, 0), (10, 1), (2, 1), (2, 2), (30, 0)]
    assert reports[1].wants_receipt and reports[2].checkpoint_dir_name == "c"
