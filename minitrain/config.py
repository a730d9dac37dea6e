"""The configs users pass to `TorchTrainer`: frozen, validated on construction (L0: stdlib only).

Names, fields and defaults follow Ray Train 2.60 ("Train V2"): `ScalingConfig`, `RunConfig`,
`CheckpointConfig`, `FailureConfig`, `LoggingConfig`, `DataConfig`, and `TorchConfig` (re-exported by
`minitrain.torch`). Every config is a frozen, keyword-only dataclass checked in `__post_init__`, so a
mistake surfaces where the config is written, before any process starts:

- a bad value raises `ConfigError` (a `ValueError`) naming the field, the value and the fix;
- a wrong type where Ray raises `TypeError` (`DataConfig.datasets_to_split`) raises `TypeError`;
- an argument Ray Train V2 removed raises `DeprecationWarning` *as an exception*, as Ray does, with the
  way to get the same effect in minitrain;
- an argument minitrain has no use for (Ray placement labels, accelerator types, TPU topology, Ray
  Data execution options, a controller failure budget, elastic resizing, preemption grace and relaxed
  collectives, resources other than CPU and GPU) is accepted at its default only: any other value
  raises `ConfigError` saying what to do instead, so a ported script never carries a setting that
  silently does nothing.

Where Ray's own tests match a fragment of Ray's error message, minitrain's message ends with Ray's
wording too (`(Ray: "...")`), so such a test still passes.

Deliberate differences from Ray: the default run name is `minitrain_run-<local time>` and the default
storage is `~/minitrain_results`; elastic `num_workers=(min, max)` and TPUs are rejected; configs are
never mutated after construction (`TorchConfig.resolved_backend` replaces Ray's in-place backend
fill-in); mappings are stored as `ReadOnlyDict`; `worker_runtime_env` supports only `env_vars` and
`working_dir`; `FailureConfig.worker_hang_timeout_s`, `worker_hang_floor_s` and `worker_stop_grace_s`,
and `RunConfig.monitoring_config` (`MonitoringConfig`) are minitrain extensions.

The environment variables (``MINITRAIN_*``) are listed, parsed and read in one place:
`minitrain.knobs`.
"""

from __future__ import annotations

import enum
import logging
import math
import numbers
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Optional, Union

from minitrain import knobs
from minitrain.errors import ConfigError

# From this many workers on, "auto" relays the workers' streams through their agents: one connection and
# batched messages per host instead of one per worker. Below it the coordinator absorbs every worker's
# stream at a few percent of a core, and the relay's hop would cost the hosts' CPUs more than it saves
# (README, "Control-plane scale").
RELAY_AUTO_FROM_WORKERS = 128


def relays_workers(num_workers: int) -> bool:
    """Whether a run of `num_workers` workers relays their streams through the node agents, as
    ``MINITRAIN_RELAY`` says (`minitrain.knobs.RELAY`); ConfigError names a value it does not know."""
    choice = knobs.RELAY.get()
    return num_workers >= RELAY_AUTO_FROM_WORKERS if choice is None else choice


class _Deprecated(enum.Enum):
    """Default of removed arguments, so 'not passed' differs from any value (None included).

    An enum member pickles by name, so the identity check survives pickling and `dataclasses.replace`.
    """

    DEPRECATED = "DEPRECATED"


_DEPRECATED = _Deprecated.DEPRECATED


def _deprecated_field() -> Any:
    return field(default=_DEPRECATED, repr=False, compare=False)


