"""Unit tests for minitrain.config: Ray-compatible defaults, validation messages, derived values."""

from __future__ import annotations

import copy
import dataclasses
import os
import pathlib
import pickle
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from minitrain import config as config_module
from minitrain.config import (
    CheckpointConfig,
    DataConfig,
    FailureConfig,
    LoggingConfig,
    MonitoringConfig,
    ReadOnlyDict,
    RunConfig,
    ScalingConfig,
    TorchConfig,
)
from minitrain.errors import ConfigError

ALL_CONFIGS = [ScalingConfig, CheckpointConfig, FailureConfig, LoggingConfig, MonitoringConfig, RunConfig, TorchConfig,
               DataConfig]


# --- defaults ------------------------------------------------------------------------------------


def test_scaling_defaults_match_ray():
    s = ScalingConfig()
    assert (s.num_workers, s.use_gpu, s.resources_per_worker, s.placement_strategy) == (1, False, None, "PACK")
    assert (s.accelerator_type, s.label_selector, s.use_tpu, s.topology) == (None, None, False, None)
    assert s.total_resources == {"CPU": 1.0}
    assert not s.local_mode


def test_checkpoint_failure_logging_torch_data_defaults_match_ray():
    c = CheckpointConfig()
    assert (c.num_to_keep, c.checkpoint_score_attribute, c.checkpoint_score_order) == (None, None, "max")
    f = FailureConfig()
    assert (f.max_failures, f.controller_failure_limit, f.max_preemption_failures) == (0, -1, -1)
    assert (f.worker_hang_timeout_s, f.worker_stop_grace_s) == ("auto", 5.0)  # minitrain extensions
    assert LoggingConfig().log_level == "INFO"
    assert LoggingConfig().level == 20
    t = TorchConfig()
    assert (t.backend, t.init_method, t.timeout_s) == (None, "env", 1800)
    assert t.to_dict() == {"backend": None, "init_method": "env", "timeout_s": 1800}
    d = DataConfig()
    assert (d.datasets_to_split, d.execution_options, d.enable_shard_locality) == ("all", None, True)


def test_run_config_defaults():
    r = RunConfig()
    assert re.fullmatch(r"minitrain_run-\d{4}-\d\d-\d\d_\d\d-\d\d-\d\d", r.name)
    assert r.storage_path == os.path.expanduser("~/minitrain_results")
    assert r.storage_filesystem is None
    assert r.failure_config == FailureConfig()
    assert r.checkpoint_config == CheckpointConfig()
    assert r.logging_config == LoggingConfig()
    assert r.callbacks == ()
    assert r.worker_runtime_env == {} and isinstance(r.worker_runtime_env, ReadOnlyDict)
    assert r.run_path == r.storage_path + "/" + r.name


def test_all_configs_are_keyword_only():
    for cls in ALL_CONFIGS:
        with pytest.raises(TypeError):
            cls(1)


# --- frozen, read-only, picklable ----------------------------------------------------------------


@pytest.mark.parametrize("cfg, attr", [
    (ScalingConfig(), "num_workers"), (CheckpointConfig(), "num_to_keep"), (FailureConfig(), "max_failures"),
    (LoggingConfig(), "log_level"), (RunConfig(name="r"), "name"), (TorchConfig(), "backend"),
    (DataConfig(), "datasets_to_split"),
])
def test_configs_are_frozen(cfg, attr):
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(cfg, attr, None)


def test_stored_mappings_are_read_only():
    s = ScalingConfig(resources_per_worker={"CPU": 2})
    r = RunConfig(name="r", worker_runtime_env={"env_vars": {"A": "1"}})
    for mapping in (s.resources_per_worker, r.worker_runtime_env, r.worker_runtime_env["env_vars"]):
        with pytest.raises(TypeError, match="frozen"):
            mapping["X"] = 1
        for mutate in (mapping.clear, mapping.popitem, lambda: mapping.update(X=1), lambda: mapping.pop("A")):
            with pytest.raises(TypeError):
                mutate()
    copied = dict(s.resources_per_worker)
    copied["GPU"] = 1  # copies are ordinary dicts
    assert s.resources_per_worker == {"CPU": 2}


def test_caller_dict_is_copied():
    env = {"env_vars": {"A": "1"}}
    resources = {"CPU": 2}
    s = ScalingConfig(resources_per_worker=resources)
    r = RunConfig(name="r", worker_runtime_env=env)
    resources["CPU"] = 99
    env["env_vars"]["A"] = "changed"
    assert s.resources_per_worker == {"CPU": 2}
    assert r.worker_runtime_env["env_vars"] == {"A": "1"}


