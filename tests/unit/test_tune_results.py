"""ResultGrid, the tuning run's state file, the trial table, and the configs' validation (in process)."""

from __future__ import annotations

import io
import json

import pytest

import minitrain
from minitrain.driver.console import LiveConsole
from minitrain.errors import ConfigError, RemoteWorkerError
from minitrain.storage import sweep_state as tr
from minitrain.tune.progress import ProgressReporter, render_table
from minitrain.tune.result_grid import ResultGrid, trial_result
from minitrain.tune.schedulers import ASHAScheduler
from minitrain.tune.tune_config import TuneConfig, with_resources
from minitrain.tune.tuner import Tuner, trial_resources


def make_trial(tmp_path, index, losses, status=tr.TrialStatus.TERMINATED, error=None):
    trial = tr.new_trial(f"abcde_{index:05d}", f"f_abcde_{index:05d}", f"f_abcde_{index:05d}", {"x": index}, index)
    (tmp_path / tr.TUNE_DIR).mkdir(exist_ok=True)
    for i, loss in enumerate(losses, start=1):
        result = {"loss": loss, "training_iteration": i}
        tr.append_history(str(tmp_path), trial, result)
        trial.last_result, trial.iteration = result, i
    trial.status, trial.error = status, error
    return trial


def grid(tmp_path):
    trials = [make_trial(tmp_path, 0, [5.0, 1.0, 4.0]), make_trial(tmp_path, 1, [3.0, 2.0, 2.0]),
              make_trial(tmp_path, 2, [float("nan")]),
              make_trial(tmp_path, 3, [9.0], status=tr.TrialStatus.ERROR,
                         error=tr.TrialError("ValueError", "boom", "tb"))]
    return ResultGrid([trial_result(str(tmp_path), t) for t in trials], str(tmp_path), "loss", "min")


def test_best_result_by_scope(tmp_path):
    results = grid(tmp_path)
    assert results.get_best_result().trial_id == "abcde_00001"  # last: 4.0 vs 2.0 (NaN skipped)
    assert results.get_best_result(scope="all").trial_id == "abcde_00000"  # best ever: 1.0
    assert results.get_best_result(scope="avg").trial_id == "abcde_00001"  # 3.33 vs 2.33
    assert results.get_best_result(metric="loss", mode="max", scope="last").trial_id == "abcde_00003"
    with pytest.raises(RuntimeError, match="No best trial found"):
        results.get_best_result(metric="accuracy")
    with pytest.raises(ValueError, match="scope"):
        results.get_best_result(scope="first")
    with pytest.raises(ValueError, match="No metric"):
        ResultGrid([], str(tmp_path)).get_best_result()


def test_errors_counts_indexing_and_dataframe(tmp_path):
    results = grid(tmp_path)
    assert len(results) == 4 and results.num_errors == 1 and results.num_terminated == 3
    assert isinstance(results.errors[0], RemoteWorkerError) and "boom" in str(results.errors[0])
    assert [r.config["x"] for r in results] == [0, 1, 2, 3] and results[1].config == {"x": 1}
    assert isinstance(results[0], minitrain.Result) and len(results[0].metrics_dataframe) == 3
    frame = results.get_dataframe()
    assert list(frame["config/x"]) == [0, 1, 2, 3] and frame["loss"].iloc[0] == 4.0
    best_rows = results.get_dataframe(filter_metric="loss", filter_mode="min")
    assert best_rows["loss"].iloc[0] == 1.0


def test_state_file_round_trip_and_history_cut(tmp_path):
    trial = make_trial(tmp_path, 0, [3.0, 2.0, 1.0], status=tr.TrialStatus.RUNNING)
    trial.checkpoint, trial.checkpoint_iteration = str(tmp_path / "c"), 2
    odd = tr.new_trial("abcde_00001", "n", "n", {"obj": object()}, 1)
    tr.write_state(str(tmp_path), {"total_trials": 2}, [trial, odd])
    header, (back, back_odd) = tr.read_state(str(tmp_path))
    assert header["total_trials"] == 2 and back == trial
    assert not back_odd.config_is_json and "object" in back_odd.config
    tr.cut_history(str(tmp_path), trial, 2)
    assert [r["loss"] for r in tr.read_history(str(tmp_path), trial)] == [3.0, 2.0]
    with open(tr.history_path(str(tmp_path), trial), "a") as f:
        f.write('{"loss": 0.')  # a torn last line is ignored
    assert len(tr.read_history(str(tmp_path), trial)) == 2
    (tmp_path / tr.STATE_FILE).write_text(json.dumps({"version": 99}))
    with pytest.raises(ValueError, match="version"):
        tr.read_state(str(tmp_path))


