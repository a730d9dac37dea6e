"""Elastic DDP and FSDP2 runs resized 2 -> 1 -> 2 on this machine (docs/elastic.md): two local "hosts"
(``localhost:1,127.0.0.1:1``, one node agent and one rank each), gloo on CPU. The second host's agent is
SIGKILLed mid-run: the run goes on with one worker from the last committed checkpoint (not a failure:
max_failures=0), the agent is replaced at once, and after the resize interval the run grows back to two
at the next checkpoint. DDP: across both resizes the parameters resume bit-exactly from the checkpoint
rank 0 wrote, every rank holds the same parameters, and the world size, the dataset shards and
`prepare_data_loader` follow the new size. FSDP2: the sharded DCP checkpoint every rank writes is
resharded 2 -> 1 -> 2 by `dcp.load`, bit-exactly.
"""

from __future__ import annotations

import json
import os
import signal
import tempfile
import time

import psutil
import pytest

import minitrain
from minitrain import FailureConfig, RunConfig, ScalingConfig
from minitrain.torch import TorchTrainer

pytestmark = pytest.mark.e2e

SAMPLES = 8


@pytest.fixture(autouse=True)
def _two_local_hosts():
    minitrain.init(hosts="localhost:1,127.0.0.1:1")
    yield
    minitrain.shutdown()


def _kill_my_agent_once(config: dict, step: int) -> None:
    """Rank 1 SIGKILLs its node agent when it reaches `config["kill_at"]`, once (a marker file)."""
    if minitrain.get_context().get_world_rank() == 1 and step == config["kill_at"] and \
            not os.path.exists(config["marker"]):
        open(config["marker"], "w").close()
        agent = psutil.Process().parent()
        while "minitrain.agent" not in " ".join(agent.cmdline()):
            agent = agent.parent()
        os.kill(agent.pid, signal.SIGKILL)
        time.sleep(600)


def _fit(tmp_path, train_fn, **datasets):
    return TorchTrainer(
        train_fn, train_loop_config={"kill_at": 3, "marker": str(tmp_path / "killed")}, datasets=datasets or None,
        scaling_config=ScalingConfig(num_workers=(1, 2), elastic_resize_monitor_interval_s=2),
        run_config=RunConfig(name="reshard", storage_path=str(tmp_path / "results"),
                             failure_config=FailureConfig(max_failures=0))).fit()


def train_ddp(config):
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader, TensorDataset

    from minitrain.torch import prepare_data_loader, prepare_model

    context = minitrain.get_context()
    world, rank = context.get_world_size(), context.get_world_rank()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    state = {"step": 0, "shrunk": False, "grown_at": None}
    checkpoint = minitrain.get_checkpoint()
    if checkpoint is not None:  # what any rank loads: the full (unsharded) state rank 0 saved
        with checkpoint.as_directory() as directory:
            saved = torch.load(os.path.join(directory, "state.pt"))
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        state = saved["state"]
    resumed = [p.detach().clone() for p in model.parameters()]
    model = prepare_model(model)  # DDP when world > 1 (rank 0's parameters broadcast); plain at world 1
    data = TensorDataset(torch.arange(SAMPLES * 4, dtype=torch.float32).reshape(SAMPLES, 4) / 10,
                         torch.ones(SAMPLES, 1))
    loader = prepare_data_loader(DataLoader(data, batch_size=2))
    if world == 1:
        state["shrunk"] = True
    if world == 2 and state["shrunk"] and state["grown_at"] is None:
        state["grown_at"] = state["step"]
    first = True
    while True:
        _kill_my_agent_once(config, state["step"])
        seen = 0
        for features, target in loader:
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(features), target).backward()
            optimizer.step()
            seen += len(features)
        state["step"] += 1
        params = torch.cat([p.detach().flatten() for p in model.parameters()])
        gathered = [torch.zeros_like(params) for _ in range(world)]
        dist.all_gather(gathered, params)
        shard_rows = sorted(int(row["item"]) for row in minitrain.get_dataset_shard("train").iter_rows())
        metrics = {"step": state["step"], "world": world, "world_rank": rank, "samples_seen": seen,
                   "shard_rows": shard_rows,
                   "params": params.tolist(), "same_on_every_rank": all(torch.equal(g, params) for g in gathered),
                   "resumed_params": torch.cat([p.flatten() for p in resumed]).tolist() if first else None}
        first = False
        with tempfile.TemporaryDirectory() as tmp:
            if rank == 0:
                unwrapped = getattr(model, "module", model)
                torch.save({"model": unwrapped.state_dict(), "optimizer": optimizer.state_dict(), "state": state},
                           os.path.join(tmp, "state.pt"))
            minitrain.report(metrics, checkpoint=minitrain.Checkpoint.from_directory(tmp) if rank == 0 else None)
        time.sleep(0.1)
        if state["grown_at"] is not None and state["step"] >= state["grown_at"] + 3:
            return
        assert state["step"] < 300, f"never grew back to 2 workers: {state}"