@pytest.mark.parametrize("cfg", [
    ScalingConfig(num_workers=2, use_gpu=True, resources_per_worker={"CPU": 2, "memory": 0}),
    CheckpointConfig(num_to_keep=2, checkpoint_score_attribute="loss", checkpoint_score_order="min"),
    FailureConfig(max_failures=-1, worker_hang_timeout_s=30, max_preemption_failures=2),
    LoggingConfig(log_level="debug"),
    RunConfig(name="r", storage_path="s3://bucket/runs", worker_runtime_env={"env_vars": {"A": "1"}},
              callbacks=[]),
    TorchConfig(backend="gloo", timeout_s=10),
    DataConfig(datasets_to_split=["train"], enable_shard_locality=False),
])
def test_pickle_copy_and_replace_round_trip(cfg):
    for clone in (pickle.loads(pickle.dumps(cfg)), copy.deepcopy(cfg), dataclasses.replace(cfg)):
        assert clone == cfg
        dataclasses.replace(clone)  # the deprecated sentinels survive pickling: no DeprecationWarning


# --- deprecated arguments ------------------------------------------------------------------------


@pytest.mark.parametrize("cls, arg", [
    (ScalingConfig, "trainer_resources"),
    (RunConfig, "sync_config"), (RunConfig, "verbose"), (RunConfig, "stop"),
    (RunConfig, "progress_reporter"), (RunConfig, "log_to_file"),
    (CheckpointConfig, "checkpoint_frequency"), (CheckpointConfig, "checkpoint_at_end"),
    (FailureConfig, "fail_fast"),
])
def test_removed_arguments_raise_deprecation_warning(cls, arg):
    with pytest.raises(DeprecationWarning) as info:
        cls(**{arg: 7})
    assert f"{cls.__name__}({arg}=7)" in str(info.value)
    assert "minitrain" in str(info.value)


@pytest.mark.parametrize("cls, arg", [(RunConfig, "verbose"), (FailureConfig, "fail_fast"),
                                      (CheckpointConfig, "checkpoint_at_end")])
def test_removed_arguments_raise_even_when_none(cls, arg):
    with pytest.raises(DeprecationWarning):
        cls(**{arg: None})


def test_trainer_resources_none_is_accepted_like_ray():
    assert ScalingConfig(trainer_resources=None).num_workers == 1


def test_removed_private_checkpoint_arguments_raise_type_error():
    with pytest.raises(TypeError):
        CheckpointConfig(_checkpoint_keep_all_ranks=True)


# --- validation errors ---------------------------------------------------------------------------

