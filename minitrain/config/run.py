"""`RunConfig` and the configs it holds: where a run writes (`RunConfig`), which checkpoints it keeps
(`CheckpointConfig`), how many failures it survives and how hung workers are judged (`FailureConfig`),
its log level (`LoggingConfig`) and how the driver watches it (`MonitoringConfig`) (L0: stdlib only)."""

from __future__ import annotations

import logging
import os
import re
import signal
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Optional, Union

from minitrain import knobs
from minitrain.config._ray_compat import _default_only, _deprecated_field, _ray_only, _ray_words, _reject_deprecated
from minitrain.config._validate import ReadOnlyDict, _choice, _fail, _int, _number, _optional_str, _suggests_fields
from minitrain.errors import ConfigError


@_suggests_fields
@dataclass(frozen=True, kw_only=True, slots=True)
class CheckpointConfig:
    """Which committed checkpoints to keep.

    `num_to_keep=None` keeps all; otherwise the best `num_to_keep` by `checkpoint_score_attribute`
    (a key of the rank-0 metrics, nested keys joined by "/"; None ranks by recency) in
    `checkpoint_score_order` ("max" or "min", exact case). The latest checkpoint is always kept too.

    `memory_tier_bytes` (minitrain's own): how many bytes of checkpoint files each host's memory tier may
    hold (docs/checkpoints.md, "The memory tier"). None (the default): a quarter of the host's memory and
    at most half the free space of `/dev/shm`; 0: no tier, every checkpoint goes from the worker
    straight to storage.
    """

    num_to_keep: Optional[int] = None
    checkpoint_score_attribute: Optional[str] = None
    checkpoint_score_order: str = "max"
    memory_tier_bytes: Optional[int] = None
    checkpoint_frequency: Any = _deprecated_field()
    checkpoint_at_end: Any = _deprecated_field()

    def __post_init__(self) -> None:
        _reject_deprecated("CheckpointConfig", {
            "checkpoint_frequency": self.checkpoint_frequency,
            "checkpoint_at_end": self.checkpoint_at_end,
        }, {
            "checkpoint_frequency": "Save a checkpoint by passing one to minitrain.report(metrics, "
                                    "checkpoint=...) at the steps you choose in the training function.",
            "checkpoint_at_end": "Pass a checkpoint to the last minitrain.report(...) call of the "
                                 "training function.",
        })
        if self.num_to_keep is not None:
            object.__setattr__(self, "num_to_keep", _int(
                self.num_to_keep, "CheckpointConfig", "num_to_keep", 1,
                "Use None to keep every checkpoint, or the number of best checkpoints to keep."
                + _ray_words(f"Received invalid num_to_keep: {self.num_to_keep}. "
                             "Must be None or an integer >= 1.")))
        if self.memory_tier_bytes is not None:
            object.__setattr__(self, "memory_tier_bytes", _int(
                self.memory_tier_bytes, "CheckpointConfig", "memory_tier_bytes", 0,
                "Use None for the default (a quarter of each host's memory), 0 for no memory tier, or a "
                "number of bytes, e.g. 8 << 30."))
        _optional_str(self.checkpoint_score_attribute, "CheckpointConfig", "checkpoint_score_attribute",
                      "Use None to rank checkpoints by recency, or a metric key you report, e.g. 'loss'.")
        _choice(self.checkpoint_score_order, "CheckpointConfig", "checkpoint_score_order", ("max", "min"),
                "Use 'max' when a higher score is better, 'min' when lower is better (e.g. a loss)."
                + _ray_words(f"Received invalid checkpoint_score_order: {self.checkpoint_score_order}. "
                             "Must be 'max' or 'min'."))