class ReadOnlyDict(dict):
    """A dict that refuses changes; configs store their mappings as these.

    Unlike `types.MappingProxyType` it pickles (configs travel to workers) and compares and serialises
    as a plain dict. `dict(d)` or `d.copy()` gives a mutable copy.
    """

    __slots__ = ()

    def _refuse(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("this mapping belongs to a frozen minitrain config and cannot be changed; "
                        "build a new config with dataclasses.replace(config, field=new_value)")

    __setitem__ = __delitem__ = __ior__ = _refuse
    clear = pop = popitem = setdefault = update = _refuse

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(frozenset(self.items()))

    def __reduce__(self):
        return (type(self), (dict(self),))


# ---------------------------------------------------------------------------------------------------
# Validation helpers. Each returns the normalised value or raises with field, value and fix.


def _fail(owner: str, name: str, requirement: str, value: Any, fix: str) -> ConfigError:
    return ConfigError(f"{owner}.{name} must be {requirement}, got {value!r}. {fix}")


def _int(value: Any, owner: str, name: str, minimum: int, fix: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise _fail(owner, name, f"an int >= {minimum}", value, fix)
    return int(value)


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def _number(value: Any, owner: str, name: str, *, above: float = -math.inf, at_least: float = -math.inf,
            fix: str) -> Any:
    if not _is_number(value) or not (value > above and value >= at_least):
        bound = f"> {above:g}" if above > -math.inf else f">= {at_least:g}"
        raise _fail(owner, name, f"a finite number {bound}", value, fix)
    return int(value) if isinstance(value, numbers.Integral) else float(value)


def _choice(value: Any, owner: str, name: str, choices: tuple[str, ...], fix: str = "") -> str:
    if not isinstance(value, str) or value not in choices:
        listed = ", ".join(repr(c) for c in choices)
        raise _fail(owner, name, f"one of {listed} (exact case)", value, fix or f"Use one of {listed}.")
    return value


def _optional_str(value: Any, owner: str, name: str, fix: str) -> Optional[str]:
    if value is not None and (not isinstance(value, str) or not value):
        raise _fail(owner, name, "None or a non-empty str", value, fix)
    return value


def _default_only(value: Any, owner: str, name: str, default: Any, why: str, fix: str) -> Any:
    """`value` when it is `default` (None, or an int such as -1), else a ConfigError saying why minitrain
    does not support the field and what to do instead."""
    if default is None:
        unsupported = value is not None
    else:  # an int default: True == 1 and -1.0 == -1 must not pass for it
        unsupported = isinstance(value, bool) or not isinstance(value, numbers.Integral) or value != default
    if unsupported:
        raise ConfigError(f"{owner}.{name} must be {default!r} (the default), got {value!r}: {why}. {fix}")
    return default


def _ray_only(value: Any, owner: str, name: str, default: Any, why: str, fix: str) -> Any:
    """`default` when `value` equals it (and has its type), else a ConfigError: a Ray argument that minitrain
    accepts at its default only, because the feature behind it does not exist in minitrain yet."""
    same_type = type(value) is type(default) or (_is_number(value) and _is_number(default)
                                                 and not isinstance(default, bool))
    if not same_type or value != default:
        raise ConfigError(f"{owner}.{name}={value!r} is not supported by minitrain yet ({why}); only the "
                          f"default {default!r} is accepted. {fix}")
    return default


def _ray_words(text: str) -> str:
    """Ray's wording of the same error, appended so that a test matching Ray's message still passes."""
    return f' (Ray: "{text}")'


def _reject_deprecated(owner: str, passed: dict[str, Any], hints: dict[str, str]) -> None:
    for arg, value in passed.items():
        if value is not _DEPRECATED:
            raise DeprecationWarning(f"{owner}({arg}={value!r}) was removed in Ray Train V2, which minitrain "
                                     f"mirrors. {hints[arg]}")


# ---------------------------------------------------------------------------------------------------


_PLACEMENT_STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")
_CANONICAL_RESOURCES = ("CPU", "GPU", "TPU", "memory")
_HOSTS_FIX = ("minitrain places workers only on the hosts you list (minitrain.init(hosts=...) or "
              "hostfile=..., i.e. ClusterConfig; --hosts/--hostfile for python -m minitrain.launch; "
              "MINITRAIN_HOSTS) and on their GPUs through use_gpu=True and resources_per_worker={'GPU': n}, "
              "so choose the hosts there")


def _resources_per_worker(value: Any, use_gpu: bool) -> Optional[ReadOnlyDict]:
    if value is None:
        return None
    owner, name = "ScalingConfig", "resources_per_worker"
    if not isinstance(value, Mapping):
        raise _fail(owner, name, "None or a dict of resource name -> amount", value,
                    'For example resources_per_worker={"CPU": 4, "GPU": 1}.')
    kept: dict[str, Any] = {}
    for key, amount in value.items():
        if not isinstance(key, str) or not key:
            raise ConfigError(f"{owner}.{name} has the key {key!r}; resource names are non-empty strings "
                              f"such as 'CPU', 'GPU' or 'memory'.")
        canonical = next((c for c in _CANONICAL_RESOURCES if c.lower() == key.lower()), key)
        if canonical != key:
            raise ConfigError(f"{owner}.{name} has the key {key!r}; resource names are case-sensitive. "
                              f"Use {canonical!r}.")
        kept_amount = _number(amount, owner, f"{name}[{key!r}]", at_least=0,
                              fix="Use an amount >= 0 (fractions are allowed; 0 drops the resource).")
        if kept_amount and key not in ("CPU", "GPU"):
            raise ConfigError(
                f"{owner}.{name} has {key!r}: {amount!r}, but minitrain reserves only 'CPU' and 'GPU' per "
                f"worker and does not support {key!r}. Remove {key!r} (or set it to 0); {_HOSTS_FIX}: "
                f"list only hosts that have enough {key!r}.")
        if kept_amount:
            kept[key] = kept_amount
    if not use_gpu and "GPU" in kept:
        raise ConfigError(f"{owner}.{name} has 'GPU': {kept['GPU']!r} but use_gpu=False. Either set "
                          f"use_gpu=True or remove 'GPU' from resources_per_worker."
                          + _ray_words("`use_gpu` is False but `GPU` was found in `resources_per_worker`."))
    if use_gpu and "GPU" in value and "GPU" not in kept:
        raise ConfigError(f"{owner}.{name} has 'GPU': {value['GPU']!r} but use_gpu=True. Either set "
                          f"use_gpu=False or give each worker a positive 'GPU' amount."
                          + _ray_words("`use_gpu` is True but `GPU` is set to 0 in `resources_per_worker`."))
    return ReadOnlyDict(kept)


@dataclass(frozen=True, kw_only=True, slots=True)
class ScalingConfig:
    """How many workers to start and what each one reserves.

    `num_workers=0` runs the training function in the driver process (local mode). With
    `resources_per_worker=None` each worker takes 1 CPU, or 1 GPU and no CPU when `use_gpu=True`.
    `resources_per_worker` holds 'CPU' and 'GPU' amounts only; zero amounts are dropped; the stored
    mapping is read-only and does not contain the implied `GPU: 1` of `use_gpu=True` (see
    `effective_resources_per_worker`). Workers are placed on the hosts the user lists
    (`minitrain.init(hosts=...)` / `ClusterConfig`, or the launcher's `--hosts`), so choose hosts
    there. Raises `ConfigError` for elastic `(min, max)` worker counts, `use_tpu=True`, any other
    resource name ('memory', 'TPU', custom names), and any `accelerator_type`, `label_selector` or
    `topology` but None (minitrain does not select hosts by accelerator type or labels, and has no
    TPUs); the defaults are accepted, so a Ray script that leaves them unset ports unchanged.
    """

    num_workers: int = 1
    use_gpu: bool = False
    resources_per_worker: Optional[Mapping[str, float]] = None
    placement_strategy: str = "PACK"
    accelerator_type: Optional[str] = None
    trainer_resources: Any = _deprecated_field()
    label_selector: Any = None
    use_tpu: bool = False
    topology: Optional[str] = None
    elastic_resize_monitor_interval_s: float = 60.0

    def __post_init__(self) -> None:
        if self.trainer_resources is not None:  # Ray's default is None, so None stays accepted
            _reject_deprecated("ScalingConfig", {"trainer_resources": self.trainer_resources}, {
                "trainer_resources": "The minitrain coordinator needs no reserved resources; remove "
                                     "trainer_resources and size the workers with resources_per_worker."})
        owner = "ScalingConfig"
        if isinstance(self.num_workers, tuple):
            raise ConfigError(f"{owner}.num_workers={self.num_workers!r} asks for elastic training, which "
                              f"minitrain does not support. Pass an int: the number of worker processes "
                              f"(0 runs the training function in this process).")
        object.__setattr__(self, "num_workers", _int(
            self.num_workers, owner, "num_workers", 0,
            "Use 0 to run the training function in this process (local mode), or the number of worker "
            "processes to start."))
        for flag in ("use_gpu", "use_tpu"):
            if not isinstance(getattr(self, flag), bool):
                raise _fail(owner, flag, "True or False", getattr(self, flag), "Pass a bool.")
        if self.use_tpu:
            raise _fail(owner, "use_tpu", "False", True, "minitrain does not support TPUs; use CPUs or GPUs.")
        object.__setattr__(self, "resources_per_worker",
                           _resources_per_worker(self.resources_per_worker, self.use_gpu))
        _choice(self.placement_strategy, owner, "placement_strategy", _PLACEMENT_STRATEGIES)
        _default_only(self.accelerator_type, owner, "accelerator_type", None,
                      "minitrain does not select hosts or GPUs by accelerator type",
                      f"Remove accelerator_type; {_HOSTS_FIX}: list only hosts with that accelerator.")
        _default_only(self.label_selector, owner, "label_selector", None,
                      "minitrain does not select hosts by label",
                      f"Remove label_selector; {_HOSTS_FIX}: list only the hosts the labels would select.")
        _default_only(self.topology, owner, "topology", None,
                      "topology is a TPU setting and minitrain does not support TPUs",
                      "Remove topology and train on CPUs or GPUs.")
        _ray_only(self.elastic_resize_monitor_interval_s, owner, "elastic_resize_monitor_interval_s", 60.0,
                  "it paces elastic resizing, and minitrain has no elastic training",
                  "Remove elastic_resize_monitor_interval_s; num_workers is a fixed int.")

    @property
    def local_mode(self) -> bool:
        """True when `num_workers == 0`: the training function runs in the driver process."""
        return self.num_workers == 0

    @property
    def min_workers(self) -> int:
        """Smallest worker count; equals `num_workers` (minitrain has no elastic training)."""
        return self.num_workers

    @property
    def max_workers(self) -> int:
        """Largest worker count; equals `num_workers` (minitrain has no elastic training)."""
        return self.num_workers

    @property
    def effective_resources_per_worker(self) -> dict[str, float]:
        """What one worker reserves, as a new dict of floats.

        `{"GPU": 1.0}` with `use_gpu` else `{"CPU": 1.0}` when `resources_per_worker` is None; otherwise
        `resources_per_worker` plus `GPU: 1.0` when `use_gpu` and no GPU amount was given (as Ray).
        """
        if self.resources_per_worker is None:
            return {"GPU": 1.0} if self.use_gpu else {"CPU": 1.0}
        resources = {key: float(amount) for key, amount in self.resources_per_worker.items()}
        if self.use_gpu:
            resources.setdefault("GPU", 1.0)
        return resources

    @property
    def num_cpus_per_worker(self) -> float:
        """CPUs per worker: 1.0 by default for CPU workers, 0.0 for GPU workers unless given (as Ray)."""
        return self.effective_resources_per_worker.get("CPU", 0.0)

    @property
    def num_gpus_per_worker(self) -> float:
        """GPUs per worker: 0.0 unless `use_gpu`; then 1.0 unless `resources_per_worker` says otherwise."""
        return self.effective_resources_per_worker.get("GPU", 0.0)

    @property
    def additional_resources_per_worker(self) -> dict[str, float]:
        """Per-worker resources other than CPU and GPU, as a new dict: always empty, because
        `resources_per_worker` accepts only 'CPU' and 'GPU' (kept for Ray compatibility)."""
        return {k: v for k, v in self.effective_resources_per_worker.items() if k not in ("CPU", "GPU")}

    @property
    def total_resources(self) -> dict[str, float]:
        """Per-worker resources times `num_workers` (the coordinator takes none), as a new dict.

        `ScalingConfig(num_workers=4).total_resources == {"CPU": 4.0}`.
        """
        return {key: amount * self.num_workers for key, amount in self.effective_resources_per_worker.items()}


@dataclass(frozen=True, kw_only=True, slots=True)
class CheckpointConfig:
    """Which committed checkpoints to keep.

    `num_to_keep=None` keeps all; otherwise the best `num_to_keep` by `checkpoint_score_attribute`
    (a key of the rank-0 metrics, nested keys joined by "/"; None ranks by recency) in
    `checkpoint_score_order` ("max" or "min", exact case). The latest checkpoint is always kept too.
    """

    num_to_keep: Optional[int] = None
    checkpoint_score_attribute: Optional[str] = None
    checkpoint_score_order: str = "max"
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
        _optional_str(self.checkpoint_score_attribute, "CheckpointConfig", "checkpoint_score_attribute",
                      "Use None to rank checkpoints by recency, or a metric key you report, e.g. 'loss'.")
        _choice(self.checkpoint_score_order, "CheckpointConfig", "checkpoint_score_order", ("max", "min"),
                "Use 'max' when a higher score is better, 'min' when lower is better (e.g. a loss)."
                + _ray_words(f"Received invalid checkpoint_score_order: {self.checkpoint_score_order}. "
                             "Must be 'max' or 'min'."))


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
    the check. While a rank uploads a checkpoint its deadline is at least 1800 s. When it fires, every thread's stack of every rank is dumped into the
    logs and the error, and ranks found waiting in a collective are marked consequences, not root
    causes. `worker_hang_floor_s` (minitrain extension; None means 600 s, torch's NCCL collective
    timeout): the shortest deadline "auto" sets; setting it with any other timeout raises.
    `worker_stop_grace_s` (minitrain extension): seconds between SIGTERM and SIGKILL when workers are
    stopped. `controller_failure_limit`: only -1 (the default) is accepted; any other value raises
    `ConfigError`, because minitrain has no separate controller budget: a failed worker-group
    start-up is a worker failure and counts against `max_failures` (set that instead).
    `max_preemption_failures` (as Ray: an int >= -1, default -1 = unlimited): in Ray the budget for
    node preemptions, counted apart from `max_failures`. minitrain does not detect preemptions yet, so
    it validates the value and uses it nowhere: every failure, a preempted node's included, counts
    against `max_failures`. The run's one failure budget is the controller's `Rules`
    (`minitrain.coordinator.decide`), built from this config.
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
                  "minitrain does not detect preemptions, so no rank is ever left out of a collective",
                  "Remove it: every preemption is a failure that restarts the whole worker group from the "
                  "latest checkpoint (budget: max_failures).")
        _ray_only(self.preemption_grace_s, owner, "preemption_grace_s", 0.0,
                  "minitrain does not detect preemptions, so there is no preemption deadline to extend",
                  "Remove it; to give stopping workers more time between SIGTERM and SIGKILL, set "
                  "worker_stop_grace_s.")
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


@dataclass(frozen=True, kw_only=True, slots=True)
class MonitoringConfig:
    """How the driver watches a run: its straggler rule and its status line (a minitrain extension:
    Ray's RunConfig has no such field).

    A rank is a straggler while the median of its last `straggler_window` work times per step (about
    one telemetry sample a second) is at least `straggler_factor` times the other ranks' median, once
    it has `straggler_min_samples` samples (`minitrain.coordinator.stragglers`). Off a terminal the
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
    return ReadOnlyDict(value)


def _runtime_env(value: Any) -> ReadOnlyDict:
    if value is None:
        return ReadOnlyDict()
    if not isinstance(value, Mapping):
        raise _fail("RunConfig", "worker_runtime_env", "None or a dict", value,
                    "For example {'env_vars': {'OMP_NUM_THREADS': '4'}}.")
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
        env["working_dir"] = working_dir
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


@dataclass(frozen=True, kw_only=True, slots=True)
class RunConfig:
    """Where a run writes and how it handles failures, checkpoints and logs.

    The run directory is `run_path` = `<storage_path>/<name>`; rerunning with the same `name` and
    `storage_path` resumes from its latest checkpoint. `name` defaults to
    `minitrain_run-YYYY-MM-DD_HH-MM-SS` (local time); `storage_path` to `~/minitrain_results`. Local
    paths are expanded and made absolute; URLs (`s3://`, `file://`, `memory://`, ...) and paths inside a
    given `storage_filesystem` (a `pyarrow.fs.FileSystem` or an fsspec filesystem; anything else raises
    `ConfigError`) are kept as given. None for a sub-config means its
    default; `worker_runtime_env` is stored as a read-only dict holding at most `env_vars` (str -> str)
    and `working_dir` (str). `callbacks` is None or a list of driver-side callbacks (stored as a
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


_BACKENDS = ("gloo", "nccl", "mpi")


@dataclass(frozen=True, kw_only=True, slots=True)
class TorchConfig:
    """How workers set up `torch.distributed`.

    `backend=None` means "nccl" with GPUs, else "gloo": ask `resolved_backend(use_gpu)`. Unlike Ray,
    which overwrites `backend` inside `TorchTrainer`, minitrain never changes the config.
    `init_method` is "env" or "tcp", accepted for Ray compatibility: both rendezvous through the
    TCPStore that rank 0 opens on a port the kernel picks (what `env://` and `tcp://` do inside torch,
    without a port chosen in advance that another process could take), and both set MASTER_ADDR and
    MASTER_PORT to it, because DeepSpeed, Lightning and Accelerate read them (Ray leaves them unset
    with "tcp"). `timeout_s` becomes the process-group timeout in seconds.
    """

    backend: Optional[str] = None
    init_method: str = "env"
    timeout_s: float = 1800

    def __post_init__(self) -> None:
        if self.backend is not None and self.backend not in _BACKENDS:
            raise _fail("TorchConfig", "backend", "None or one of 'gloo', 'nccl', 'mpi'", self.backend,
                        "Use None to pick 'nccl' with GPUs and 'gloo' without, or name one of these.")
        _choice(self.init_method, "TorchConfig", "init_method", ("env", "tcp"))
        object.__setattr__(self, "timeout_s", _number(
            self.timeout_s, "TorchConfig", "timeout_s", above=0,
            fix="Use the seconds a collective may wait before the process group times out (default 1800)."))

    def resolved_backend(self, use_gpu: bool) -> str:
        """The backend to use: `backend` if set, else "nccl" when `use_gpu` and "gloo" otherwise."""
        if self.backend is not None:
            return self.backend
        return "nccl" if use_gpu else "gloo"

    def to_dict(self) -> dict[str, Any]:
        """The fields as a new plain dict (as Ray's `TorchConfig.to_dict`)."""
        return {"backend": self.backend, "init_method": self.init_method, "timeout_s": self.timeout_s}


@dataclass(frozen=True, kw_only=True, slots=True)
class DataConfig:
    """Which datasets are split across workers: "all" or a list of dataset names (stored as a tuple).

    Split datasets give each rank a disjoint shard; the others give every rank the full data. Anything
    other than "all" or a list/tuple of str raises `TypeError`, as Ray does; `TorchTrainer` refuses a
    name that is not in its `datasets`. `execution_options` steers Ray Data's streaming executor,
    which minitrain does not have: only None (the default) is accepted, anything else raises
    `ConfigError`. `enable_shard_locality` must be a bool; True and False give identical runs: Ray
    uses it to hand each worker blocks already stored on its node, while in minitrain there is no
    locality to enable: a rank's rows are a pure function of the row count, world size, rank,
    epoch, seeds and batching options (`minitrain.data.sharding`), and each worker reads them itself
    from where the dataset lives (its files, the staging directory, the run's payload, or the
    function that builds it), so the value cannot change which rows a rank reads, their order, or
    where they are read from.
    """

    datasets_to_split: Any = "all"
    execution_options: Any = None
    enable_shard_locality: bool = True

    def __post_init__(self) -> None:
        value = self.datasets_to_split
        if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
            object.__setattr__(self, "datasets_to_split", tuple(value))
        elif not (isinstance(value, str) and value == "all"):
            raise TypeError(
                f"DataConfig.datasets_to_split must be 'all' or a list of dataset names (str), got "
                f"{value!r}. For example DataConfig(datasets_to_split=['train'])."
                + _ray_words("`datasets_to_split` should be a 'all' or a list of strings of dataset names. "
                             f"Received {type(value).__name__} with value {value}."))
        _default_only(self.execution_options, "DataConfig", "execution_options", None,
                      "execution options steer Ray Data's streaming executor, which minitrain does not have",
                      "Remove execution_options: each worker reads its own shard directly (see "
                      "minitrain.data); size batches with iter_torch_batches(batch_size=...).")
        if not isinstance(self.enable_shard_locality, bool):
            raise _fail("DataConfig", "enable_shard_locality", "True or False", self.enable_shard_locality,
                        "Pass a bool; either value gives the same run (see DataConfig).")

    def should_split(self, name: str) -> bool:
        """Whether the dataset called `name` is split across workers."""
        return self.datasets_to_split == "all" or name in self.datasets_to_split
