"""XGBoostTrainer and LightGBMTrainer in process: their arguments, Ray's legacy-argument errors, the
report callbacks' metrics, the backends' pure parts, and `DataIterator.materialize` they build on."""

from __future__ import annotations

import logging

import numpy as np
import pytest

import minitrain
from minitrain import ConfigError, RunConfig, ScalingConfig
from minitrain._gbdt import flatten_last, metric_names, report_dict
from minitrain.driver.trainer import DataParallelTrainer
from minitrain.lightgbm import LightGBMConfig, LightGBMTrainer, get_network_params
from minitrain.torch import TorchConfig, TorchTrainer
from minitrain.worker.lightgbm_backend import LightGBMBackend, routable_address
from minitrain.worker.xgboost_backend import XGBoostBackend, task_id
from minitrain.xgboost import XGBoostConfig, XGBoostTrainer

TRAINERS = [XGBoostTrainer, LightGBMTrainer]


def noop(config):
    pass


@pytest.mark.parametrize("trainer", TRAINERS)
@pytest.mark.parametrize("legacy", [{"params": {"eta": 0.1}}, {"label_column": "y"}, {"num_boost_round": 10}])
def test_ray_legacy_arguments_raise_rays_deprecation_error(trainer, legacy):
    with pytest.raises(DeprecationWarning, match=rf"legacy {trainer.__name__} API is deprecated.*"
                                                 rf"{next(iter(legacy))}.*issues/50042"):
        trainer(noop, **legacy)
    with pytest.raises(DeprecationWarning):  # the legacy form without a training function says the same
        trainer(datasets={}, **legacy)


@pytest.mark.parametrize("trainer", TRAINERS)
def test_ray_v2_removed_arguments_raise_as_for_torch(trainer):
    with pytest.raises(DeprecationWarning, match=rf"{trainer.__name__}\(metadata=...\) was removed"):
        trainer(noop, metadata={"a": 1})
    with pytest.raises(DeprecationWarning, match=rf"{trainer.__name__}\(resume_from_checkpoint=...\)"):
        trainer(noop, resume_from_checkpoint="/somewhere")
    with pytest.raises(DeprecationWarning, match="RayTrainReportCallback.get_model"):
        trainer.get_model(None)


def test_configs_are_checked_by_their_own_field_name():
    with pytest.raises(ConfigError, match=r"XGBoostTrainer\(xgboost_config=...\) must be a minitrain.XGBoostConfig"):
        XGBoostTrainer(noop, xgboost_config=TorchConfig())
    with pytest.raises(ConfigError, match=r"LightGBMTrainer\(lightgbm_config=...\)"):
        LightGBMTrainer(noop, lightgbm_config=XGBoostConfig())
    with pytest.raises(ConfigError, match=r"TorchTrainer\(torch_config=...\)"):
        TorchTrainer(noop, torch_config=XGBoostConfig())
    with pytest.raises(ConfigError, match=r"XGBoostTrainer\(train_loop_per_worker=...\) must be callable"):
        XGBoostTrainer()
    with pytest.raises(ConfigError, match="xgboost_communicator"):
        XGBoostConfig(xgboost_communicator="nccl")
    with pytest.raises(ConfigError, match="timeout_s"):
        LightGBMConfig(timeout_s=0)


def test_the_trainers_share_the_base_and_name_their_backends():
    xgb = XGBoostTrainer(noop, xgboost_config=XGBoostConfig(timeout_s=60), scaling_config=ScalingConfig(num_workers=2))
    lgb = LightGBMTrainer(noop, train_loop_config={"eta": 0.1})
    torch = TorchTrainer(noop)
    assert all(isinstance(t, DataParallelTrainer) for t in (xgb, lgb, torch))
    assert xgb.xgboost_config == XGBoostConfig(timeout_s=60) and lgb.lightgbm_config == LightGBMConfig()
    assert (xgb._backend().name, xgb._backend().timeout_s) == ("xgboost", 60.0)
    assert isinstance(xgb._backend(), XGBoostBackend) and isinstance(lgb._backend(), LightGBMBackend)
    assert (torch._backend().name, torch._backend().timeout_s) == ("gloo", 1800.0)
    torch.torch_config = TorchConfig(backend="nccl", timeout_s=5)  # the attribute still replaces the config
    assert (torch._backend().name, torch._backend().timeout_s) == ("nccl", 5.0)
    assert repr(xgb).startswith("XGBoostTrainer(noop")


