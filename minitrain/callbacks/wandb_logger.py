"""`WandbLoggerCallback` (Ray's `ray.air.integrations.wandb.WandbLoggerCallback`) (L3).

One run directory is one W&B run: its id is kept in the run directory (`trackers/state.json`) and
later fits resume it (`resume="allow"`), so restarts and resumes never make a second W&B run; the
config goes to `wandb.init` only when the W&B run is created. Works offline (`WANDB_MODE=offline`).
"""

from __future__ import annotations

import inspect
import os
import uuid
from typing import Any, List, Optional

from minitrain.callbacks.base import Callback, TrainRunContext, flatten, json_safe, require_extra
from minitrain.checkpoint import Checkpoint
from minitrain.errors import ConfigError

_STATE_KEY = "wandb"
# wandb.init arguments the callback sets itself.
_OWN = ("id", "resume", "config", "reinit")


class WandbLoggerCallback(Callback):
    """Logs rank 0's metrics of every report round with `run.log(metrics, step=report index)`.

    Arguments as Ray's: `project` (None: `WANDB_PROJECT`, else the run's `RunConfig.name`), `group`
    (None: `WANDB_GROUP`), `api_key_file` / `api_key` (passed to `wandb.login`; nothing is put on a
    command line), `excludes` (metric names, flattened with "/", never logged), and `**kwargs` passed
    to `wandb.init` (`entity`, `name`, `tags`, `dir`, `mode`, ...; unknown names raise `ConfigError`;
    `id`, `resume`, `config` and `reinit` are the callback's own). The W&B run's summary keeps
    `latest_checkpoint`, `attempts` and each failed attempt's error; it finishes with exit code 0 when
    the run succeeded, else 1. Ray's `upload_checkpoints=True` and `log_config=True` are not supported
    yet (`ConfigError`). Raises ImportError naming the `wandb` extra when W&B is missing.
    """

    def __init__(self, project: Optional[str] = None, group: Optional[str] = None,
                 api_key_file: Optional[str] = None, api_key: Optional[str] = None,
                 excludes: Optional[List[str]] = None, log_config: bool = False,
                 upload_checkpoints: bool = False, **kwargs: Any):
        for name, value in (("project", project), ("group", group), ("api_key_file", api_key_file),
                            ("api_key", api_key)):
            if value is not None and (not isinstance(value, str) or not value):
                shown = "<hidden>" if name == "api_key" else repr(value)
                raise ConfigError(f"WandbLoggerCallback({name}=...) must be None or a non-empty str, got {shown}.")
        if upload_checkpoints is not False:
            raise ConfigError("WandbLoggerCallback(upload_checkpoints=True) is not supported by minitrain yet: "
                              "checkpoints stay in the run directory (their paths are in the W&B summary). Log "
                              "one as an artifact yourself with wandb.Artifact(...).add_dir(checkpoint.path).")
        if log_config is not False:
            raise ConfigError("WandbLoggerCallback(log_config=True) is not supported: minitrain logs the config "
                              "(train_loop_config and the scaling) once, as the W&B run's config, not with "
                              "every result. Remove log_config.")
        self._wandb = require_extra("wandb", "wandb", "WandbLoggerCallback")
        accepted = set(inspect.signature(self._wandb.init).parameters) - set(_OWN)
        unknown = sorted(set(kwargs) - accepted)
        if unknown:
            raise ConfigError(f"WandbLoggerCallback got {', '.join(unknown)}, which wandb.init does not take "
                              f"(or the callback sets itself: {', '.join(_OWN)}). Remove them.")
        self.project = project
        self.group = group
        self.api_key_file = api_key_file
        self.api_key = api_key
        self.excludes = set(excludes or ())
        self.init_kwargs = dict(kwargs)
        self.run: Any = None
        self._attempts = 0

    def on_run_start(self, run_context: TrainRunContext) -> None:
        self._login()
        state = run_context.load_state(_STATE_KEY)
        run_id = state.get("run_id")
        kwargs = dict(self.init_kwargs)
        kwargs.setdefault("name", run_context.run_config.name)
        kwargs.setdefault("project", self.project or os.environ.get("WANDB_PROJECT") or run_context.run_config.name)
        group = self.group or os.environ.get("WANDB_GROUP")
        if group:
            kwargs.setdefault("group", group)
        if run_id is None:
            run_id = uuid.uuid4().hex[:12]
            kwargs["config"] = run_context.config_to_log()  # once: a resumed W&B run keeps it
        self.run = self._wandb.init(id=run_id, resume="allow", reinit="create_new", **kwargs)
        self._attempts = 0
        run_context.save_state(_STATE_KEY, {"run_id": self.run.id, "project": self.run.project})

    def on_attempt_start(self, run_context: TrainRunContext, attempt: int, world_size: int) -> None:
        self._attempts += 1
        self.run.summary["attempts"] = self._attempts

    def on_report(self, run_context: TrainRunContext, step: int, metrics: dict) -> None:
        logged = {k: v for k, v in json_safe(flatten(metrics)).items() if k not in self.excludes}
        self.run.log(logged, step=step)

    def on_checkpoint(self, run_context: TrainRunContext, step: int, checkpoint: Checkpoint, metrics: dict) -> None:
        self.run.summary["latest_checkpoint"] = checkpoint.path

    def on_attempt_failure(self, run_context: TrainRunContext, attempt: int, error: str, restarting: bool) -> None:
        self.run.summary[f"attempt_{attempt}_failure"] = error

    def on_run_end(self, run_context: TrainRunContext, status: str, error: Optional[str]) -> None:
        if self.run is None:
            return
        self.run.summary["status"] = status
        if error:
            self.run.summary["error"] = error
        self.run.finish(exit_code=0 if status == "SUCCEEDED" else 1)
        self.run = None

    def _login(self) -> None:
        key = self.api_key
        if key is None and self.api_key_file is not None:
            with open(os.path.expanduser(self.api_key_file), encoding="utf-8") as handle:
                key = handle.readline().strip()
        if key:
            self._wandb.login(key=key)
