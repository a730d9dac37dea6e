"""Hyperparameter search with ASHA: a ported Ray Tune + Ray Train script (only the imports changed).

    python examples/tune_asha.py --num-samples 8 --epochs 10

Each trial trains a small MLP on a synthetic regression task (y = X @ w_true + noise, fixed seed;
nothing is downloaded) with DistributedDataParallel on `--num-workers` CPU workers, reporting its
validation loss and a checkpoint every epoch. ASHA stops the trials whose loss trails the others at
epochs 1, 2, 4, ... (reduction factor 2); the trials run side by side while this machine's CPUs allow
and queue otherwise. Stopping it with Ctrl-C and running it again with the same `--storage-path`
resumes the sweep (finished trials kept, unfinished ones from their latest checkpoints).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import torch
from torch import nn

import minitrain
from minitrain import tune
from minitrain.torch import TorchTrainer, prepare_model
from minitrain.tune.schedulers import ASHAScheduler

FEATURES = 8


def make_data(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    w_true = torch.arange(1.0, FEATURES + 1).unsqueeze(1) / FEATURES
    x = torch.randn(n, FEATURES, generator=generator)
    return x, x @ w_true + 0.1 * torch.randn(n, 1, generator=generator)


def train_func(config: dict) -> None:
    """One worker: full-batch SGD on its half of the data; validation loss on a held-out set."""
    torch.manual_seed(0)
    context = minitrain.get_context()
    x, y = make_data(256, seed=1)
    x, y = x[context.get_world_rank()::context.get_world_size()], y[context.get_world_rank()::context.get_world_size()]
    x_val, y_val = make_data(128, seed=2)
    model = prepare_model(nn.Sequential(nn.Linear(FEATURES, config["hidden"]), nn.ReLU(), nn.Linear(config["hidden"], 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"], momentum=config["momentum"])
    start = 0
    checkpoint = minitrain.get_checkpoint()
    if checkpoint:  # a retried or restored trial goes on from its latest checkpoint
        with checkpoint.as_directory() as directory:
            state = torch.load(os.path.join(directory, "state.pt"))
        model.module.load_state_dict(state["model"]) if hasattr(model, "module") else model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = state["epoch"] + 1
    for epoch in range(start, config["epochs"]):
        for _ in range(config["steps_per_epoch"]):
            optimizer.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
        with torch.no_grad():
            val_loss = nn.functional.mse_loss(model(x_val), y_val).item()
        with tempfile.TemporaryDirectory() as directory:
            if context.get_world_rank() == 0:
                inner = model.module if hasattr(model, "module") else model
                torch.save({"model": inner.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch},
                           os.path.join(directory, "state.pt"))
            minitrain.report({"val_loss": val_loss, "epoch": epoch},
                             checkpoint=minitrain.Checkpoint.from_directory(directory))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-samples", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--num-workers", type=int, default=1)
    parser.add_argument("--storage-path", default=os.path.expanduser("~/minitrain_results"))
    parser.add_argument("--name", default="tune_asha")
    parser.add_argument("--smoke-test", action="store_true", help="3 trials of 3 epochs, for CI")
    args = parser.parse_args(argv)
    if args.smoke_test:
        args.num_samples, args.epochs = 3, 3

    trainer = TorchTrainer(train_func, train_loop_config={"epochs": args.epochs, "steps_per_epoch": 20},
                           scaling_config=minitrain.ScalingConfig(num_workers=args.num_workers))
    path = os.path.join(args.storage_path, args.name)
    param_space = {"train_loop_config": {"lr": tune.loguniform(1e-4, 1e-1), "momentum": tune.uniform(0.0, 0.9),
                                         "hidden": tune.choice([16, 32, 64])}}
    if tune.Tuner.can_restore(path):
        print(f"resuming the sweep in {path}")
        tuner = tune.Tuner.restore(path, trainer)  # the sweep's param space, ASHA and seed come back with it
    else:
        tuner = tune.Tuner(
            trainer, param_space=param_space,
            tune_config=tune.TuneConfig(num_samples=args.num_samples, scheduler=ASHAScheduler(
                metric="val_loss", mode="min", max_t=args.epochs, grace_period=1, reduction_factor=2),
                search_alg=tune.BasicVariantGenerator(random_state=0)),
            run_config=tune.RunConfig(name=args.name, storage_path=args.storage_path))
    results = tuner.fit()
    best = results.get_best_result(metric="val_loss", mode="min")
    print("best config:", best.config["train_loop_config"])
    print("best val_loss:", round(best.metrics["val_loss"], 4), "after", best.metrics["training_iteration"], "epochs")
    print("best checkpoint:", best.checkpoint.path)
    print(results.get_dataframe()[["trial_id", "status", "training_iteration", "val_loss"]].to_string())
    return 0 if results.num_errors == 0 and best.metrics["val_loss"] < 1.0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
