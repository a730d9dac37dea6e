"""One fit() per run directory (minitrain.storage.run_lock) between processes: the OFD lock on local disk,
held by another process and released by its death. The per-process registry and the leases on memory
storage and object stores: tests/unit/test_run_lock_leases.py."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from minitrain.storage.filesystem import Storage
from minitrain.storage.layout import LOCK_NAME
from minitrain.storage.run_lock import RunLock, RunLockedError


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
