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