def test_table_and_plain_lines(tmp_path):
    trials = [make_trial(tmp_path, 0, [0.5]), make_trial(tmp_path, 1, [0.25], status=tr.TrialStatus.RUNNING)]
    trials[0].stop_reason = "stopped early by ASHAScheduler at training_iteration=1"
    table = render_table(trials, "loss")
    assert "1 RUNNING, 1 TERMINATED" in table and "TERMINATED (stopped early)" in table and "0.25" in table
    out = io.StringIO()
    reporter = ProgressReporter("loss", console=LiveConsole("lines", stdout=out, stderr=out))
    reporter.trial_changed(trials[0])
    reporter.update(trials)  # off a TTY: no table until the end
    assert out.getvalue().startswith("Trial f_abcde_00000 TERMINATED after 1 iterations, loss=0.5 (stopped early")
    reporter.finish(trials)
    assert "Trial status" in out.getvalue()


@pytest.mark.parametrize("kwargs, field", [({"mode": "best"}, "mode"), ({"num_samples": 0}, "num_samples"),
                                           ({"num_samples": -1}, "time_budget_s"),
                                           ({"max_concurrent_trials": -1}, "max_concurrent_trials"),
                                           ({"reuse_actors": True}, "reuse_actors"),
                                           ({"scheduler": "asha"}, "scheduler"),
                                           ({"search_alg": object()}, "search_alg")])
def test_tune_config_refuses_bad_values(kwargs, field):
    with pytest.raises(ConfigError, match=field):
        TuneConfig(**kwargs)


def test_resources_of_a_trial():
    trainer = minitrain.torch.TorchTrainer(lambda: None, scaling_config=minitrain.ScalingConfig(num_workers=3))
    assert trial_resources(trainer) == {"CPU": 3.0, "GPU": 0.0}
    assert trial_resources(with_resources(lambda config: None, {"cpu": 2, "GPU": 1})) == {"CPU": 2.0, "GPU": 1.0}
    assert trial_resources(lambda config: None) == {"CPU": 1.0, "GPU": 0.0}
    with pytest.raises(ConfigError, match="memory"):
        with_resources(lambda config: None, {"memory": 1})


def test_tuner_refuses_bad_trainables_and_spaces(tmp_path):
    trainer = minitrain.torch.TorchTrainer(lambda: None)
    with pytest.raises(ConfigError, match="only 'train_loop_config'"):
        Tuner(trainer, param_space={"scaling_config": 1})
    with pytest.raises(ConfigError, match="exactly one argument"):
        Tuner(lambda a, b: None)
    with pytest.raises(ConfigError, match="class trainables"):
        Tuner(type("Trainable", (), {}))
    with pytest.raises(ConfigError, match="storage_path"):
        Tuner(lambda config: None, run_config=minitrain.RunConfig(storage_path="s3://bucket/x"))
    with pytest.raises(ConfigError, match="Tuner.restore"):
        Tuner.restore(str(tmp_path), lambda config: None)
    assert not Tuner.can_restore(str(tmp_path))


def test_scheduler_without_a_metric_is_refused_before_any_trial(tmp_path):
    tuner = Tuner(lambda config: None, tune_config=TuneConfig(scheduler=ASHAScheduler()),
                  run_config=minitrain.RunConfig(name="x", storage_path=str(tmp_path)))
    with pytest.raises(ConfigError, match="needs a metric and a mode"):
        tuner.fit()


def test_tune_is_exported_from_the_package_as_in_ray():
    import minitrain.tune as tune_module

    assert minitrain.tune is tune_module and minitrain.tune.Tuner is Tuner
    assert tune_module.Result is tune_module.TrialResult and "Tuner" in dir(tune_module)
