"""JaxTrainer and JaxConfig in process: Ray's signature, the config checks (TPUs refused), the JaxConfig a
trainer derives from its ScalingConfig, and the worker backend's pure parts (no jax needed)."""

from __future__ import annotations

import inspect
import socket

import cloudpickle
import pytest

import minitrain.jax
from minitrain import ConfigError, ScalingConfig
from minitrain.config._validate import UnknownFieldError
from minitrain.jax import JaxConfig, JaxTrainer
from minitrain.torch import TorchConfig
from minitrain.worker.jax_backend import host_port, jax_settings, reserve_port


def noop(config):
    pass


def test_the_constructor_takes_ray_v2s_arguments():
    parameters = inspect.signature(JaxTrainer.__init__).parameters
    assert list(parameters) == ["self", "train_loop_per_worker", "train_loop_config", "jax_config", "scaling_config",
                                "dataset_config", "run_config", "datasets", "validation_config"]
    assert all(p.kind is p.KEYWORD_ONLY for name, p in parameters.items() if name not in ("self", "train_loop_per_worker"))
    assert sorted(minitrain.jax.__all__) == ["JaxConfig", "JaxTrainer"] and "JaxTrainer" in dir(minitrain.jax)


def test_tpus_are_refused_with_the_field_named():
    with pytest.raises(ConfigError, match=r"JaxConfig.use_tpu must be False, got True\. minitrain runs on CPU and "
                                          r"GPU hosts and has no TPU support"):
        JaxConfig(use_tpu=True)
    with pytest.raises(ConfigError, match=r"ScalingConfig.use_tpu must be False"):
        ScalingConfig(num_workers=4, use_tpu=True)
    with pytest.raises(ConfigError, match=r"ScalingConfig.topology.*TPU"):
        ScalingConfig(num_workers=4, topology="4x4")


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"use_gpu": "yes"}, r"JaxConfig.use_gpu must be True or False, got 'yes'"),
    ({"use_tpu": 0}, r"JaxConfig.use_tpu must be True or False"),
    ({"timeout_s": 0}, r"JaxConfig.timeout_s must be a finite number > 0, got 0"),
    ({"timeout_s": float("inf")}, r"JaxConfig.timeout_s"),
])
def test_bad_config_values_raise_naming_the_field(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        JaxConfig(**kwargs)


def test_an_unknown_field_suggests_the_close_one():
    with pytest.raises(UnknownFieldError, match=r"JaxConfig has no field 'use_gpus'; did you mean 'use_gpu'\?"):
        JaxConfig(use_gpus=True)


def test_the_jax_config_follows_the_scaling_config_unless_given():
    assert JaxTrainer(noop).jax_config == JaxConfig()
    gpus = ScalingConfig(num_workers=2, use_gpu=True)
    assert JaxTrainer(noop, scaling_config=gpus).jax_config == JaxConfig(use_gpu=True)
    assert JaxTrainer(noop, jax_config=JaxConfig(use_gpu=True, timeout_s=60), scaling_config=gpus).jax_config.timeout_s == 60
    with pytest.raises(ConfigError, match=r"JaxConfig\(use_gpu=True\)\) disagrees with ScalingConfig\(use_gpu=False\)"):
        JaxTrainer(noop, jax_config=JaxConfig(use_gpu=True))
    with pytest.raises(ConfigError, match=r"JaxConfig\(use_gpu=False\)\) disagrees with ScalingConfig\(use_gpu=True\)"):
        JaxTrainer(noop, jax_config=JaxConfig(), scaling_config=gpus)
    with pytest.raises(ConfigError, match=r"JaxTrainer\(jax_config=...\) must be a minitrain.JaxConfig"):
        JaxTrainer(noop, jax_config=TorchConfig())
    with pytest.raises(ConfigError, match=r"JaxTrainer\(validation_config="):
        JaxTrainer(noop, validation_config=object())


def test_the_backend_is_jax_with_the_configs_timeout_and_travels_pickled():
    backend = JaxTrainer(noop, jax_config=JaxConfig(timeout_s=42))._backend()
    assert (backend.name, backend.timeout_s) == ("jax", 42.0)
    assert cloudpickle.loads(cloudpickle.dumps(backend)) == backend


def test_jax_settings_leave_what_the_environment_names():
    everything = {"jax_enable_preemption_service": False, "jax_cpu_collectives_implementation": "gloo",
                  "jax_platforms": "cpu"}
    assert jax_settings({}, has_gpus=False) == everything
    assert "jax_platforms" not in jax_settings({}, has_gpus=True)  # JAX picks the GPUs placed for the worker
    assert jax_settings({"JAX_PLATFORMS": "cuda", "JAX_CPU_COLLECTIVES_IMPLEMENTATION": "mpi"}, has_gpus=False) == {
        "jax_enable_preemption_service": False}


def test_host_port_brackets_ipv6():
    assert host_port("10.0.0.5", 1234) == "10.0.0.5:1234"
    assert host_port("::1", 1234) == "[::1]:1234"


def test_a_reserved_port_is_shared_only_with_reuseport_sockets():
    """The coordination service's gRPC server binds with SO_REUSEPORT; an ordinary bind is refused."""
    with reserve_port("127.0.0.1") as reserved:
        port = reserved.getsockname()[1]
        with socket.socket() as other, pytest.raises(OSError):
            other.bind(("127.0.0.1", port))
        with socket.socket() as server:
            server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            server.bind(("127.0.0.1", port))
            server.listen()
