"""`MLflowLoggerCallback` (Ray's `ray.air.integrations.mlflow.MLflowLoggerCallback`) (L3).

One run directory is one MLflow run: its id is kept in the run directory (`trackers/state.json`), so
restarts and resumes log into it; the config is logged as params once, when the MLflow run is created.
Uses `MlflowClient` with explicit run ids (no global active run), from the callback thread.
"""

from __future__ import annotations

import os
import time
from typing import Any, Dict, Optional

from minitrain.callbacks.base import Callback, TrainRunContext, flatten, numeric, require_extra
from minitrain.checkpoint import Checkpoint
from minitrain.errors import ConfigError
from minitrain.run_state import RunState

_STATE_KEY = "mlflow"
_PARAM_LIMIT = 6000  # MLflow's longest param value
_TAG_LIMIT = 5000  # kept below MLflow's tag limit (8000)
# MLflow's own RunStatus words (it has no ERRORED or ABORTED), for the run's terminal states.
_MLFLOW_STATUS = {RunState.SUCCEEDED: "FINISHED", RunState.FAILED: "FAILED", RunState.ABORTED: "KILLED"}


class MLflowLoggerCallback(Callback):
    """Logs rank 0's numeric metrics of every report round at step = the run-wide report index.

    Arguments as Ray's: `tracking_uri` (None: MLflow's default, e.g. `MLFLOW_TRACKING_URI`),
    `registry_uri`, `experiment_name` (None: the run's `RunConfig.name`; created when missing), `tags`
    (set on the MLflow run when it is created), `tracking_token` (set as `MLFLOW_TRACKING_TOKEN` in this
    process, as Ray does), `save_artifact` (True: each committed checkpoint's files are logged as
    artifacts under `checkpoints/<checkpoint dir>/`), `log_params_on_trial_end` (True: the config is
    logged when the run ends instead of when it starts). The MLflow run is named after the run, gets
    the tags `minitrain.run_path` and `minitrain.attempts`, a `minitrain.attempt_<n>.failure` tag per
    failed attempt and `minitrain.latest_checkpoint`; it ends FINISHED, FAILED or KILLED.
    Raises ImportError naming the `mlflow` extra when MLflow is missing.
    """

    def __init__(self, tracking_uri: Optional[str] = None, *, registry_uri: Optional[str] = None,
                 experiment_name: Optional[str] = None, tags: Optional[Dict[str, Any]] = None,
                 tracking_token: Optional[str] = None, save_artifact: bool = False,
                 log_params_on_trial_end: bool = False):
        for name, value in (("tracking_uri", tracking_uri), ("registry_uri", registry_uri),
                            ("experiment_name", experiment_name), ("tracking_token", tracking_token)):
            if value is not None and (not isinstance(value, str) or not value):
                raise ConfigError(f"MLflowLoggerCallback({name}=...) must be None or a non-empty str, got {value!r}.")
        if tags is not None and not isinstance(tags, dict):
            raise ConfigError(f"MLflowLoggerCallback(tags=...) must be None or a dict, got {tags!r}.")
        for name, value in (("save_artifact", save_artifact), ("log_params_on_trial_end", log_params_on_trial_end)):
            if not isinstance(value, bool):
                raise ConfigError(f"MLflowLoggerCallback({name}=...) must be True or False, got {value!r}.")
        self._mlflow = require_extra("mlflow", "mlflow", "MLflowLoggerCallback")
        self.tracking_uri = tracking_uri
        self.registry_uri = registry_uri
        self.experiment_name = experiment_name
        self.tags = dict(tags or {})
        self.tracking_token = tracking_token
        self.save_artifact = save_artifact
        self.log_params_on_trial_end = log_params_on_trial_end
        self.client: Any = None
        self.run_id: Optional[str] = None
        self._attempts = 0

    def on_run_start(self, run_context: TrainRunContext) -> None:
        if self.tracking_token is not None:
            os.environ["MLFLOW_TRACKING_TOKEN"] = self.tracking_token
        self.client = self._mlflow.tracking.MlflowClient(tracking_uri=self.tracking_uri, registry_uri=self.registry_uri)
        self._attempts = 0
        state = run_context.load_state(_STATE_KEY)
        self.run_id = state.get("run_id") if self._exists(state.get("run_id")) else None
        if self.run_id is not None:  # a resume: the same MLflow run, running again
            self.client.update_run(self.run_id, status="RUNNING")
            return
        name = self.experiment_name or run_context.run_config.name
        experiment = self.client.get_experiment_by_name(name)
        experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(name)
        tags = {str(k): str(v) for k, v in self.tags.items()}
        tags["minitrain.run_path"] = run_context.run_path
        run = self.client.create_run(experiment_id, run_name=run_context.run_config.name, tags=tags)
        self.run_id = run.info.run_id
        run_context.save_state(_STATE_KEY, {"run_id": self.run_id, "tracking_uri": self.client.tracking_uri,
                                            "params_logged": False})
        if not self.log_params_on_trial_end:
            self._log_params_once(run_context)

    def on_attempt_start(self, run_context: TrainRunContext, attempt: int, world_size: int) -> None:
        self._attempts += 1
        self.client.set_tag(self.run_id, "minitrain.attempts", str(self._attempts))

    def on_report(self, run_context: TrainRunContext, step: int, metrics: dict) -> None:
        now = int(time.time() * 1000)
        entries = [self._mlflow.entities.Metric(key, value, now, step) for key, value in numeric(metrics).items()]
        if entries:
            self.client.log_batch(self.run_id, metrics=entries)

    def on_checkpoint(self, run_context: TrainRunContext, step: int, checkpoint: Checkpoint, metrics: dict) -> None:
        self.client.set_tag(self.run_id, "minitrain.latest_checkpoint", checkpoint.path)
        if self.save_artifact:
            with checkpoint.as_directory() as local:
                self.client.log_artifacts(self.run_id, local, artifact_path=f"checkpoints/{os.path.basename(checkpoint.path)}")

    def on_attempt_failure(self, run_context: TrainRunContext, attempt: int, error: str, restarting: bool) -> None:
        self.client.set_tag(self.run_id, f"minitrain.attempt_{attempt}.failure", error[:_TAG_LIMIT])

    def on_run_end(self, run_context: TrainRunContext, status: str, error: Optional[str]) -> None:
        if self.run_id is None:
            return
        if self.log_params_on_trial_end:
            self._log_params_once(run_context)
        if error:
            self.client.set_tag(self.run_id, "minitrain.error", error[:_TAG_LIMIT])
        self.client.set_terminated(self.run_id, status=_MLFLOW_STATUS[RunState(status)])

    def _exists(self, run_id: Optional[str]) -> bool:
        if not run_id:
            return False
        try:
            self.client.get_run(run_id)
        except self._mlflow.exceptions.MlflowException:  # deleted, or another tracking server
            return False
        return True

    def _log_params_once(self, run_context: TrainRunContext) -> None:
        state = run_context.load_state(_STATE_KEY)
        if state.get("params_logged"):
            return
        params = [self._mlflow.entities.Param(key, str(value)[:_PARAM_LIMIT])
                  for key, value in flatten(run_context.config_to_log()).items()]
        for start in range(0, len(params), 100):  # MLflow takes at most 100 params per batch
            self.client.log_batch(self.run_id, params=params[start:start + 100])
        run_context.save_state(_STATE_KEY, {**state, "run_id": self.run_id, "params_logged": True})
