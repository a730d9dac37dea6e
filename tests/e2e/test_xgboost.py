"""XGBoostTrainer end to end with real xgboost on 2 CPU workers: the data-parallel model matches a
single-process one, a worker killed mid-boosting restarts and the final model has every round, a Tune
sweep over eta, and (with the `cluster` marker) a run across two hosts."""

from __future__ import annotations

import pathlib

import pytest

xgboost = pytest.importorskip("xgboost", reason="XGBoostTrainer's tests need xgboost (pip install 'minitrain[xgboost]')")
pd = pytest.importorskip("pandas")

import minitrain  # noqa: E402
from minitrain import CheckpointConfig, RunConfig, ScalingConfig, tune  # noqa: E402
from minitrain.xgboost import RayTrainReportCallback, XGBoostTrainer  # noqa: E402

from gbdt_support import ROUNDS, gbdt_datasets, gbdt_trainer  # noqa: E402
from gbdt_trainables import make_frame, split, train_xgboost, xgboost_params  # noqa: E402

pytestmark = pytest.mark.e2e


def _trainer(tmp_path, name="xgb", failures=0, **config):
    return gbdt_trainer(XGBoostTrainer, train_xgboost, tmp_path, name, failures, **config)


def _error(booster) -> float:
    x, y = split(make_frame(600, seed=1))
    predicted = booster.predict(xgboost.DMatrix(x)) > 0.5
    return float((predicted != y.to_numpy()).mean())


def test_two_workers_reach_the_single_process_accuracy(tmp_path):
    result = _trainer(tmp_path).fit()

    booster = RayTrainReportCallback.get_model(result.checkpoint)
    assert booster.num_boosted_rounds() == ROUNDS and result.return_value == {"resumed_from": 0, "world": 2}
    x, y = split(make_frame(2000, seed=0))
    alone = xgboost.train(xgboost_params({}), xgboost.DMatrix(x, label=y), num_boost_round=ROUNDS)
    assert abs(_error(booster) - _error(alone)) <= 0.02, (_error(booster), _error(alone))
    assert _error(booster) < 0.2
    # The reported metric is XGBoost's own evaluation over both ranks' validation shards.
    assert abs(result.metrics["valid-error"] - _error(booster)) < 1e-6
    assert len(result.metrics_dataframe) == ROUNDS + 1  # every round, and the checkpoint at the end


def test_a_worker_killed_mid_boosting_restarts_and_the_model_has_every_round(tmp_path):
    marker = tmp_path / "killed"
    result = _trainer(tmp_path, failures=1, frequency=2, kill_at=7, kill_rank=1, marker=str(marker)).fit()

    assert marker.exists()
    resumed_from = result.return_value["resumed_from"]
    assert resumed_from in (4, 6, 8), resumed_from  # the latest committed checkpoint (every 2 rounds)
    assert RayTrainReportCallback.get_model(result.checkpoint).num_boosted_rounds() == ROUNDS
    assert (pathlib.Path(result.path) / "logs" / "attempt_1").is_dir()


def test_top_k_retention_keeps_the_best_rounds_by_the_reported_metric(tmp_path):
    # Every 3rd round is checkpointed (4 of 12); keep the 2 with the lowest validation logloss, which
    # falls round by round here, so the last two checkpoints are the ones kept.
    checkpointing = CheckpointConfig(num_to_keep=2, checkpoint_score_attribute="valid-logloss",
                                     checkpoint_score_order="min")
    trainer = XGBoostTrainer(train_xgboost, train_loop_config={"rounds": ROUNDS, "frequency": 3},
                             datasets=gbdt_datasets(), scaling_config=ScalingConfig(num_workers=2),
                             run_config=RunConfig(name="topk", storage_path=str(tmp_path / "runs"),
                                                  checkpoint_config=checkpointing))
    result = trainer.fit()

    kept = sorted((RayTrainReportCallback.get_model(c).num_boosted_rounds(), m["valid-logloss"])
                  for c, m in result.best_checkpoints)
    assert [rounds for rounds, _ in kept] == [9, 12]
    assert kept[1][1] <= kept[0][1]  # the metric the retention ranked by, as reported
    checkpoint_dirs = [p.name for p in pathlib.Path(result.path).iterdir()
                       if p.is_dir() and p.name.startswith("checkpoint_")]
    assert len(checkpoint_dirs) == 2  # the evicted rounds' directories are gone


def test_a_tune_sweep_over_eta(tmp_path):
    trainer = XGBoostTrainer(train_xgboost, train_loop_config={"rounds": 4}, datasets=gbdt_datasets(),
                             scaling_config=ScalingConfig(num_workers=2),
                             run_config=RunConfig(name="sweep", storage_path=str(tmp_path)))
    results = tune.Tuner(trainer, param_space={"train_loop_config": {"eta": tune.grid_search([0.02, 0.5])}},
                         tune_config=tune.TuneConfig(metric="valid-logloss", mode="min")).fit()

    assert len(results) == 2 and results.num_errors == 0
    best = results.get_best_result()
    assert best.config["train_loop_config"]["eta"] == 0.5  # 4 rounds: the larger step gets further
    assert RayTrainReportCallback.get_model(best.checkpoint).num_boosted_rounds() == 4


@pytest.mark.cluster
def test_training_across_two_hosts(netns_cluster, tmp_path):
    workdir = pathlib.Path(netns_cluster.workdir)
    minitrain.init(hosts=[f"{h.ip}:1" for h in netns_cluster.hosts], ssh_user="root",
                   ssh_identity_file=str(workdir / "id_ed25519"), ssh_known_hosts_file=str(workdir / "known_hosts"),
                   ssh_options=("IdentitiesOnly=yes", "GlobalKnownHostsFile=/dev/null"))
    try:
        result = _trainer(tmp_path, name="xgb2").fit()
    finally:
        minitrain.shutdown()

    assert RayTrainReportCallback.get_model(result.checkpoint).num_boosted_rounds() == ROUNDS
    assert result.return_value["world"] == 2 and result.metrics["valid-error"] < 0.2
    rank1_log = (pathlib.Path(result.path) / "logs" / "attempt_0" / "rank_1.log").read_text()
    assert "got rank 1" in rank1_log  # XGBoost's tracker (on rank 0's host) ranked the remote worker
