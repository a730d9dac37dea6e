"""Driver-side callbacks of a run: `RunConfig(callbacks=[...])` (L3).

- `UserCallback` (Ray's `ray.train.UserCallback`, also `minitrain.UserCallback`): `after_report`
  and `after_exception`.
- `Callback`: a UserCallback with the trackers' hooks (run start/end, attempt start/failure, each
  report of rank 0, each committed checkpoint).
- Trackers: `TensorBoardCallback` (alias `TBXLoggerCallback`, Ray Tune's name), `MLflowLoggerCallback`,
  `WandbLoggerCallback`, `CSVLoggerCallback`, `JsonLoggerCallback`. Each keeps one tracker run across
  the restarts and resumes of a run directory and logs the config once. TensorBoard, MLflow and W&B
  are optional extras (`pip install minitrain[tensorboard|mlflow|wandb]`), imported when the callback
  is built.

Names load lazily, so `import minitrain.callbacks` imports no tracker library.
"""

from __future__ import annotations

from minitrain._lazy import lazy_exports

from minitrain.callbacks.base import Callback, TrainRunContext, UserCallback

_LAZY = {
    "TensorBoardCallback": "minitrain.callbacks.tensorboard_logger",
    "TBXLoggerCallback": "minitrain.callbacks.tensorboard_logger",
    "MLflowLoggerCallback": "minitrain.callbacks.mlflow_logger",
    "WandbLoggerCallback": "minitrain.callbacks.wandb_logger",
    "CSVLoggerCallback": "minitrain.callbacks.file_loggers",
    "JsonLoggerCallback": "minitrain.callbacks.file_loggers",
}

__all__ = ["Callback", "TrainRunContext", "UserCallback", *sorted(_LAZY)]


__getattr__, __dir__ = lazy_exports("minitrain.callbacks", _LAZY, __all__)
