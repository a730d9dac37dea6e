"""minitrain quickstart: data-parallel regression on CPU workers, written as a ported Ray Train script.

    python examples/quickstart.py --num-workers 2 --epochs 5

Each worker builds the same synthetic dataset (y = X @ w_true + noise, fixed seed; nothing is
downloaded), trains a small MLP on its shard with DistributedDataParallel over gloo, and reports its
loss every epoch. `result.metrics` is rank 0's last report.

The training function alone also runs under the launcher:

    python -m minitrain.launch examples/quickstart.py:train_func
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import minitrain
from minitrain import RunConfig, ScalingConfig
from minitrain.torch import TorchTrainer, prepare_data_loader, prepare_model

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
    """Runs on every worker: train, and report {"epoch", "loss", "first_loss"} once per epoch."""
    epochs = config.get("epochs", 5)
    context = minitrain.get_context()
    is_rank_zero = context.get_world_rank() == 0

    model = nn.Sequential(nn.Linear(NUM_FEATURES, 32), nn.ReLU(), nn.Linear(32, 1))
    model = prepare_model(model)  # moves to get_device(); wraps in DDP when world size > 1
    optimizer = torch.optim.Adam(model.parameters(), lr=config.get("lr", 1e-2))
    loss_fn = nn.MSELoss()
    loader = DataLoader(make_dataset(), batch_size=config.get("batch_size", 64), shuffle=True)
    loader = prepare_data_loader(loader)  # gives each worker its own shard

    first_loss = None
    for epoch in range(epochs):
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
        minitrain.report({"epoch": epoch, "loss": epoch_loss, "first_loss": first_loss})
        if is_rank_zero:
            print(f"epoch {epoch}: loss {epoch_loss:.4f}")


def main(argv: list[str] | None = None) -> int:
    """Train, print the final metrics, and return 1 when the loss did not drop."""
    parser = argparse.ArgumentParser(description="minitrain quickstart: DDP regression on CPU workers.")
    parser.add_argument("--num-workers", type=int, default=2, help="training processes (default 2)")
    parser.add_argument("--epochs", type=int, default=5, help="epochs in total (default 5)")
    parser.add_argument("--storage-path", default="~/minitrain_results",
                        help="where the run directory goes (default ~/minitrain_results)")
    args = parser.parse_args(argv)

    trainer = TorchTrainer(
        train_func,
        train_loop_config={"epochs": args.epochs, "lr": 1e-2, "batch_size": 64},
        scaling_config=ScalingConfig(num_workers=args.num_workers),
        run_config=RunConfig(name="quickstart", storage_path=os.path.expanduser(args.storage_path)),
    )
    result = trainer.fit()
    print(f"result.metrics: {result.metrics}")

    first, last = result.metrics["first_loss"], result.metrics["loss"]
    if not last < first:
        print(f"FAILED: loss did not drop ({first:.4f} -> {last:.4f})", file=sys.stderr)
        return 1
    print(f"loss dropped from {first:.4f} to {last:.4f}; logs are in {result.path}/logs")
    return 0

if __name__ == "__main__":
    sys.exit(main())