# (class, kwargs, exception type, field named in the message, bad value whose repr is in the message)
BAD = [
    (ScalingConfig, {"num_workers": -1}, ConfigError, "num_workers", -1),
    (ScalingConfig, {"num_workers": 2.0}, ConfigError, "num_workers", 2.0),
    (ScalingConfig, {"num_workers": True}, ConfigError, "num_workers", True),
    (ScalingConfig, {"num_workers": "2"}, ConfigError, "num_workers", "2"),
    (ScalingConfig, {"num_workers": (4, 2)}, ConfigError, "num_workers", (4, 2)),
    (ScalingConfig, {"num_workers": (0, 2)}, ConfigError, "num_workers", (0, 2)),
    (ScalingConfig, {"num_workers": (1, 2.0)}, ConfigError, "num_workers", (1, 2.0)),
    (ScalingConfig, {"num_workers": (1, 2, 3)}, ConfigError, "num_workers", (1, 2, 3)),
    (ScalingConfig, {"num_workers": (1, 2), "elastic_resize_monitor_interval_s": 0}, ConfigError,
     "elastic_resize_monitor_interval_s", 0),
    (ScalingConfig, {"num_workers": (1, 2), "elastic_resize_monitor_interval_s": -5}, ConfigError,
     "elastic_resize_monitor_interval_s", -5),
    (ScalingConfig, {"use_gpu": 1}, ConfigError, "use_gpu", 1),
    (ScalingConfig, {"use_tpu": True}, ConfigError, "use_tpu", True),
    (ScalingConfig, {"resources_per_worker": [("CPU", 1)]}, ConfigError, "resources_per_worker", [("CPU", 1)]),
    (ScalingConfig, {"resources_per_worker": {"CPU": -1}}, ConfigError, "resources_per_worker['CPU']", -1),
    (ScalingConfig, {"resources_per_worker": {"CPU": "2"}}, ConfigError, "resources_per_worker['CPU']", "2"),
    (ScalingConfig, {"resources_per_worker": {"CPU": float("nan")}}, ConfigError, "resources_per_worker['CPU']",
     float("nan")),
    (ScalingConfig, {"resources_per_worker": {"CPU": True}}, ConfigError, "resources_per_worker['CPU']", True),
    (ScalingConfig, {"resources_per_worker": {3: 1}}, ConfigError, "resources_per_worker", 3),
    (ScalingConfig, {"resources_per_worker": {"gpu": 1}}, ConfigError, "resources_per_worker", "gpu"),
    (ScalingConfig, {"resources_per_worker": {"GPU": 1}}, ConfigError, "resources_per_worker", 1),
    (ScalingConfig, {"use_gpu": True, "resources_per_worker": {"GPU": 0}}, ConfigError, "resources_per_worker", 0),
    (ScalingConfig, {"placement_strategy": "pack"}, ConfigError, "placement_strategy", "pack"),
    (ScalingConfig, {"placement_strategy": None}, ConfigError, "placement_strategy", None),
    (ScalingConfig, {"resources_per_worker": {"memory": -1}}, ConfigError, "resources_per_worker['memory']", -1),
    (ScalingConfig, {"resources_per_worker": {"CPU": 1, "custom": 0.5}}, ConfigError, "resources_per_worker",
     "custom"),
    (ScalingConfig, {"resources_per_worker": {"TPU": 4}}, ConfigError, "resources_per_worker", "TPU"),
    (ScalingConfig, {"accelerator_type": ""}, ConfigError, "accelerator_type", ""),
    (ScalingConfig, {"accelerator_type": "A100"}, ConfigError, "accelerator_type", "A100"),
    (ScalingConfig, {"label_selector": "zone=a"}, ConfigError, "label_selector", "zone=a"),
    (ScalingConfig, {"label_selector": {"zone": "a"}}, ConfigError, "label_selector", {"zone": "a"}),
    (ScalingConfig, {"num_workers": 2, "label_selector": [{"a": "b"}]}, ConfigError, "label_selector",
     [{"a": "b"}]),
    (ScalingConfig, {"topology": 4}, ConfigError, "topology", 4),
    (ScalingConfig, {"topology": "2x2"}, ConfigError, "topology", "2x2"),
    (CheckpointConfig, {"num_to_keep": 0}, ConfigError, "num_to_keep", 0),
    (CheckpointConfig, {"num_to_keep": -2}, ConfigError, "num_to_keep", -2),
    (CheckpointConfig, {"num_to_keep": 1.5}, ConfigError, "num_to_keep", 1.5),
    (CheckpointConfig, {"checkpoint_score_attribute": ""}, ConfigError, "checkpoint_score_attribute", ""),
    (CheckpointConfig, {"checkpoint_score_attribute": 3}, ConfigError, "checkpoint_score_attribute", 3),
    (CheckpointConfig, {"checkpoint_score_order": "MAX"}, ConfigError, "checkpoint_score_order", "MAX"),
    (FailureConfig, {"max_failures": -2}, ConfigError, "max_failures", -2),
    (FailureConfig, {"max_failures": None}, ConfigError, "max_failures", None),
    (FailureConfig, {"worker_hang_timeout_s": 0}, ConfigError, "worker_hang_timeout_s", 0),
    (FailureConfig, {"worker_hang_timeout_s": float("inf")}, ConfigError, "worker_hang_timeout_s", float("inf")),
    (FailureConfig, {"worker_stop_grace_s": -0.5}, ConfigError, "worker_stop_grace_s", -0.5),
    (FailureConfig, {"controller_failure_limit": -3}, ConfigError, "controller_failure_limit", -3),
    (FailureConfig, {"controller_failure_limit": 0}, ConfigError, "controller_failure_limit", 0),
    (FailureConfig, {"controller_failure_limit": 5}, ConfigError, "controller_failure_limit", 5),
    (FailureConfig, {"controller_failure_limit": None}, ConfigError, "controller_failure_limit", None),
    (FailureConfig, {"max_preemption_failures": -2}, ConfigError, "max_preemption_failures", -2),
    (FailureConfig, {"max_preemption_failures": 1.0}, ConfigError, "max_preemption_failures", 1.0),
    (FailureConfig, {"max_preemption_failures": True}, ConfigError, "max_preemption_failures", True),
    (FailureConfig, {"max_preemption_failures": None}, ConfigError, "max_preemption_failures", None),
    (FailureConfig, {"preemption_signals": "SIGTERM"}, ConfigError, "preemption_signals", "SIGTERM"),
    (FailureConfig, {"preemption_signals": ("SIGKILL",)}, ConfigError, "preemption_signals", ("SIGKILL",)),
    (FailureConfig, {"preemption_signals": ("SIGINT",)}, ConfigError, "preemption_signals", ("SIGINT",)),
    (FailureConfig, {"preemption_signals": ("SIGNOPE",)}, ConfigError, "preemption_signals", ("SIGNOPE",)),
    (FailureConfig, {"preemption_signals": (1.5,)}, ConfigError, "preemption_signals", (1.5,)),
    (FailureConfig, {"preemption_timeout_s": 0}, ConfigError, "preemption_timeout_s", 0),
    (FailureConfig, {"preemption_timeout_s": "20"}, ConfigError, "preemption_timeout_s", "20"),
    (LoggingConfig, {"log_level": "LOUD"}, ConfigError, "log_level", "LOUD"),
    (LoggingConfig, {"log_level": 10}, ConfigError, "log_level", 10),
    (RunConfig, {"name": ""}, ConfigError, "name", ""),
    (RunConfig, {"name": "a/b"}, ConfigError, "name", "a/b"),
    (RunConfig, {"name": "a\\b"}, ConfigError, "name", "a\\b"),
    (RunConfig, {"name": "."}, ConfigError, "name", "."),
    (RunConfig, {"name": ".."}, ConfigError, "name", ".."),
    (RunConfig, {"name": 5}, ConfigError, "name", 5),
    (RunConfig, {"storage_path": ""}, ConfigError, "storage_path", ""),
    (RunConfig, {"storage_path": 3}, ConfigError, "storage_path", 3),
    (RunConfig, {"failure_config": CheckpointConfig()}, ConfigError, "failure_config", CheckpointConfig()),
    (RunConfig, {"checkpoint_config": {"num_to_keep": 1}}, ConfigError, "checkpoint_config", {"num_to_keep": 1}),
    (RunConfig, {"logging_config": "DEBUG"}, ConfigError, "logging_config", "DEBUG"),
    (RunConfig, {"callbacks": "cb"}, ConfigError, "callbacks", "cb"),
    (RunConfig, {"callbacks": [1]}, ConfigError, "callbacks[0]", 1),
    (RunConfig, {"worker_runtime_env": ["env_vars"]}, ConfigError, "worker_runtime_env", ["env_vars"]),
    (RunConfig, {"worker_runtime_env": {"pip": ["torch"]}}, ConfigError, "worker_runtime_env", "pip"),
    (RunConfig, {"worker_runtime_env": {"env_vars": ["A=1"]}}, ConfigError, "env_vars", ["A=1"]),
    (RunConfig, {"worker_runtime_env": {"env_vars": {"A": 1}}}, ConfigError, "env_vars']['A']", 1),
    (RunConfig, {"worker_runtime_env": {"env_vars": {"A=B": "1"}}}, ConfigError, "env_vars", "A=B"),
    (RunConfig, {"worker_runtime_env": {"env_vars": {5: "1"}}}, ConfigError, "env_vars", 5),
    (RunConfig, {"worker_runtime_env": {"working_dir": ""}}, ConfigError, "working_dir", ""),
    (TorchConfig, {"backend": "NCCL"}, ConfigError, "backend", "NCCL"),
    (TorchConfig, {"backend": "tpu_dist"}, ConfigError, "backend", "tpu_dist"),
    (TorchConfig, {"init_method": "file"}, ConfigError, "init_method", "file"),
    (TorchConfig, {"timeout_s": 0}, ConfigError, "timeout_s", 0),
    (TorchConfig, {"timeout_s": "60"}, ConfigError, "timeout_s", "60"),
    (DataConfig, {"datasets_to_split": "train"}, TypeError, "datasets_to_split", "train"),
    (DataConfig, {"datasets_to_split": ["train", 1]}, TypeError, "datasets_to_split", ["train", 1]),
    (DataConfig, {"datasets_to_split": None}, TypeError, "datasets_to_split", None),
    (DataConfig, {"execution_options": {"locality_with_output": True}}, ConfigError, "execution_options",
     {"locality_with_output": True}),
    (DataConfig, {"enable_shard_locality": "yes"}, ConfigError, "enable_shard_locality", "yes"),
    (DataConfig, {"enable_shard_locality": None}, ConfigError, "enable_shard_locality", None),
    (MonitoringConfig, {"straggler_factor": 1}, ConfigError, "straggler_factor", 1),
    (MonitoringConfig, {"straggler_factor": "1.5"}, ConfigError, "straggler_factor", "1.5"),
    (MonitoringConfig, {"straggler_window": 0}, ConfigError, "straggler_window", 0),
    (MonitoringConfig, {"straggler_window": 2.0}, ConfigError, "straggler_window", 2.0),
    (MonitoringConfig, {"straggler_min_samples": 0}, ConfigError, "straggler_min_samples", 0),
    (MonitoringConfig, {"status_interval_s": 0}, ConfigError, "status_interval_s", 0),
    (MonitoringConfig, {"status_interval_s": float("inf")}, ConfigError, "status_interval_s", float("inf")),
    (RunConfig, {"monitoring_config": {"straggler_factor": 2}}, ConfigError, "monitoring_config",
     {"straggler_factor": 2}),
]