@_suggests_fields
@dataclass(frozen=True, kw_only=True, slots=True)
class FailureConfig:
    """How many failures a run survives, and how workers are judged hung and stopped.

    A failure of any rank restarts the whole worker group from the latest committed checkpoint while
    failures so far <= `max_failures` (0: the first failure is fatal; -1: unlimited).
    `worker_hang_timeout_s` (minitrain extension): when a rank that makes no progress counts as hung,
    which is a failure. Progress is a `report()` (its arrival at the coordinator), entering the
    training function, or starting or ending a checkpoint upload. "auto" (the default): a rank is hung
    past `max(worker_hang_floor_s, 10 x the slowest of its last 100 report intervals)` (the group's
    slowest while the rank has shown fewer than two; its pace is kept across restarts, and the
    interval spanning a start is not counted), and at least 1800 s until its first report of a later
    attempt (restore, recompilation). Nothing is judged before any rank showed a pace: the first
    steps of a run take a time nothing predicts. A number: a fixed deadline that also covers start-up
    and the first step: choose it longer than the slowest gap between two reports. None disables
    the check. While a rank uploads a checkpoint its deadline is at least 1800 s. When it fires,
    every thread's stack of every rank is dumped into the logs and the error, and ranks found
    waiting in a collective are marked consequences, not root causes. `worker_hang_floor_s` (minitrain extension; None means 600 s, torch's NCCL collective
    timeout): the shortest deadline "auto" sets; setting it with any other timeout raises.
    `worker_stop_grace_s` (minitrain extension): seconds between SIGTERM and SIGKILL when workers are
    stopped. `controller_failure_limit`: only -1 (the default) is accepted; any other value raises
    `ConfigError`, because minitrain has no separate controller budget: a failed worker-group
    start-up is a worker failure and counts against `max_failures` (set that instead).
    `preemption_signals` (minitrain extension; default ("SIGUSR2", "SIGTERM")): the signals that mark
    the run preempted when the driver or any node agent receives one (names such as "SIGUSR2" or
    numbers; stored as names; an empty tuple turns preemption off, and SIGTERM to the driver then
    stops the run as Ctrl-C does). Every rank then learns one agreed report round from the
    coordinator, `minitrain.get_preemption_info()` is non-None on every rank from that round on, the
    round commits, and `fit()` raises `PreemptionError` (docs/preemption.md).
    `preemption_timeout_s` (minitrain extension, default 20 s): the most time from the first
    preemption signal to the agreed round's commit; past it, or at a second signal, the workers are
    killed at once and the last committed checkpoint stands. Keep it below the scheduler's kill delay
    (Slurm's KillWait, Kubernetes' terminationGracePeriodSeconds: 30 s by default).
    `max_preemption_failures` (as Ray: an int >= -1, default -1 = unlimited): how many preemptions
    the run may be resumed from. A preemption ends the `fit()` it interrupts (its machines are going
    away), so the resume is the next `fit()` of the same run; `PreemptionError.resumable` is False
    once the run's preemptions exceed the budget (0: never resume). It never counts against
    `max_failures`. The run's one failure budget is the controller's `Rules`
    (`minitrain.coordinator.policy.decide`), built from this config.
    `max_attempts_without_progress` (minitrain extension, as NVIDIA's resiliency extension's
    `--ft-max-no-progress-cycles`; default 3; -1 never stops): the run stops with `NoProgressError` once
    that many attempts in a row failed without progress, whatever `max_failures` says (a restart on the
    same hosts would repeat the failure; `python -m minitrain.launch` exits 93, which schedulers are told
    not to retry). An attempt makes progress when it commits a report round beyond the furthest one the
    run had committed before it; the rounds an attempt redoes after resuming from an older checkpoint
    are not progress. An elastic resize and a preemption are not failures and are not counted.
    """

    max_failures: int = 0
    worker_hang_timeout_s: Union[float, str, None] = "auto"
    worker_hang_floor_s: Optional[float] = None
    worker_stop_grace_s: float = 5.0
    fail_fast: Any = _deprecated_field()
    controller_failure_limit: int = -1
    max_preemption_failures: int = -1
    relax_collectives_on_preemption: bool = False
    preemption_grace_s: float = 0.0
    preemption_signals: tuple = ("SIGUSR2", "SIGTERM")
    preemption_timeout_s: float = 20.0
    max_attempts_without_progress: int = 3

    def __post_init__(self) -> None:
        _reject_deprecated("FailureConfig", {"fail_fast": self.fail_fast}, {
            "fail_fast": "Use FailureConfig(max_failures=0) to stop at the first failure."})
        owner = "FailureConfig"
        object.__setattr__(self, "max_failures", _int(
            self.max_failures, owner, "max_failures", -1,
            "Use 0 to fail on the first error, N to retry up to N times, or -1 to retry without limit."))
        if self.worker_hang_timeout_s is not None and self.worker_hang_timeout_s != "auto":
            object.__setattr__(self, "worker_hang_timeout_s", _number(
                self.worker_hang_timeout_s, owner, "worker_hang_timeout_s", above=0,
                fix="Use 'auto' (the default: a deadline from each rank's pace), None to disable hang "
                    "detection, or the seconds without progress after which a rank counts as hung."))
        object.__setattr__(self, "worker_stop_grace_s", _number(
            self.worker_stop_grace_s, owner, "worker_stop_grace_s", at_least=0,
            fix="Use the seconds a stopping worker gets between SIGTERM and SIGKILL (0 kills at once)."))
        object.__setattr__(self, "controller_failure_limit", _default_only(
            self.controller_failure_limit, owner, "controller_failure_limit", -1,
            "minitrain has no separate budget for controller failures: a failed worker-group start-up "
            "counts against max_failures",
            "Remove controller_failure_limit and set max_failures instead (it counts start-up "
            "failures too)."))
        object.__setattr__(self, "max_preemption_failures", _int(
            self.max_preemption_failures, owner, "max_preemption_failures", -1,
            "Use -1 (the default) for unlimited, 0 to fail on the first preemption, or N to restart "
            "after up to N preemptions."))
        _ray_only(self.relax_collectives_on_preemption, owner, "relax_collectives_on_preemption", False,
                  "minitrain never leaves a rank out of a collective: a preemption stops every rank at "
                  "one agreed round",
                  "Remove it: on a preemption every rank checkpoints at the same agreed round "
                  "(docs/preemption.md).")
        _ray_only(self.preemption_grace_s, owner, "preemption_grace_s", 0.0,
                  "minitrain has no preemption deadline to extend past: the agreed round must commit "
                  "within preemption_timeout_s",
                  "Remove it; to give the agreed checkpoint more time, set preemption_timeout_s.")
        object.__setattr__(self, "preemption_signals", _signal_names(self.preemption_signals, owner))
        object.__setattr__(self, "preemption_timeout_s", _number(
            self.preemption_timeout_s, owner, "preemption_timeout_s", above=0,
            fix="Use the seconds a preempted run may take to commit its agreed checkpoint, below the "
                "scheduler's kill delay (e.g. 20 for Slurm's default KillWait of 30 s)."))
        no_progress_fix = ("Use N >= 1 to stop the run once N attempts in a row failed without committing a "
                           "new round (default 3), or -1 to restart as long as max_failures allows.")
        object.__setattr__(self, "max_attempts_without_progress", _int(
            self.max_attempts_without_progress, owner, "max_attempts_without_progress", -1, no_progress_fix))
        if self.max_attempts_without_progress == 0:  # 0 attempts cannot fail: no meaning to give it
            raise _fail(owner, "max_attempts_without_progress", "-1 or an int >= 1", 0, no_progress_fix)
        if self.worker_hang_floor_s is not None:
            object.__setattr__(self, "worker_hang_floor_s", _number(
                self.worker_hang_floor_s, owner, "worker_hang_floor_s", above=0,
                fix="Use None (600 s) or the shortest deadline, in seconds, that "
                    "worker_hang_timeout_s='auto' may set."))
            if self.worker_hang_timeout_s != "auto":
                raise ConfigError(
                    f"FailureConfig.worker_hang_floor_s={self.worker_hang_floor_s:g} only applies to "
                    f"worker_hang_timeout_s='auto', but worker_hang_timeout_s={self.worker_hang_timeout_s!r}. "
                    "Remove worker_hang_floor_s, or set worker_hang_timeout_s='auto'.")