def test_report_metrics_are_flattened_selected_and_postprocessed():
    flat = flatten_last({"train": {"rmse": [3.0, 2.0]}, "validation": {"rmse": [4.0, 2.5], "mae": 1.0}})
    assert flat == {"train-rmse": 2.0, "validation-rmse": 2.5, "validation-mae": 1.0}
    assert report_dict(flat, None, None) == flat
    assert report_dict(flat, metric_names("validation-rmse"), None) == {"validation-rmse": 2.5}
    assert report_dict(flat, metric_names({"loss": "validation-rmse"}), lambda d: {**d, "x": 1}) == {"loss": 2.5, "x": 1}
    with pytest.raises(KeyError, match="validation-logloss.*validation-rmse"):
        report_dict(flat, metric_names(["validation-logloss"]), None)
    with pytest.raises(TypeError, match="metrics"):
        metric_names(3)


def test_xgboost_task_ids_sort_as_the_ranks_do():
    ranks = [10, 2, 1, 0, 123]
    assert sorted(ranks, key=task_id) == sorted(ranks)
    with pytest.raises(RuntimeError, match="not set up"):
        XGBoostBackend().communicator_args()


def test_lightgbm_network_params_outside_a_worker_are_empty_with_a_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="minitrain"):
        assert get_network_params() == {}
    assert "outside the training function" in caplog.text
    assert routable_address("127.0.0.1", 9) == "127.0.0.1"


def test_materialize_gives_each_rank_its_own_rows_in_memory():
    pd = pytest.importorskip("pandas")
    dataset = minitrain.data.from_items([{"x": float(i), "y": i % 2} for i in range(10)])
    from minitrain.data.iterator import DataIterator

    frames = [DataIterator(dataset, world_size=2, rank=rank).materialize().to_pandas() for rank in (0, 1)]
    assert all(isinstance(frame, pd.DataFrame) for frame in frames)
    assert sorted(pd.concat(frames)["x"].tolist()) == [float(i) for i in range(10)]
    assert len(frames[0]) == len(frames[1]) == 5
    rows = minitrain.data.from_items(list(range(4)))  # a row dataset keeps its rows
    assert list(DataIterator(rows).materialize().iter_rows()) == list(DataIterator(rows).materialize().iter_rows())


# Local mode keeps the reported Checkpoint object only (as Ray's); the callback's temporary directory is gone
# by then, so these check what was reported; the e2e tests load the committed models.
def test_xgboost_callback_in_local_mode_reports_the_chosen_metrics(tmp_path):
    xgboost = pytest.importorskip("xgboost")
    from minitrain.xgboost import RayTrainReportCallback

    def train(config):
        rng = np.random.default_rng(0)
        x = rng.normal(size=(200, 4))
        dtrain = xgboost.DMatrix(x, label=(x[:, 0] > 0).astype(int))
        xgboost.train({"objective": "binary:logistic", "eval_metric": "logloss"}, dtrain, num_boost_round=5,
                      evals=[(dtrain, "train")],
                      callbacks=[RayTrainReportCallback(metrics={"loss": "train-logloss"}, frequency=2)])

    result = XGBoostTrainer(train, scaling_config=ScalingConfig(num_workers=0)).fit()
    assert set(result.metrics) == {"loss"} and result.metrics["loss"] < 0.3
    assert result.checkpoint is not None  # checkpoint_at_end (round 5 is not a multiple of frequency=2)


def test_lightgbm_callback_in_local_mode_reports_the_chosen_metrics():
    lightgbm = pytest.importorskip("lightgbm")
    from minitrain.lightgbm import RayTrainReportCallback

    def train():
        rng = np.random.default_rng(0)
        x = rng.normal(size=(200, 4))
        data = lightgbm.Dataset(x, label=x[:, 0] * 2)
        lightgbm.train({"objective": "regression", "verbose": -1, **get_network_params()}, data,
                       num_boost_round=4, valid_sets=[data], valid_names=["eval"],
                       callbacks=[RayTrainReportCallback(metrics="eval-l2")])

    result = LightGBMTrainer(train, scaling_config=ScalingConfig(num_workers=0),
                             run_config=RunConfig(name="local")).fit()
    assert set(result.metrics) == {"eval-l2"} and result.checkpoint is not None
