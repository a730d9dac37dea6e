"""Trial functions and config objects of tests/e2e/test_tune_restore.py, in a module of their own (each trial
process imports it; it imports only minitrain)."""

from __future__ import annotations

import json
import os
import time

import minitrain
from minitrain import tune


class Small:
    """A config value that is not JSON (a class), as Ray's examples tune model classes."""

    size = 1


class Large:
    size = 3


def model_trainable(config):
    """Six iterations with a checkpoint each, resuming from the latest; reports what its config holds."""
    checkpoint = tune.get_checkpoint()
    start = checkpoint.to_dict()["i"] + 1 if checkpoint else 0
    for i in range(start, 6):
        time.sleep(0.2)
        tune.report({"i": i, "size": config["model"].size, "x": config["x"], "double": config["double"]},
                    checkpoint=minitrain.Checkpoint.from_dict({"i": i}))


def fails_until_fixed(config):
    """Two checkpointed iterations, then fails unless `<out>/fixed` exists; notes where each run started."""
    checkpoint = tune.get_checkpoint()
    start = checkpoint.to_dict()["i"] + 1 if checkpoint else 0
    with open(os.path.join(config["out"], "starts.jsonl"), "a") as f:
        f.write(json.dumps({"trial": tune.get_context().get_trial_id(), "start": start}) + "\n")
    for i in range(start, 4):
        if i == 2 and not os.path.exists(os.path.join(config["out"], "fixed")):
            raise RuntimeError("not fixed yet")
        tune.report({"i": i, "k": config["k"]}, checkpoint=minitrain.Checkpoint.from_dict({"i": i}))