@_suggests_fields
@dataclass(frozen=True, kw_only=True, slots=True)
class LoggingConfig:
    """Level of minitrain's loggers for a run; a `logging` level name, stored upper-cased."""

    log_level: str = "INFO"

    def __post_init__(self) -> None:
        level = self.log_level.upper() if isinstance(self.log_level, str) else None
        if level is None or not isinstance(logging.getLevelName(level), int):
            raise _fail("LoggingConfig", "log_level", "a logging level name", self.log_level,
                        "Use one of DEBUG, INFO, WARNING, ERROR, CRITICAL (any case).")
        object.__setattr__(self, "log_level", level)

    @property
    def level(self) -> int:
        """The numeric `logging` level, e.g. 20 for "INFO"."""
        return logging.getLevelName(self.log_level)


@_suggests_fields
@dataclass(frozen=True, kw_only=True, slots=True)
class MonitoringConfig:
    """How the driver watches a run: its straggler rule and its status line (a minitrain extension:
    Ray's RunConfig has no such field).

    A rank is a straggler while the median of its last `straggler_window` work times per step (about
    one telemetry sample a second) is at least `straggler_factor` times the other ranks' median, once
    it has `straggler_min_samples` samples (`minitrain.monitoring.stragglers`). Off a terminal the
    status is one summary line every `status_interval_s` seconds. A field left None takes its
    environment variable (`minitrain.knobs`: MINITRAIN_STRAGGLER_FACTOR, MINITRAIN_STRAGGLER_WINDOW,
    MINITRAIN_STRAGGLER_MIN_SAMPLES, MINITRAIN_STATUS_INTERVAL_S) when the config is built, else the
    default: 1.5, 10, 5 (or the window when that is smaller) and 30 s. The stored config holds the
    values in force; a bad one raises `ConfigError` naming the field (and its variable), the value
    and the fix.
    """

    straggler_factor: Optional[float] = None
    straggler_window: Optional[int] = None
    straggler_min_samples: Optional[int] = None
    status_interval_s: Optional[float] = None

    def __post_init__(self) -> None:
        owner = "MonitoringConfig"
        factor = knobs.STRAGGLER_FACTOR.get() if self.straggler_factor is None else _number(
            self.straggler_factor, owner, "straggler_factor", above=1,
            fix="Use e.g. 1.5 to flag a rank whose steps take 50% longer than the others'.")
        window = knobs.STRAGGLER_WINDOW.get() if self.straggler_window is None else _int(
            self.straggler_window, owner, "straggler_window", 1,
            "Use the number of telemetry samples (about one a second) whose median judges a rank, e.g. 10.")
        min_samples, knob = self.straggler_min_samples, knobs.STRAGGLER_MIN_SAMPLES
        if min_samples is None:  # unset everywhere: the default, or the window when that is smaller
            min_samples = min(knob.default, window) if knob.text() is None else knob.get()
        min_samples = _int(min_samples, owner, "straggler_min_samples", 1,
                           "Use the samples a rank needs before it is judged, at most straggler_window.")
        if min_samples > window:
            raise ConfigError(
                f"{owner}.straggler_min_samples (default: {knobs.STRAGGLER_MIN_SAMPLES.name}) must be at most "
                f"straggler_window ({window}; default: {knobs.STRAGGLER_WINDOW.name}), got {min_samples}. "
                f"Lower straggler_min_samples or raise straggler_window.")
        interval = knobs.STATUS_INTERVAL_S.get() if self.status_interval_s is None else _number(
            self.status_interval_s, owner, "status_interval_s", above=0,
            fix="Use the seconds between status lines off a terminal, e.g. 30.")
        for name, value in (("straggler_factor", factor), ("straggler_window", window),
                            ("straggler_min_samples", min_samples), ("status_interval_s", interval)):
            object.__setattr__(self, name, value)


