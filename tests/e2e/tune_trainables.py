"""Trial functions of tests/e2e/test_tune.py, in a module of their own: each trial process imports the
module its function lives in, and this one imports only minitrain (not optuna, torch or pytest), so a
trial starts in a fraction of a second."""

from __future__ import annotations

import json
import os
import time

import minitrain
from minitrain import tune


def train_func(config):
    """A per-worker training function: the loss depends only on lr (best at 1e-3)."""
    for epoch in range(config["epochs"]):
        loss = abs(config["lr"] - 1e-3) * 1000 + 1.0 / (epoch + 1)
        minitrain.report({"eval_loss": loss, "epoch": epoch},
                         checkpoint=minitrain.Checkpoint.from_dict({"epoch": epoch}))


def driver_fn(config):
    """Ray Train v2's pattern: a function trainable that builds a TorchTrainer and runs fit()."""
    from minitrain.torch import TorchTrainer

    trainer = TorchTrainer(
        train_func, train_loop_config=config["train_loop_config"],
        scaling_config=minitrain.ScalingConfig(num_workers=1),
        run_config=minitrain.RunConfig(name=f"train-{tune.get_context().get_trial_id()}",
                                       storage_path=tune.get_context().get_trial_dir()))
    trainer.fit()


def sphere(config):
    """A seeded synthetic objective: 4-D sphere around (3, -1, 2, 0)."""
    tune.report({"loss": sum((config[k] - v) ** 2 for k, v in zip("abcd", (3, -1, 2, 0)))})


def resumable(config):
    """Six iterations with a checkpoint each; records where each run of the trial started."""
    checkpoint = tune.get_checkpoint()
    start = checkpoint.to_dict()["i"] + 1 if checkpoint else 0
    with open(os.path.join(config["out"], "starts.jsonl"), "a") as f:
        f.write(json.dumps({"trial": tune.get_context().get_trial_id(), "start": start}) + "\n")
    for i in range(start, 6):
        time.sleep(0.25)
        tune.report({"score": config["x"] + i, "i": i}, checkpoint=minitrain.Checkpoint.from_dict({"i": i}))


def restore_space(out):
    return {"x": tune.uniform(0, 1), "out": out}


def timed(config):
    started = time.time()
    time.sleep(1.0)
    tune.report({"started": started, "ended": time.time()})


def flaky(config):
    """Fails once after its first checkpoint ("once") or every time ("always")."""
    marker = os.path.join(config["out"], f"failed_{config['mode']}")
    checkpoint = tune.get_checkpoint()
    tune.report({"step": 0 if checkpoint is None else 10}, checkpoint=minitrain.Checkpoint.from_dict({"s": 0}))
    if config["mode"] == "always" or not os.path.exists(marker):
        open(marker, "a").close()
        raise ValueError(f"injected failure ({config['mode']})")
    tune.report({"step": 1})
