"""The configs users pass to `TorchTrainer`: frozen, validated on construction (L0: stdlib only).

Names, fields and defaults follow Ray Train 2.60 ("Train V2"): `ScalingConfig`, `RunConfig`,
`CheckpointConfig`, `FailureConfig`, `LoggingConfig`, `DataConfig`, and `TorchConfig` (re-exported by
`minitrain.torch`). Every config is a frozen, keyword-only dataclass checked in `__post_init__`, so a
mistake surfaces where the config is written, before any process starts:

- a misspelled field raises `UnknownFieldError` (a `TypeError`, as Python's own, and a `ConfigError`)
  naming the field that was meant: `ScalingConfig(num_worker=2)` says "did you mean 'num_workers'?";
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
storage is `~/minitrain_results`; TPUs are rejected (elastic `num_workers=(min, max)` is supported:
docs/elastic.md); configs are
never mutated after construction (`TorchConfig.resolved_backend` replaces Ray's in-place backend
fill-in); mappings are stored as `ReadOnlyDict`; `worker_runtime_env` supports only `env_vars` and
`working_dir`; `FailureConfig.worker_hang_timeout_s`, `worker_hang_floor_s` and `worker_stop_grace_s`,
and `RunConfig.monitoring_config` (`MonitoringConfig`) are minitrain extensions.

The environment variables (``MINITRAIN_*``) are listed, parsed and read in one place:
`minitrain.knobs`.

One module per concern: `scaling` (ScalingConfig), `run` (RunConfig and the configs it holds:
CheckpointConfig, FailureConfig, LoggingConfig, MonitoringConfig), `data` (DataConfig), `torch_config`
(TorchConfig), `_validate` (the validation helpers and ReadOnlyDict) and `_ray_compat` (the Ray
arguments refused or accepted at their default only). Import the names from `minitrain.config`.
"""

from minitrain.config._validate import ReadOnlyDict, UnknownFieldError
from minitrain.config.data import DataConfig
from minitrain.config.run import (
    CALLBACK_HOOKS,
    CheckpointConfig,
    FailureConfig,
    LoggingConfig,
    MonitoringConfig,
    RunConfig,
    bad_filesystem,
    filesystem_kind,
)
from minitrain.config.scaling import ScalingConfig
from minitrain.config.torch_config import TorchConfig

__all__ = ["CALLBACK_HOOKS", "CheckpointConfig", "DataConfig", "FailureConfig", "LoggingConfig", "MonitoringConfig",
           "ReadOnlyDict", "RunConfig", "ScalingConfig", "TorchConfig", "UnknownFieldError", "bad_filesystem",
           "filesystem_kind"]
