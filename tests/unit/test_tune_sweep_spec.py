"""What Tuner.fit() hands the sweep loop (minitrain.tune.sweep_loop.SweepSpec): built once from the
Tuner's configs and the state file's header, read-only afterwards."""

from __future__ import annotations

import dataclasses

import pytest

from minitrain.config import FailureConfig, RunConfig
from minitrain.storage import sweep_state as tr
from minitrain.tune.resources import trial_demand
from minitrain.tune.sweep_loop import SweepLimits, SweepSpec
from minitrain.tune.tune_config import TuneConfig
from minitrain.tune.tuner import Tuner


def train(config):
    pass


def test_the_tuner_builds_the_spec_from_its_configs_and_the_header(tmp_path):
    tuner = Tuner(train, param_space={"x": 1},
                  tune_config=TuneConfig(max_concurrent_trials=3, time_budget_s=60.0),
                  run_config=RunConfig(name="exp", storage_path=str(tmp_path),
                                       failure_config=FailureConfig(max_failures=2)))
    header = {"name": "exp", "trainable": "train", "id_prefix": "abcde", "total_trials": 4}
    spec = tuner._spec(header, trial_demand(train))
    assert spec.experiment_path == str(tmp_path / "exp") and spec.experiment_name == "exp"
    assert spec.limits == SweepLimits(max_concurrent=3, max_failures=2, time_budget_s=60.0)
    assert spec.total_trials == 4 and spec.id_prefix == "abcde" and spec.trainable is train
    assert spec.trial_resources == {"CPU": 1.0, "GPU": 0.0}
    trial = tr.new_trial("abcde_00000", "", "", {"x": 1}, 0)
    spec.name_trial(trial)
    assert trial.name == "train_abcde_00000" and trial.dirname.startswith("train_abcde_00000")
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.limits = SweepLimits()  # type: ignore[misc]


def test_default_limits_are_the_tune_configs_defaults():
    assert SweepLimits() == SweepLimits(max_concurrent=0, max_failures=0, time_budget_s=None)
    assert {f.name for f in dataclasses.fields(SweepSpec)} >= {"experiment_path", "header", "limits"}
