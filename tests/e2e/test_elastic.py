"""Elastic sizes end to end (ScalingConfig(num_workers=(1, 2)), docs/elastic.md) on the fake multi-host
cluster: hosts are network namespaces with their own IP and sshd (scripts/netns_cluster.py), one slot
each. Host h1's agent is SIGKILLed mid-run: the run goes on at world size 1 from the last committed
checkpoint without spending the failure budget (max_failures=0 proves it), and, when the resize
interval is short, the host is probed again and the run grows back to 2 at a checkpoint boundary.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import tempfile
import time

import psutil
import pytest

import minitrain
from minitrain import FailureConfig, RunConfig, ScalingConfig
from minitrain.procs import wait_until_gone
from minitrain.torch import TorchTrainer

pytestmark = [pytest.mark.e2e, pytest.mark.cluster]


@pytest.fixture(autouse=True)
def _forget_cluster():
    yield
    minitrain.shutdown()


def _init(cluster) -> None:
    workdir = pathlib.Path(cluster.workdir)
    minitrain.init(hosts=[f"{h.ip}:1" for h in cluster.hosts], ssh_user="root",
                   ssh_identity_file=str(workdir / "id_ed25519"), ssh_known_hosts_file=str(workdir / "known_hosts"),
                   ssh_options=("IdentitiesOnly=yes", "GlobalKnownHostsFile=/dev/null"))


def _kill_my_agent() -> None:
    """SIGKILL the node agent this worker runs under (its nearest `minitrain.agent` ancestor)."""
    process = psutil.Process().parent()
    while process is not None and "minitrain.agent" not in " ".join(process.cmdline()):
        process = process.parent()
    assert process is not None, "no agent above this worker"
    os.kill(process.pid, signal.SIGKILL)


def train_elastic(config):
    """Counts steps through checkpoints; h1's rank kills its agent at `kill_at` (once, marker file);
    stops at `steps`, or (`grow`) after `after_grow` steps at world size 2 that follow the loss."""
    import torch
    import torch.distributed as dist

    context = minitrain.get_context()
    world, rank = context.get_world_size(), context.get_world_rank()
    state = {"step": 0, "shrunk": False, "grown_at": None}
    checkpoint = minitrain.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as directory:
            state = json.load(open(os.path.join(directory, "state.json")))
    if world == 1:
        state["shrunk"] = True
    if world == 2 and state["shrunk"] and state["grown_at"] is None:
        state["grown_at"] = state["step"]
    while True:
        if context.get_node_rank() == 1 and state["step"] == config["kill_at"] and \
                not os.path.exists(config["marker"]):
            open(config["marker"], "w").close()
            _kill_my_agent()
            time.sleep(600)
        total = torch.ones(1)
        dist.all_reduce(total)  # every rank takes part: a lost peer breaks this step
        state["step"] += 1
        # under the test's tmp_path: a rank stopped inside this block (the resize's stop) leaves it there
        with tempfile.TemporaryDirectory(dir=os.path.dirname(config["marker"])) as tmp:
            if rank == 0:
                json.dump(state, open(os.path.join(tmp, "state.json"), "w"))
            minitrain.report({"step": state["step"], "world": world, "sum": total.item()},
                             checkpoint=minitrain.Checkpoint.from_directory(tmp) if rank == 0 else None)
        time.sleep(config["step_s"])
        if config["grow"]:
            if state["grown_at"] is not None and state["step"] >= state["grown_at"] + config["after_grow"]:
                return
            assert state["step"] < config["steps"], f"never grew back to 2 workers: {state}"
        elif state["step"] >= config["steps"]:
            return


def _fit(tmp_path, interval_s: float, **config):
    config = {"kill_at": 3, "marker": str(tmp_path / "killed"), "steps": 12, "step_s": 0.2, "grow": False,
              "after_grow": 3, **config}
    return TorchTrainer(train_elastic, train_loop_config=config,
                        scaling_config=ScalingConfig(num_workers=(1, 2), elastic_resize_monitor_interval_s=interval_s),
                        run_config=RunConfig(name="elastic", storage_path=str(tmp_path / "results"),
                                             failure_config=FailureConfig(max_failures=0))).fit()


def _events(tmp_path, kind: str) -> list[dict]:
    lines = (tmp_path / "results" / "elastic" / "events.jsonl").read_text().splitlines()
    return [event for event in map(json.loads, lines) if event.get("kind") == kind]


def _worker_pids_gone(timeout_s: float) -> list:
    ours = [p for p in psutil.Process().children(recursive=True) if "minitrain" in " ".join(p.cmdline())]
    return wait_until_gone([p.pid for p in ours], timeout_s)


def test_losing_a_hosts_agent_shrinks_to_the_survivor_without_spending_the_budget(netns_cluster, tmp_path):
    h0, h1 = netns_cluster.hosts
    _init(netns_cluster)
    result = _fit(tmp_path, interval_s=60.0)  # no growth check before the run ends

    assert (tmp_path / "killed").exists()
    assert result.metrics["world"] == 1 and result.metrics["step"] == 12 and result.metrics["sum"] == 1.0
    history = result.metrics_dataframe
    # The steps go on from the last committed checkpoint (at most the step in flight is redone).
    assert list(history["world"])[:3] == [2, 2, 2] and set(history["world"]) == {1, 2}
    resumed_at = list(history["step"])[list(history["world"]).index(1)]
    assert resumed_at in (3, 4), list(history["step"])
    assert len(result.resizes) == 1
    resize = result.resizes[0]
    assert (resize.attempt, resize.from_workers, resize.to_workers) == (1, 2, 1)
    assert resize.reason.startswith(f"host {h1.ip} lost"), resize.reason
    events = _events(tmp_path, "resize")
    assert [(e["from_workers"], e["to_workers"]) for e in events] == [(2, 1)]
    assert _worker_pids_gone(20) == []


def test_a_host_that_answers_again_is_used_at_the_next_checkpoint_after_the_interval(netns_cluster, tmp_path):
    h0, h1 = netns_cluster.hosts
    _init(netns_cluster)
    started = time.monotonic()
    result = _fit(tmp_path, interval_s=2.0, grow=True, steps=300, step_s=0.1)

    assert result.metrics["world"] == 2 and result.metrics["sum"] == 2.0
    sizes = [(r.from_workers, r.to_workers) for r in result.resizes]
    assert sizes == [(2, 1), (1, 2)], result.resizes
    shrink, grow = result.resizes
    assert h1.ip in shrink.reason and h1.ip in grow.reason and "checkpoint boundary" in grow.reason
    assert grow.time - shrink.time >= 1.9  # at most once per interval (2 s from the decision to shrink)
    assert [(e["from_workers"], e["to_workers"]) for e in _events(tmp_path, "resize")] == sizes
    assert time.monotonic() - started < 120
    assert _worker_pids_gone(20) == []
