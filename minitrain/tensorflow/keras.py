"""`ReportCheckpointCallback`: Ray's Keras callback that reports Keras' logs and checkpoints the model (L3).

The callback subclasses `tf.keras.callbacks.Callback`, so it belongs to whichever Keras `tf.keras`
resolves to: Keras 3 by default (TensorFlow >= 2.16), Keras 2 (`tf-keras`) when `TF_USE_LEGACY_KERAS=1`
is set before TensorFlow is imported. Importing this module imports tensorflow.
"""

from __future__ import annotations

import shutil
from typing import Any, Callable, Optional, Union

import tensorflow as tf

from minitrain import train_api
from minitrain.tensorflow.checkpoint import TensorflowCheckpoint

# Keras' callback hooks (less the "on_" prefix), the events `checkpoint_on` and `report_metrics_on` name.
EVENTS = ("epoch_begin", "epoch_end", "train_batch_begin", "train_batch_end", "test_batch_begin", "test_batch_end",
          "predict_batch_begin", "predict_batch_end", "train_begin", "train_end", "test_begin", "test_end",
          "predict_begin", "predict_end")

MetricsArg = Optional[Union[str, list, dict]]


def _events(value: Union[str, list], argument: str) -> list[str]:
    events = [value] if isinstance(value, str) else value
    if not isinstance(events, (list, tuple)) or not all(isinstance(event, str) for event in events):
        raise TypeError(f"ReportCheckpointCallback({argument}={value!r}): give an event name or a list of them, "
                        f"from {list(EVENTS)}.")
    unknown = [event for event in events if event not in EVENTS]
    if unknown:
        raise ValueError(f"Invalid trigger time selected: {unknown} in ReportCheckpointCallback({argument}=...). "
                         f"Must be one of {list(EVENTS)}.")
    return list(events)


def _plain(value: Any) -> Any:
    """A scalar tensor or numpy value as a Python number (Keras 3 logs may hold tensors); others as given."""
    if hasattr(value, "numpy"):
        value = value.numpy()
    if hasattr(value, "item") and getattr(value, "size", 2) == 1:
        return value.item()
    return value


def _hook(event: str) -> Callable:
    def hook(self: "ReportCheckpointCallback", *args: Any, logs: Optional[dict] = None) -> None:
        # Keras calls batch and epoch hooks as (index, logs) and the others as (logs); logs may be positional.
        if logs is None and args and isinstance(args[-1], dict):
            logs = args[-1]
        if event in self._on:
            self._handle(logs or {}, event)

    hook.__name__ = f"on_{event}"
    hook.__doc__ = f"Keras' `on_{event}`: report (and checkpoint) when it is one of the callback's events."
    return hook


class ReportCheckpointCallback(tf.keras.callbacks.Callback):
    """A Keras callback (`model.fit(..., callbacks=[...])`, or a `keras.callbacks.CallbackList` driven by a
    custom training loop) that calls `minitrain.report` with Keras' logs, as Ray's
    `ray.train.tensorflow.keras.ReportCheckpointCallback`.

    `report_metrics_on`: the events (Keras hooks less "on_": "epoch_end", "train_batch_end", ...) that
    report the logs; `checkpoint_on`: the events that also checkpoint the model (metrics are always
    reported with a checkpoint, as in Ray); `metrics`: report only these log keys (a key, a list, or a
    dict of reported name -> log key; None reports all logs). A tensor or numpy scalar in the logs is
    reported as a Python number.

    A checkpoint is `TensorflowCheckpoint.from_model(self.model)` (`model.keras`). Every rank saves the
    model (under a distribution strategy saving reads variables collectively), but only rank 0 reports
    the directory: every replica holds the same model. The other ranks report the same metrics round
    without a checkpoint, and the temporary directories are deleted once reported.
    """

    def __init__(self, checkpoint_on: Union[str, list] = "epoch_end", report_metrics_on: Union[str, list] = "epoch_end",
                 metrics: MetricsArg = None):
        super().__init__()
        self._checkpoint_on = _events(checkpoint_on, "checkpoint_on")
        self._report_metrics_on = _events(report_metrics_on, "report_metrics_on")
        self._on = set(self._checkpoint_on) | set(self._report_metrics_on)
        if not (metrics is None or isinstance(metrics, (str, dict))
                or (isinstance(metrics, list) and all(isinstance(name, str) for name in metrics))):
            raise TypeError(f"ReportCheckpointCallback(metrics={metrics!r}): give a log key ('loss'), a list of "
                            "them, a dict of reported name -> log key ({'train_loss': 'loss'}), or None for all.")
        self._metrics = metrics

    def _reported_metrics(self, logs: dict) -> dict:
        if self._metrics is None:
            pairs = [(key, key) for key in logs]
        elif isinstance(self._metrics, str):
            pairs = [(self._metrics, self._metrics)]
        elif isinstance(self._metrics, list):
            pairs = [(key, key) for key in self._metrics]
        else:
            pairs = list(self._metrics.items())
        missing = [key for _, key in pairs if key not in logs]
        if missing:
            raise KeyError(f"ReportCheckpointCallback(metrics=...) names {missing}, which Keras' logs of this event "
                           f"do not have; they have {sorted(logs)}.")
        return {name: _plain(logs[key]) for name, key in pairs}

    def _handle(self, logs: dict, event: str) -> None:
        metrics = self._reported_metrics(logs)
        if event not in self._checkpoint_on:
            train_api.report(metrics)
            return
        checkpoint = TensorflowCheckpoint.from_model(self.model)
        try:
            rank = train_api.get_context().get_world_rank()
            train_api.report(metrics, checkpoint=checkpoint if rank in (0, None) else None)
        finally:
            shutil.rmtree(checkpoint.path, ignore_errors=True)


for _event in EVENTS:
    setattr(ReportCheckpointCallback, f"on_{_event}", _hook(_event))
del _event
