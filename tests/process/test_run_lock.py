"""One fit() per run directory (minitrain.storage.run_lock): an OFD lock locally, a conditional-create lease on
object stores (a real S3 API: moto), and a per-process registry."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid

import pytest

from minitrain.storage.layout import LOCK_NAME
from minitrain.storage.run_lock import LEASE_EXPIRY_S, RunLock, RunLockedError
from minitrain.storage.filesystem import Storage


def test_a_second_lock_in_the_same_process_is_refused_until_released(tmp_path):
    storage = Storage.for_run(str(tmp_path), "run")
    with RunLock(storage):
        with pytest.raises(RunLockedError, match="this process"):
            RunLock(storage).acquire()
        holder = json.loads((tmp_path / "run" / LOCK_NAME).read_text())
        assert holder["pid"] == os.getpid()
    with RunLock(storage):  # released: taken again
        pass


def test_another_process_holding_the_lock_is_named_and_its_death_releases_it(tmp_path):
    storage = Storage.for_run(str(tmp_path), "run")
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom minitrain.storage.run_lock import RunLock\n"
         "from minitrain.storage.filesystem import Storage\n"
         f"RunLock(Storage.for_run({str(tmp_path)!r}, 'run')).acquire()\nprint('held', flush=True)\n"
         "time.sleep(600)"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(RunLockedError) as info:
            RunLock(storage).acquire()
        assert f"pid {holder.pid}" in str(info.value) and str(tmp_path / "run") in str(info.value)
    finally:
        holder.kill()  # SIGKILL: the kernel drops its fcntl lock
        holder.wait()
    with RunLock(storage):
        assert json.loads((tmp_path / "run" / LOCK_NAME).read_text())["pid"] == os.getpid()


def test_the_lock_holds_after_this_process_opens_and_closes_the_lock_file(tmp_path):
    # A classic POSIX lock (lockf) is dropped when its process closes ANY descriptor of the file: a
    # look at the holder or a copy of the run directory let a second driver in (found by the fault
    # suite's rival driver).
    storage = Storage.for_run(str(tmp_path), "run")
    probe = [sys.executable, "-c", "from minitrain.storage.run_lock import RunLock, RunLockedError\n"
             "from minitrain.storage.filesystem import Storage\n"
             f"try:\n    RunLock(Storage.for_run({str(tmp_path)!r}, 'run')).acquire()\nexcept RunLockedError:\n"
             "    print('refused')\nelse:\n    print('taken')"]
    with RunLock(storage):
        assert json.loads((tmp_path / "run" / LOCK_NAME).read_text())["pid"] == os.getpid()
        shutil.copytree(tmp_path / "run", tmp_path / "copy")
        assert subprocess.run(probe, capture_output=True, text=True, check=True).stdout.strip() == "refused"
    assert subprocess.run(probe, capture_output=True, text=True, check=True).stdout.strip() == "taken"


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
    # issue 26 probe (locks on object stores): a driver frozen past the expiry lost its lease to another; when
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
