"""RunConfig(worker_runtime_env=...) against Ray's runtime_env keys: `env_vars` and `working_dir` are
taken (the e2e run in tests/e2e/test_upload_mode_mixes.py sees them on every rank); each other key Ray
documents is refused with a ConfigError naming the key, its value, why, and what to do instead; and the
config fields refuse a wrong type naming the field, as Ray's RunConfig does."""

from __future__ import annotations

import os

import pytest

from minitrain import CheckpointConfig, ConfigError, FailureConfig, RunConfig
from minitrain.config.run import _REFUSED_RUNTIME_ENV_KEYS


@pytest.mark.parametrize("key", sorted(_REFUSED_RUNTIME_ENV_KEYS))
def test_each_ray_runtime_env_key_minitrain_does_not_build_is_refused_by_name(key):
    with pytest.raises(ConfigError, match=rf"worker_runtime_env\['{key}'\]='value' is not supported: .+\. "):
        RunConfig(name="r", worker_runtime_env={key: "value"})


def test_every_refusal_says_what_to_do():
    for reason in _REFUSED_RUNTIME_ENV_KEYS.values():
        assert any(word in reason for word in ("install", "remove", "instead", "run ", "start", "put")), reason


@pytest.mark.parametrize("working_dir", ["s3://bucket/code.zip", "https://host/code", "code.zip"])
def test_a_working_dir_to_download_or_unpack_is_refused(working_dir):
    with pytest.raises(ConfigError, match="does not download or unpack"):
        RunConfig(name="r", worker_runtime_env={"working_dir": working_dir})


def test_a_relative_working_dir_is_the_driver_s(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert RunConfig(name="r", worker_runtime_env={"working_dir": "code"}).worker_runtime_env["working_dir"] == \
        os.path.join(str(tmp_path), "code")


def test_a_variable_reference_in_env_vars_is_refused_rather_than_set_literally():
    with pytest.raises(ConfigError, match=r"\['PATH'\].*references another variable"):
        RunConfig(name="r", worker_runtime_env={"env_vars": {"PATH": "${PATH}:/opt/bin"}})


def test_env_vars_are_kept_as_given():
    env = RunConfig(name="r", worker_runtime_env={"env_vars": {"A": "1", "B": "x y"}}).worker_runtime_env
    assert dict(env["env_vars"]) == {"A": "1", "B": "x y"}


@pytest.mark.parametrize("field, value", [
    ("failure_config", CheckpointConfig()), ("checkpoint_config", FailureConfig()),
    ("logging_config", {"log_level": "INFO"}), ("monitoring_config", 1), ("callbacks", "callback"),
    ("worker_runtime_env", "env_vars"),
])
def test_a_config_field_of_the_wrong_type_raises_naming_the_field(field, value):
    with pytest.raises(ConfigError, match=rf"RunConfig\.{field}"):
        RunConfig(name="r", **{field: value})
