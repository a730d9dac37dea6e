"""Sweep limits and names as Ray's: `TuneConfig(time_budget_s=datetime.timedelta)` with
`num_samples=-1`, `tune.with_resources` given a function of the config (refused, with the reason),
default experiment names that stay unique when two Tuners start in the same second (a name the user
gave is never changed), and a `Tuner(TorchTrainer)` trial merging a tuned nested train_loop_config
into the trainer's own as Ray's `deep_update` does."""

from __future__ import annotations

import datetime
import re
import types

import pytest

import minitrain
from minitrain import tune
from minitrain.errors import ConfigError
from minitrain.torch import TorchTrainer
from minitrain.tune import tuner as tuner_module


def train(config):
    tune.report({"score": 1})


# ------------------------------------------------------------------ time_budget_s and num_samples=-1


@pytest.mark.parametrize("budget", [datetime.timedelta(minutes=1, seconds=30), 90, 90.0])
def test_time_budget_takes_seconds_or_a_timedelta(budget):
    config = tune.TuneConfig(num_samples=-1, time_budget_s=budget)
    assert config.num_samples == -1 and config.time_budget_s == 90.0


@pytest.mark.parametrize("budget", [datetime.timedelta(0), datetime.timedelta(seconds=-1), 0, "60"])
def test_a_budget_that_is_not_positive_is_refused_naming_the_field(budget):
    with pytest.raises(ConfigError, match="time_budget_s"):
        tune.TuneConfig(time_budget_s=budget)


def test_num_samples_minus_one_without_a_budget_says_what_bounds_it():
    with pytest.raises(ConfigError, match=r"num_samples=-1.*time_budget_s"):
        tune.TuneConfig(num_samples=-1)


def test_the_budget_reaches_the_sweep_limits(tmp_path):
    tuner = tune.Tuner(train, tune_config=tune.TuneConfig(num_samples=-1, time_budget_s=datetime.timedelta(seconds=5)),
                       run_config=tune.RunConfig(name="n", storage_path=str(tmp_path)))
    header = {"name": "n", "trainable": "train", "id_prefix": "abcde", "total_trials": 10**9}
    assert tuner._spec(header, None).limits.time_budget_s == 5.0


# ------------------------------------------------------------------ with_resources


def test_with_resources_as_a_function_of_the_config_is_refused_with_its_reason():
    with pytest.raises(ConfigError, match=r"resources=.*reserves a trial's hosts before it draws the trial's config"):
        tune.with_resources(train, resources=lambda config: {"gpu": 1 if config["big"] else 0})


def test_with_resources_fixed_amounts_still_work():
    assert tune.with_resources(train, {"cpu": 2}).resources == {"CPU": 2.0, "GPU": 0.0}


# ------------------------------------------------------------------ default experiment names


@pytest.fixture
def frozen_clock(monkeypatch):
    """Every default name made in the same second (the clock is what cannot be made to repeat)."""
    moment = datetime.datetime(2026, 1, 2, 3, 4, 5)
    fake = types.SimpleNamespace(datetime=types.SimpleNamespace(now=lambda: moment))
    monkeypatch.setattr(minitrain.tune.run_config, "datetime", fake)
    return "train_2026-01-02_03-04-05"


def test_two_tuners_in_the_same_second_get_names_of_their_own(tmp_path, frozen_clock):
    config = tune.RunConfig(storage_path=str(tmp_path))
    first, second = tune.Tuner(train, run_config=config), tune.Tuner(train, run_config=config)
    assert first.run_config.name == frozen_clock  # Ray's format
    assert second.run_config.name == f"{frozen_clock}_2"
    assert first.experiment_path != second.experiment_path


def test_a_default_name_another_process_took_is_passed_over(tmp_path, frozen_clock):
    (tmp_path / frozen_clock).mkdir()  # a sweep of another process, before this Tuner chose
    tuner = tune.Tuner(train, run_config=tune.RunConfig(storage_path=str(tmp_path)))
    assert re.fullmatch(rf"{frozen_clock}_\d+", tuner.run_config.name)
    (tmp_path / tuner.run_config.name).mkdir()  # ... and one that took its name after it chose
    taken = tuner.run_config.name
    tuner._claim_default_name()
    assert tuner.run_config.name not in (frozen_clock, taken) and tuner.run_config.name.startswith(frozen_clock)
    assert (tmp_path / tuner.run_config.name).is_dir()
    assert tuner.experiment_path == str(tmp_path / tuner.run_config.name)


def test_a_name_the_user_gave_is_kept(tmp_path):
    (tmp_path / "mine").mkdir()
    tuner = tune.Tuner(train, run_config=tune.RunConfig(name="mine", storage_path=str(tmp_path)))
    assert tuner.run_config.name == "mine" and not tuner._default_name


# ------------------------------------------------------------------ Tuner(TorchTrainer): the nested merge


def test_a_tuned_nested_train_loop_config_keeps_the_trainers_other_keys(tmp_path):
    """Ray's trainers deep-merge the sampled config into their own: a shallow merge dropped `wd` beside
    the tuned `lr`, and the trial failed (KeyError) before reporting any metric."""
    trainer = TorchTrainer(lambda config: None, train_loop_config={"opt": {"lr": 0.1, "wd": 0.01}, "epochs": 2},
                           scaling_config=minitrain.ScalingConfig(num_workers=1),
                           run_config=minitrain.RunConfig(name="n", storage_path=str(tmp_path)))
    assert tuner_module._deep_merge(trainer.train_loop_config, {"opt": {"lr": 0.5}, "new": 1}) == \
        {"opt": {"lr": 0.5, "wd": 0.01}, "epochs": 2, "new": 1}
    tuner = tune.Tuner(trainer, param_space={"train_loop_config": {"opt": {"lr": tune.grid_search([0.5])}}})
    header = {"name": "n", "trainable": "TorchTrainer", "id_prefix": "abcde", "total_trials": 1}
    trial_trainable = tuner._spec(header, None).trainable
    assert isinstance(trial_trainable, tuner_module._TrainerTrial) and trial_trainable.trainer is trainer
    assert trainer.train_loop_config == {"opt": {"lr": 0.1, "wd": 0.01}, "epochs": 2}  # the trainer is untouched
