"""Planted links in a shared storage directory: another user who can write `storage_path`
creates the run directory's entries first, under minitrain's own names, as links to the victim's files.
Every local write of the run refuses them, naming the entry, and leaves the victim's files untouched."""

from __future__ import annotations

import os

import pytest

from minitrain.driver.logs import LogSink
from minitrain.storage.filesystem import Storage, StorageError
from minitrain.storage.layout import (EVENTS_NAME, INDEX_NAME, LOCK_NAME, LOGS_DIR, METRICS_NAME, STAGING_DIR,
                                      TELEMETRY_NAME, TRACKERS_DIR, VALIDATE_MARKER)
from minitrain.storage.run_lock import RunLock
from minitrain.storage.safe_files import PlantedEntryError

OTHER_UID = 54321


@pytest.fixture
def victim(tmp_path):
    """A file and a directory of the victim's, outside the shared storage directory."""
    home = tmp_path / "home"
    (home / "dir").mkdir(parents=True)
    (home / "precious.txt").write_text("keep me\n")
    (home / "dir" / "notes.txt").write_text("mine\n")
    return home


def _intact(victim) -> None:
    assert (victim / "precious.txt").read_text() == "keep me\n"
    assert sorted(os.listdir(victim / "dir")) == ["notes.txt"]
    assert (victim / "dir" / "notes.txt").read_text() == "mine\n"


def _shared_run(tmp_path, planted: dict[str, str]) -> Storage:
    run = tmp_path / "shared" / "run"
    run.mkdir(parents=True)
    for name, target in planted.items():
        os.symlink(target, run / name)
    return Storage.for_run(str(tmp_path / "shared"), "run")


@pytest.mark.parametrize("name", [LOCK_NAME, VALIDATE_MARKER, EVENTS_NAME, TELEMETRY_NAME, METRICS_NAME,
                                  INDEX_NAME, LOGS_DIR, TRACKERS_DIR, STAGING_DIR])
def test_the_run_lock_refuses_a_planted_link_under_any_own_name(tmp_path, victim, name):
    target = victim / ("dir" if name in (LOGS_DIR, TRACKERS_DIR, STAGING_DIR) else "precious.txt")
    storage = _shared_run(tmp_path, {name: str(target)})
    with pytest.raises(StorageError, match="symbolic link") as info:
        RunLock(storage).acquire()
    assert f"run/{name}" in str(info.value) and "storage_path" in str(info.value)
    _intact(victim)


