"""`minitrain.xgboost`: Ray Train's `ray.train.xgboost` without Ray (data-parallel XGBoost).

Port a Ray Train XGBoost script by changing its imports:

    from minitrain.xgboost import RayTrainReportCallback, XGBoostTrainer

    def train_fn_per_worker(config):
        train_df = minitrain.get_dataset_shard("train").materialize().to_pandas()
        dtrain = xgboost.DMatrix(train_df.drop("y", axis=1), label=train_df["y"])
        xgboost.train(params, dtrain, num_boost_round=10, callbacks=[RayTrainReportCallback()])

Every worker runs the function inside XGBoost's communicator, whose tracker rank 0 starts for each
attempt (`minitrain.worker.xgboost_backend`), so `xgboost.train` trains data-parallel across ranks and
hosts. Names load lazily: `XGBoostTrainer` and `XGBoostConfig` do not import xgboost (the driver may
build a trainer without it); `RayTrainReportCallback` does (it is an `xgboost.callback.TrainingCallback`).
Install with `pip install 'minitrain[xgboost]'`.
"""

from __future__ import annotations

from minitrain._lazy import lazy_exports

_LAZY = {
    "XGBoostTrainer": "minitrain.xgboost.trainer",
    "XGBoostConfig": "minitrain.xgboost.config",
    "RayTrainReportCallback": "minitrain.xgboost.callback",
}

__all__ = sorted(_LAZY)


__getattr__, __dir__ = lazy_exports("minitrain.xgboost", _LAZY, __all__)
