"""LightGBMTrainer end to end with real lightgbm on 2 CPU workers: the data-parallel model matches a
single-process one, a worker killed mid-boosting restarts and the final model has every round, a Tune
sweep over the learning rate (LightGBM's eta), and (with the `cluster` marker) a run across two hosts."""

from __future__ import annotations

import pathlib

import pytest

lightgbm = pytest.importorskip("lightgbm", reason="LightGBMTrainer's tests need lightgbm (pip install 'minitrain[lightgbm]')")
pd = pytest.importorskip("pandas")

import minitrain  # noqa: E402
from minitrain import RunConfig, ScalingConfig, tune  # noqa: E402
from minitrain.lightgbm import LightGBMTrainer, RayTrainReportCallback  # noqa: E402

from gbdt_support import ROUNDS, gbdt_datasets, gbdt_trainer  # noqa: E402
from gbdt_trainables import lightgbm_params, make_frame, split, train_lightgbm  # noqa: E402

pytestmark = pytest.mark.e2e


def _trainer(tmp_path, name="lgb", failures=0, **config):
    return gbdt_trainer(LightGBMTrainer, train_lightgbm, tmp_path, name, failures, **config)


def _error(booster) -> float:
    x, y = split(make_frame(600, seed=1))
    predicted = booster.predict(x) > 0.5
    return float((predicted != y.to_numpy()).mean())


def test_two_workers_reach_the_single_process_accuracy(tmp_path):
    result = _trainer(tmp_path).fit()

    booster = RayTrainReportCallback.get_model(result.checkpoint)
    assert booster.current_iteration() == ROUNDS and result.return_value == {"resumed_from": 0, "machines": 2}
    x, y = split(make_frame(2000, seed=0))
    alone = lightgbm.train(lightgbm_params({}), lightgbm.Dataset(x, label=y), num_boost_round=ROUNDS)
    assert abs(_error(booster) - _error(alone)) <= 0.02, (_error(booster), _error(alone))
    assert _error(booster) < 0.2
    # LightGBM evaluates each rank's own validation shard: rank 0's is the reported one.
    assert 0 < result.metrics["valid-binary_error"] < 0.2
    assert len(result.metrics_dataframe) == ROUNDS  # every round, the last one with the checkpoint


def test_a_worker_killed_mid_boosting_restarts_and_the_model_has_every_round(tmp_path):
    marker = tmp_path / "killed"
    result = _trainer(tmp_path, failures=1, frequency=2, kill_at=7, kill_rank=1, marker=str(marker)).fit()

    assert marker.exists()
    resumed_from = result.return_value["resumed_from"]
    assert resumed_from in (4, 6, 8), resumed_from  # the latest committed checkpoint (every 2 rounds)
    assert RayTrainReportCallback.get_model(result.checkpoint).current_iteration() == ROUNDS
    assert (pathlib.Path(result.path) / "logs" / "attempt_1").is_dir()


def test_a_tune_sweep_over_the_learning_rate(tmp_path):
    trainer = LightGBMTrainer(train_lightgbm, train_loop_config={"rounds": 4}, datasets=gbdt_datasets(),
                             scaling_config=ScalingConfig(num_workers=2),
                             run_config=RunConfig(name="sweep", storage_path=str(tmp_path)))
    results = tune.Tuner(trainer, param_space={"train_loop_config": {"learning_rate": tune.grid_search([0.02, 0.5])}},
                         tune_config=tune.TuneConfig(metric="valid-binary_logloss", mode="min")).fit()

    assert len(results) == 2 and results.num_errors == 0
    best = results.get_best_result()
    assert best.config["train_loop_config"]["learning_rate"] == 0.5  # 4 rounds: the larger step gets further
    assert RayTrainReportCallback.get_model(best.checkpoint).current_iteration() == 4


@pytest.mark.cluster
def test_training_across_two_hosts(netns_cluster, tmp_path):
    workdir = pathlib.Path(netns_cluster.workdir)
    minitrain.init(hosts=[f"{h.ip}:1" for h in netns_cluster.hosts], ssh_user="root",
                   ssh_identity_file=str(workdir / "id_ed25519"), ssh_known_hosts_file=str(workdir / "known_hosts"),
                   ssh_options=("IdentitiesOnly=yes", "GlobalKnownHostsFile=/dev/null"))
    try:
        result = _trainer(tmp_path, name="lgb2", verbose=True).fit()
    finally:
        minitrain.shutdown()

    assert RayTrainReportCallback.get_model(result.checkpoint).current_iteration() == ROUNDS
    assert result.return_value["machines"] == 2 and result.metrics["valid-binary_error"] < 0.2
    rank1_log = (pathlib.Path(result.path) / "logs" / "attempt_0" / "rank_1.log").read_text()
    assert "Local rank: 1, total number of machines: 2" in rank1_log  # LightGBM's network spans both hosts
