"""`minitrain.get_context().get_storage()` in a worker (minitrain.worker.session.StorageContext): Ray's
StorageContext attributes, backed by the run's Storage, so the NO_UPLOAD writers and
checkpoint_upload_fns of Ray's upload-mode tests run unchanged. In process: a fake client stands in
for the coordinator, the run directory is real."""

from __future__ import annotations

import os

import pyarrow.fs
import pytest

from minitrain import CheckpointUploadMode
from minitrain.checkpoint import Checkpoint
from minitrain.context import TrainContext
from minitrain.storage.filesystem import Storage
from minitrain.worker.session import StorageContext, WorkerSession
from test_worker_session import FakeClient


@pytest.fixture
def run(tmp_path):
    storage = Storage.for_run(str(tmp_path / "results"), "exp")
    storage.makedirs()
    return storage


def _session(run):
    client = FakeClient()
    context = TrainContext(experiment_name="exp", storage_path=run.url(""))
    return WorkerSession(client, context, run), client


def test_get_storage_gives_ray_s_attributes(run, tmp_path):
    session, _ = _session(run)
    storage = session.context.get_storage()
    assert isinstance(storage, StorageContext)
    assert storage.storage_path == str(tmp_path / "results")
    assert storage.experiment_dir_name == "exp"
    assert storage.experiment_fs_path == str(tmp_path / "results" / "exp")
    assert isinstance(storage.storage_filesystem, pyarrow.fs.FileSystem)
    assert storage.storage_filesystem.get_file_info(storage.experiment_fs_path).type == pyarrow.fs.FileType.Directory
    assert storage.build_checkpoint_path_from_name("ckpt_1") == str(tmp_path / "results" / "exp" / "ckpt_1")


@pytest.mark.parametrize("name", ["", "a/b", "..", ".staging", "logs", 3])
def test_build_checkpoint_path_refuses_names_outside_the_run_directory(run, name):
    session, _ = _session(run)
    with pytest.raises(ValueError, match="checkpoint_dir_name"):
        session.context.get_storage().build_checkpoint_path_from_name(name)


def test_a_no_upload_writer_reports_the_directory_get_storage_built(run):
    """Ray's NO_UPLOAD pattern: write into build_checkpoint_path_from_name(name), report it."""
    session, client = _session(run)
    path = session.context.get_storage().build_checkpoint_path_from_name("my_ckpt")
    os.makedirs(path)
    with open(os.path.join(path, "shard_0"), "w") as f:
        f.write("w")
    session.report({"a": 1}, checkpoint=Checkpoint(path), checkpoint_upload_mode=CheckpointUploadMode.NO_UPLOAD)
    report = client.sent[0].report
    assert (report.checkpoint_dir_name, report.staged) == ("my_ckpt", False)


def test_persist_current_checkpoint_serves_as_a_checkpoint_upload_fn(run, tmp_path):
    session, client = _session(run)
    local = tmp_path / "local"
    local.mkdir()
    (local / "model.txt").write_text("weights")

    def upload(checkpoint, dir_name):
        return session.context.get_storage().persist_current_checkpoint(checkpoint, dir_name)

    session.report({"a": 1}, checkpoint=Checkpoint.from_directory(str(local)), checkpoint_dir_name="up",
                   checkpoint_upload_fn=upload)
    assert (client.sent[0].report.checkpoint_dir_name, client.sent[0].report.staged) == ("up", False)
    assert open(run.path("up/model.txt")).read() == "weights"


def test_get_storage_in_local_mode_raises_naming_the_reason():
    with pytest.raises(RuntimeError, match="local mode"):
        TrainContext(experiment_name="x", local_mode=True).get_storage()