_DEFAULT_STORAGE_PATH = "~/minitrain_results"
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
_RUNTIME_ENV_KEYS = ("env_vars", "working_dir")
# Ray's other runtime_env keys, each refused with why and what to do instead: minitrain starts workers
# with the hosts' own Python environment and files (it has no package cache and uploads no code).
_INSTALL_FIX = "install them on every host before the run (the same environment the driver uses)"
_REFUSED_RUNTIME_ENV_KEYS = {
    "pip": f"minitrain does not install packages: {_INSTALL_FIX}",
    "uv": f"minitrain does not install packages: {_INSTALL_FIX}",
    "conda": f"minitrain does not install packages or switch environments: {_INSTALL_FIX}",
    "py_modules": "minitrain does not upload modules: the workers import from the driver's sys.path, so "
                  "put the modules on a path every host shares, or install them on every host",
    "py_executable": "workers run under the Python that runs the agent on each host; start the run with "
                     "the interpreter you want",
    "container": "minitrain does not start containers: run the driver and agents inside the image",
    "image_uri": "minitrain does not start containers: run the driver and agents inside the image",
    "excludes": "minitrain does not upload working_dir (workers run in it on their own host), so there is "
                "nothing to exclude; remove it",
    "java_jars": "minitrain runs Python workers only; remove it",
    "nsight": "minitrain does not wrap workers in a profiler; start nsys inside the training function",
    "mpi": "minitrain does not launch workers through MPI; remove it",
    "config": "RuntimeEnvConfig (setup_timeout_seconds, eager_install) times a runtime environment's "
              "installation, which minitrain does not do; remove it",
    "worker_process_setup_hook": "call the setup function at the top of the training function instead",
}


