"""Trial functions and config objects of tests/e2e/test_tune_restore.py, in a module of their own (each trial
process imports it; it imports only minitrain)."""

from __future__ import annotations

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


def dummy_train_fn_with_report(config):
    """ray/python/ray/tune/tests/test_tuner_restore.py: _dummy_train_fn_with_report (session -> tune)."""
    tune.report({"score": 1})


def train_fn_sometimes_failing(config):
    """ray/python/ray/tune/tests/test_tuner_restore.py: _train_fn_sometimes_failing, imports ported (session ->
    tune). Fails after its `num_epochs` reports while the marker exists."""
    failing, hanging = config["failing_hanging"]
    checkpoint = tune.get_checkpoint()
    state = {"it": checkpoint.to_dict()["it"]} if checkpoint else {"it": 0}
    for _ in range(config.get("num_epochs", 1)):
        state["it"] += 1
        tune.report(state, checkpoint=minitrain.Checkpoint.from_dict(state))
    if failing and failing.exists():
        raise RuntimeError("I am failing")
    if hanging and hanging.exists():
        time.sleep(60)
    state["it"] += 1
    tune.report(state, checkpoint=minitrain.Checkpoint.from_dict(state))
