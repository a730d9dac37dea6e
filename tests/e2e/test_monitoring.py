"""Monitoring end to end (issue 16): a real 2-worker run whose rank 1 sleeps in every step is named a
straggler, with no code for it in the training function; the telemetry behind it reaches the run
directory, and a monitor rebuilt from there shows the same."""

from __future__ import annotations

import logging
import time

import pytest

import minitrain
from minitrain import RunConfig, ScalingConfig
from minitrain.coordinator.monitor import RunMonitor
from minitrain.storage.filesystem import Storage
from minitrain.torch import TorchTrainer

pytestmark = pytest.mark.e2e


def _train(config: dict) -> None:
    rank = minitrain.get_context().get_world_rank()
    step_s = config["slow_step_s"] if rank == config["slow_rank"] else config["step_s"]
    minitrain.set_progress_total(1000)  # more than it makes: the run ends by time
    deadline = time.monotonic() + config["train_s"]
    step = 0
    while time.monotonic() < deadline:
        time.sleep(step_s)  # the "compute" of one step
        minitrain.report({"step": step})
        step += 1


def test_a_rank_slowed_in_its_step_is_named_the_straggler(tmp_path, monkeypatch, caplog, capsys):
    # A short window so the test stays short: 3 samples (about 3 s of training) decide.
    monkeypatch.setenv("MINITRAIN_STRAGGLER_WINDOW", "5")
    monkeypatch.setenv("MINITRAIN_STRAGGLER_MIN_SAMPLES", "3")
    trainer = TorchTrainer(
        _train, train_loop_config={"slow_rank": 1, "step_s": 0.05, "slow_step_s": 0.25, "train_s": 7.0},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name="straggle", storage_path=str(tmp_path)))
    with caplog.at_level(logging.WARNING, logger="minitrain"):
        result = trainer.fit()

    [straggler] = result.stragglers
    assert (straggler.rank, straggler.cause) == (1, "compute") and straggler.host
    assert straggler.slower_by >= 1.5 and straggler.step_time_s >= 0.2
    assert "rank 1 on" in caplog.text and "is a straggler" in caplog.text

    monitor = RunMonitor.from_run_dir(Storage.for_run(str(tmp_path), "straggle"))
    [attempt] = monitor.attempts()
    assert straggler.since - attempt["started_at"] < 30.0  # named within 30 s of the attempt's start
    assert monitor.run()["state"] == "FINISHED"
    ranks = monitor.ranks()
    assert [r["rank"] for r in ranks] == [0, 1]
    for row in ranks:
        assert row["pid"] > 0 and row["rss_bytes"] > 0 and row["cpu_percent"] is not None
        assert row["gpus"] == [] and row["phase"] == "TRAINING"
    assert ranks[0]["step_time_s"] < 0.2 <= ranks[1]["step_time_s"]
    assert monitor.samples(rank=1) and [e["rank"] for e in monitor.straggler_history()] == [1]
    assert monitor.run()["total"] == 1000 and 0 < monitor.run()["progress"] < 1

    # Off a terminal (pytest captures stderr) the console's last status is one summary line.
    [summary] = [line for line in capsys.readouterr().err.splitlines() if line.startswith("minitrain: straggle")]
    assert "attempt 0 FINISHED" in summary and "/1000 steps" in summary and "(slowest: rank 1)" in summary
