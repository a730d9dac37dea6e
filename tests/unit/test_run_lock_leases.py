"""One fit() per run directory, within one process (minitrain.storage.run_lock): the per-process registry,
and the conditional-create lease on memory storage and on object stores (a real S3 API: moto, served from a
thread). The OFD lock between processes: tests/process/test_run_lock.py."""

from __future__ import annotations

import json
import os
import time
import uuid

import pytest

from minitrain.storage.filesystem import Storage
from minitrain.storage.layout import LOCK_NAME
from minitrain.storage.run_lock import LEASE_EXPIRY_S, RunLock, RunLockedError


def test_a_second_lock_in_the_same_process_is_refused_until_released(tmp_path):
    storage = Storage.for_run(str(tmp_path), "run")
    with RunLock(storage):
        with pytest.raises(RunLockedError, match="this process"):
            RunLock(storage).acquire()
        holder = json.loads((tmp_path / "run" / LOCK_NAME).read_text())
        assert holder["pid"] == os.getpid()
    with RunLock(storage):  # released: taken again
        pass


def test_memory_storage_uses_a_lease(tmp_path):
    storage = Storage.for_run(f"memory://lock-{uuid.uuid4().hex}", "run")
    lock = RunLock(storage)
    lock.acquire()
    try:
        assert storage.exists(LOCK_NAME)
    finally:
        lock.release()
    assert not storage.exists(LOCK_NAME)


def test_an_s3_lease_is_exclusive_and_an_expired_one_is_taken_over(s3):
    storage = Storage.for_run(s3.url("results"), "run", filesystem=s3.filesystem())
    other = dict(host="elsewhere", pid=4242, since=time.time(), renewed_at=time.time())
    storage.fs.pipe_file(storage.path(LOCK_NAME), json.dumps(other).encode())
    with pytest.raises(RunLockedError, match="host elsewhere, pid 4242"):
        RunLock(storage).acquire()
    stale = dict(other, renewed_at=time.time() - LEASE_EXPIRY_S - 5)
    storage.fs.pipe_file(storage.path(LOCK_NAME), json.dumps(stale).encode())
    lock = RunLock(storage)
    lock.acquire()
    try:
        assert json.loads(storage.fs.cat_file(storage.path(LOCK_NAME)))["pid"] == os.getpid()
        storage.fs.invalidate_cache()
        with pytest.raises(RunLockedError):  # a conditional create: the live lease wins
            RunLock(Storage.for_run(s3.url("results"), "run", filesystem=s3.filesystem()))._take_lease()
    finally:
        lock.release()


def test_an_s3_holder_that_lost_its_lease_never_overwrites_or_deletes_the_new_one(s3, monkeypatch, caplog):
    # A driver frozen past the expiry lost its lease on the object store to another; when
    # it wakes, its renewer and its release must leave the new holder's lease alone.
    import minitrain.storage.run_lock as run_lock

    monkeypatch.setattr(run_lock, "LEASE_RENEW_S", 0.2)
    storage = Storage.for_run(s3.url("results"), "run", filesystem=s3.filesystem())
    lock = RunLock(storage)
    lock.acquire()
    try:
        other = dict(host="elsewhere", pid=4242, since=time.time(), renewed_at=time.time(), token="theirs")
        storage.fs.pipe_file(storage.path(LOCK_NAME), json.dumps(other).encode())  # the takeover
        deadline = time.monotonic() + 10
        while not lock.lost_lease and time.monotonic() < deadline:
            time.sleep(0.05)
        assert lock.lost_lease
        assert "taken over by another fit() (" in caplog.text and "host elsewhere, pid 4242" in caplog.text
    finally:
        lock.release()
    storage.fs.invalidate_cache()
    assert json.loads(storage.fs.cat_file(storage.path(LOCK_NAME)))["token"] == "theirs"