def _default_name() -> str:
    return f"minitrain_run-{datetime.now():%Y-%m-%d_%H-%M-%S}"


def filesystem_kind(value: Any) -> Optional[str]:
    """"fsspec" for an fsspec filesystem, "pyarrow" for a `pyarrow.fs.FileSystem`, else None.

    Decided from the names of the object's classes, so neither library is imported to check (pyarrow is
    optional, and this module uses the standard library only)."""
    for cls in type(value).__mro__:
        qualified = f"{cls.__module__}.{cls.__qualname__}"
        if qualified == "fsspec.spec.AbstractFileSystem":
            return "fsspec"
        if qualified == "pyarrow._fs.FileSystem":
            return "pyarrow"
    return None


def bad_filesystem(where: str, value: Any) -> ConfigError:
    """The ConfigError for `value` given as the filesystem `where` (e.g. "RunConfig.storage_filesystem")."""
    kind = type(value)
    return ConfigError(
        f"{where} must be None, a pyarrow.fs.FileSystem or an fsspec filesystem, got {value!r} (type "
        f"{kind.__module__}.{kind.__qualname__}). Pass e.g. pyarrow.fs.S3FileSystem(...) or "
        f"fsspec.filesystem('s3', ...), or leave it None and give a URL such as 's3://bucket/runs'.")


def _storage_path(value: Any, has_filesystem: bool) -> str:
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str) or not value:
        raise _fail("RunConfig", "storage_path", "a non-empty str or path", value,
                    "Use a local directory (e.g. '~/minitrain_results') or a URL such as 's3://bucket/runs'; "
                    "multi-node runs need storage every node can reach.")
    if has_filesystem or _URL.match(value):
        return value  # a URL, or a path inside the given filesystem: not a local path to expand
    # Made absolute now: workers may start in other directories, and the path is the resume key.
    return os.path.abspath(os.path.expanduser(value))


