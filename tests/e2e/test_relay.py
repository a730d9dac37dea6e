"""Workers' streams relayed by their node agent, end to end (MINITRAIN_RELAY; minitrain/agent/relay.py).

A real run with the relay on (the default; also forced): every rank's stream goes through its agent's
Unix socket (the training function looks at its own process' sockets), a rank fails after a committed
checkpoint, the group restarts from it and finishes, and every round's metrics and the checkpoint arrive
as with direct streams. MINITRAIN_RELAY=0 gives every rank its direct gRPC stream instead.
"""

from __future__ import annotations

import json
import os

import psutil
import pytest

import minitrain
from minitrain import Checkpoint, FailureConfig, RunConfig, ScalingConfig
from minitrain.torch import TorchTrainer

pytestmark = pytest.mark.e2e


def _streams(driver_pid: int) -> dict:
    """Whether this worker holds a TCP connection to the driver's gRPC server (a direct stream) and
    whether it holds a Unix socket connection (its agent's relay)."""
    listening = {c.laddr.port for c in psutil.net_connections("tcp")
                 if c.pid == driver_pid and c.status == psutil.CONN_LISTEN}
    mine = psutil.Process()
    return {"to_driver": any(c.raddr and c.raddr.port in listening for c in mine.net_connections("tcp")),
            "unix": bool(mine.net_connections("unix"))}


def train_fails_once_after_a_checkpoint(config):
    context = minitrain.get_context()
    rank = context.get_world_rank()
    start = 0
    checkpoint = minitrain.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as directory:
            with open(os.path.join(directory, "step.json")) as handle:
                start = json.load(handle)["step"] + 1
    with open(os.path.join(config["out"], f"relayed_rank{rank}_from{start}.json"), "w") as handle:
        json.dump(_streams(config["driver_pid"]), handle)
    for step in range(start, 4):
        if step == 2:
            directory = os.path.join(config["out"], f"ckpt_rank{rank}_step{step}")
            os.makedirs(directory, exist_ok=True)
            with open(os.path.join(directory, "step.json"), "w") as handle:
                json.dump({"step": step}, handle)
            minitrain.report({"step": step, "rank": rank}, checkpoint=Checkpoint.from_directory(directory))
            if start == 0 and rank == 1:
                raise RuntimeError("rank 1 fails once, right after the checkpoint was committed")
        else:
            minitrain.report({"step": step, "rank": rank})


def _fit(tmp_path, **failure):
    return TorchTrainer(
        train_fails_once_after_a_checkpoint, train_loop_config={"out": str(tmp_path), "driver_pid": os.getpid()},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name="relay", storage_path=str(tmp_path / "runs"),
                             failure_config=FailureConfig(**failure))).fit()


@pytest.mark.parametrize("relay", [None, "1"], ids=["default", "forced"])
def test_a_relayed_run_restarts_from_its_checkpoint_and_loses_nothing(tmp_path, monkeypatch, relay):
    if relay is None:
        monkeypatch.delenv("MINITRAIN_RELAY", raising=False)
    else:
        monkeypatch.setenv("MINITRAIN_RELAY", relay)
    result = _fit(tmp_path, max_failures=1)
    assert result.error is None
    # Both attempts' ranks went through the relay: attempt 0 from step 0, attempt 1 from step 3.
    for rank in (0, 1):
        for start in (0, 3):
            seen = json.loads((tmp_path / f"relayed_rank{rank}_from{start}.json").read_text())
            assert seen == {"to_driver": False, "unix": True}, (rank, start)
    assert result.metrics["step"] == 3
    with result.checkpoint.as_directory() as directory:
        assert json.load(open(os.path.join(directory, "step.json")))["step"] == 2
    history = [(row["step"], row["rank"]) for row in result.metrics_dataframe.to_dict("records")]
    # Rank 0's rounds in order, the committed ones once; step 3 once per attempt that reached it
    # (attempt 0's rank 0 may report it before the stop reaches it).
    assert history[:3] == [(0, 0), (1, 0), (2, 0)] and history[3:] in ([(3, 0)], [(3, 0), (3, 0)]), history


def test_relay_off_gives_every_rank_a_direct_stream(tmp_path, monkeypatch):
    monkeypatch.setenv("MINITRAIN_RELAY", "0")
    result = _fit(tmp_path, max_failures=1)
    assert result.error is None
    for rank in (0, 1):
        for start in (0, 3):
            seen = json.loads((tmp_path / f"relayed_rank{rank}_from{start}.json").read_text())
            assert seen == {"to_driver": True, "unix": False}, (rank, start)


def train_reports_back_to_back(config):
    from minitrain import _session

    rank = minitrain.get_context().get_world_rank()
    for step in range(config["reports"]):
        minitrain.report({"step": step, "rank": rank})
    waited = _session.current("report").phase_seconds["window_wait_s"]
    with open(os.path.join(config["out"], f"window_rank{rank}.json"), "w") as handle:
        json.dump({"window_wait_s": waited}, handle)


def test_reports_past_the_report_window_wait_and_all_arrive_in_order(tmp_path, monkeypatch):
    """A loop that reports back to back, far faster than the coordinator records reports, runs into
    the report window (backpressure) and waits for receipts through the relay; nothing is lost or
    reordered on the way."""
    monkeypatch.setenv("MINITRAIN_RELAY", "1")
    reports = 5000  # 20 windows: back to back, no coordinator records them as fast as they are made
    result = TorchTrainer(
        train_reports_back_to_back, train_loop_config={"out": str(tmp_path), "reports": reports},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name="window", storage_path=str(tmp_path / "runs"))).fit()
    assert result.error is None and result.metrics == {"step": reports - 1, "rank": 0}
    history = [row["step"] for row in result.metrics_dataframe.to_dict("records")]
    assert history == list(range(reports))
    waits = [json.loads((tmp_path / f"window_rank{rank}.json").read_text())["window_wait_s"] for rank in (0, 1)]
    assert max(waits) > 0, "no rank ever waited for a receipt: the window did not hold"