@pytest.mark.parametrize("cls, kwargs, exc_type, field_name, bad", BAD,
                         ids=[f"{c.__name__}-{k}" for c, k, *_ in BAD])
def test_invalid_values_raise_naming_field_and_value(cls, kwargs, exc_type, field_name, bad):
    with pytest.raises(exc_type) as info:
        cls(**kwargs)
    message = str(info.value)
    assert field_name in message
    assert repr(bad) in message
    assert cls.__name__ in message


def test_config_error_is_a_value_error():
    with pytest.raises(ValueError):
        ScalingConfig(num_workers=-1)


def test_messages_carry_a_fix():
    with pytest.raises(ConfigError, match="local mode"):
        ScalingConfig(num_workers=-1)
    with pytest.raises(ConfigError, match=r"1 <= min <= max.*num_workers=\(1, 4\)"):
        ScalingConfig(num_workers=(4, 1))
    with pytest.raises(ConfigError, match="'gloo', 'nccl', 'mpi'"):
        TorchConfig(backend="ucc")
    with pytest.raises(ConfigError, match="DEBUG, INFO, WARNING, ERROR, CRITICAL"):
        LoggingConfig(log_level="LOUD")
    with pytest.raises(ConfigError, match="'env_vars' and 'working_dir'.*does not install"):
        RunConfig(worker_runtime_env={"conda": "env.yaml"})
    with pytest.raises(ConfigError, match="resume"):
        RunConfig(name="a/b")
    with pytest.raises(ConfigError, match=r"minitrain\.FailureConfig"):
        RunConfig(failure_config=object())