def test_each_write_refuses_a_link_planted_after_the_lock(tmp_path, victim):
    storage = _shared_run(tmp_path, {})
    with RunLock(storage):
        run = tmp_path / "shared" / "run"
        for name in (METRICS_NAME, EVENTS_NAME, TELEMETRY_NAME, INDEX_NAME, VALIDATE_MARKER):
            os.symlink(victim / "precious.txt", run / name)
        os.symlink(victim / "dir", run / LOGS_DIR)
        os.symlink(victim / "dir", run / STAGING_DIR)
        os.symlink(victim / "dir", run / "checkpoint_000001")
        attempts = [
            lambda: storage.append_text(METRICS_NAME, "{}\n"),
            lambda: storage.append_text(EVENTS_NAME, "{}\n"),
            lambda: storage.append_text(f"{LOGS_DIR}/attempt_0/rank_0.log", "x\n"),
            lambda: storage.write_text_atomic(INDEX_NAME, "{}"),
            lambda: storage.write_text_atomic(f"{STAGING_DIR}/x.json", "{}"),
            lambda: storage.makedirs(f"{STAGING_DIR}/attempt_0"),
            lambda: storage.upload_dir(str(victim / "dir"), f"{STAGING_DIR}/attempt_0/rank_0/ckpt"),
            lambda: storage.validate_writable(),
            lambda: storage.remove_tree(f"{STAGING_DIR}/notes.txt"),
            lambda: storage.open_local(f"{LOGS_DIR}/attempt_0/rank_0.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT),
        ]
        for attempt in attempts:
            with pytest.raises(StorageError, match="symbolic link"):
                attempt()
        _intact(victim)


def test_a_commit_into_a_planted_checkpoint_directory_is_refused(tmp_path, victim):
    storage = _shared_run(tmp_path, {})
    staged = tmp_path / "ckpt"
    staged.mkdir()
    (staged / "model.pt").write_text("weights")
    storage.upload_dir(str(staged), f"{STAGING_DIR}/a/r/checkpoint_000001")
    os.symlink(victim / "dir", tmp_path / "shared" / "run" / "checkpoint_000001")
    with pytest.raises(StorageError, match="symbolic link"):
        storage.promote([f"{STAGING_DIR}/a/r/checkpoint_000001"], "checkpoint_000001")
    _intact(victim)


def test_a_planted_run_directory_or_entry_of_another_user_is_refused(tmp_path):
    run = tmp_path / "shared" / "run"
    run.mkdir(parents=True)
    os.chown(run, OTHER_UID, OTHER_UID)
    storage = Storage.for_run(str(tmp_path / "shared"), "run")
    with pytest.raises(StorageError, match=f"belongs to uid {OTHER_UID}"):
        RunLock(storage).acquire()
    os.chown(run, os.geteuid(), os.getegid())
    (run / METRICS_NAME).write_text("")
    os.chown(run / METRICS_NAME, OTHER_UID, OTHER_UID)
    with pytest.raises(StorageError, match=f"{METRICS_NAME} belongs to uid {OTHER_UID}"):
        storage.append_text(METRICS_NAME, "{}\n")


def test_a_run_directory_planted_as_a_link_is_refused(tmp_path, victim):
    (tmp_path / "shared").mkdir()
    os.symlink(victim / "dir", tmp_path / "shared" / "run")
    storage = Storage.for_run(str(tmp_path / "shared"), "run")
    with pytest.raises(StorageError, match="symbolic link"):
        storage.append_text(METRICS_NAME, "{}\n")
    _intact(victim)


def test_a_planted_hard_link_to_a_file_of_ours_is_refused(tmp_path, victim):
    storage = _shared_run(tmp_path, {})
    os.link(victim / "precious.txt", tmp_path / "shared" / "run" / EVENTS_NAME)
    with pytest.raises(StorageError, match="2 hard links"):
        storage.append_text(EVENTS_NAME, "{}\n")
    _intact(victim)


def test_the_worker_logs_refuse_a_planted_logs_directory(tmp_path, victim):
    storage = _shared_run(tmp_path, {LOGS_DIR: str(victim / "dir")})
    sink = LogSink(storage.path(LOGS_DIR), console=False, run_storage=storage)
    sink.open(0, 0)
    sink.write(0, 0, "node", False, ["hello"])
    assert len(sink.failures) == 1 and "symbolic link" in str(sink.failures[0])
    _intact(victim)


def test_the_error_is_an_oserror_naming_the_path_and_the_fix(tmp_path):
    error = PlantedEntryError("/shared/run/.minitrain_lock", "is a symbolic link (to '/home/v/x')")
    assert isinstance(error, OSError)
    assert str(error).startswith("/shared/run/.minitrain_lock is a symbolic link") and "storage_path" in str(error)


def test_ordinary_writes_still_work_and_reopen_own_files(tmp_path):
    storage = Storage.for_run(str(tmp_path), "run")
    with RunLock(storage):
        storage.validate_writable()
        storage.append_text(METRICS_NAME, "a\n")
        storage.append_text(METRICS_NAME, "b\n")
        storage.write_text_atomic(INDEX_NAME, "{}")
        storage.write_text_atomic(INDEX_NAME, "{\"v\": 1}")
    with RunLock(storage):  # a second fit() in the same directory reopens its own lock file
        pass
    assert storage.read_text(METRICS_NAME) == "a\nb\n" and storage.read_text(INDEX_NAME) == "{\"v\": 1}"


def test_the_datasets_staging_beside_the_run_refuses_a_planted_link(tmp_path, victim):
    from minitrain.data.staging import StagingArea
    from minitrain.storage.layout import DATASETS_DIR

    storage = _shared_run(tmp_path, {})
    os.symlink(victim / "dir", tmp_path / "shared" / DATASETS_DIR)
    with pytest.raises(StorageError, match="symbolic link"):
        StagingArea.for_run(storage, all_local=False)
    _intact(victim)
    os.unlink(tmp_path / "shared" / DATASETS_DIR)
    area = StagingArea.for_run(storage, all_local=False)
    assert os.path.isdir(area.root) and not os.path.islink(tmp_path / "shared" / DATASETS_DIR)
    area.cleanup()
