"""TorchTrainer refuses bad input with a clear ConfigError before any process starts."""

from __future__ import annotations

import threading

import psutil
import pytest

import minitrain
from minitrain import RunConfig, ScalingConfig
from minitrain.errors import ConfigError
from minitrain.torch import TorchTrainer


def _no_args():
    pass


def _two_args(a, b):
    pass


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


@pytest.fixture
def run_config(tmp_path):
    return RunConfig(name="validation", storage_path=str(tmp_path))


def test_negative_workers_names_the_field():
    with pytest.raises(ConfigError, match=r"num_workers.*-1"):
        ScalingConfig(num_workers=-1)


def test_two_required_arguments_are_refused(run_config):
    with pytest.raises(ConfigError, match="0 or 1 required arguments.*'_two_args' takes 2"):
        TorchTrainer(_two_args, run_config=run_config)


def test_non_callable_is_refused(run_config):
    with pytest.raises(ConfigError, match="train_loop_per_worker.*callable"):
        TorchTrainer("train.py", run_config=run_config)


def test_ray_config_objects_are_refused_by_type(run_config):
    class RayScalingConfig:  # what a half-ported script would pass
        pass

    with pytest.raises(ConfigError, match="scaling_config.*minitrain.ScalingConfig"):
        TorchTrainer(_no_args, scaling_config=RayScalingConfig(), run_config=run_config)


def test_use_gpu_without_gpus_fails_before_starting_anything(run_config, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    before = _children()
    trainer = TorchTrainer(_no_args, scaling_config=ScalingConfig(num_workers=2, use_gpu=True),
                           run_config=run_config)
    with pytest.raises(ConfigError, match=r"use_gpu=True.*needs 2 GPU\(s\).*has 0.*use_gpu=False"):
        trainer.fit()
    assert _children() == before
    elastic = TorchTrainer(_no_args, scaling_config=ScalingConfig(num_workers=(1, 4), use_gpu=True),
                           run_config=run_config)
    with pytest.raises(ConfigError, match=r"num_workers=\(1, 4\)\) needs 1 GPU\(s\)"):  # only min must fit
        elastic.fit()
    assert _children() == before


def test_unpicklable_config_names_train_loop_config(run_config):
    before = _children()
    trainer = TorchTrainer(_no_args, train_loop_config={"lock": threading.Lock()},
                           scaling_config=ScalingConfig(num_workers=2), run_config=run_config)
    with pytest.raises(ConfigError, match="train_loop_config cannot be pickled"):
        trainer.fit()
    assert _children() == before


def test_removed_ray_arguments_raise_deprecation(run_config):
    with pytest.raises(DeprecationWarning, match="resume_from_checkpoint"):
        TorchTrainer(_no_args, run_config=run_config, resume_from_checkpoint="/x")
    with pytest.raises(DeprecationWarning, match="metadata"):
        TorchTrainer(_no_args, run_config=run_config, metadata={"a": 1})


def test_rays_alpha_validation_config_is_refused_with_what_to_do_instead(run_config):
    TorchTrainer(_no_args, run_config=run_config, validation_config=None)  # Ray's default is accepted
    with pytest.raises(ConfigError, match=r"validation_config=.*not supported.*report the validation metrics"):
        TorchTrainer(_no_args, run_config=run_config, validation_config=object())


def test_per_worker_functions_refuse_to_run_outside_training():
    for call in (lambda: minitrain.report({"a": 1}), minitrain.get_context, minitrain.get_checkpoint):
        with pytest.raises(RuntimeError, match="outside of a minitrain training function"):
            call()


def test_training_failed_error_is_not_a_runtime_error():
    assert not issubclass(minitrain.TrainingFailedError, RuntimeError)
    assert issubclass(minitrain.WorkerGroupError, minitrain.TrainingFailedError)


def test_corrupted_index_is_an_error_before_anything_starts(tmp_path):
    from minitrain.storage.checkpoint_manager import INDEX_NAME, CheckpointIndexError

    run_dir = tmp_path / "validation"
    run_dir.mkdir()
    (run_dir / INDEX_NAME).write_text("{not json")
    before = _children()
    trainer = TorchTrainer(_no_args, scaling_config=ScalingConfig(num_workers=2),
                           run_config=RunConfig(name="validation", storage_path=str(tmp_path)))
    with pytest.raises(CheckpointIndexError, match=INDEX_NAME):
        trainer.fit()
    assert _children() == before
    assert (run_dir / INDEX_NAME).read_text() == "{not json"  # never silently replaced


def test_memory_storage_is_refused_when_the_cluster_has_other_hosts(monkeypatch):
    monkeypatch.setenv("MINITRAIN_HOSTS", "localhost:2,gpu-far-away:8")
    before = _children()
    trainer = TorchTrainer(_no_args, scaling_config=ScalingConfig(num_workers=2),
                           run_config=RunConfig(name="m", storage_path="memory://runs"))
    with pytest.raises(ConfigError, match=r"storage_path='memory://runs'.*this node only.*gpu-far-away.*s3://"):
        trainer.fit()
    assert _children() == before  # refused before anything started (no SSH pre-flight either)
