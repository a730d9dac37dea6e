"""`ScalingConfig`: how many workers a run starts and what each one reserves (L0: stdlib only)."""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Optional, Union

from minitrain.config._ray_compat import _default_only, _deprecated_field, _ray_only, _ray_words, _reject_deprecated
from minitrain.config._validate import ReadOnlyDict, _choice, _fail, _int, _number, _suggests_fields
from minitrain.errors import ConfigError


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
        if kept_amount and key not in ("CPU", "GPU", "memory"):
            raise ConfigError(
                f"{owner}.{name} has {key!r}: {amount!r}, but minitrain reserves only 'CPU', 'GPU' and 'memory' "
                f"per worker and does not support {key!r}. Remove {key!r} (or set it to 0); {_HOSTS_FIX}: "
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


_NUM_WORKERS_FIX = ("Pass an int (the number of worker processes; 0 runs the training function in this process: "
                    "local mode), "
                    "or an elastic (min, max) pair of ints with 1 <= min <= max, e.g. num_workers=(1, 4).")


def _check_num_workers(config: "ScalingConfig") -> None:
    """`num_workers` is an int >= 0 or a `(min, max)` tuple of ints with 1 <= min <= max (stored as a
    tuple of ints, as given)."""
    value, owner = config.num_workers, "ScalingConfig"
    if isinstance(value, (tuple, list)):
        if len(value) != 2 or any(isinstance(v, bool) or not isinstance(v, numbers.Integral) for v in value):
            raise _fail(owner, "num_workers", "an int or a (min, max) tuple of two ints", value, _NUM_WORKERS_FIX)
        low, high = int(value[0]), int(value[1])
        if low < 1 or low > high:
            raise ConfigError(f"{owner}.num_workers={tuple(value)!r} is not a valid elastic (min, max) range: it "
                              f"needs 1 <= min <= max. {_NUM_WORKERS_FIX}")
        object.__setattr__(config, "num_workers", (low, high))
        return
    object.__setattr__(config, "num_workers", _int(value, owner, "num_workers", 0, _NUM_WORKERS_FIX))


def _check_resize_interval(config: "ScalingConfig") -> None:
    """An elastic run's `elastic_resize_monitor_interval_s`: a number > 0. A fixed-size run accepts the
    default only (there is nothing to resize)."""
    owner, name = "ScalingConfig", "elastic_resize_monitor_interval_s"
    if not isinstance(config.num_workers, tuple):
        _ray_only(config.elastic_resize_monitor_interval_s, owner, name, 60.0,
                  "it paces elastic resizing, and num_workers is a fixed int",
                  "Remove elastic_resize_monitor_interval_s, or make num_workers an elastic (min, max) pair.")
        return
    object.__setattr__(config, name, float(_number(
        config.elastic_resize_monitor_interval_s, owner, name, above=0,
        fix="Give the seconds between growth checks of an elastic run, e.g. 60 (Ray's default) or 5.")))


@_suggests_fields
@dataclass(frozen=True, kw_only=True, slots=True)
class ScalingConfig:
    """How many workers to start and what each one reserves.

    `num_workers=0` runs the training function in the driver process (local mode). With
    `resources_per_worker=None` each worker takes 1 CPU, or 1 GPU and no CPU when `use_gpu=True`.
    `resources_per_worker` holds 'CPU', 'GPU' and 'memory' (bytes, as Ray) amounts only; zero amounts
    are dropped; named CPUs and memory are claimed in each host's resource ledger (runs wait for each
    other: `minitrain.hosts.reserve`), never enforced on the worker processes; the stored
    mapping is read-only and does not contain the implied `GPU: 1` of `use_gpu=True` (see
    `effective_resources_per_worker`). Workers are placed on the hosts the user lists
    (`minitrain.init(hosts=...)` / `ClusterConfig`, or the launcher's `--hosts`), so choose hosts
    there. `num_workers=(min, max)` is elastic (as Ray's, docs/elastic.md): the run starts with as many
    workers as the hosts that answer hold, between `min` and `max`, shrinks to the survivors when a host
    is lost (not a failure) and grows back at a checkpoint boundary, at most once per
    `elastic_resize_monitor_interval_s` (> 0; only an elastic run takes a value other than the
    default). Raises `ConfigError` for `use_tpu=True`, any other
    resource name ('TPU', custom names), and any `accelerator_type`, `label_selector` or
    `topology` but None (minitrain does not select hosts by accelerator type or labels, and has no
    TPUs); the defaults are accepted, so a Ray script that leaves them unset ports unchanged.
    """

    num_workers: Union[int, tuple[int, int]] = 1
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
        _check_num_workers(self)
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
        _check_resize_interval(self)

    @property
    def local_mode(self) -> bool:
        """True when `num_workers == 0`: the training function runs in the driver process."""
        return self.num_workers == 0

    @property
    def elasticity_enabled(self) -> bool:
        """True when `num_workers` is a `(min, max)` pair (docs/elastic.md)."""
        return isinstance(self.num_workers, tuple)

    @property
    def min_workers(self) -> int:
        """Smallest worker count: `num_workers`, or `min` of an elastic `(min, max)`."""
        return self.num_workers[0] if isinstance(self.num_workers, tuple) else self.num_workers

    @property
    def max_workers(self) -> int:
        """Largest worker count: `num_workers`, or `max` of an elastic `(min, max)` (what a run asks for
        and what its resources are reserved for)."""
        return self.num_workers[1] if isinstance(self.num_workers, tuple) else self.num_workers

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
        """Per-worker resources other than CPU and GPU, as a new dict: 'memory' when named (the only
        other resource `resources_per_worker` accepts)."""
        return {k: v for k, v in self.effective_resources_per_worker.items() if k not in ("CPU", "GPU")}

    @property
    def total_resources(self) -> dict[str, float]:
        """Per-worker resources times `max_workers` (the coordinator takes none), as a new dict.

        `ScalingConfig(num_workers=4).total_resources == {"CPU": 4.0}`.
        """
        return {key: amount * self.max_workers for key, amount in self.effective_resources_per_worker.items()}
