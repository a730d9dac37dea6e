"""Monitoring end to end: a real 3-worker run whose rank 2 sleeps longer in every step is
named the straggler, with no code for it in the training function. Every rank passes a checkpoint
every few steps, so the fast ranks spend most of their time blocked in report() waiting for the
round's commit, i.e. for rank 2: they must not be named (that wait is not their work). The telemetry
behind it reaches the run directory, and a monitor rebuilt from there shows the same."""

from __future__ import annotations

import logging
import os
import tempfile
import time

import pytest

import minitrain
from minitrain import MonitoringConfig, RunConfig, ScalingConfig
from minitrain.monitoring.monitor import RunMonitor
from minitrain.storage.filesystem import Storage
from minitrain.torch import TorchTrainer

pytestmark = pytest.mark.e2e


def _train(config: dict) -> None:
    rank = minitrain.get_context().get_world_rank()
    step_s = config["slow_step_s"] if rank == config["slow_rank"] else config["step_s"]
    minitrain.set_progress_total(1000)  # more than it makes: the run ends by time
    deadline = time.monotonic() + config["train_s"]
    step = 0
    while time.monotonic() < deadline or step % config["checkpoint_every"]:  # end on a full round
        time.sleep(step_s)  # the "compute" of one step
        if (step + 1) % config["checkpoint_every"]:
            minitrain.report({"step": step})
        else:  # a checkpoint round: report() returns once every rank reported it (the commit)
            with tempfile.TemporaryDirectory() as tmp:
                with open(os.path.join(tmp, f"rank_{rank}.txt"), "w") as handle:
                    handle.write(str(step))
                minitrain.report({"step": step}, checkpoint=minitrain.Checkpoint.from_directory(tmp))
        step += 1


def test_the_slow_rank_is_named_the_straggler_not_the_ranks_waiting_for_it(tmp_path, monkeypatch, caplog,
                                                                           capsys):
    # A short window so the test stays short: 3 samples (about 3 s of training) decide. The window comes
    # from the environment; the minimum and the status interval are MonitoringConfig fields, which win
    # over their variables (set here to values that would never flag a rank or print a line in time).
    monkeypatch.setenv("MINITRAIN_STRAGGLER_WINDOW", "5")
    monkeypatch.setenv("MINITRAIN_STRAGGLER_MIN_SAMPLES", "50")
    monkeypatch.setenv("MINITRAIN_STATUS_INTERVAL_S", "3600")
    monitoring = MonitoringConfig(straggler_min_samples=3, status_interval_s=1.0)
    trainer = TorchTrainer(
        _train, train_loop_config={"slow_rank": 2, "step_s": 0.05, "slow_step_s": 0.25, "train_s": 7.0,
                                   "checkpoint_every": 5},
        scaling_config=ScalingConfig(num_workers=3),
        run_config=RunConfig(name="straggle", storage_path=str(tmp_path), monitoring_config=monitoring))
    with caplog.at_level(logging.WARNING, logger="minitrain"):
        result = trainer.fit()

    [straggler] = result.stragglers  # rank 2, and never ranks 0 or 1
    assert (straggler.rank, straggler.cause) == (2, "compute") and straggler.host
    assert straggler.slower_by >= 1.5 and straggler.step_time_s >= 0.2
    assert "rank 2 on" in caplog.text and "is a straggler" in caplog.text
    assert "rank 0 on" not in caplog.text and "rank 1 on" not in caplog.text
    assert result.checkpoint is not None

    monitor = RunMonitor.from_run_dir(Storage.for_run(str(tmp_path), "straggle"))
    [attempt] = monitor.attempts()
    assert straggler.since - attempt["started_at"] < 30.0  # named within 30 s of the attempt's start
    assert monitor.run()["state"] == "FINISHED"
    ranks = monitor.ranks()
    assert [r["rank"] for r in ranks] == [0, 1, 2]
    for row in ranks:
        assert row["pid"] > 0 and row["rss_bytes"] > 0 and row["cpu_percent"] is not None
        assert row["gpus"] == [] and row["phase"] == "ENDED"  # the run is over: not TRAINING
    assert max(ranks[0]["work_time_s"], ranks[1]["work_time_s"]) < 0.2 <= ranks[2]["work_time_s"]
    # The fast ranks' time blocked at the checkpoint rounds is counted as report wait.
    fast = [s for s in monitor.samples(rank=0) if s["step_time_s"] is not None]
    assert max(s["report_wait_s"] for s in fast) > 0.2
    assert [e["rank"] for e in monitor.straggler_history()] == [2]
    run = monitor.run()
    assert run["total"] == 1000 and 0 < run["progress"] < 1 and 0 < run["steps_per_s"] < 20

    # Off a terminal (pytest captures stderr) the status is a summary line every status_interval_s, and
    # a last one at the end.
    *during, summary = [line for line in capsys.readouterr().err.splitlines()
                        if line.startswith("minitrain: straggle")]
    assert len(during) >= 3  # about one a second over 7 s of training
    assert "attempt 0 FINISHED" in summary and "/1000 steps" in summary and "(slowest: rank 2)" in summary