# --- ScalingConfig derived values ----------------------------------------------------------------


def test_ray_examples_for_total_resources():
    assert ScalingConfig(num_workers=4, use_gpu=True).total_resources == {"GPU": 4.0}
    assert ScalingConfig(num_workers=4).total_resources == {"CPU": 4.0}


def test_local_mode_and_worker_counts():
    s = ScalingConfig(num_workers=0)
    assert s.local_mode and s.min_workers == s.max_workers == 0
    s = ScalingConfig(num_workers=3)
    assert not s.local_mode and s.min_workers == s.max_workers == 3


def test_gpu_workers_take_no_cpu_by_default():
    s = ScalingConfig(num_workers=2, use_gpu=True)
    assert s.effective_resources_per_worker == {"GPU": 1.0}
    assert (s.num_cpus_per_worker, s.num_gpus_per_worker) == (0.0, 1.0)
    assert s.additional_resources_per_worker == {}
    c = ScalingConfig()
    assert (c.num_cpus_per_worker, c.num_gpus_per_worker) == (1.0, 0.0)


def test_memory_per_worker_is_kept_for_the_ledger():
    s = ScalingConfig(num_workers=2, resources_per_worker={"CPU": 1, "memory": 2e9})
    assert s.additional_resources_per_worker == {"memory": 2e9}
    assert s.total_resources == {"CPU": 2.0, "memory": 4e9}


def test_resources_per_worker_normalisation():
    s = ScalingConfig(num_workers=2, use_gpu=True,
                      resources_per_worker={"CPU": 4, "memory": 0, "custom": 0, "TPU": 0})
    assert s.resources_per_worker == {"CPU": 4}  # zeros dropped, so a zero of any name is accepted
    assert s.effective_resources_per_worker == {"CPU": 4.0, "GPU": 1.0}
    assert (s.num_cpus_per_worker, s.num_gpus_per_worker) == (4.0, 1.0)
    assert s.additional_resources_per_worker == {}
    assert s.total_resources == {"CPU": 8.0, "GPU": 2.0}
    assert ScalingConfig(use_gpu=True, resources_per_worker={"GPU": 0.5}).num_gpus_per_worker == 0.5
    assert ScalingConfig(resources_per_worker={"GPU": 0}).num_gpus_per_worker == 0.0
    assert ScalingConfig(resources_per_worker={"GPU": 0}).num_cpus_per_worker == 0.0  # as Ray


def test_derived_dicts_are_fresh_copies():
    s = ScalingConfig(num_workers=2)
    s.total_resources["CPU"] = 0
    s.effective_resources_per_worker["CPU"] = 0
    assert s.total_resources == {"CPU": 2.0}


def test_unsupported_ray_fields_accept_their_defaults():
    # A ported Ray script that passes the defaults explicitly is unaffected.
    s = ScalingConfig(num_workers=2, accelerator_type=None, label_selector=None, topology=None,
                      placement_strategy="STRICT_SPREAD")
    assert (s.accelerator_type, s.label_selector, s.topology) == (None, None, None)
    assert FailureConfig(controller_failure_limit=-1).controller_failure_limit == -1
    assert DataConfig(execution_options=None).execution_options is None
    assert RunConfig(name="r", callbacks=None).callbacks == RunConfig(name="r", callbacks=()).callbacks == ()