def test_ddp_resumes_bit_exactly_across_2_1_2_and_its_shards_follow_the_size(tmp_path):
    result = _fit(tmp_path, train_ddp, train=minitrain.data.from_items(list(range(SAMPLES))))

    assert [(r.from_workers, r.to_workers) for r in result.resizes] == [(2, 1), (1, 2)], result.resizes
    assert "host 127.0.0.1 lost" in result.resizes[0].reason
    reports = list(result.metrics_dataframe.to_dict("records"))
    worlds = [r["world"] for r in reports]
    assert worlds[0] == 2 and 1 in worlds and worlds[-1] == 2
    by_step = {}
    for report in reports:
        # prepare_data_loader's sampler follows the world size: each rank sees its share of the rows
        assert report["samples_seen"] == SAMPLES // report["world"], report
        assert len(report["shard_rows"]) == SAMPLES // report["world"], report  # so does the dataset shard
        assert report["same_on_every_rank"], report
        if report["resumed_params"] is not None and by_step:
            # Bit-exact: the parameters each resumed attempt starts from are those of the checkpoint it
            # resumed (the latest committed step before it started).
            assert report["resumed_params"] == by_step[report["step"] - 1], report
        by_step[report["step"]] = report["params"]
    starts = [r for r in reports if r["resumed_params"] is not None]
    assert [r["world"] for r in starts] == [2, 1, 2]


def train_fsdp2(config):
    """FSDP2 (`fully_shard`) with a sharded DCP checkpoint written by every rank: `dcp.load` at another
    world size reads the slices each new rank owns."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch import nn
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions, get_model_state_dict, get_state_dict, set_state_dict,
    )
    from torch.distributed.fsdp import fully_shard

    context = minitrain.get_context()
    world, rank = context.get_world_size(), context.get_world_rank()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 1))
    fully_shard(model[0])
    fully_shard(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    options = StateDictOptions(flatten_optimizer_state_dict=True)
    full = StateDictOptions(full_state_dict=True)
    x = torch.randn(32, 6, generator=torch.Generator().manual_seed(1))  # the same batch on every rank

    def loss_now():
        return torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))

    state = {"step": 0, "shrunk": False, "grown_at": None}
    checkpoint = minitrain.get_checkpoint()
    resumed = None
    if checkpoint is not None:
        with checkpoint.as_directory() as directory:
            model_state, optimizer_state = get_state_dict(model, optimizer, options=options)
            loaded = {"model": model_state, "optimizer": optimizer_state}
            dcp.load(loaded, checkpoint_id=directory)
            set_state_dict(model, optimizer, model_state_dict=loaded["model"], optim_state_dict=loaded["optimizer"],
                           options=options)
            state = json.load(open(os.path.join(directory, "state.json")))
        with torch.no_grad():
            resumed = {"params": {k: v.flatten().tolist() for k, v in
                                  get_model_state_dict(model, options=full).items()},
                       "loss": loss_now().item()}
    if world == 1:
        state["shrunk"] = True
    if world == 2 and state["shrunk"] and state["grown_at"] is None:
        state["grown_at"] = state["step"]
    while True:
        _kill_my_agent_once(config, state["step"])
        loss = loss_now()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        state["step"] += 1
        with torch.no_grad():
            after = loss_now().item()
        params = {k: v.flatten().tolist() for k, v in get_model_state_dict(model, options=full).items()}
        with tempfile.TemporaryDirectory() as tmp:
            model_state, optimizer_state = get_state_dict(model, optimizer, options=options)
            dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=tmp)
            if rank == 0:
                json.dump(state, open(os.path.join(tmp, "state.json"), "w"))
            files = sorted(os.listdir(tmp))
            minitrain.report({"step": state["step"], "world": world, "params": params, "loss": after,
                              "files": files, "resumed": resumed},
                             checkpoint=minitrain.Checkpoint.from_directory(tmp))
        resumed = None
        time.sleep(0.1)
        if state["grown_at"] is not None and state["step"] >= state["grown_at"] + 3:
            return
        assert state["step"] < 300, f"never grew back to 2 workers: {state}"


def test_fsdp2_dcp_shards_reshard_across_2_1_2(tmp_path):
    result = _fit(tmp_path, train_fsdp2)

    assert [(r.from_workers, r.to_workers) for r in result.resizes] == [(2, 1), (1, 2)], result.resizes
    reports = list(result.metrics_dataframe.to_dict("records"))
    by_step = {}
    starts = []
    for report in reports:
        # rank 0 wrote its own shard (and the metadata); the committed checkpoint holds every rank's
        assert report["files"] == [".metadata", "__0_0.distcp", "state.json"], report["files"]
        if report["resumed"] is not None:
            starts.append(report["world"])
            before = by_step[report["step"] - 1]
            # Resharded N -> M ranks, the full parameters are those saved, bit for bit, and so the loss
            assert report["resumed"]["params"] == before["params"]
            assert report["resumed"]["loss"] == pytest.approx(before["loss"], rel=1e-6)
        by_step[report["step"]] = report
    assert starts == [1, 2]  # resumed once at each size
    assert sorted(os.listdir(result.checkpoint.path)) == [".metadata", "__0_0.distcp", "__1_0.distcp", "state.json"]
