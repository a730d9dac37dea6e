"""Progress digests: an agent's consecutive relayed reports folded into columns (the wire format's side).

A relayed batch (`RelayedUp`) at thousands of ranks is mostly plain reports: one per worker of the
host and round. As `RelayedMessage(stream, WorkerMessage(report=Report(...)))` items each costs the
coordinator's server loop a nested message to walk in Python (about ten field reads through the
protobuf runtime, per report). `fold_reports` (the agent's side, L2) replaces every run of consecutive
foldable reports among the items by one item carrying a `ReportDigest`: packed columns (stream, attempt,
rank, round, reported_at, wants_ack, wants_receipt) and the metrics JSON, which the protobuf runtime
decodes in C. The coordinator turns a digest back into `ReportRecord`s with one `map` over the columns
(`minitrain.rpc.convert.reports_from_digest`, with the other conversions from messages to records).

Contract (what makes the fold invisible to the controller):
- nothing is lost or merged: entry i of a digest is exactly one report, with every field the controller
  reads (a folded report has no checkpoint: `checkpoint_dir_name` empty, `staged` false);
- nothing is reordered: a digest takes the place of the run of items it folds, and any item that is not
  foldable (another message kind, a report with a checkpoint, a message of another run, a closing item)
  ends the run and keeps its own place;
- the report window holds: `wants_receipt` and `wants_ack` travel per report, so the coordinator answers
  each as it would the report's own message.
"""

from __future__ import annotations

from typing import Iterable

from minitrain.rpc._gen import minitrain_pb2 as pb


def _foldable(message: pb.WorkerMessage, run_id: str):
    """The reports of `message` when it may be folded (plain reports of `run_id`), else None."""
    if message.run_id != run_id:
        return None  # (the coordinator reads it on its own and ends the stream)
    kind = message.WhichOneof("body")
    if kind == "report":
        reports = (message.report,)
    elif kind == "report_batch":
        reports = message.report_batch.reports
    else:
        return None
    for report in reports:
        if report.checkpoint_dir_name or report.staged:
            return None
    return reports


def fold_reports(items: Iterable[pb.RelayedMessage], run_id: str) -> list[pb.RelayedMessage]:
    """`items` in order, with each run of consecutive foldable reports (see the module docstring) as one
    digest item (stream 0). A run of a single report with nothing beside it is folded too: the digest is
    smaller to decode than the nested message."""
    out: list[pb.RelayedMessage] = []
    columns = None
    for item in items:
        reports = None
        if not item.closed and item.HasField("message"):
            reports = _foldable(item.message, run_id)
        if reports is None:
            if columns is not None:
                out.append(_digest_item(columns))
                columns = None
            out.append(item)
            continue
        if columns is None:
            columns = ([], [], [], [], [], [], [], [])
        stream, attempt, rank = item.stream, item.message.attempt, item.message.rank
        streams, attempts, ranks, rounds, stamps, metrics, acks, receipts = columns
        for report in reports:
            streams.append(stream)
            attempts.append(attempt)
            ranks.append(rank)
            rounds.append(report.round)
            stamps.append(report.reported_at)
            metrics.append(report.metrics_json)
            acks.append(report.wants_ack)
            receipts.append(report.wants_receipt)
    if columns is not None:
        out.append(_digest_item(columns))
    return out


def _digest_item(columns) -> pb.RelayedMessage:
    streams, attempts, ranks, rounds, stamps, metrics, acks, receipts = columns
    return pb.RelayedMessage(digest=pb.ReportDigest(
        stream=streams, attempt=attempts, rank=ranks, round=rounds, reported_at=stamps, metrics_json=metrics,
        wants_ack=acks, wants_receipt=receipts))

