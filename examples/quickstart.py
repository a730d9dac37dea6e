"""minitrain quickstart: data-parallel regression on CPU workers, written as a ported Ray Train script.

    python examples/quickstart.py --num-workers 2 --epochs 5

Each worker builds the same synthetic dataset (y = X @ w_true + noise, fixed seed; nothing is
downloaded), trains a small MLP on its shard with DistributedDataParallel over gloo, and reports its
loss every epoch together with a checkpoint. Running it again with the same `--name` and
`--storage-path` resumes from the latest checkpoint (pass a larger `--epochs` to train further; a run
that already reached `--epochs` says it had nothing left to do). `result.metrics` is rank 0's last
report. `scripts/quickstart.sh` gives each of its runs a name of its own, so it trains every time.

The training function alone also runs under the launcher:

    python -m minitrain.launch examples/quickstart.py:train_func
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
from minitrain.torch import TorchTrainer, get_device, prepare_data_loader, prepare_model

NUM_SAMPLES = 4096
NUM_FEATURES = 16


def make_dataset(num_samples: int = NUM_SAMPLES, num_features: int = NUM_FEATURES, seed: int = 0) -> TensorDataset:
    """The same noisy linear-regression data on every worker (fixed seed, so shards are consistent)."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(num_samples, num_features, generator=generator)
    w_true = torch.randn(num_features, 1, generator=generator)
    y = x @ w_true + 0.1 * torch.randn(num_samples, 1, generator=generator)
    return TensorDataset(x, y)


def train_func(config: dict) -> None:
    """Runs on every worker: train, then report {"epoch", "loss"} and a checkpoint once per epoch."""
    epochs = config.get("epochs", 5)
    context = minitrain.get_context()
    is_rank_zero = context.get_world_rank() == 0

    model = nn.Sequential(nn.Linear(NUM_FEATURES, 32), nn.ReLU(), nn.Linear(32, 1))
    model = prepare_model(model)  # moves to get_device(); wraps in DDP when world size > 1
    optimizer = torch.optim.Adam(model.parameters(), lr=config.get("lr", 1e-2))
    loss_fn = nn.MSELoss()
    loader = DataLoader(make_dataset(), batch_size=config.get("batch_size", 64), shuffle=True)
    loader = prepare_data_loader(loader)  # gives each worker its own shard

    start_epoch = 0
    checkpoint = minitrain.get_checkpoint()  # set when resuming a run of the same name
    if checkpoint:
        with checkpoint.as_directory() as checkpoint_dir:
            state = torch.load(os.path.join(checkpoint_dir, "state.pt"), map_location=get_device())
        _unwrap(model).load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start_epoch = state["epoch"] + 1
        if is_rank_zero:
            print(f"resuming after epoch {state['epoch']}")

    first_loss = None
    for epoch in range(start_epoch, epochs):
        if context.get_world_size() > 1:
            loader.sampler.set_epoch(epoch)  # a different shuffle every epoch
        total, batches = 0.0, 0
        for x, y in loader:
            loss = loss_fn(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += loss.item()
            batches += 1
        epoch_loss = total / max(batches, 1)  # this worker's shard; rank 0's value is the one kept
        first_loss = epoch_loss if first_loss is None else first_loss

        with tempfile.TemporaryDirectory() as tmp:
            checkpoint = None
            if is_rank_zero:  # one copy of the (replicated) weights is enough
                state = {"epoch": epoch, "model": _unwrap(model).state_dict(), "optimizer": optimizer.state_dict()}
                torch.save(state, os.path.join(tmp, "state.pt"))
                checkpoint = minitrain.Checkpoint.from_directory(tmp)
            minitrain.report({"epoch": epoch, "loss": epoch_loss, "first_loss": first_loss}, checkpoint=checkpoint)
        if is_rank_zero:
            print(f"epoch {epoch}: loss {epoch_loss:.4f}")


def _unwrap(model: nn.Module) -> nn.Module:
    """The user's model inside a DistributedDataParallel wrapper (or the model itself)."""
    return getattr(model, "module", model)


def _epochs_done(run_dir: str) -> int:
    """How many epochs the run in `run_dir` has committed (0 for a new run)."""
    if not TorchTrainer.can_restore(run_dir):
        return 0
    metrics = minitrain.Result.from_path(run_dir).metrics
    return metrics["epoch"] + 1 if metrics else 0


def main(argv: list[str] | None = None) -> int:
    """Train, print the final metrics, and return 1 when the loss did not drop."""
    parser = argparse.ArgumentParser(description="minitrain quickstart: DDP regression on CPU workers.")
    parser.add_argument("--num-workers", type=int, default=2, help="training processes (default 2)")
    parser.add_argument("--epochs", type=int, default=5, help="epochs in total (default 5)")
    parser.add_argument("--name", default="quickstart",
                        help="run name, the resume key (default quickstart)")
    parser.add_argument("--storage-path", default="~/minitrain_results",
                        help="where the run's checkpoints go (default ~/minitrain_results)")
    args = parser.parse_args(argv)

    storage_path = os.path.expanduser(args.storage_path)
    done = _epochs_done(os.path.join(storage_path, args.name))
    if done >= args.epochs:  # say so instead of starting workers that would have nothing to do
        print(f"run {args.name!r} in {storage_path} has already trained {done} epoch(s), and --epochs is "
              f"{args.epochs}: nothing to do. Pass a larger --epochs to train further, or another --name to "
              "start a new run.")
        return 0
    trainer = TorchTrainer(
        train_func,
        train_loop_config={"epochs": args.epochs, "lr": 1e-2, "batch_size": 64},
        scaling_config=ScalingConfig(num_workers=args.num_workers),
        run_config=RunConfig(name=args.name, storage_path=storage_path),
    )
    result = trainer.fit()
    print(f"result.metrics: {result.metrics}")

    if result.metrics is None or result.metrics["epoch"] < 1:
        print("fewer than two epochs ran in this call; nothing to compare")
        return 0
    first, last = result.metrics["first_loss"], result.metrics["loss"]
    if not last < first:
        print(f"FAILED: loss did not drop ({first:.4f} -> {last:.4f})", file=sys.stderr)
        return 1
    print(f"loss dropped from {first:.4f} to {last:.4f}; latest checkpoint: {result.checkpoint.path}")
    return 0

if __name__ == "__main__":
    sys.exit(main())
