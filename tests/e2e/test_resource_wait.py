"""Runs wait for resources instead of failing: two real drivers that each need the whole host
run one after the other and both succeed, and the second says what it waited for and who held it; a Tune
trial and a plain run share the same ledger."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

DRIVER = Path(__file__).with_name("resource_wait_driver.py")
ROOT = Path(__file__).resolve().parents[2]


def _wait_for(condition, what: str, timeout_s: float = 120.0, alive=()) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        ended = [p for p in alive if p.poll() is not None]
        if ended:
            raise AssertionError(f"{what} did not happen: pid {ended[0].pid} exited with {ended[0].returncode}")
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
        _wait_for(lambda: (out / "started_first").exists(), "the first run's start", alive=[first])
        second = start("second")
        _wait_for(lambda: "is waiting for" in (tmp_path / "second.log").read_text(), "the second run's wait", alive=[first, second])
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


def test_a_tune_trial_waits_for_a_plain_run_on_the_same_ledger(tmp_path, monkeypatch):
    """A plain run holds the whole host; a sweep whose trial needs the whole host too starts the trial
    (the sweep's own placement sees an idle host), and the trial's fit() waits in the ledger until the
    plain run ends, saying so in the trial's log."""
    from minitrain import tune
    from resource_wait_driver import whole_host_trainer

    out, storage = tmp_path / "out", tmp_path / "storage"
    out.mkdir()
    env = _env(tmp_path)
    for name in ("MINITRAIN_LEDGER_DIR", "MINITRAIN_STATUS", "MINITRAIN_DASHBOARD"):
        monkeypatch.setenv(name, env[name])
    with open(tmp_path / "plain.log", "w") as log:
        plain = subprocess.Popen([sys.executable, str(DRIVER), "plain", str(out), str(storage), "--hold"], env=env,
                                 stdout=log, stderr=subprocess.STDOUT, cwd=str(tmp_path))
    try:
        _wait_for(lambda: (out / "started_plain").exists(), "the plain run's start", alive=[plain])
        results: list = []
        sweep = threading.Thread(target=lambda: results.append(tune.Tuner(
            whole_host_trainer("trial", str(out), str(storage))).fit()), name="sweep")
        sweep.start()
        trial_logs = lambda: list((storage / "trial").glob(".tune/*.log"))  # noqa: E731
        _wait_for(lambda: any("is waiting for" in p.read_text() for p in trial_logs()), "the trial's wait")
        assert not (out / "started_trial").exists()
        (out / "go").touch()
        assert plain.wait(180) == 0, (tmp_path / "plain.log").read_text()
        sweep.join(300)
        assert not sweep.is_alive()
    finally:
        if plain.poll() is None:
            plain.kill()
            plain.wait(30)
    (grid,) = results
    assert grid.num_errors == 0 and len(grid) == 1
    said = "".join(p.read_text() for p in trial_logs())
    assert "held by run plain (" in said and f"pid {plain.pid}" in said
    assert (out / "started_trial").read_text() == "finished_plain"


def _world_size(config):
    import minitrain

    minitrain.report({"world_size": minitrain.get_context().get_world_size()})


def test_an_elastic_run_starts_with_what_is_free_when_another_run_holds_part_of_the_host(tmp_path):
    import minitrain
    from minitrain.hosts import hostinfo
    from minitrain.hosts.cluster import ClusterConfig, HostSpec
    from minitrain.hosts.demand import Need
    from minitrain.hosts.reserve import reserve
    from minitrain.torch import TorchTrainer

    cpus = hostinfo.cpu_count()
    if cpus < 2:
        pytest.skip("needs 2 CPUs: one held by another run, one for the elastic run")
    held = cpus // 2
    with reserve(ClusterConfig(hosts=(HostSpec("localhost"),)), Need(1, cpus=float(held)), "holder"):
        result = TorchTrainer(
            _world_size,
            scaling_config=minitrain.ScalingConfig(num_workers=(1, cpus), resources_per_worker={"CPU": 1}),
            run_config=minitrain.RunConfig(name="elastic", storage_path=str(tmp_path))).fit()
    assert result.metrics["world_size"] == cpus - held
