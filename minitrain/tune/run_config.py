"""Tune's own run configuration (L3): `RunConfig`, `FailureConfig`, `CheckpointConfig`, `SyncConfig`,
as `ray.tune.RunConfig` & co., distinct from Train v2's (`minitrain.RunConfig`).

Ray Tune kept the arguments Train v2 removed (`stop`, `verbose`, `progress_reporter`, `sync_config`,
`log_to_file`, `fail_fast`, `checkpoint_frequency`, ...), so a Tune script passes them here; each either
works or raises a `ConfigError` saying that minitrain does not support it (never a Train v2
deprecation). `Tuner` also takes a Train `minitrain.RunConfig` and reads it through `from_train`.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
from dataclasses import dataclass
from typing import Any, Optional

from minitrain.config import CheckpointConfig as TrainCheckpointConfig
from minitrain.config import FailureConfig as TrainFailureConfig
from minitrain.config import LoggingConfig
from minitrain.config import RunConfig as TrainRunConfig
from minitrain.errors import ConfigError
from minitrain.tune.callback import check_callbacks
from minitrain.tune.stopper import Stopper, as_stopper

DEFAULT_STORAGE_PATH = "~/minitrain_results"


def _unsupported(field: str, value: Any, why: str) -> ConfigError:
    return ConfigError(f"tune.RunConfig({field}={value!r}) is not supported by minitrain.tune: {why}")


@dataclass(frozen=True)
class FailureConfig:
    """How a sweep treats failing trials (Ray Tune's `FailureConfig`). `max_failures`: retries of each
    trial from its latest checkpoint (-1: without limit). `fail_fast=True` ends the sweep at the first
    trial that errors (the others are stopped; `fit()` returns the grid); `fail_fast="raise"` also
    raises that trial's error from `fit()`. Ray requires `max_failures=0` with `fail_fast`."""

    max_failures: int = 0
    fail_fast: Any = False

    def __post_init__(self) -> None:
        n = self.max_failures
        if isinstance(n, bool) or not isinstance(n, int) or n < -1:
            raise ConfigError(f"tune.FailureConfig(max_failures={n!r}) must be an int >= -1.")
        if not (isinstance(self.fail_fast, bool) or self.fail_fast == "raise"):
            raise ConfigError(f"tune.FailureConfig(fail_fast={self.fail_fast!r}) must be False, True or 'raise'.")
        if self.fail_fast and n != 0:
            raise ValueError("max_failures must be 0 if fail_fast=True.")


@dataclass(frozen=True)
class CheckpointConfig:
    """Which checkpoints of each function trial are kept (Ray Tune's `CheckpointConfig`): the best
    `num_to_keep` by `checkpoint_score_attribute` in `checkpoint_score_order` ('max'/'min'; no
    attribute: the most recent), and always the latest. `checkpoint_frequency`/`checkpoint_at_end`
    drive class trainables, which minitrain.tune does not run: only their defaults are accepted."""

    num_to_keep: Optional[int] = None
    checkpoint_score_attribute: Optional[str] = None
    checkpoint_score_order: str = "max"
    checkpoint_frequency: int = 0
    checkpoint_at_end: Optional[bool] = None

    def __post_init__(self) -> None:
        # The checks of Train's CheckpointConfig (the same three fields, the same messages).
        TrainCheckpointConfig(num_to_keep=self.num_to_keep, checkpoint_score_attribute=self.checkpoint_score_attribute,
                              checkpoint_score_order=self.checkpoint_score_order)
        if self.checkpoint_frequency not in (0, None) or self.checkpoint_at_end:
            raise ConfigError(f"tune.CheckpointConfig(checkpoint_frequency={self.checkpoint_frequency!r}, "
                              f"checkpoint_at_end={self.checkpoint_at_end!r}) drives class trainables "
                              "(tune.Trainable), which minitrain.tune does not run. A function trainable "
                              "saves a checkpoint with tune.report(metrics, checkpoint=...).")

    @classmethod
    def from_train(cls, config: TrainCheckpointConfig) -> "CheckpointConfig":
        """The same retention, from Train's `minitrain.CheckpointConfig`."""
        return cls(config.num_to_keep, config.checkpoint_score_attribute, config.checkpoint_score_order)


@dataclass(frozen=True)
class SyncConfig:
    """Ray Tune's `SyncConfig`, accepted for its arguments: a sweep's trials write their results and
    checkpoints straight into `storage_path` (local or shared), so there is nothing to synchronise."""

    sync_period: float = 300
    sync_timeout: float = 1800
    sync_artifacts: bool = False
    sync_artifacts_on_checkpoint: bool = True


@dataclass(frozen=True)
class RunConfig:
    """Where a sweep writes and how it runs (Ray Tune's `RunConfig`).

    `name` (default `<trainable>_<date>`, as Ray) and `storage_path` (default `~/minitrain_results`,
    a local or shared path) make the sweep directory. `stop` is a dict of result bounds, a function
    `(trial_id, result) -> bool` or a `tune.stopper.Stopper` (see minitrain.tune.stopper).
    `failure_config` and `checkpoint_config` are Tune's (Train's are accepted too). `verbose` 0
    hides the trial table (1-3, a `Verbosity`, or None show it). `sync_config` and `log_to_file` are
    accepted (trials write to storage directly; each trial's output is in `.tune/<trial>.log`).
    `callbacks` is a list of `tune.Callback`s the sweep loop calls (minitrain.tune.callback; anything
    else raises ConfigError naming the entry); `progress_reporter` raises ConfigError: not supported.
    `logging_config` (a minitrain extension) sets the driver's log level.
    """

    name: Optional[str] = None
    storage_path: Optional[str] = None
    storage_filesystem: Any = None
    failure_config: Optional[FailureConfig] = None
    checkpoint_config: Optional[CheckpointConfig] = None
    sync_config: Optional[SyncConfig] = None
    verbose: Any = None
    stop: Any = None
    callbacks: Optional[list] = None
    progress_reporter: Any = None
    log_to_file: Any = False
    logging_config: Optional[LoggingConfig] = None

    def __post_init__(self) -> None:
        set_ = lambda field, value: object.__setattr__(self, field, value)  # noqa: E731 - frozen
        if self.name is not None and (not isinstance(self.name, str) or self.name in ("", ".", "..")
                                      or "/" in self.name or "\\" in self.name or "\0" in self.name):
            raise ConfigError(f"tune.RunConfig(name={self.name!r}) must be a non-empty directory name without "
                              "'/' (or None for '<trainable>_<date>').")
        if self.storage_filesystem is not None or "://" in str(self.storage_path or "").replace("file://", ""):
            raise _unsupported("storage_path", self.storage_path, "a sweep is kept on a local or shared (NFS) "
                               "path; trials' TorchTrainers may still use remote storage in their own RunConfig.")
        if self.storage_path is not None:
            set_("storage_path", os.path.abspath(os.path.expanduser(
                os.fspath(self.storage_path).removeprefix("file://"))))
        failure = self.failure_config
        if isinstance(failure, TrainFailureConfig):
            failure = FailureConfig(max_failures=failure.max_failures)
        set_("failure_config", _typed(failure, FailureConfig, "failure_config"))
        checkpoint = self.checkpoint_config
        if isinstance(checkpoint, TrainCheckpointConfig):
            checkpoint = CheckpointConfig.from_train(checkpoint)
        set_("checkpoint_config", _typed(checkpoint, CheckpointConfig, "checkpoint_config"))
        set_("logging_config", _typed(self.logging_config, LoggingConfig, "logging_config"))
        if self.sync_config is not None and type(self.sync_config).__name__ != "SyncConfig":
            raise ConfigError(f"tune.RunConfig(sync_config={self.sync_config!r}) must be a tune.SyncConfig or None.")
        if self.verbose is not None and int(self.verbose) not in (0, 1, 2, 3):
            raise ConfigError(f"tune.RunConfig(verbose={self.verbose!r}) must be 0, 1, 2, 3 (or a Verbosity).")
        if not isinstance(self.log_to_file, (bool, str, tuple, list)):
            raise ConfigError(f"tune.RunConfig(log_to_file={self.log_to_file!r}) must be a bool, a file name "
                              "or a (stdout, stderr) pair.")
        if self.callbacks is not None:  # Ray's check: each entry a tune.Callback (a TypeError-like ConfigError)
            set_("callbacks", check_callbacks(self.callbacks))
        if self.progress_reporter is not None:
            raise _unsupported("progress_reporter", self.progress_reporter, "the trial table is minitrain's "
                               "live console (MINITRAIN_STATUS) and the sweep's dashboard page; verbose=0 hides it.")
        as_stopper(self.stop)  # a ConfigError now for a `stop` of the wrong kind

    @property
    def show_table(self) -> bool:
        """Whether the live trial table is drawn (`verbose` other than 0)."""
        return self.verbose is None or int(self.verbose) != 0

    def stopper(self) -> Stopper:
        """`stop` as a `Stopper` (a fresh one for a dict or function; the user's own Stopper as given)."""
        return as_stopper(self.stop)

    def with_default_name(self, trainable_name: str) -> "RunConfig":
        """This config with `name` and `storage_path` filled in (Ray's `<trainable>_<date>` name)."""
        name = self.name or f"{trainable_name}_{datetime.datetime.now():%Y-%m-%d_%H-%M-%S}"
        storage = self.storage_path or os.path.abspath(os.path.expanduser(DEFAULT_STORAGE_PATH))
        return _replace(self, name=name, storage_path=storage)

    @classmethod
    def from_train(cls, config: TrainRunConfig) -> "RunConfig":
        """Train's `minitrain.RunConfig` read as a sweep's: its name, storage path, retries, retention and
        log level (its callbacks and runtime env belong to a TorchTrainer, not to the sweep)."""
        if config.callbacks:
            raise ConfigError("Tuner(run_config=minitrain.RunConfig(callbacks=...)): Train callbacks are called "
                              "by a TorchTrainer's fit(), not by the sweep; set them on the TorchTrainer's RunConfig.")
        if config.worker_runtime_env:
            raise ConfigError("Tuner(run_config=RunConfig(worker_runtime_env=...)) has no effect on trials; set it "
                              "on the TorchTrainer's RunConfig.")
        return cls(name=config.name, storage_path=config.storage_path, storage_filesystem=config.storage_filesystem,
                   failure_config=FailureConfig(max_failures=config.failure_config.max_failures),
                   checkpoint_config=CheckpointConfig.from_train(config.checkpoint_config),
                   logging_config=config.logging_config)


def _typed(value: Any, cls: type, field: str) -> Any:
    if value is None:
        return cls()
    if not isinstance(value, cls):
        raise ConfigError(f"tune.RunConfig({field}={value!r}) must be a minitrain.tune.{cls.__name__} or None.")
    return value


def _replace(config: RunConfig, **changes: Any) -> RunConfig:
    return dataclasses.replace(config, **changes)
