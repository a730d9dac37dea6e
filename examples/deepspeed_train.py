"""DeepSpeed ZeRO under minitrain: every rank checkpoints its own optimizer shard, and resumes.

    pip install deepspeed                      # not a minitrain dependency
    python examples/deepspeed_train.py --num-workers 2 --epochs 4
    python examples/deepspeed_train.py --smoke-test --storage-path /tmp/runs   # seconds, for CI
    python examples/deepspeed_train.py --zero-stage 2 --precision fp16 --offload-optimizer   # ZeRO-Offload

Running it again with the same `--storage-path` and `--name` resumes from the latest checkpoint.
On CPU, DeepSpeed compiles a shared-memory communication op the first time, and its CPU Adam for
`--offload-optimizer` (a C++ compiler is needed; minutes, then cached in ~/.cache/torch_extensions).
fp16 on CPU needs a CPU with fp16 arithmetic (AVX512-FP16 or AMX); use bf16 elsewhere
(docs/guide/distributed.md, "DeepSpeed on CPU").

minitrain starts the workers and initialises the process group before the training function runs,
and sets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT, so
`deepspeed.initialize` joins that group instead of looking for a launcher (no `deepspeed` command, no
hostfile). With ZeRO stage 1, 2 or 3 the optimizer state is sharded (with 3 the parameters too):
`engine.save_checkpoint` writes rank-named files on every rank, and because every rank passes its directory to `minitrain.report`,
the ranks' files merge into one checkpoint directory from which `engine.load_checkpoint` resumes.
Runs on CPU workers (DeepSpeed's CPU accelerator, gloo) as well as GPUs (`--use-gpu`, NCCL).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import minitrain
from minitrain import RunConfig, ScalingConfig
from minitrain.torch import TorchTrainer, prepare_data_loader

TAG = "state"  # DeepSpeed's sub-directory name inside each reported checkpoint


def make_dataset(num_samples: int, num_features: int, seed: int = 0) -> TensorDataset:
    """A noisy linear regression, identical on every worker (fixed seed); nothing is downloaded."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(num_samples, num_features, generator=generator)
    y = x @ torch.randn(num_features, 1, generator=generator) + 0.1 * torch.randn(num_samples, 1, generator=generator)
    return TensorDataset(x, y)


def train_func(config: dict) -> None:
    """Runs on every worker: ZeRO data-parallel training with a sharded checkpoint every epoch."""
    import deepspeed

    features, hidden = config["features"], config["hidden"]
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, 1))
    world_size = minitrain.get_context().get_world_size()
    zero = {"stage": config["zero_stage"]}
    ds_config = {
        "train_batch_size": config["batch_size"] * world_size,
        "train_micro_batch_size_per_gpu": config["batch_size"],
        "zero_optimization": zero,
        "steps_per_print": 10**9,
    }
    if config["precision"] != "fp32":
        ds_config[config["precision"]] = {"enabled": True}
    if config["offload_optimizer"]:
        # ZeRO-Offload: the optimizer state and step live in host memory, stepped by DeepSpeed's own
        # CPU Adam (compiled on first use, then cached in ~/.cache/torch_extensions).
        zero["offload_optimizer"] = {"device": "cpu"}
        ds_config["optimizer"] = {"type": "AdamW", "params": {"lr": config["lr"]}}
        optimizer = None
    else:
        # A torch optimizer instance keeps DeepSpeed from compiling its fused optimizers.
        optimizer = torch.optim.AdamW(model.parameters(), lr=config["lr"])
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                           optimizer=optimizer, config=ds_config)

    start_epoch = 0
    checkpoint = minitrain.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as directory:
            _, client_state = engine.load_checkpoint(directory, tag=TAG)
        start_epoch = client_state["epoch"] + 1

    dataset = make_dataset(config["samples"], features)
    loader = prepare_data_loader(DataLoader(dataset, batch_size=config["batch_size"], shuffle=True),
                                 move_to_device=False)
    first_loss = None
    for epoch in range(start_epoch, config["epochs"]):
        if world_size > 1:
            loader.sampler.set_epoch(epoch)
        total, batches = 0.0, 0
        for x, y in loader:
            x, y = x.to(engine.device, dtype=_dtype(config["precision"])), y.to(engine.device)
            loss = nn.functional.mse_loss(engine(x).float(), y)
            engine.backward(loss)
            engine.step()
            total, batches = total + loss.item(), batches + 1
        epoch_loss = total / max(batches, 1)
        first_loss = epoch_loss if first_loss is None else first_loss
        with tempfile.TemporaryDirectory() as tmp:
            # Collective: each rank writes its ZeRO shard (rank 0 also the model); all of them report.
            engine.save_checkpoint(tmp, tag=TAG, client_state={"epoch": epoch})
            minitrain.report({"epoch": epoch, "start_epoch": start_epoch, "loss": epoch_loss,
                              "first_loss": first_loss},
                             checkpoint=minitrain.Checkpoint.from_directory(tmp))


def _dtype(precision: str) -> torch.dtype:
    return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]


def main(argv: list[str] | None = None) -> int:
    """Train (resuming a run of the same name); return 1 when the loss did not drop in this call."""
    parser = argparse.ArgumentParser(description="DeepSpeed ZeRO training under minitrain.")
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--use-gpu", action="store_true")
    parser.add_argument("--epochs", type=int, default=None, help="epochs in total (default 4; 2 with --smoke-test)")
    parser.add_argument("--zero-stage", type=int, default=2, choices=(0, 1, 2, 3))
    parser.add_argument("--precision", default="fp32", choices=("fp32", "bf16", "fp16"),
                        help="fp16 needs a GPU: DeepSpeed's CPU accelerator has no fp16 (use bf16 on CPU)")
    parser.add_argument("--offload-optimizer", action="store_true",
                        help="ZeRO-Offload: optimizer state and step on the host (DeepSpeed's CPU Adam)")
    parser.add_argument("--storage-path", default="~/minitrain_results")
    parser.add_argument("--name", default="deepspeed_example")
    parser.add_argument("--smoke-test", action="store_true", help="tiny sizes, 2 epochs: seconds on CPU")
    args = parser.parse_args(argv)
    config = {"epochs": 4, "zero_stage": args.zero_stage, "precision": args.precision,
              "offload_optimizer": args.offload_optimizer, "lr": 1e-2, "batch_size": 32,
              "samples": 4096, "features": 32, "hidden": 64}
    if args.smoke_test:
        config.update(epochs=2, samples=256, features=8, hidden=16)
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
    print(f"checkpoint files: {sorted(_files(result.checkpoint.path))}")
    if metrics["epoch"] > metrics["start_epoch"] and not metrics["loss"] < metrics["first_loss"]:
        print("FAILED: the loss did not drop", file=sys.stderr)
        return 1
    return 0


def _files(root: str) -> list[str]:
    return [os.path.relpath(os.path.join(d, f), root) for d, _, files in os.walk(root) for f in files]


if __name__ == "__main__":
    sys.exit(main())
