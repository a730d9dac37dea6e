"""Ray Tune's own surface end to end: Tune's RunConfig (`stop`, `fail_fast`,
`checkpoint_config`). Few, small sweeps: each trial is a real process."""

from __future__ import annotations

import os

import pytest

from minitrain import tune
from minitrain.tune.stopper import CombinedStopper, MaximumIterationStopper, TrialPlateauStopper
import minitrain
from tune_ray_trainables import SpecificError, counting, failing, train_driver_fn, with_data

pytestmark = pytest.mark.e2e


def test_stop_dict_stopper_and_missing_key(tmp_path):
    space = {"n": 10, "x": tune.grid_search([0, 1])}
    results = tune.Tuner(counting, param_space=space, run_config=tune.RunConfig(
        name="dict", storage_path=str(tmp_path), stop={"training_iteration": 3})).fit()
    assert [r.metrics["training_iteration"] for r in results] == [3, 3]
    assert all(r.status == "TERMINATED" and "RunConfig(stop=...)" in r.stop_reason for r in results)
    # Ray's stopping-guide example: CombinedStopper(MaximumIterationStopper, TrialPlateauStopper)
    stopper = CombinedStopper(MaximumIterationStopper(max_iter=5), TrialPlateauStopper(metric="score"))
    results = tune.Tuner(counting, param_space={"n": 10}, run_config=tune.RunConfig(
        name="stopper", storage_path=str(tmp_path), stop=stopper)).fit()
    assert results[0].metrics["i"] == 4
    results = tune.Tuner(counting, param_space={"n": 10}, run_config=tune.RunConfig(
        name="missing", storage_path=str(tmp_path), stop={"nope": 1})).fit()
    assert results[0].status == "ERROR" and "Stopping criteria nope not provided" in str(results[0].error)


@pytest.mark.parametrize("fail_fast", [False, True, "raise"])
def test_trainable_error_with_tuner(tmp_path, fail_fast):
    """Ported from ray/python/ray/air/tests/test_errors.py::test_trainable_error_with_tuner (function)."""
    tuner = tune.Tuner(failing, tune_config=tune.TuneConfig(num_samples=2, max_concurrent_trials=1),
                       run_config=tune.RunConfig(name=f"fail_fast={fail_fast}", storage_path=str(tmp_path),
                                                 failure_config=tune.FailureConfig(fail_fast=fail_fast)))
    if fail_fast is False:
        results = tuner.fit()
        assert len(results) == 2 and all(isinstance(r.error, SpecificError) for r in results)
        assert all(isinstance(e, SpecificError) for e in results.errors)  # errors keep their type
    elif fail_fast is True:
        results = tuner.fit()
        assert len([r.error for r in results if r.error]) == 1
    else:
        with pytest.raises(SpecificError, match="Failing!"):
            tuner.fit()


def test_checkpoint_config_num_to_keep_for_function_trials(tmp_path):
    keep = tune.CheckpointConfig(num_to_keep=2, checkpoint_score_attribute="score", checkpoint_score_order="min")
    result = tune.Tuner(counting, param_space={"n": 5, "checkpoints": True}, run_config=tune.RunConfig(
        name="keep", storage_path=str(tmp_path), checkpoint_config=keep)).fit()[0]
    kept = sorted(os.listdir(result.path))
    # the two lowest scores (i=0, 1) and the latest (i=4); the others deleted from the trial directory
    assert kept == ["checkpoint_000000", "checkpoint_000001", "checkpoint_000004"], kept
    assert [c.to_dict()["i"] for c, _ in result.best_checkpoints] == [0, 1, 4]
    assert result.checkpoint.to_dict()["i"] == 4


def test_with_parameters_reaches_each_trial(tmp_path):
    trainable = tune.with_resources(tune.with_parameters(with_data, data=list(range(100))), {"cpu": 1})
    results = tune.Tuner(trainable, param_space={"k": tune.grid_search([1, 2])}, run_config=tune.RunConfig(
        name="params", storage_path=str(tmp_path))).fit()
    assert [r.metrics["total"] for r in results] == [4950, 9900]
    assert [r.metrics["trial"] for r in results] == [r.trial_id for r in results]


def test_restore_of_a_finished_sweep_gives_its_results_without_running(tmp_path):
    """After ray/python/ray/tune/tests/test_tuner_restore.py: Tuner.restore(path).get_results()."""
    path = str(tmp_path / "done")
    fitted = tune.Tuner(counting, param_space={"n": 3, "x": tune.grid_search([0, 5])}, run_config=tune.RunConfig(
        name="done", storage_path=str(tmp_path))).fit()
    before = os.path.getmtime(os.path.join(path, "tuner_state.json"))
    restored = tune.Tuner.restore(path).get_results()
    assert [r.metrics["score"] for r in restored] == [r.metrics["score"] for r in fitted] == [2, 7]
    assert [r.config for r in restored] == [r.config for r in fitted]
    assert os.path.getmtime(os.path.join(path, "tuner_state.json")) == before  # nothing ran
    assert [r.metrics["score"] for r in tune.Tuner.restore(path, trainable=counting).get_results()] == [2, 7]
    with pytest.raises(Exception, match="without trainable"):
        tune.Tuner.restore(path).fit()
    failed = tune.Tuner(failing, run_config=tune.RunConfig(name="failed", storage_path=str(tmp_path))).fit()
    assert isinstance(failed[0].error, SpecificError)
    # from storage the type is rebuilt by name (its module is imported here), nothing unpickled
    assert isinstance(tune.Tuner.restore(str(tmp_path / "failed")).get_results()[0].error, SpecificError)


def test_tune_report_callback_forwards_each_train_report_with_its_checkpoint_path(tmp_path):
    """Ray's Train/Tune interop guide (ray.tune.integration.ray_train.TuneReportCallback), imports ported."""
    from minitrain.tune.integration.ray_train import TuneReportCallback

    with pytest.raises(RuntimeError, match="must be used in a Tune session"):
        TuneReportCallback()  # as Ray's, outside a trial
    train_storage = str(tmp_path / "train")
    results = tune.Tuner(train_driver_fn, param_space={
        "train_loop_config": {"lr": tune.grid_search([0.1, 0.2]), "epochs": 3}, "num_workers": 2,
        "storage_path": train_storage}, tune_config=tune.TuneConfig(metric="loss", mode="min", max_concurrent_trials=1),
        run_config=tune.RunConfig(name="interop", storage_path=str(tmp_path))).fit()
    assert results.num_errors == 0, [str(r.error) for r in results]
    best = results.get_best_result()
    assert best.config["train_loop_config"]["lr"] == 0.1
    history = best.metrics_dataframe
    assert list(history["epoch"]) == [0, 1, 2] and list(history["training_iteration"]) == [1, 2, 3]
    run_dir = os.path.join(train_storage, f"train-trial_id={best.trial_id}")
    assert list(history["checkpoint_path"]) == [os.path.join(run_dir, f"checkpoint_{i:06d}") for i in range(3)]
    # the path names the Train run's committed checkpoint; the trial holds it too
    assert minitrain.Checkpoint(best.metrics["checkpoint_path"]).to_dict() == {"epoch": 2}
    assert best.checkpoint.to_dict() == {"epoch": 2}