@pytest.mark.parametrize("kwargs, fix", [
    ({"accelerator_type": "A100"}, r"does not select hosts or GPUs by accelerator type.*minitrain\.init\(hosts="),
    ({"label_selector": {"zone": "a"}}, r"does not select hosts by label.*minitrain\.init\(hosts="),
    ({"num_workers": 2, "label_selector": [{"a": "1"}, {"a": "2"}]}, r"does not select hosts by label"),
    ({"topology": "2x2"}, r"TPU setting.*CPUs or GPUs"),
    ({"resources_per_worker": {"HBM": 2e9}}, r"only 'CPU', 'GPU' and 'memory'.*Remove 'HBM'.*--hosts"),
])
def test_unsupported_scaling_fields_raise_with_a_fix(kwargs, fix):
    with pytest.raises(ConfigError, match=fix):
        ScalingConfig(**kwargs)


def test_controller_failure_limit_other_than_default_points_to_max_failures():
    with pytest.raises(ConfigError, match=r"controller_failure_limit must be -1 \(the default\), got 3: .*"
                                          r"start-up counts against max_failures.*set max_failures"):
        FailureConfig(controller_failure_limit=3)


def test_data_config_execution_options_raise_and_shard_locality_takes_either_bool():
    with pytest.raises(ConfigError, match=r"execution_options must be None.*Remove execution_options"):
        DataConfig(execution_options=object())
    for flag in (True, False):
        assert DataConfig(enable_shard_locality=flag).enable_shard_locality is flag


def test_a_callback_without_any_hook_raises_with_a_fix():
    with pytest.raises(ConfigError, match=r"RunConfig\.callbacks\[0\] must be a minitrain\.UserCallback.*"
                                          r"builtins\.object.*subclass minitrain\.UserCallback"):
        RunConfig(name="r", callbacks=[object()])


def test_no_docstring_calls_a_field_accepted_but_unused():
    for cls in ALL_CONFIGS:
        text = " ".join(cls.__doc__.split())
        for phrase in ("accepted and stored", "not used", "have no effect", "accepted and ignored"):
            assert phrase not in text, f"{cls.__name__}: {phrase!r}"


# --- error fragments Ray's own tests match ---------------------------------------------------------


@pytest.mark.parametrize("build, exc_type, fragment", [
    (lambda: CheckpointConfig(num_to_keep=0), ConfigError, "Received invalid num_to_keep"),
    (lambda: CheckpointConfig(num_to_keep=-1), ConfigError, "Received invalid num_to_keep"),
    (lambda: CheckpointConfig(checkpoint_score_order="MAX"), ConfigError, "Received invalid checkpoint_score_order"),
    (lambda: ScalingConfig(use_gpu=False, resources_per_worker={"GPU": 1}), ConfigError,
     "`use_gpu` is False but `GPU` was found in"),
    (lambda: ScalingConfig(use_gpu=True, resources_per_worker={"GPU": 0}), ConfigError,
     "`use_gpu` is True but `GPU` is set to 0 in"),
    (lambda: DataConfig(datasets_to_split="hello"), TypeError, "`datasets_to_split` should be"),
    (lambda: DataConfig(datasets_to_split={}), TypeError, "`datasets_to_split` should be"),
], ids=["num_to_keep=0", "num_to_keep=-1", "score_order", "gpu-without-use_gpu", "use_gpu-with-gpu-0",
        "split-str", "split-dict"])
def test_messages_carry_the_fragment_ray_tests_match(build, exc_type, fragment):
    with pytest.raises(exc_type, match=re.escape(fragment)) as info:
        build()
    message = str(info.value)
    assert message.index(fragment) > 0  # after minitrain's own wording, which names class.field
    assert re.match(r"(CheckpointConfig|ScalingConfig|DataConfig)\.\w+", message)


@given(n=st.integers(min_value=0, max_value=10_000), use_gpu=st.booleans(),
       cpus=st.none() | st.floats(min_value=0, max_value=64, allow_nan=False))
def test_total_resources_is_per_worker_times_num_workers(n, use_gpu, cpus):
    resources = None if cpus is None else {"CPU": cpus}
    s = ScalingConfig(num_workers=n, use_gpu=use_gpu, resources_per_worker=resources)
    per_worker = s.effective_resources_per_worker
    assert s.total_resources == {key: amount * n for key, amount in per_worker.items()}
    assert s.total_resources.get("GPU", 0.0) == (float(n) if use_gpu else 0.0)
    assert s.num_cpus_per_worker == (1.0 if cpus is None and not use_gpu else float(cpus or 0.0))


