"""TensorflowTrainer in process, without TensorFlow: its arguments and refusals, TensorflowConfig, and the
backend's TF_CONFIG (built from the addresses the ranks publish in the attempt's store, checked when read)."""

from __future__ import annotations

import json
import os
import sys

import pytest
import torch.distributed as dist

from minitrain import ConfigError, RunConfig, ScalingConfig
from minitrain.commands import Assignment
from minitrain.driver.trainer import DataParallelTrainer
from minitrain.records import WorkerAssignment
from minitrain.tensorflow import TensorflowConfig, TensorflowTrainer
from minitrain.torch import TorchConfig
from minitrain.worker.backend import StoreLink
from minitrain.worker.tensorflow_backend import (
    TF_CONFIG, TensorflowBackend, check_endpoint, endpoint, tf_config,
)


def noop(config):
    pass


def test_the_trainer_names_its_backend_without_importing_tensorflow():
    imported = "tensorflow" in sys.modules  # another test of this process may have imported it
    trainer = TensorflowTrainer(noop, tensorflow_config=TensorflowConfig(timeout_s=60),
                                scaling_config=ScalingConfig(num_workers=2))
    assert isinstance(trainer, DataParallelTrainer) and trainer.tensorflow_config.timeout_s == 60
    backend = trainer._backend()
    assert isinstance(backend, TensorflowBackend) and (backend.name, backend.timeout_s) == ("tensorflow", 60.0)
    assert TensorflowTrainer(noop).tensorflow_config == TensorflowConfig()
    assert ("tensorflow" in sys.modules) == imported


def test_bad_arguments_are_refused_naming_the_field():
    with pytest.raises(ConfigError, match=r"TensorflowTrainer\(tensorflow_config=...\) must be a minitrain.TensorflowConfig"):
        TensorflowTrainer(noop, tensorflow_config=TorchConfig())
    with pytest.raises(ConfigError, match=r"TensorflowConfig.timeout_s.*0"):
        TensorflowConfig(timeout_s=0)
    with pytest.raises(DeprecationWarning, match=r"TensorflowTrainer\(metadata=...\) was removed"):
        TensorflowTrainer(noop, metadata={"a": 1})
    with pytest.raises(DeprecationWarning, match=r"TensorflowTrainer\(resume_from_checkpoint=...\)"):
        TensorflowTrainer(noop, resume_from_checkpoint="/somewhere")
    with pytest.raises(ConfigError, match="train_loop_per_worker should take in 0 or 1 required arguments"):
        TensorflowTrainer(lambda a, b: None)
    assert TensorflowConfig(timeout_s=5).to_dict() == {"timeout_s": 5}


def test_tf_config_in_the_workers_environment_is_refused_since_each_attempt_sets_it():
    run_config = RunConfig(worker_runtime_env={"env_vars": {"TF_CONFIG": "{}", "TF_USE_LEGACY_KERAS": "1"}})
    with pytest.raises(ConfigError, match=r"TF_CONFIG.*Remove TF_CONFIG from env_vars"):
        TensorflowTrainer(noop, run_config=run_config)
    TensorflowTrainer(noop, run_config=RunConfig(worker_runtime_env={"env_vars": {"TF_USE_LEGACY_KERAS": "1"}}))


def test_tf_config_names_every_worker_in_rank_order_and_this_rank_as_its_task():
    workers = ["10.0.0.1:2222", "10.0.0.2:3333"]
    assert tf_config(workers, 1) == {"cluster": {"worker": workers}, "task": {"type": "worker", "index": 1}}
    for rank in (2, -1, True, "0"):
        with pytest.raises(ValueError, match="rank"):
            tf_config(workers, rank)
    with pytest.raises(ValueError, match="at least one"):
        tf_config([], 0)
    assert endpoint("10.0.0.1", 80) == "10.0.0.1:80" and endpoint("fe80::1", 80) == "[fe80::1]:80"


@pytest.mark.parametrize("entry", ["", "host", "host:", ":80", "host:0", "host:65536", "host:8o", "a b:80",
                                   "h,x:80", "x" * 300 + ":80"])
def test_a_published_address_that_is_not_host_port_is_refused_naming_the_rank(entry):
    with pytest.raises(RuntimeError, match=r"rank 3 published .* expected 'host:port'"):
        check_endpoint(entry, 3)


def _link(rank: int, world_size: int, store) -> StoreLink:
    worker = WorkerAssignment(rank, rank, world_size, world_size, 0, "n0")
    assignment = Assignment(worker=worker, experiment_name="e", backend="tensorflow", dist_timeout_s=5.0,
                            payload=b"", store_address="127.0.0.1", storage_path="/tmp/run")
    return StoreLink(assignment, store, "127.0.0.1", 29500)


def test_setup_publishes_a_free_port_reads_every_rank_and_teardown_clears_tf_config(monkeypatch):
    monkeypatch.delenv(TF_CONFIG, raising=False)
    store = dist.HashStore()  # the attempt's store, in process: rank 1 has published already
    store.set("minitrain/tensorflow/worker/1", "127.0.0.1:4242")
    backend = TensorflowBackend()
    backend.setup(_link(0, 2, store))

    config = json.loads(os.environ[TF_CONFIG])
    mine = store.get("minitrain/tensorflow/worker/0").decode()
    assert config == {"cluster": {"worker": [mine, "127.0.0.1:4242"]}, "task": {"type": "worker", "index": 0}}
    host, port = mine.rsplit(":", 1)
    assert host == "127.0.0.1" and 0 < int(port) < 65536
    backend.teardown()
    assert TF_CONFIG not in os.environ


def test_setup_refuses_what_a_peer_published_when_it_is_not_an_address(monkeypatch):
    monkeypatch.delenv(TF_CONFIG, raising=False)
    store = dist.HashStore()
    store.set("minitrain/tensorflow/worker/1", '127.0.0.1:1", "evil:2')
    with pytest.raises(RuntimeError, match="rank 1 published"):
        TensorflowBackend().setup(_link(0, 2, store))
    assert TF_CONFIG not in os.environ
