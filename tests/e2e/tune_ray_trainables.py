"""Trial functions of tests/e2e/test_tune_ray_surface.py (Ray Tune's own surface), in a module of their own so
that each trial process imports only minitrain."""

from __future__ import annotations

import minitrain
from minitrain import tune


class SpecificError(RuntimeError):
    """A user's own exception type (what `result.error` must keep)."""


def counting(config):
    """Reports `n` results: i, a score rising with i, and a checkpoint each."""
    for i in range(config.get("n", 10)):
        tune.report({"i": i, "score": config.get("x", 0) + i},
                    checkpoint=minitrain.Checkpoint.from_dict({"i": i}) if config.get("checkpoints") else None)


def failing(config):
    """Ported from ray/python/ray/air/tests/test_errors.py: failing_fn."""
    raise SpecificError("Failing!")


def with_data(config, data):
    """A `tune.with_parameters` trainable: reports what it was given and its trial id."""
    tune.report({"total": sum(data) * config["k"], "trial": tune.get_context().get_trial_id()})


def train_fn_per_worker(config):
    """Ray's Train/Tune interop guide: each worker reports a loss, rank 0 a checkpoint every epoch."""
    for epoch in range(config["epochs"]):
        checkpoint = None
        if minitrain.get_context().get_world_rank() == 0:
            checkpoint = minitrain.Checkpoint.from_dict({"epoch": epoch})
        minitrain.report({"loss": config["lr"] * (config["epochs"] - epoch), "epoch": epoch}, checkpoint=checkpoint)


def train_driver_fn(config):
    """Ray's Train/Tune interop guide, imports ported: a TorchTrainer in a function trainable, its reports
    forwarded by `TuneReportCallback`."""
    from minitrain.torch import TorchTrainer
    from minitrain.tune.integration.ray_train import TuneReportCallback

    trainer = TorchTrainer(
        train_fn_per_worker, train_loop_config=config["train_loop_config"],
        scaling_config=minitrain.ScalingConfig(num_workers=config["num_workers"]),
        run_config=minitrain.RunConfig(name=f"train-trial_id={tune.get_context().get_trial_id()}",
                                       storage_path=config["storage_path"], callbacks=[TuneReportCallback()]))
    trainer.fit()