# --- MonitoringConfig: fields with environment defaults ------------------------------------------

_MONITORING_VARS = ("MINITRAIN_STRAGGLER_FACTOR", "MINITRAIN_STRAGGLER_WINDOW", "MINITRAIN_STRAGGLER_MIN_SAMPLES",
                    "MINITRAIN_STATUS_INTERVAL_S")


@pytest.fixture
def no_monitoring_env(monkeypatch):
    for name in _MONITORING_VARS:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_monitoring_defaults(no_monitoring_env):
    m = MonitoringConfig()
    assert (m.straggler_factor, m.straggler_window, m.straggler_min_samples, m.status_interval_s) == (1.5, 10, 5, 30.0)
    assert RunConfig(name="r").monitoring_config == m
    assert MonitoringConfig(straggler_window=3).straggler_min_samples == 3  # the default 5, capped by the window


def test_monitoring_fields_default_to_their_environment_variables(no_monitoring_env):
    for name, value in zip(_MONITORING_VARS, ("2", "4", "2", "5")):
        no_monitoring_env.setenv(name, value)
    m = RunConfig(name="r").monitoring_config
    assert (m.straggler_factor, m.straggler_window, m.straggler_min_samples, m.status_interval_s) == (2.0, 4, 2, 5.0)
    no_monitoring_env.delenv("MINITRAIN_STRAGGLER_MIN_SAMPLES")
    assert MonitoringConfig().straggler_min_samples == 4  # the default 5, capped by the environment's window


def test_monitoring_fields_override_the_environment(no_monitoring_env):
    for name, value in zip(_MONITORING_VARS, ("2", "4", "2", "5")):
        no_monitoring_env.setenv(name, value)
    m = MonitoringConfig(straggler_factor=3, straggler_window=20, straggler_min_samples=8, status_interval_s=0.5)
    assert (m.straggler_factor, m.straggler_window, m.straggler_min_samples, m.status_interval_s) == (3, 20, 8, 0.5)
    no_monitoring_env.setenv("MINITRAIN_STATUS_INTERVAL_S", "soon")  # a bad variable under a set field is not read
    assert MonitoringConfig(status_interval_s=1).status_interval_s == 1


def test_a_bad_monitoring_variable_names_the_variable(no_monitoring_env):
    no_monitoring_env.setenv("MINITRAIN_STATUS_INTERVAL_S", "soon")
    with pytest.raises(ConfigError, match="MINITRAIN_STATUS_INTERVAL_S='soon'.*above 0"):
        RunConfig(name="r")


def test_min_samples_above_the_window_names_both_fields_and_variables(no_monitoring_env):
    with pytest.raises(ConfigError, match=r"straggler_min_samples .*MINITRAIN_STRAGGLER_MIN_SAMPLES.*straggler_window "
                                          r"\(4; default: MINITRAIN_STRAGGLER_WINDOW\), got 6"):
        MonitoringConfig(straggler_window=4, straggler_min_samples=6)


# --- RunConfig paths -----------------------------------------------------------------------------


