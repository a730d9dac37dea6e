"""The training session inside a worker (minitrain.worker.session.WorkerSession), in process: a fake
client stands in for the coordinator stream, the run directory is real. Every error path of report()
raises before anything is sent, names the argument and the fix, and leaves the round counter alone."""

from __future__ import annotations

import os
import threading
from types import SimpleNamespace

import pytest

from minitrain import CheckpointUploadMode
from minitrain.checkpoint import Checkpoint
from minitrain.context import TrainContext
from minitrain.records import Phase
from minitrain.rpc._gen import minitrain_pb2 as pb
from minitrain.storage.filesystem import Storage
from minitrain.storage.layout import staged_dir
from minitrain.worker.session import UploadFailed, WorkerSession
from minitrain.worker.transport.client import WorkerClient


class FakeClient:
    """The part of WorkerClient a session uses: records messages, acknowledges at once."""

    run_id, attempt, rank = "run-1", 2, 0
    preemption_noticed = False  # no preemption in these tests (tests/e2e/test_preemption_signals.py)

    def __init__(self):
        self.sent = []
        self.acked = []
        self.phases = []  # the phases sent, in order

    def count_reports_with(self, rounds_reported):
        self.rounds_reported = rounds_reported  # (asked only by a preemption notice, which never comes here)

    def report_message(self, round_, metrics_json, dir_name, staged):
        return WorkerClient.report_message(self, round_, metrics_json, dir_name, staged)  # the real message

    def put(self, report):
        self.sent.append(SimpleNamespace(report=report.to_message()))  # what the sender would send

    def send_phase(self, phase):
        self.phases.append(Phase(phase))

    def wait_report_ack(self, round_, timeout_s):
        self.acked.append(round_)

    @property
    def recorded_round(self):
        return len(self.sent) - 1  # the coordinator records each report at once

    def list_checkpoints(self, request_id, rounds, timeout_s):
        return []


@pytest.fixture
def run(tmp_path):
    storage = Storage.for_run(str(tmp_path / "results"), "run")
    storage.makedirs()
    return storage


def _session(storage, committed=()):
    client = FakeClient()
    session = WorkerSession(client, TrainContext(experiment_name="run"), storage, report_index_base=5,
                            committed_dir_names=tuple(committed))
    return session, client


def _checkpoint(tmp_path, name="ckpt"):
    directory = tmp_path / name
    directory.mkdir(exist_ok=True)
    (directory / "model.txt").write_text("weights")
    return Checkpoint.from_directory(str(directory))


def test_a_sync_checkpoint_is_staged_reported_and_acknowledged(run, tmp_path):
    session, client = _session(run)
    session.report({"loss": 1.0}, checkpoint=_checkpoint(tmp_path))
    report = client.sent[0].report
    assert (report.round, report.checkpoint_dir_name, report.staged, report.wants_ack) == (
        0, "checkpoint_000005", True, True)
    assert client.acked == [0]
    assert os.listdir(run.path(staged_dir(2, 0, "checkpoint_000005"))) == ["model.txt"]
    assert session.phase_seconds["upload_s"] > 0 and session.rounds_reported == 1
    # The coordinator's hang clock knows the upload (it gives an upload its own allowance).
    assert client.phases == [Phase.CHECKPOINT_UPLOAD, Phase.TRAINING]


def test_metrics_only_reports_never_wait(run):
    session, client = _session(run)
    session.report({"step": 1})
    assert client.sent[0].report.wants_ack is False and client.acked == []


class _QueueingClient(WorkerClient):
    """A real WorkerClient whose transport only keeps what it would send."""

    def __init__(self):
        super().__init__("run-1", 2, 0)
        self.queued = []

    def _queue(self, item, urgent):
        self.queued.append(item)


def test_a_preemption_notice_is_answered_with_the_session_s_report_count(run):
    """The session tells its client how to count its reports (`count_reports_with`): the client's answer to
    a PreemptionNotice, made on the stream's thread, is the count of report() calls so far."""
    client = _QueueingClient()
    session = WorkerSession(client, TrainContext(experiment_name="run"), run)
    session.report({"step": 1})
    session.report({"step": 2})
    client._take(pb.WorkerCommand(preemption_notice=pb.PreemptionNotice()))  # as the transport's reader does
    [answer] = [m for m in client.queued if isinstance(m, pb.WorkerMessage) and m.HasField("preemption_seen")]
    assert answer.preemption_seen.rounds == 2 == session.rounds_reported and client.preemption_noticed


