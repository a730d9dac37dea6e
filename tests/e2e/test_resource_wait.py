"""Runs wait for resources instead of failing (issue 29): two real drivers that each need the whole host
run one after the other and both succeed, and the second says what it waited for and who held it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

DRIVER = Path(__file__).with_name("resource_wait_driver.py")
ROOT = Path(__file__).resolve().parents[2]


def _wait_for(condition, what: str, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not happen within {timeout_s} s")
        time.sleep(0.05)


def _env(tmp_path) -> dict:
    return {**os.environ, "MINITRAIN_LEDGER_DIR": str(tmp_path / "ledger"), "MINITRAIN_STATUS": "lines",
            "MINITRAIN_DASHBOARD": "0",
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}


def test_two_runs_that_need_the_whole_host_run_one_after_the_other(tmp_path):
    out, storage = tmp_path / "out", tmp_path / "storage"
    out.mkdir()
    env = _env(tmp_path)
    logs = {name: open(tmp_path / f"{name}.log", "w+") for name in ("first", "second")}

    def start(name, *extra):
        return subprocess.Popen([sys.executable, str(DRIVER), name, str(out), str(storage), *extra], env=env,
                                stdout=logs[name], stderr=subprocess.STDOUT, cwd=str(tmp_path))

    first = start("first", "--hold")
    second = None
    try:
        _wait_for(lambda: (out / "started_first").exists(), "the first run's start")
        second = start("second")
        _wait_for(lambda: "is waiting for" in (tmp_path / "second.log").read_text(), "the second run's wait")
        assert not (out / "started_second").exists()
        (out / "go").touch()
        assert first.wait(180) == 0, (tmp_path / "first.log").read_text()
        assert second.wait(180) == 0, (tmp_path / "second.log").read_text()
    finally:
        for process in (first, second):
            if process is not None and process.poll() is None:
                process.kill()
                process.wait(30)
        for log in logs.values():
            log.close()
    said = (tmp_path / "second.log").read_text()
    cpus = os.sched_getaffinity(0)
    assert f"run 'second' is waiting for {len(cpus)} CPUs on localhost since " in said
    assert "held by run first (" in said and f"pid {first.pid}" in said
    assert "run 'second' got" in said and "result second {'done': 1}" in said
    # Never overlapping: the second's worker started after the first's had finished.
    assert (out / "started_second").read_text() == "finished_first"
    assert not os.listdir(tmp_path / "ledger")[1:], "a claim outlived its run"