def test_storage_path_local_forms(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    assert RunConfig(name="r", storage_path="~/runs").storage_path == str(tmp_path / "runs")
    assert RunConfig(name="r", storage_path=pathlib.Path(tmp_path, "p")).storage_path == str(tmp_path / "p")
    monkeypatch.chdir(tmp_path)
    assert RunConfig(name="r", storage_path="rel").run_path == f"{tmp_path}/rel/r"


@pytest.mark.parametrize("url, run_path", [
    ("s3://bucket/runs", "s3://bucket/runs/r"),
    ("s3://bucket/runs/", "s3://bucket/runs/r"),
    ("file:///tmp/x", "file:///tmp/x/r"),
    ("memory://", "memory://r"),
    ("gs://b", "gs://b/r"),
])
def test_urls_are_kept_as_given(url, run_path):
    r = RunConfig(name="r", storage_path=url)
    assert r.storage_path == url and r.run_path == run_path


def test_storage_path_inside_a_filesystem_is_not_expanded():
    import fsspec

    r = RunConfig(name="r", storage_path="bucket/runs", storage_filesystem=fsspec.filesystem("memory"))
    assert r.storage_path == "bucket/runs" and r.run_path == "bucket/runs/r"


def test_run_config_normalises_collections():
    r = RunConfig(name="r", callbacks=[], worker_runtime_env={"env_vars": {"A": "1"}, "working_dir": "/w"})
    assert r.callbacks == ()
    assert r.worker_runtime_env == {"env_vars": {"A": "1"}, "working_dir": "/w"}
    f = FailureConfig(max_failures=3)
    assert RunConfig(name="r", failure_config=f).failure_config is f


# --- LoggingConfig, TorchConfig, DataConfig ------------------------------------------------------


@pytest.mark.parametrize("given_level, stored", [("debug", "DEBUG"), ("Warning", "WARNING"), ("ERROR", "ERROR")])
def test_log_level_is_upper_cased(given_level, stored):
    assert LoggingConfig(log_level=given_level).log_level == stored


def test_torch_backend_resolution_does_not_mutate():
    t = TorchConfig()
    assert t.resolved_backend(use_gpu=True) == "nccl"
    assert t.resolved_backend(use_gpu=False) == "gloo"
    assert t.backend is None
    assert TorchConfig(backend="gloo").resolved_backend(use_gpu=True) == "gloo"
    assert TorchConfig(init_method="tcp", timeout_s=2.5).timeout_s == 2.5


def test_data_config_should_split():
    assert DataConfig().should_split("anything")
    d = DataConfig(datasets_to_split=["train"])
    assert d.datasets_to_split == ("train",)
    assert d.should_split("train") and not d.should_split("val")
    assert not DataConfig(datasets_to_split=[]).should_split("train")


# --- house rules ---------------------------------------------------------------------------------


def test_config_package_imports_only_stdlib_errors_knobs_and_itself():
    import ast
    import sys

    imported = set()
    for path in pathlib.Path(config_module.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                imported.update({f"minitrain.{alias.name}" for alias in node.names} if node.module == "minitrain"
                                else {node.module})
    allowed = set(sys.stdlib_module_names) | {"minitrain.errors", "minitrain.knobs"}
    outside = {name for name in imported if name.split(".")[0] not in allowed and name not in allowed
               and not name.startswith("minitrain.config.")}
    assert outside == set()


def test_the_package_exports_every_public_config_name():
    import minitrain.config._validate
    import minitrain.config.data
    import minitrain.config.run
    import minitrain.config.scaling
    import minitrain.config.torch_config

    for module in (minitrain.config._validate, minitrain.config.data, minitrain.config.run,
                   minitrain.config.scaling, minitrain.config.torch_config):
        public = {name for name, value in vars(module).items() if not name.startswith("_")
                  and getattr(value, "__module__", module.__name__) == module.__name__
                  and not isinstance(value, type(pathlib))}
        public -= {"annotations", "logger", "T"}
        assert public <= set(config_module.__all__), (module.__name__, public - set(config_module.__all__))
        assert all(getattr(config_module, name) is getattr(module, name) for name in public)


def test_configs_are_frozen_kw_only_slotted_and_documented():
    for cls in ALL_CONFIGS:
        params = cls.__dataclass_params__
        assert params.frozen and "__slots__" in cls.__dict__
        assert all(f.kw_only for f in dataclasses.fields(cls))
        assert cls.__doc__ and len(cls.__doc__) > 40
        for name, member in vars(cls).items():
            if not name.startswith("_") and (callable(member) or isinstance(member, property)):
                assert member.__doc__, f"{cls.__name__}.{name} has no docstring"


# ---------------------------------------------------------------- misspelled fields

@pytest.mark.parametrize("config_class, wrong, meant", [
    (ScalingConfig, "num_worker", "num_workers"),
    (ScalingConfig, "use_gpus", "use_gpu"),
    (RunConfig, "storage_pth", "storage_path"),
    (CheckpointConfig, "num_to_kep", "num_to_keep"),
    (FailureConfig, "max_failure", "max_failures"),
    (LoggingConfig, "loglevel", "log_level"),
    (MonitoringConfig, "status_interval", "status_interval_s"),
    (DataConfig, "dataset_to_split", "datasets_to_split"),
    (TorchConfig, "backnd", "backend"),
])
def test_a_misspelled_field_names_the_field_that_was_meant(config_class, wrong, meant):
    from minitrain.config._validate import UnknownFieldError

    with pytest.raises(TypeError, match=f"did you mean '{meant}'") as info:
        config_class(**{wrong: 1})
    assert isinstance(info.value, UnknownFieldError) and isinstance(info.value, ConfigError)
    assert f"{config_class.__name__}({wrong}=1)" in str(info.value)
    assert f"unexpected keyword argument '{wrong}'" in str(info.value)  # Python's own words still match


def test_an_unknown_field_without_a_close_match_lists_the_fields_and_not_the_removed_ones():
    with pytest.raises(TypeError, match="its fields are num_workers, use_gpu") as info:
        ScalingConfig(zzz=1)
    assert "trainer_resources" not in str(info.value)


def test_removed_ray_fields_keep_their_deprecation_error():
    with pytest.raises(DeprecationWarning, match="trainer_resources"):
        ScalingConfig(trainer_resources={"CPU": 1})