def _env_vars(value: Any) -> ReadOnlyDict:
    where = "RunConfig.worker_runtime_env['env_vars']"
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where} must be a dict of str -> str, got {value!r}. "
                          f"For example {{'OMP_NUM_THREADS': '4'}}.")
    for key, val in value.items():
        if not isinstance(key, str) or not key or "=" in key or "\0" in key:
            raise ConfigError(f"{where} has the key {key!r}; environment variable names are non-empty "
                              f"str without '=' or NUL.")
        if not isinstance(val, str):
            raise ConfigError(f"{where}[{key!r}] must be a str, got {val!r}. Convert it, e.g. str({val!r}).")
        if "\0" in val:
            raise ConfigError(f"{where}[{key!r}] contains a NUL character, which environment values cannot hold.")
        if "${" in val:
            raise ConfigError(
                f"{where}[{key!r}]={val!r} references another variable: Ray expands ${{VAR}} from each worker's "
                f"environment, minitrain sets values as given. Spell the value out, or build it in the training "
                f"function (os.environ[{key!r}] = os.environ.get(...) + ...).")
    return ReadOnlyDict(value)


def _runtime_env(value: Any) -> ReadOnlyDict:
    if value is None:
        return ReadOnlyDict()
    if not isinstance(value, Mapping):
        raise _fail("RunConfig", "worker_runtime_env", "None or a dict", value,
                    "For example {'env_vars': {'OMP_NUM_THREADS': '4'}}.")
    for key in value:
        if key in _REFUSED_RUNTIME_ENV_KEYS:
            raise ConfigError(
                f"RunConfig.worker_runtime_env[{key!r}]={value[key]!r} is not supported: "
                f"{_REFUSED_RUNTIME_ENV_KEYS[key]}. minitrain supports only 'env_vars' and 'working_dir'; it "
                f"does not install packages (pip, conda, uv, py_modules).")
    unknown = [key for key in value if key not in _RUNTIME_ENV_KEYS]
    if unknown:
        raise ConfigError(
            f"RunConfig.worker_runtime_env has unsupported key(s) {', '.join(map(repr, unknown))} in "
            f"{dict(value)!r}. minitrain supports only 'env_vars' and 'working_dir'; it does not install "
            f"packages (pip, conda, uv, py_modules): install them on every host before the run.")
    env: dict[str, Any] = {}
    if "env_vars" in value:
        env["env_vars"] = _env_vars(value["env_vars"])
    if "working_dir" in value:
        working_dir = value["working_dir"]
        if isinstance(working_dir, os.PathLike):
            working_dir = os.fspath(working_dir)
        if not isinstance(working_dir, str) or not working_dir:
            raise ConfigError(f"RunConfig.worker_runtime_env['working_dir'] must be a non-empty str, got "
                              f"{working_dir!r}. Use the directory the workers should run in.")
        if _URL.match(working_dir) or working_dir.endswith((".zip", ".whl")):
            raise ConfigError(
                f"RunConfig.worker_runtime_env['working_dir']={working_dir!r}: minitrain does not download or "
                "unpack a working directory (Ray uploads it); workers run in a directory that exists on "
                "every host. Unpack it on every host (or on shared storage) and pass that path.")
        # Relative to the driver's directory, as Ray reads it; workers may start elsewhere.
        env["working_dir"] = os.path.abspath(os.path.expanduser(working_dir))
    return ReadOnlyDict(env)


# The hooks a RunConfig callback may have: Ray's UserCallback's two, then those of minitrain's trackers
# (minitrain.callbacks.Callback). A callback needs at least one of them.
CALLBACK_HOOKS = ("after_report", "after_exception", "on_run_start", "on_attempt_start", "on_report",
                  "on_checkpoint", "on_attempt_failure", "on_run_end")


