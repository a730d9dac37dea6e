"""`minitrain.lightgbm`: Ray Train's `ray.train.lightgbm` without Ray (data-parallel LightGBM).

Port a Ray Train LightGBM script by changing its imports:

    from minitrain.lightgbm import LightGBMTrainer, RayTrainReportCallback, get_network_params

    def train_fn_per_worker(config):
        train_df = minitrain.get_dataset_shard("train").materialize().to_pandas()
        params = {"objective": "regression", **get_network_params()}
        lightgbm.train(params, lightgbm.Dataset(train_df.drop("y", axis=1), label=train_df["y"]),
                       callbacks=[RayTrainReportCallback()])

`get_network_params()` gives this worker's `machines`, `local_listen_port` and `num_machines`: every
rank's routable address and a free port, agreed for each attempt (`minitrain.worker.lightgbm_backend`).
Names load lazily: `LightGBMTrainer`, `LightGBMConfig` and `get_network_params` do not import lightgbm;
`RayTrainReportCallback` does. Install with `pip install 'minitrain[lightgbm]'`.
"""

from __future__ import annotations

from minitrain._lazy import lazy_exports

_LAZY = {
    "LightGBMTrainer": "minitrain.lightgbm.trainer",
    "LightGBMConfig": "minitrain.lightgbm.config",
    "get_network_params": "minitrain.lightgbm.config",
    "RayTrainReportCallback": "minitrain.lightgbm.callback",
}

__all__ = sorted(_LAZY)


__getattr__, __dir__ = lazy_exports("minitrain.lightgbm", _LAZY, __all__)
