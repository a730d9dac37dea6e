"""The callback classes users subclass, and the run context every hook receives (L3).

`UserCallback` is Ray Train's (`ray.train.UserCallback`): `after_report` and `after_exception`.
`Callback` adds the hooks minitrain's trackers use (run start/end, attempt start/failure, each
report of rank 0, each committed checkpoint). Both run in the driver, on one thread per run that
`minitrain.callbacks.runner.CallbackRunner` owns, never on the controller's thread.
"""

from __future__ import annotations

import importlib
import json
import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from minitrain.checkpoint import Checkpoint
from minitrain.config import DataConfig, RunConfig, ScalingConfig, TorchConfig
from minitrain.storage.filesystem import Storage
from minitrain.storage.layout import TRACKERS_DIR
from minitrain.storage.retention import flatten_metrics

STATE_FILE = f"{TRACKERS_DIR}/state.json"


@dataclass(frozen=True)
class TrainRunContext:
    """What a callback knows of the run (Ray's `TrainRunContext`, plus minitrain's run directory).

    `run_id` is new for every `fit()` (a restart inside one fit() keeps it; a resume gets a new one).
    `train_loop_config`, `scaling_config`, `backend_config` (the `TorchConfig`), `datasets` and
    `dataset_config` are the trainer's, as given. `load_state`/`save_state` keep small JSON values in
    the run directory (`trackers/state.json`), so a tracker finds its run again after a restart or a
    resume of the same `RunConfig(name, storage_path)`.
    """

    run_id: str
    run_config: RunConfig
    train_loop_config: Optional[Dict[str, Any]]
    scaling_config: ScalingConfig
    backend_config: TorchConfig
    datasets: Dict[str, Any]
    dataset_config: DataConfig
    storage: Storage = field(repr=False, compare=False)

    def get_run_config(self) -> RunConfig:
        """The run's `RunConfig` (as Ray)."""
        return self.run_config

    @property
    def run_path(self) -> str:
        """The run directory as a path or URL (`<storage_path>/<name>`; for `memory://` runs, the
        local mirror the run uses while it runs)."""
        return self.storage.url()

    @property
    def local_run_dir(self) -> Optional[str]:
        """The run directory as a local path, or None when it is not on this machine's filesystem."""
        return self.storage.path() if self.storage.is_local else None

    def load_state(self, key: str) -> dict:
        """The JSON object saved under `key` by an earlier `save_state` of this run directory ({} if none)."""
        if not self.storage.exists(STATE_FILE):
            return {}
        value = json.loads(self.storage.read_text(STATE_FILE)).get(key)
        return value if isinstance(value, dict) else {}

    def save_state(self, key: str, value: dict) -> None:
        """Keep the JSON-safe `value` under `key` in the run directory (replaced atomically)."""
        state = json.loads(self.storage.read_text(STATE_FILE)) if self.storage.exists(STATE_FILE) else {}
        state[key] = value
        self.storage.write_text_atomic(STATE_FILE, json.dumps(state, indent=1, sort_keys=True))

    def config_to_log(self) -> dict:
        """What trackers log once as the run's configuration: `train_loop_config` and the scaling, as
        JSON-safe values (anything else becomes its `repr`)."""
        scaling = self.scaling_config
        return json_safe({
            "train_loop_config": dict(self.train_loop_config or {}),
            "scaling_config": {"num_workers": scaling.num_workers, "use_gpu": scaling.use_gpu,
                               "resources_per_worker": dict(scaling.effective_resources_per_worker)},
        })


def json_safe(value: Any) -> Any:
    """`value` with every leaf a JSON value: containers kept, others replaced by their `repr`."""
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    return repr(value)


def flatten(metrics: dict) -> dict:
    """Nested dicts flattened with "/" between keys (Ray's convention for metric names)."""
    return flatten_metrics(metrics)


def numeric(metrics: dict) -> dict:
    """The flattened metrics that are real numbers (bools excluded), as floats: what trackers plot."""
    return {k: float(v) for k, v in flatten(metrics).items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)}


class UserCallback:
    """Ray Train's driver-side callback: subclass it and pass an instance in `RunConfig(callbacks=[...])`.

    Hooks run in the driver, one call at a time, in the order of `callbacks`, on a thread of their own
    (a slow hook never holds up training; `fit()` waits for the calls still queued when the run ends,
    up to `CallbackRunner.drain_timeout_s`). A hook that raises is logged with its traceback and the
    run goes on (Ray fails the run instead; see docs/porting.md).
    """

    def after_report(self, run_context: TrainRunContext, metrics: List[Dict[str, Any]],
                     checkpoint: Optional[Checkpoint]) -> None:
        """Every rank answered one report round: `metrics[r]` is rank r's metrics ({} for a rank that
        had finished without reporting the round); `checkpoint` is the committed checkpoint of the round
        on the run's storage, or None when no rank passed one. With `num_to_keep`, a callback that lags
        behind by more than `num_to_keep` checkpoints may find this one already deleted."""

    def after_exception(self, run_context: TrainRunContext, worker_exceptions: Dict[int, Exception]) -> None:
        """An attempt failed: `worker_exceptions[r]` is the exception of each failed rank r (the worker's
        own exception when it could be unpickled in the driver, else a minitrain error describing it)."""


class Callback(UserCallback):
    """A `UserCallback` with the hooks of minitrain's trackers; override the ones you need.

    `step` is the run-wide index of the report round (the `report_index` of checkpoints): it grows
    across restarts and resumes, so a tracker never sees a step twice (except after a crash of the
    driver itself, which can replay the rounds after the last committed checkpoint).
    """

    def on_run_start(self, run_context: TrainRunContext) -> None:
        """The run (this `fit()`) starts; a resumed run starts again here."""

    def on_attempt_start(self, run_context: TrainRunContext, attempt: int, world_size: int) -> None:
        """Attempt `attempt` of this `fit()` (0 first, as the `logs/attempt_<n>` directories) started
        `world_size` ranks."""

    def on_report(self, run_context: TrainRunContext, step: int, metrics: Dict[str, Any]) -> None:
        """Rank 0's metrics of the report round `step` (every rank answered it)."""

    def on_checkpoint(self, run_context: TrainRunContext, step: int, checkpoint: Checkpoint,
                      metrics: Dict[str, Any]) -> None:
        """Round `step` committed `checkpoint`; `metrics` are rank 0's metrics of the round."""

    def on_attempt_failure(self, run_context: TrainRunContext, attempt: int, error: str, restarting: bool) -> None:
        """Attempt `attempt` failed; `error` names the root cause; `restarting` says whether another
        attempt follows."""

    def on_run_end(self, run_context: TrainRunContext, status: str, error: Optional[str]) -> None:
        """The run ended: `status` is "SUCCEEDED", "FAILED" or "ABORTED"; `error` says why when it failed."""


def require_extra(module: str, extra: str, callback: str) -> Any:
    """`import module`, or an ImportError naming the extra that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(f"{callback} needs the {module!r} package, which is not installed ({exc}). Install it "
                          f"with: pip install 'minitrain[{extra}]'") from exc