def _callbacks(value: Any) -> tuple[Any, ...]:
    if value is None:
        return ()
    if not isinstance(value, (list, tuple)):
        raise _fail("RunConfig", "callbacks", "None or a list of callbacks", value,
                    "Pass e.g. callbacks=[MyCallback()], where MyCallback subclasses minitrain.UserCallback.")
    for index, callback in enumerate(value):
        kind = type(callback)
        if isinstance(callback, type):
            raise ConfigError(f"RunConfig.callbacks[{index}] is the class {callback.__qualname__}, not an "
                              f"instance. Pass {callback.__qualname__}(...).")
        if not any(callable(getattr(callback, hook, None)) for hook in CALLBACK_HOOKS):
            raise ConfigError(
                f"RunConfig.callbacks[{index}] must be a minitrain.UserCallback, a tracker from "
                f"minitrain.callbacks, or an object with one of the hooks {', '.join(CALLBACK_HOOKS)}; got "
                f"{callback!r} (type {kind.__module__}.{kind.__qualname__}). Ray Tune callbacks are not called "
                f"by a trainer: subclass minitrain.UserCallback, or use minitrain.callbacks.MLflowLoggerCallback, "
                f"WandbLoggerCallback, TensorBoardCallback, CSVLoggerCallback or JsonLoggerCallback.")
    return tuple(value)


def _instance(value: Any, cls: type, name: str) -> Any:
    if value is None:
        return cls()
    if not isinstance(value, cls):
        raise ConfigError(
            f"RunConfig.{name} must be None or a minitrain.{cls.__name__}, got {value!r} "
            f"(type {type(value).__module__}.{type(value).__qualname__}). Build it with "
            f"minitrain.{cls.__name__}(...); Ray's config classes are not accepted.")
    return value


@_suggests_fields
@dataclass(frozen=True, kw_only=True, slots=True)
class RunConfig:
    """Where a run writes and how it handles failures, checkpoints and logs.

    The run directory is `run_path` = `<storage_path>/<name>`; rerunning with the same `name` and
    `storage_path` resumes from its latest checkpoint. `name` defaults to
    `minitrain_run-YYYY-MM-DD_HH-MM-SS` (local time); `storage_path` to `~/minitrain_results`. Local
    paths are expanded and made absolute; URLs (`s3://`, `file://`, `memory://`, ...) and paths inside a
    given `storage_filesystem` (a `pyarrow.fs.FileSystem` or an fsspec filesystem; anything else raises
    `ConfigError`) are kept as given. None for a sub-config means its
    default; `worker_runtime_env` is stored as a read-only dict holding at most `env_vars` (str -> str,
    set on every worker as given; a `${VAR}` reference raises) and `working_dir` (every worker's
    directory, made absolute against the driver's; a URL or archive raises). Ray's other runtime_env
    keys (`pip`, `conda`, `uv`, `py_modules`, `container`, ...) raise `ConfigError` naming the key and
    what to do instead (`_REFUSED_RUNTIME_ENV_KEYS`). `callbacks` is None or a list of driver-side callbacks (stored as a
    tuple): `minitrain.UserCallback`s, the trackers of `minitrain.callbacks`, or any object with at
    least one of their hooks (`CALLBACK_HOOKS`); anything else raises `ConfigError` naming its index.
    `monitoring_config` (a minitrain extension, `MonitoringConfig`) sets the driver's straggler rule
    and status interval.
    """

    name: Optional[str] = None
    storage_path: Optional[str | os.PathLike] = None
    storage_filesystem: Any = None
    failure_config: Optional[FailureConfig] = None
    checkpoint_config: Optional[CheckpointConfig] = None
    callbacks: Optional[tuple[Any, ...]] = None
    worker_runtime_env: Optional[Mapping[str, Any]] = None
    logging_config: Optional[LoggingConfig] = None
    monitoring_config: Optional[MonitoringConfig] = None
    sync_config: Any = _deprecated_field()
    verbose: Any = _deprecated_field()
    stop: Any = _deprecated_field()
    progress_reporter: Any = _deprecated_field()
    log_to_file: Any = _deprecated_field()

    def __post_init__(self) -> None:
        _reject_deprecated("RunConfig", {
            "sync_config": self.sync_config, "verbose": self.verbose, "stop": self.stop,
            "progress_reporter": self.progress_reporter, "log_to_file": self.log_to_file,
        }, {
            "sync_config": "Workers write checkpoints straight to storage_path, so there is nothing to "
                           "sync; use a storage_path every node can reach (or storage_filesystem).",
            "verbose": "Set the detail of minitrain's logs with RunConfig(logging_config=LoggingConfig("
                       "log_level=...)).",
            "stop": "Stop from inside the training function: return from it when your condition is met.",
            "progress_reporter": "Metrics passed to minitrain.report() are logged and kept in the run "
                                 "directory (metrics.jsonl, Result.metrics_dataframe); for custom "
                                 "reporting, act on them inside the training function.",
            "log_to_file": "minitrain always writes each worker's output to "
                           "<storage_path>/<name>/logs/attempt_<n>/rank_<r>.log.",
        })
        object.__setattr__(self, "name", self._checked_name())
        if self.storage_filesystem is not None and filesystem_kind(self.storage_filesystem) is None:
            raise bad_filesystem("RunConfig.storage_filesystem", self.storage_filesystem)
        object.__setattr__(self, "storage_path", _storage_path(
            os.path.expanduser(_DEFAULT_STORAGE_PATH) if self.storage_path is None else self.storage_path,
            self.storage_filesystem is not None))
        for name, cls in (("failure_config", FailureConfig), ("checkpoint_config", CheckpointConfig),
                          ("logging_config", LoggingConfig), ("monitoring_config", MonitoringConfig)):
            object.__setattr__(self, name, _instance(getattr(self, name), cls, name))
        object.__setattr__(self, "callbacks", _callbacks(self.callbacks))
        object.__setattr__(self, "worker_runtime_env", _runtime_env(self.worker_runtime_env))

    def _checked_name(self) -> str:
        name = _default_name() if self.name is None else self.name
        if (not isinstance(name, str) or name in ("", ".", "..") or "/" in name or "\\" in name
                or "\0" in name):
            raise _fail("RunConfig", "name", "a non-empty str without '/' or '\\', other than '.' and '..'",
                        name, "The name is a directory created under storage_path and the key a rerun "
                              "resumes by; use e.g. 'resnet50-lr0.1', or None for a dated default.")
        return name

    @property
    def run_path(self) -> str:
        """`storage_path` and `name` joined with "/": the run directory, as a local path or URL."""
        separator = "" if self.storage_path.endswith("/") else "/"
        return f"{self.storage_path}{separator}{self.name}"


