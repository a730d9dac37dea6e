"""`TensorBoardCallback` (alias `TBXLoggerCallback`, Ray Tune's name): a run as TensorBoard events (L3).

Writes event files with the `tensorboard` package's own writer (the `tensorboard` extra; no torch and
no TensorFlow in the driver). One run directory is one TensorBoard run: restarts and resumes write
new event files into the same log directory, with steps that only grow, and the config is written
once (the run directory's `trackers/state.json` remembers it).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Optional

from minitrain.callbacks.base import Callback, TrainRunContext, numeric, require_extra
from minitrain.checkpoint import Checkpoint
from minitrain.errors import ConfigError
from minitrain.storage.layout import TRACKERS_DIR

_STATE_KEY = "tensorboard"


class TensorBoardCallback(Callback):
    """Logs rank 0's numeric metrics of every report round as scalars (nested keys joined with "/") at
    step = the run-wide report index, and as text: the config (`config`, once), each committed
    checkpoint (`checkpoint`), each failed attempt (`attempt_failure`) and how the run ended (`run_end`).

    `logdir`: a local directory; None (the default) writes `<run directory>/trackers/tensorboard`,
    which needs a local run directory (for `s3://` and other remote storage, pass `logdir`).
    Raises ImportError naming the `tensorboard` extra when the package is missing.
    """

    def __init__(self, logdir: Optional[str] = None):
        if logdir is not None and (not isinstance(logdir, (str, os.PathLike)) or not os.fspath(logdir)):
            raise ConfigError(f"TensorBoardCallback(logdir=...) must be None or a local directory, got {logdir!r}.")
        self._writer_cls = require_extra("tensorboard.summary.writer.event_file_writer", "tensorboard",
                                         "TensorBoardCallback").EventFileWriter
        self._protos = require_extra("tensorboard.compat.proto.summary_pb2", "tensorboard", "TensorBoardCallback")
        self._events = require_extra("tensorboard.compat.proto.event_pb2", "tensorboard", "TensorBoardCallback")
        self.logdir = os.fspath(logdir) if logdir is not None else None
        self._writer: Any = None
        self._step = 0

    def on_run_start(self, run_context: TrainRunContext) -> None:
        if self.logdir is None:
            if run_context.local_run_dir is None:
                raise ConfigError(f"TensorBoardCallback() writes into the run directory by default, but "
                                  f"{run_context.run_path} is not local. Pass TensorBoardCallback(logdir=...) "
                                  f"with a local directory.")
            self.logdir = os.path.join(run_context.local_run_dir, TRACKERS_DIR, "tensorboard")
            # In the run directory: created without following a planted link (minitrain.storage.safe_files);
            # the writer then opens its event file itself.
            run_context.storage.makedirs(f"{TRACKERS_DIR}/tensorboard")
        os.makedirs(self.logdir, exist_ok=True)
        self._writer = self._writer_cls(self.logdir)
        state = run_context.load_state(_STATE_KEY)
        if not state.get("config_logged"):
            self._text("config", json.dumps(run_context.config_to_log(), indent=1), 0)
            self._writer.flush()
            run_context.save_state(_STATE_KEY, {"config_logged": True, "logdir": self.logdir})

    def on_report(self, run_context: TrainRunContext, step: int, metrics: dict) -> None:
        self._step = step
        summary = self._protos.Summary(value=[self._protos.Summary.Value(tag=name, simple_value=value)
                                              for name, value in numeric(metrics).items()])
        self._writer.add_event(self._events.Event(wall_time=time.time(), step=step, summary=summary))

    def on_checkpoint(self, run_context: TrainRunContext, step: int, checkpoint: Checkpoint, metrics: dict) -> None:
        self._text("checkpoint", checkpoint.path, step)

    def on_attempt_failure(self, run_context: TrainRunContext, attempt: int, error: str, restarting: bool) -> None:
        self._text("attempt_failure", f"attempt {attempt} failed ({'restarting' if restarting else 'final'}): "
                                      f"{error}", self._step)
        self._writer.flush()

    def on_run_end(self, run_context: TrainRunContext, status: str, error: Optional[str]) -> None:
        if self._writer is None:
            return
        self._text("run_end", status + (f": {error}" if error else ""), self._step)
        self._writer.close()
        self._writer = None

    def _text(self, tag: str, text: str, step: int) -> None:
        """A text summary, as TensorBoard's text plugin reads it."""
        tensor_pb2 = require_extra("tensorboard.compat.proto.tensor_pb2", "tensorboard", "TensorBoardCallback")
        shape_pb2 = require_extra("tensorboard.compat.proto.tensor_shape_pb2", "tensorboard", "TensorBoardCallback")
        metadata = self._protos.SummaryMetadata(
            plugin_data=self._protos.SummaryMetadata.PluginData(plugin_name="text"))
        tensor = tensor_pb2.TensorProto(dtype="DT_STRING", string_val=[text.encode("utf-8")],
                                        tensor_shape=shape_pb2.TensorShapeProto(dim=[shape_pb2.TensorShapeProto.Dim(size=1)]))
        summary = self._protos.Summary(value=[self._protos.Summary.Value(tag=tag, metadata=metadata, tensor=tensor)])
        self._writer.add_event(self._events.Event(wall_time=time.time(), step=step, summary=summary))


TBXLoggerCallback = TensorBoardCallback
