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

from minitrain._lazy import lazy_exports

# Loaded on first use, so a trial process (which needs only tune.report) starts without numpy, the
# schedulers or the trainer.
_EXPORTS = {
    "Checkpoint": "minitrain.checkpoint",
    # Tune's own configs (Ray's ray.tune.RunConfig & co.), not Train v2's
    "CheckpointConfig": "minitrain.tune.run_config", "FailureConfig": "minitrain.tune.run_config",
    "RunConfig": "minitrain.tune.run_config", "SyncConfig": "minitrain.tune.run_config",
    "Stopper": "minitrain.tune.stopper",
    "ResultGrid": "minitrain.tune.result_grid", "Result": "minitrain.tune.result_grid",
    "TrialResult": "minitrain.tune.result_grid",
    "Callback": "minitrain.tune.callback",
    "ASHAScheduler": "minitrain.tune.schedulers", "AsyncHyperBandScheduler": "minitrain.tune.schedulers",
    "FIFOScheduler": "minitrain.tune.schedulers", "MedianStoppingRule": "minitrain.tune.schedulers",
    "HyperBandScheduler": "minitrain.tune.schedulers", "PopulationBasedTraining": "minitrain.tune.schedulers",
    "BasicVariantGenerator": "minitrain.tune.search", "ConcurrencyLimiter": "minitrain.tune.search",
    "Searcher": "minitrain.tune.search",
    "TrialStopped": "minitrain.tune.session", "TuneContext": "minitrain.tune.session",
    "get_checkpoint": "minitrain.tune.session", "get_context": "minitrain.tune.session",
    "report": "minitrain.tune.session",
    "TuneConfig": "minitrain.tune.tune_config", "with_resources": "minitrain.tune.tune_config",
    "with_parameters": "minitrain.tune.tune_config",
    "Tuner": "minitrain.tune.tuner",
    **{name: "minitrain.tune.search_space" for name in (
        "choice", "grid_search", "lograndint", "loguniform", "qlograndint", "qloguniform", "qrandint", "qrandn",
        "quniform", "randint", "randn", "sample_from", "uniform")},
}
_SUBMODULES = {"schedulers", "search", "stopper"}

__all__ = sorted(_EXPORTS) + sorted(_SUBMODULES)


__getattr__, __dir__ = lazy_exports("minitrain.tune", _EXPORTS, __all__, submodules=_SUBMODULES,
                                   aliases={"Result": "TrialResult"})
