"""FSDP, sharded checkpoints and the DeepSpeed environment on 2 real gloo workers.

One run trains with `prepare_model(parallel_strategy="fsdp")` (FSDP1) and saves a sharded
`torch.distributed.checkpoint` from every rank each epoch; a second run of the same name resumes it
with FSDP2's `fully_shard` called directly in the training function (DCP reshards on load). The first
run also records what `deepspeed.initialize` needs from the environment and the process group, so
that contract is checked without DeepSpeed installed.
"""

from __future__ import annotations

import json
import os
import tempfile

import pytest

import minitrain
from minitrain import RunConfig, ScalingConfig
from minitrain.torch import TorchTrainer

pytestmark = pytest.mark.e2e

# What deepspeed.comm.init_distributed reads before it reuses an initialised process group (without
# them it falls back to MPI discovery), plus LOCAL_WORLD_SIZE, which DeepSpeed's launcher also sets.
DEEPSPEED_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def _build(api: str):
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 1))
    if api == "prepare_model":
        from minitrain.torch import prepare_model

        return prepare_model(model, parallel_strategy="fsdp", parallel_strategy_kwargs={"use_orig_params": True})
    from torch.distributed.fsdp import fully_shard

    fully_shard(model[0])
    fully_shard(model)
    return model


def _deepspeed_view() -> dict:
    """The environment and process group as deepspeed.initialize would find them."""
    import torch.distributed as dist

    env = {name: os.environ.get(name) for name in DEEPSPEED_ENV}
    # MASTER_ADDR:MASTER_PORT must be the live store of this run: a client can join it.
    store = dist.TCPStore(env["MASTER_ADDR"], int(env["MASTER_PORT"]), is_master=False, wait_for_workers=False)
    rank = int(env["RANK"])
    store.set(f"deepspeed_probe_{rank}", "ok")
    store.wait([f"deepspeed_probe_{1 - rank}"])
    return {"env": env, "initialized": dist.is_initialized(), "backend": dist.get_backend(),
            "rank": dist.get_rank(), "world_size": dist.get_world_size()}


def train_sharded(config: dict):
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_state_dict,
        set_state_dict,
    )
    from torch.distributed.fsdp import FullyShardedDataParallel

    options = StateDictOptions(flatten_optimizer_state_dict=True)
    rank = minitrain.get_context().get_world_rank()
    model = _build(config["api"])
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    record = {"fsdp1": isinstance(model, FullyShardedDataParallel)}
    if config["api"] == "prepare_model":
        record["deepspeed"] = _deepspeed_view()

    start = 0
    checkpoint = minitrain.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as directory:
            record["resumed_files"] = sorted(os.listdir(directory))
            model_state, optimizer_state = get_state_dict(model, optimizer, options=options)
            state = {"model": model_state, "optimizer": optimizer_state}
            dcp.load(state, checkpoint_id=directory)
            set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"],
                           options=options)
            start = int(open(os.path.join(directory, "epoch.txt")).read()) + 1
    full = StateDictOptions(full_state_dict=True)  # (cpu_offload=True crashes FSDP1 on CPU in torch 2.13)
    record["loaded"] = {k: v.flatten().tolist() for k, v in get_model_state_dict(model, options=full).items()}

    x = torch.randn(32, 6, generator=torch.Generator().manual_seed(rank))
    for epoch in range(start, config["epochs"]):
        loss = torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        with tempfile.TemporaryDirectory() as tmp:
            model_state, optimizer_state = get_state_dict(model, optimizer, options=options)
            dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=tmp)
            if rank == 0:
                with open(os.path.join(tmp, "epoch.txt"), "w") as handle:
                    handle.write(str(epoch))
            record.setdefault("own_files", []).append(sorted(os.listdir(tmp)))
            minitrain.report({"epoch": epoch, "loss": loss.item()}, checkpoint=minitrain.Checkpoint.from_directory(tmp))
    record["saved"] = {k: v.flatten().tolist() for k, v in get_model_state_dict(model, options=full).items()}
    with open(os.path.join(config["out"], f"{config['api']}_rank{rank}.json"), "w") as handle:
        json.dump(record, handle)


def _fit(tmp_path, api: str, epochs: int):
    return TorchTrainer(train_sharded, train_loop_config={"api": api, "epochs": epochs, "out": str(tmp_path)},
                        scaling_config=ScalingConfig(num_workers=2),
                        run_config=RunConfig(name="fsdp", storage_path=str(tmp_path / "runs"))).fit()


def _records(tmp_path, api: str) -> list[dict]:
    return [json.loads((tmp_path / f"{api}_rank{rank}.json").read_text()) for rank in range(2)]


def test_sharded_checkpoints_from_every_rank_resume_across_fsdp_versions(tmp_path):
    first = _fit(tmp_path, "prepare_model", epochs=2)

    saved = _records(tmp_path, "prepare_model")
    assert all(r["fsdp1"] for r in saved)
    # Each rank wrote only its own shard; the committed checkpoint holds every rank's files.
    assert saved[0]["own_files"][-1] == [".metadata", "__0_0.distcp", "epoch.txt"]
    assert saved[1]["own_files"][-1] == ["__1_0.distcp"]
    committed = sorted(os.listdir(first.checkpoint.path))
    assert committed == [".metadata", "__0_0.distcp", "__1_0.distcp", "epoch.txt"]
    assert first.metrics["epoch"] == 1

    # The DeepSpeed contract: torchrun-style variables, one live store, the group already up.
    views = [r["deepspeed"] for r in saved]
    for rank, view in enumerate(views):
        env = view["env"]
        assert env["RANK"] == str(rank) and env["LOCAL_RANK"] == str(rank)
        assert env["WORLD_SIZE"] == "2" and env["LOCAL_WORLD_SIZE"] == "2"
        assert view["initialized"] and view["backend"] == "gloo"
        assert (view["rank"], view["world_size"]) == (rank, 2)
    assert views[0]["env"]["MASTER_ADDR"] == views[1]["env"]["MASTER_ADDR"]
    assert views[0]["env"]["MASTER_PORT"] == views[1]["env"]["MASTER_PORT"]

    second = _fit(tmp_path, "fully_shard", epochs=3)

    resumed = _records(tmp_path, "fully_shard")
    assert not any(r["fsdp1"] for r in resumed)
    assert resumed[0]["resumed_files"] == committed
    for record in resumed:  # FSDP2 loaded exactly the weights FSDP1 saved last
        assert record["loaded"].keys() == saved[0]["saved"].keys()
        for name, values in saved[0]["saved"].items():
            assert record["loaded"][name] == values
    assert second.metrics["epoch"] == 2
    assert sorted(os.listdir(second.checkpoint.path)) == committed
