"""Training functions of tests/e2e/test_xgboost.py and test_lightgbm.py, in a module of their own: workers and
Tune's trial processes import the module a function lives in, and this one imports only minitrain, numpy
and (inside the functions) the library, not pytest."""

from __future__ import annotations

import os
import signal

import numpy as np

import minitrain

FEATURES = [f"f{i}" for i in range(6)]


def make_frame(rows: int, seed: int):
    """A seeded binary classification table (pandas): a non-linear boundary with some noise."""
    import pandas as pd

    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, len(FEATURES)))
    signal_ = x[:, 0] + 0.5 * x[:, 1] ** 2 - x[:, 2] * x[:, 3] + 0.3 * rng.normal(size=rows)
    frame = pd.DataFrame(x, columns=FEATURES)
    frame["y"] = (signal_ > 0.5).astype(int)
    return frame


def split(frame):
    """(features, labels) of a frame from `make_frame`."""
    return frame[FEATURES], frame["y"]


def _die_once(config: dict, round_index: int) -> None:
    """SIGKILL this worker at `config["kill_at"]` on rank `config["kill_rank"]`, the first time only (a
    marker file remembers it across attempts)."""
    marker = config.get("marker")
    if (marker and round_index == config["kill_at"] and not os.path.exists(marker)
            and minitrain.get_context().get_world_rank() == config.get("kill_rank", 1)):
        open(marker, "w").close()
        os.kill(os.getpid(), signal.SIGKILL)


def xgboost_params(config: dict) -> dict:
    """The boosting parameters of these tests (`eta` from the config)."""
    return {"objective": "binary:logistic", "eval_metric": ["logloss", "error"], "tree_method": "hist",
            "max_depth": 4, "eta": config.get("eta", 0.3), "seed": 0}


def train_xgboost(config: dict) -> dict:
    """Ray's pattern: shards to DMatrix, resume from the checkpoint with the rounds left, report each round."""
    import xgboost

    from minitrain.xgboost import RayTrainReportCallback

    class DieOnce(xgboost.callback.TrainingCallback):
        def after_iteration(self, model, epoch, evals_log):
            _die_once(config, epoch)
            return False

    train_x, train_y = split(minitrain.get_dataset_shard("train").materialize().to_pandas())
    valid_x, valid_y = split(minitrain.get_dataset_shard("valid").materialize().to_pandas())
    checkpoint = minitrain.get_checkpoint()
    booster = RayTrainReportCallback.get_model(checkpoint) if checkpoint else None
    done = booster.num_boosted_rounds() if booster is not None else 0
    xgboost.train(xgboost_params(config), xgboost.DMatrix(train_x, label=train_y),
                  num_boost_round=config["rounds"] - done, xgb_model=booster,
                  evals=[(xgboost.DMatrix(valid_x, label=valid_y), "valid")],
                  callbacks=[RayTrainReportCallback(frequency=config.get("frequency", 0)), DieOnce()])
    return {"resumed_from": done, "world": xgboost.collective.get_world_size()}


def lightgbm_params(config: dict) -> dict:
    """The boosting parameters of these tests, with this worker's network parameters."""
    from minitrain.lightgbm import get_network_params

    return {"objective": "binary", "metric": ["binary_logloss", "binary_error"], "num_leaves": 15,
            "learning_rate": config.get("learning_rate", 0.3), "min_data_in_leaf": 5, "verbose": 1 if config.get("verbose") else -1, "seed": 0,
            "deterministic": True, **get_network_params()}


def train_lightgbm(config: dict) -> dict:
    """Ray's pattern with LightGBM: get_network_params() in the params, resume with init_model."""
    import lightgbm

    from minitrain.lightgbm import RayTrainReportCallback

    def die_once(env) -> None:
        _die_once(config, env.iteration)

    train_x, train_y = split(minitrain.get_dataset_shard("train").materialize().to_pandas())
    valid_x, valid_y = split(minitrain.get_dataset_shard("valid").materialize().to_pandas())
    checkpoint = minitrain.get_checkpoint()
    booster = RayTrainReportCallback.get_model(checkpoint) if checkpoint else None
    done = booster.current_iteration() if booster is not None else 0
    train_set = lightgbm.Dataset(train_x, label=train_y)
    lightgbm.train(lightgbm_params(config), train_set, num_boost_round=config["rounds"] - done, init_model=booster,
                   valid_sets=[lightgbm.Dataset(valid_x, label=valid_y, reference=train_set)], valid_names=["valid"],
                   callbacks=[RayTrainReportCallback(frequency=config.get("frequency", 0)), die_once])
    return {"resumed_from": done, "machines": len(get_network_params_or_empty().get("machines", "").split(","))}


def get_network_params_or_empty() -> dict:
    """`get_network_params()` (imported here so the trial module stays light)."""
    from minitrain.lightgbm import get_network_params

    return get_network_params()