# Signals that cannot mark a preemption: uncaught (KILL, STOP), Ctrl-C's own (INT), or what every
# child's exit sends (CHLD).
_NOT_PREEMPTION_SIGNALS = frozenset({"SIGKILL", "SIGSTOP", "SIGINT", "SIGCHLD"})


def _signal_names(value: Any, owner: str) -> tuple[str, ...]:
    """`preemption_signals` as a tuple of signal names ("SIGUSR2"), from names or numbers."""
    fix = ('Use signal names or numbers, e.g. ("SIGUSR2", "SIGTERM") (the default), or () to turn '
           "preemption handling off.")
    if isinstance(value, (str, bytes)) or not isinstance(value, (tuple, list, frozenset, set)):
        raise _fail(owner, "preemption_signals", "a tuple of signals", value, fix)
    names: list[str] = []
    for item in value:
        try:
            if isinstance(item, str):
                name = item.upper() if item.upper().startswith("SIG") else "SIG" + item.upper()
                number = signal.Signals[name]
            elif isinstance(item, int) and not isinstance(item, bool):
                number = signal.Signals(item)
            else:
                raise KeyError(item)
        except (KeyError, ValueError):
            raise _fail(owner, "preemption_signals", "a tuple of signals", value,
                        f"{item!r} is not a signal here. " + fix) from None
        if number.name in _NOT_PREEMPTION_SIGNALS:
            raise _fail(owner, "preemption_signals", "a tuple of signals", value,
                        f"{number.name} cannot mark a preemption (it cannot be caught, or it means something "
                        "else to minitrain). " + fix)
        if number.name not in names:
            names.append(number.name)
    return tuple(names)