def _refused(session, client, error, match, **kwargs):
    with pytest.raises(error, match=match):
        session.report({"loss": 1.0}, **kwargs)
    assert client.sent == [] and session.rounds_reported == 0


def test_validation_is_refused(run):
    session, client = _session(run)
    _refused(session, client, ValueError, "validation=", validation=True)


def test_a_checkpoint_that_is_not_a_checkpoint_is_refused(run, tmp_path):
    session, client = _session(run)
    _refused(session, client, TypeError, "minitrain.Checkpoint.from_directory", checkpoint=str(tmp_path))


@pytest.mark.parametrize("name, match", [("a/b", "plain directory name"), ("..", "plain directory name"),
                                         ("", "plain directory name"), ("logs", "reserved"),
                                         (".staging", "reserved"), (".hidden", "reserved")])
def test_a_bad_checkpoint_dir_name_is_refused(run, tmp_path, name, match):
    session, client = _session(run)
    _refused(session, client, ValueError, match, checkpoint=_checkpoint(tmp_path), checkpoint_dir_name=name)


def test_a_committed_name_is_never_reused(run, tmp_path):
    session, client = _session(run, committed=["best"])
    _refused(session, client, ValueError, "already used by a committed checkpoint",
             checkpoint=_checkpoint(tmp_path), checkpoint_dir_name="best")


def test_deleting_a_checkpoint_inside_the_run_directory_is_refused(run):
    inside = run.path("mine")
    os.makedirs(inside)
    session, client = _session(run)
    _refused(session, client, ValueError, "would delete a directory inside the run directory",
             checkpoint=Checkpoint.from_directory(inside), delete_local_checkpoint_after_upload=True)
    assert os.path.isdir(inside)


def test_no_upload_needs_a_directory_directly_in_the_run_directory(run, tmp_path):
    session, client = _session(run)
    _refused(session, client, ValueError, "directly inside the run directory", checkpoint=_checkpoint(tmp_path),
             checkpoint_upload_mode=CheckpointUploadMode.NO_UPLOAD)


def test_an_upload_fn_result_outside_the_run_directory_is_refused(run, tmp_path):
    session, client = _session(run)
    elsewhere = _checkpoint(tmp_path, "elsewhere")
    with pytest.raises(ValueError, match="checkpoint_upload_fn's result"):
        session.report({"loss": 1.0}, checkpoint=_checkpoint(tmp_path),
                       checkpoint_upload_fn=lambda checkpoint, name: elsewhere)
    assert client.sent == []


def test_the_collective_is_refused_before_the_process_group(run):
    session, _ = _session(run)
    with pytest.raises(RuntimeError, match="before the process group is initialised"):
        session.collective_channel()


def test_a_failed_async_upload_fails_the_worker_and_the_drain(run, tmp_path):
    session, client = _session(run)
    failed = threading.Event()
    session.on_async_failure(lambda exc: failed.set())

    def broken_upload(checkpoint, name):
        raise OSError("disk full")

    session.report({"loss": 1.0}, checkpoint=_checkpoint(tmp_path),
                   checkpoint_upload_mode=CheckpointUploadMode.ASYNC, checkpoint_upload_fn=broken_upload)
    assert failed.wait(10), "the worker was not told"
    with pytest.raises(UploadFailed, match="disk full"):
        session.finish()
    assert client.sent == []


@pytest.mark.parametrize("round_", [0, 63])  # 63 asks for a receipt
@pytest.mark.parametrize("dir_name, staged", [("", False), ("checkpoint_000001", False), ("checkpoint_000001", True)])
def test_a_queued_report_s_message_is_every_field_it_holds(round_, dir_name, staged):
    from minitrain.rpc._gen import minitrain_pb2 as pb
    from minitrain.worker.transport.client import QueuedReport

    queued = QueuedReport(round_, '{"loss": 1.5}', dir_name, staged)
    assert queued.to_message() == pb.Report(
        round=round_, metrics_json='{"loss": 1.5}', reported_at=queued.reported_at, checkpoint_dir_name=dir_name,
        wants_ack=bool(dir_name), staged=staged, wants_receipt=round_ == 63)
