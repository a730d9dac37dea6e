"""The driver side that tests/e2e/test_xgboost.py and test_lightgbm.py share: their datasets and a trainer of
either library over them (the training functions, which workers import, are in gbdt_trainables.py)."""

from __future__ import annotations

import minitrain
from minitrain import FailureConfig, RunConfig, ScalingConfig

from gbdt_trainables import make_frame

ROUNDS = 12  # boosting rounds of a run, unless its train_loop_config says otherwise


def gbdt_datasets() -> dict:
    """The "train" (2,000 rows, seed 0) and "valid" (600 rows, seed 1) datasets of `make_frame`."""
    return {"train": minitrain.data.from_pandas(make_frame(2000, seed=0)),
            "valid": minitrain.data.from_pandas(make_frame(600, seed=1))}


def gbdt_trainer(trainer_class, train_fn, tmp_path, name: str, failures: int = 0, **config):
    """A `trainer_class` (XGBoostTrainer or LightGBMTrainer) running `train_fn` for ROUNDS rounds (`config`
    adds to its train_loop_config) on 2 workers over `gbdt_datasets()`, stored as run `name` under
    `tmp_path/runs`, allowed `failures` failures."""
    return trainer_class(train_fn, train_loop_config={"rounds": ROUNDS, **config}, datasets=gbdt_datasets(),
                         scaling_config=ScalingConfig(num_workers=2),
                         run_config=RunConfig(name=name, storage_path=str(tmp_path / "runs"),
                                              failure_config=FailureConfig(max_failures=failures)))
