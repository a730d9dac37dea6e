"""FSDP under minitrain: a sharded model, sharded checkpoints written by every rank, and resume.

    python examples/fsdp_train.py --num-workers 2 --epochs 4
    python examples/fsdp_train.py --api prepare_model           # FSDP1 through prepare_model
    python examples/fsdp_train.py --smoke-test --storage-path /tmp/runs   # seconds, for CI

`--api fully_shard` (the default) shards each layer with FSDP2's `torch.distributed.fsdp.fully_shard`
in the training function, as you would without minitrain; `--api prepare_model` lets
`minitrain.torch.prepare_model(model, parallel_strategy="fsdp")` wrap the model in FSDP1's
`FullyShardedDataParallel`. Both run on CPU workers over gloo, and on GPUs (`--use-gpu`, NCCL).

Every epoch, each rank saves only its own shards with `torch.distributed.checkpoint` (DCP) into a
local temporary directory and passes it to `minitrain.report`; the files of all ranks merge into one
checkpoint directory in storage (`.metadata`, `__0_0.distcp`, `__1_0.distcp`, ...). Running the
script again with the same `--storage-path` and `--name` resumes from it: DCP reads each rank's part
back, even with another world size or the other `--api` (DCP reshards on load).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict
from torch.utils.data import DataLoader, TensorDataset

import minitrain
from minitrain import RunConfig, ScalingConfig
from minitrain.torch import TorchTrainer, get_device, prepare_data_loader, prepare_model

PROGRESS_FILE = "progress.json"  # written by rank 0 beside the shards
# Optimizer state keyed by parameter name ("state.<name>.exp_avg"), not by position: it loads into
# FSDP1 and FSDP2 alike (torch 2.13 fails to load FSDP1's nested default form into a fresh optimizer).
STATE_DICT_OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True)


def make_dataset(num_samples: int, num_features: int, seed: int = 0) -> TensorDataset:
    """A noisy non-linear regression, identical on every worker (fixed seed); nothing is downloaded."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(num_samples, num_features, generator=generator)
    y = torch.tanh(x @ torch.randn(num_features, 1, generator=generator))
    return TensorDataset(x, y + 0.05 * torch.randn(num_samples, 1, generator=generator))


def build_model(num_features: int, hidden: int, layers: int) -> nn.Sequential:
    """An MLP of `layers` hidden blocks; each block is one FSDP unit."""
    blocks = [nn.Sequential(nn.Linear(num_features if i == 0 else hidden, hidden), nn.ReLU()) for i in range(layers)]
    return nn.Sequential(*blocks, nn.Linear(hidden, 1))


def shard(model: nn.Sequential, api: str) -> nn.Module:
    """Shard `model` across the run's workers with FSDP2 (`fully_shard`) or FSDP1 (`prepare_model`)."""
    if api == "prepare_model":
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy

        return prepare_model(model, parallel_strategy="fsdp",
                             parallel_strategy_kwargs={"auto_wrap_policy": ModuleWrapPolicy({nn.Sequential}),
                                                       "use_orig_params": True})
    from torch.distributed.fsdp import fully_shard

    model.to(get_device())
    for block in model[:-1]:
        fully_shard(block)
    fully_shard(model)  # the root unit holds what is left (the output layer)
    return model


def save_sharded(directory: str, model: nn.Module, optimizer: torch.optim.Optimizer, epoch: int) -> None:
    """Every rank writes its own shards of the model and optimizer into `directory` (a collective)."""
    model_state, optimizer_state = get_state_dict(model, optimizer, options=STATE_DICT_OPTIONS)
    dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=directory)
    if minitrain.get_context().get_world_rank() == 0:
        with open(os.path.join(directory, PROGRESS_FILE), "w") as handle:
            json.dump({"epoch": epoch}, handle)


def load_sharded(directory: str, model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Load this rank's shards from `directory` into `model` and `optimizer`; return the saved epoch."""
    model_state, optimizer_state = get_state_dict(model, optimizer, options=STATE_DICT_OPTIONS)
    state = {"model": model_state, "optimizer": optimizer_state}
    dcp.load(state, checkpoint_id=directory)
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"],
                   options=STATE_DICT_OPTIONS)
    with open(os.path.join(directory, PROGRESS_FILE)) as handle:
        return json.load(handle)["epoch"]


def train_func(config: dict) -> None:
    """Runs on every worker: sharded training with a sharded checkpoint from every rank each epoch."""
    torch.manual_seed(0)  # the same initial weights everywhere, before sharding
    model = shard(build_model(config["features"], config["hidden"], config["layers"]), config["api"])
    optimizer = torch.optim.Adam(model.parameters(), lr=config["lr"])

    start_epoch = 0
    checkpoint = minitrain.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as directory:
            start_epoch = load_sharded(directory, model, optimizer) + 1

    loader = DataLoader(make_dataset(config["samples"], config["features"]), batch_size=config["batch_size"],
                        shuffle=True)
    loader = prepare_data_loader(loader)
    world_size = minitrain.get_context().get_world_size()
    first_loss = None
    for epoch in range(start_epoch, config["epochs"]):
        if world_size > 1:
            loader.sampler.set_epoch(epoch)
        total, batches = 0.0, 0
        for x, y in loader:
            loss = nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total, batches = total + loss.item(), batches + 1
        epoch_loss = total / max(batches, 1)
        first_loss = epoch_loss if first_loss is None else first_loss
        with tempfile.TemporaryDirectory() as tmp:
            save_sharded(tmp, model, optimizer, epoch)
            minitrain.report({"epoch": epoch, "start_epoch": start_epoch, "loss": epoch_loss, "first_loss": first_loss},
                             checkpoint=minitrain.Checkpoint.from_directory(tmp))


def main(argv: list[str] | None = None) -> int:
    """Train (resuming a run of the same name); return 1 when the loss did not drop in this call."""
    parser = argparse.ArgumentParser(description="FSDP training with sharded checkpoints under minitrain.")
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--use-gpu", action="store_true")
    parser.add_argument("--api", choices=("fully_shard", "prepare_model"), default="fully_shard")
    parser.add_argument("--epochs", type=int, default=None, help="epochs in total (default 4; 2 with --smoke-test)")
    parser.add_argument("--storage-path", default="~/minitrain_results")
    parser.add_argument("--name", default="fsdp_example")
    parser.add_argument("--smoke-test", action="store_true", help="tiny sizes, 2 epochs: seconds on CPU")
    args = parser.parse_args(argv)
    config = {"api": args.api, "epochs": 4, "lr": 3e-3, "batch_size": 64, "samples": 8192, "features": 32,
              "hidden": 256, "layers": 4}
    if args.smoke_test:
        config.update(epochs=2, samples=512, features=8, hidden=32, layers=2)
    if args.epochs is not None:
        config["epochs"] = args.epochs

    result = TorchTrainer(
        train_func, train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=args.num_workers, use_gpu=args.use_gpu),
        run_config=RunConfig(name=args.name, storage_path=os.path.expanduser(args.storage_path)),
    ).fit()
    metrics = result.metrics
    print(f"result.metrics: {metrics}")
    if metrics is None:
        print(f"nothing left to train: the run already finished {config['epochs']} epochs")
        return 0
    print(f"checkpoint {result.checkpoint.path}: {sorted(os.listdir(result.checkpoint.path))}")
    if metrics["epoch"] > metrics["start_epoch"] and not metrics["loss"] < metrics["first_loss"]:
        print("FAILED: the loss did not drop", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
