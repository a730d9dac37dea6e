"""Tune's own RunConfig (`minitrain.tune.RunConfig`, Ray's `ray.tune.RunConfig`): it accepts Tune's
arguments (working, or a ConfigError that says "not supported"), never a Train v2 deprecation."""

from __future__ import annotations

import os

import pytest

import minitrain
from minitrain import tune
from minitrain.errors import ConfigError
from minitrain.tune.run_config import CheckpointConfig, FailureConfig, RunConfig, SyncConfig
from minitrain.tune.stopper import DictStopper, MaximumIterationStopper


def train(config):
    pass


def test_tune_exports_its_own_configs_distinct_from_train_v2s():
    assert tune.RunConfig is RunConfig and tune.RunConfig is not minitrain.RunConfig
    assert tune.FailureConfig is FailureConfig and tune.CheckpointConfig is CheckpointConfig
    assert tune.SyncConfig is SyncConfig


def test_tune_arguments_that_train_v2_removed_are_accepted(tmp_path):
    config = RunConfig(name="exp", storage_path=str(tmp_path), verbose=2, stop={"training_iteration": 5},
                       sync_config=SyncConfig(sync_period=10), log_to_file=True,
                       failure_config=FailureConfig(fail_fast=True),
                       checkpoint_config=CheckpointConfig(num_to_keep=2, checkpoint_score_attribute="acc"))
    assert isinstance(config.stopper(), DictStopper) and config.show_table
    assert not RunConfig(verbose=0).show_table
    assert RunConfig(stop=MaximumIterationStopper(3)).stopper().__class__ is MaximumIterationStopper
    assert RunConfig(storage_path="~/x").storage_path == os.path.expanduser("~/x")


def test_what_cannot_work_says_not_supported():
    with pytest.raises(ConfigError, match=r"callbacks=\.\.\.\): entry 0 .* is not a minitrain.tune.Callback"):
        RunConfig(callbacks=[object()])  # Ray's rule: every entry a tune.Callback
    with pytest.raises(ConfigError, match="progress_reporter.*not supported"):
        RunConfig(progress_reporter=object())
    with pytest.raises(ConfigError, match="storage_path.*not supported"):
        RunConfig(storage_path="s3://bucket/x")
    with pytest.raises(ConfigError, match="class trainables"):
        CheckpointConfig(checkpoint_frequency=2)
    with pytest.raises(ConfigError, match="class trainables"):
        CheckpointConfig(checkpoint_at_end=True)
    with pytest.raises(ConfigError, match="must be None, a dict"):
        RunConfig(stop=3)
    with pytest.raises(ConfigError, match="verbose"):
        RunConfig(verbose=7)


def test_failure_config_is_rays():
    assert FailureConfig(fail_fast="raise").fail_fast == "raise"
    with pytest.raises(ValueError, match="max_failures must be 0 if fail_fast=True"):
        FailureConfig(max_failures=2, fail_fast=True)
    with pytest.raises(ConfigError, match="fail_fast"):
        FailureConfig(fail_fast="yes")
    with pytest.raises(ConfigError, match="max_failures"):
        FailureConfig(max_failures=-2)
    with pytest.raises(ConfigError, match="num_to_keep"):
        CheckpointConfig(num_to_keep=0)


def test_the_tuner_reads_tune_and_train_run_configs(tmp_path):
    tuner = tune.Tuner(train, run_config=minitrain.RunConfig(
        name="t", storage_path=str(tmp_path), failure_config=minitrain.FailureConfig(max_failures=2),
        checkpoint_config=minitrain.CheckpointConfig(num_to_keep=1)))
    assert tuner.run_config.failure_config.max_failures == 2 and tuner.run_config.checkpoint_config.num_to_keep == 1
    assert tuner.experiment_path == str(tmp_path / "t")
    unnamed = tune.Tuner(train, run_config=RunConfig(storage_path=str(tmp_path)))
    assert os.path.basename(unnamed.experiment_path).startswith("train_")  # Ray's <trainable>_<date>
    with pytest.raises(ConfigError, match="Train callbacks"):
        tune.Tuner(train, run_config=minitrain.RunConfig(callbacks=[minitrain.UserCallback()]))


def test_a_trainers_retention_stays_the_trainers(tmp_path):
    trainer = minitrain.torch.TorchTrainer(train, run_config=minitrain.RunConfig(
        name="t", storage_path=str(tmp_path), checkpoint_config=minitrain.CheckpointConfig(num_to_keep=1)))
    assert tune.Tuner(trainer).run_config.checkpoint_config == CheckpointConfig()
    with pytest.raises(ConfigError, match="TorchTrainer's RunConfig"):
        tune.Tuner(trainer, run_config=RunConfig(checkpoint_config=CheckpointConfig(num_to_keep=1)))
