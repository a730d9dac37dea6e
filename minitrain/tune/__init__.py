"""minitrain.tune: Ray Tune's `Tuner` surface on top of `TorchTrainer` (`ray.tune` -> `minitrain.tune`).

    from minitrain import tune
    tuner = tune.Tuner(trainer, param_space={"train_loop_config": {"lr": tune.loguniform(1e-4, 1e-1)}},
                       tune_config=tune.TuneConfig(num_samples=8, scheduler=ASHAScheduler(metric="loss", mode="min")))
    best = tuner.fit().get_best_result(metric="loss", mode="min")

Each trial runs in a process of its own (minitrain.tune.trial_process); trials run concurrently while
the hosts' CPUs/GPUs allow. Schedulers live in `minitrain.tune.schedulers`, searchers in
`minitrain.tune.search` (`OptunaSearch` in `minitrain.tune.search.optuna`), as in Ray.
"""

from __future__ import annotations

from minitrain.checkpoint import Checkpoint
from minitrain.config import CheckpointConfig, FailureConfig, RunConfig
from minitrain.tune import schedulers, search
from minitrain.tune.result_grid import ResultGrid, TrialResult
from minitrain.tune.schedulers import ASHAScheduler, AsyncHyperBandScheduler, FIFOScheduler, MedianStoppingRule
from minitrain.tune.search import BasicVariantGenerator, ConcurrencyLimiter, Searcher
from minitrain.tune.search_space import (
    choice, grid_search, lograndint, loguniform, qlograndint, qloguniform, qrandint, qrandn, quniform, randint,
    randn, sample_from, uniform,
)
from minitrain.tune.session import TrialStopped, TuneContext, get_checkpoint, get_context, report
from minitrain.tune.tune_config import TuneConfig, with_resources
from minitrain.tune.tuner import Tuner

Result = TrialResult

__all__ = [
    "ASHAScheduler", "AsyncHyperBandScheduler", "BasicVariantGenerator", "Checkpoint", "CheckpointConfig",
    "ConcurrencyLimiter", "FIFOScheduler", "FailureConfig", "MedianStoppingRule", "Result", "ResultGrid",
    "RunConfig", "Searcher", "TrialStopped", "TuneConfig", "TuneContext", "Tuner", "choice", "get_checkpoint",
    "get_context", "grid_search", "lograndint", "loguniform", "qlograndint", "qloguniform", "qrandint", "qrandn",
    "quniform", "randint", "randn", "report", "sample_from", "schedulers", "search", "uniform", "with_resources",
]
