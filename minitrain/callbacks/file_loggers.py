"""`CSVLoggerCallback` and `JsonLoggerCallback`: a run's reports as files (Ray Tune's names) (L3).

By default both write into the run directory's `trackers/` (any storage: local, `s3://`, ...), so a
restarted or resumed run appends to the same files; `path` puts the file elsewhere (a local path or an
fsspec URL). Rows are keyed by the run-wide report index `step`, which only grows across restarts
and resumes.
"""

from __future__ import annotations

import csv
import io
import json
import posixpath
import time
from typing import Any, Optional

import fsspec

from minitrain.callbacks.base import Callback, TrainRunContext, flatten, json_safe
from minitrain.checkpoint import Checkpoint
from minitrain.errors import ConfigError
from minitrain.storage.filesystem import Storage
from minitrain.storage.layout import TRACKERS_DIR


class _FileLogger(Callback):
    """Resolves where the file lives: `path` when given, else `trackers/<default_name>` in the run."""

    default_name = ""

    def __init__(self, path: Optional[str] = None):
        if path is not None and (not isinstance(path, str) or not path or path.endswith("/")):
            raise ConfigError(f"{type(self).__name__}(path=...) must be None or a file path or URL, got "
                              f"{path!r}. Use None to write trackers/{self.default_name} in the run directory.")
        self.path = path
        self._storage: Optional[Storage] = None
        self._rel = ""
        self._attempt = 0

    def _open(self, run_context: TrainRunContext) -> None:
        if self.path is None:
            self._storage, self._rel = run_context.storage, f"{TRACKERS_DIR}/{self.default_name}"
            return
        fs, full = fsspec.core.url_to_fs(self.path)
        self._storage, self._rel = Storage(fs, posixpath.dirname(full) or "/"), posixpath.basename(full)

    def on_attempt_start(self, run_context: TrainRunContext, attempt: int, world_size: int) -> None:
        self._attempt = attempt


class CSVLoggerCallback(_FileLogger):
    """Rank 0's metrics of every report round as CSV rows (`trackers/progress.csv` by default, Ray's name).

    Columns: `step`, `attempt`, `time`, then the flattened numeric and string metrics (nested keys
    joined with "/"; a metric named like a fixed column is written as `metrics/<name>`). A metric that
    first appears in a later round adds a column: the file is rewritten with the wider header.
    """

    default_name = "progress.csv"
    _FIXED = ("step", "attempt", "time")

    def __init__(self, path: Optional[str] = None):
        super().__init__(path)
        self._header: list[str] = []
        self._rows: list[dict] = []

    def on_run_start(self, run_context: TrainRunContext) -> None:
        self._open(run_context)
        if self._storage.exists(self._rel):  # a restart or resume: carry on in the same file
            reader = csv.DictReader(io.StringIO(self._storage.read_text(self._rel)))
            self._header = list(reader.fieldnames or self._FIXED)
            self._rows = list(reader)

    def on_report(self, run_context: TrainRunContext, step: int, metrics: dict) -> None:
        row: dict[str, Any] = {"step": step, "attempt": self._attempt, "time": round(time.time(), 3)}
        for key, value in flatten(metrics).items():
            if isinstance(value, (int, float, str, bool)):
                row[f"metrics/{key}" if key in self._FIXED else key] = value
        new = [key for key in row if key not in self._header]
        self._rows.append(row)
        if not self._header or new:
            self._header = (self._header or []) + new
            self._storage.write_text_atomic(self._rel, self._csv(self._rows, header=True))
        else:
            self._storage.append_text(self._rel, self._csv([row], header=False))

    def _csv(self, rows: list[dict], header: bool) -> str:
        out = io.StringIO()
        writer = csv.DictWriter(out, fieldnames=self._header, lineterminator="\n")
        if header:
            writer.writeheader()
        writer.writerows(rows)
        return out.getvalue()


class JsonLoggerCallback(_FileLogger):
    """The run's events as JSON lines (`trackers/result.json` by default, Ray's name) and its config in
    `params.json` beside it, written once (a resume keeps the first one).

    Each line has `event` ("report", "checkpoint", "attempt_failure" or "run_end"), `step` (the report
    index; for a failure or the end, the last step seen), `attempt` and `time`; a report line has
    rank 0's `metrics`, a checkpoint line the checkpoint's `path`, a failure line `error` and
    `restarting`, the end line `status` and `error`. Non-JSON values are written as their `repr`.
    """

    default_name = "result.json"

    def __init__(self, path: Optional[str] = None):
        super().__init__(path)
        self._step = -1

    def on_run_start(self, run_context: TrainRunContext) -> None:
        self._open(run_context)
        params = posixpath.join(posixpath.dirname(self._rel), "params.json")
        if not self._storage.exists(params):
            self._storage.write_text_atomic(params, json.dumps(run_context.config_to_log(), indent=1))

    def on_report(self, run_context: TrainRunContext, step: int, metrics: dict) -> None:
        self._step = step
        self._line("report", metrics=json_safe(metrics))

    def on_checkpoint(self, run_context: TrainRunContext, step: int, checkpoint: Checkpoint, metrics: dict) -> None:
        self._step = step
        self._line("checkpoint", path=checkpoint.path)

    def on_attempt_failure(self, run_context: TrainRunContext, attempt: int, error: str, restarting: bool) -> None:
        self._line("attempt_failure", error=error, restarting=restarting)

    def on_run_end(self, run_context: TrainRunContext, status: str, error: Optional[str]) -> None:
        self._line("run_end", status=status, error=error)

    def _line(self, event: str, **fields: Any) -> None:
        entry = {"event": event, "step": self._step, "attempt": self._attempt, "time": round(time.time(), 3),
                 **fields}
        self._storage.append_text(self._rel, json.dumps(entry) + "\n")
