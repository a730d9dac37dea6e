"""`Result`: what `TorchTrainer.fit()` returns (L3)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Optional

import fsspec
from fsspec.implementations.local import LocalFileSystem

from minitrain.checkpoint import Checkpoint
from minitrain.monitoring.goodput import Goodput

from minitrain.storage.layout import INDEX_NAME as SNAPSHOT_FILE
from minitrain.storage.layout import METRICS_NAME as METRICS_FILE
from minitrain.storage.layout import split_metrics_lines
from minitrain.storage.user_filesystems import as_fsspec, for_users, given_pyarrow


@dataclass(frozen=True)
class Straggler:
    """A rank whose step time, less its waits for the other ranks (inside report(), e.g. for a
    checkpoint round's commit, and in minitrain's collectives), stayed at least
    the straggler factor (`MonitoringConfig.straggler_factor`, default 1.5) times the other ranks'
    median of the same (docs/monitoring.md).
    `slower_by` is that ratio and `step_time_s` / `median_step_time_s` the two such step times, as
    last measured while it lasted; `cause` is "data wait" when the rank's extra time waiting on its
    data iterator explains at least half of its extra step time, else "compute".
    `since` and `until` are wall-clock times (`until` is when it cleared or its attempt ended)."""

    rank: int
    host: str
    slower_by: float
    cause: str
    step_time_s: float
    median_step_time_s: float
    attempt: int
    since: float
    until: Optional[float] = None

    @classmethod
    def from_dict(cls, episode: dict) -> "Straggler":
        """From one of `RunMonitor.straggler_history()`'s dicts."""
        return cls(**{name: episode.get(name) for name in cls.__dataclass_fields__})


@dataclass(frozen=True)
class Resize:
    """One resize of an elastic run (`ScalingConfig(num_workers=(min, max))`, docs/elastic.md): attempt
    `attempt` started with `to_workers` workers where the one before had `from_workers`, at `time`
    (seconds since the epoch), because of `reason` (e.g. "host h1 lost (...)"). A resize is never a
    charged failure."""

    attempt: int
    from_workers: int
    to_workers: int
    reason: str
    time: float

    @classmethod
    def from_dict(cls, entry: dict) -> "Resize":
        """From one of `RunMonitor.resizes()`' dicts."""
        return cls(**{name: entry.get(name) for name in cls.__dataclass_fields__})


@dataclass(frozen=True)
class CheckpointCommit:
    """One checkpoint a `fit()` committed, at its two levels: `committed_at` (wall clock; in memory when
    its files went through the nodes' memory tiers: every rank's files there, replicated on several
    hosts) and `durable_at` (on storage and in the run's index; None if it never got there)."""

    dir_name: str
    report_index: int
    attempt: int
    committed_at: float
    durable_at: Optional[float]

    @classmethod
    def from_dict(cls, entry: dict) -> "CheckpointCommit":
        """From one of `RunMonitor.checkpoints()`' dicts."""
        return cls(dir_name=entry.get("dir"), report_index=entry.get("index"), attempt=entry.get("attempt"),
                   committed_at=entry.get("committed_at"), durable_at=entry.get("durable_at"))


@dataclass
class Result:
    """The outcome of a finished run, as `ray.train.Result`.

    `metrics` is rank 0's last report (a deliberate difference from Ray v2, where it is the metrics of
    the last checkpoint); `path` is the run directory `<storage_path>/<name>` (None in local mode);
    `return_value` is what rank 0's training function returned, when it could be sent back.
    `best_checkpoints` is `[(Checkpoint, metrics), ...]` of the retained checkpoints.
    `stragglers` lists every rank that was a straggler during the run (a `Straggler` per episode, in
    the order they started; empty when none was, and in local mode). `resizes` lists an elastic run's
    resizes (a `Resize` each, in order; empty for a fixed-size run or one that never changed size).
    `failed_attempts` lists the attempts of this `fit()` that failed before it succeeded (a
    `minitrain.records.FailedAttempt` each: the root cause's host, rank, phase and cause, as
    `WorkerGroupError.failed_attempts` has them; empty when none failed).
    `checkpoint_commits` lists the checkpoints this `fit()` committed, in order, each with when it was
    committed and when it became durable (a `CheckpointCommit`; docs/guide/checkpoints.md, "The memory
    tier"); a run that returns has every one of them durable.
    `goodput` is the run's goodput ledger (a `minitrain.monitoring.goodput.Goodput`: worker-seconds by
    cause in total, per attempt and per rank, and `share`, the compute share; docs/monitoring.md,
    "Goodput"); None in local mode and for a Result rebuilt with `from_path`.

    `metrics_dataframe` is a pandas DataFrame with one row per rank-0 report, in order (Ray v2 gives
    one row per retained checkpoint only; the full history is what users want to plot). Nested metric
    dicts stay dict cells, as in Ray. It is built on first access from `_metrics_history`, so pandas is
    needed only then; a DataFrame passed to the constructor is returned as given.
    """

    metrics: Optional[dict]
    checkpoint: Any
    error: Optional[BaseException]
    path: Optional[str]
    # Replaced below by a property of the same name; the dataclass keeps it as an ordinary init argument.
    metrics_dataframe: Any = field(default=None, repr=False, compare=False)
    best_checkpoints: list = field(default_factory=list)
    _storage_filesystem: Any = None
    return_value: Any = None
    _metrics_history: Optional[list] = field(default=None, repr=False, compare=False)
    stragglers: list = field(default_factory=list)
    resizes: list = field(default_factory=list)
    checkpoint_commits: list = field(default_factory=list)
    failed_attempts: list = field(default_factory=list)
    goodput: Optional[Goodput] = None
    _shown_filesystem: Any = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.best_checkpoints is None:
            self.best_checkpoints = []

    @property
    def filesystem(self) -> Any:
        """The storage filesystem of `path` as a `pyarrow.fs.FileSystem`, as Ray types it: the one given
        as `storage_filesystem` when one was (the same object), else `pyarrow.fs.LocalFileSystem()` on local
        storage and `pyarrow.fs.PyFileSystem(pyarrow.fs.FSSpecHandler(fs))` over the fsspec filesystem
        otherwise, so Ray's `result.filesystem.get_file_info(...)`, `open_input_file(...)` and
        `pyarrow.fs.copy_files(..., source_filesystem=result.filesystem)` work on every storage. Without
        pyarrow installed it is the fsspec filesystem. None in local mode (no run directory)."""
        if self._storage_filesystem is None:
            return None
        if self._shown_filesystem is None:
            self._shown_filesystem = for_users(self._storage_filesystem)
        return self._shown_filesystem

    @property
    def config(self):
        """Removed in Ray Train v2; raises `DeprecationWarning` as Ray does."""
        raise DeprecationWarning("Result.config was removed in Ray Train v2 (which minitrain mirrors); "
                                 "keep your train_loop_config yourself.")

    def get_best_checkpoint(self, metric: str, mode: str) -> Checkpoint:
        """The checkpoint among `best_checkpoints` whose `metric` is largest (`mode="max"`) or smallest.

        `metric` may address a nested value as `"a/b"`. Entries without the metric are skipped.
        Raises `ValueError` for a mode other than "max"/"min", `RuntimeError` when there are no
        checkpoints or none of them has the metric (as Ray).
        """
        if mode not in ("max", "min"):
            raise ValueError(f'Unsupported mode: {mode!r}. Please choose from ["min", "max"].')
        if not self.best_checkpoints:
            raise RuntimeError("No checkpoint exists in this Result: the run never reported a checkpoint "
                               "(pass checkpoint= to minitrain.report()).")
        scored, names = [], set()
        for checkpoint, metrics in self.best_checkpoints:
            flat = _flatten(metrics or {})
            names.update(flat)
            if metric in flat:
                scored.append((flat[metric], checkpoint))
        if not scored:
            raise RuntimeError(f"Invalid metric name {metric!r}: no checkpoint reported it. "
                               f"You may choose from the following metrics: {sorted(names)}.")
        pick = max if mode == "max" else min
        return pick(scored, key=lambda item: item[0])[1]

    @classmethod
    def from_path(cls, path: str, storage_filesystem: Any = None) -> "Result":
        """Rebuild the Result of a finished run from its run directory `<storage_path>/<name>`.

        `path` may be a URL when `storage_filesystem` (an fsspec filesystem or a `pyarrow.fs.FileSystem`)
        is not given. Reads
        `checkpoint_manager_snapshot.json` and, if present, `metrics.jsonl`. `best_checkpoints` holds
        every retained checkpoint in snapshot order, plus the latest if it is missing there (so it can
        include a latest checkpoint outside the top K, as Ray's `from_path` does); `checkpoint` is the
        latest; `metrics` is the last report in `metrics.jsonl`, else the latest checkpoint's metrics;
        `error` is None. A run that never committed a checkpoint has no snapshot and raises `RuntimeError`.
        """
        if storage_filesystem is None:
            fs, run_path = fsspec.core.url_to_fs(os.path.expanduser(os.fspath(path)))
        else:
            fs = as_fsspec(storage_filesystem, "Result.from_path(storage_filesystem=...)")
            run_path = fs._strip_protocol(os.fspath(path))
        shown = given_pyarrow(storage_filesystem) or fs  # shown to users as pyarrow: see `filesystem`
        if isinstance(fs, LocalFileSystem):
            run_path = os.path.abspath(os.path.expanduser(run_path))
        run_path = run_path.rstrip("/") or "/"
        if not fs.isdir(run_path):
            raise RuntimeError(f"Experiment folder {run_path} doesn't exist.")
        snapshot_path = f"{run_path}/{SNAPSHOT_FILE}"
        if not fs.exists(snapshot_path):
            raise RuntimeError(f"Failed to restore the Result: {SNAPSHOT_FILE} doesn't exist in the experiment "
                               f"folder {run_path}. A run that never committed a checkpoint has none.")
        snapshot = _read_json(fs, snapshot_path)

        def entry(record: dict) -> tuple:
            name = record.get("checkpoint_dir_name") if isinstance(record, dict) else None
            if not isinstance(name, str) or not name:
                raise ValueError(f"{snapshot_path}: checkpoint entry without a checkpoint_dir_name: {record!r}")
            return Checkpoint(f"{run_path}/{name}", filesystem=shown), record.get("metrics") or {}, name

        retained = [entry(record) for record in snapshot.get("checkpoint_results") or []]
        latest = snapshot.get("latest_checkpoint_result")
        latest_entry = entry(latest) if latest else None
        if latest_entry is not None:
            match = [item for item in retained if item[2] == latest_entry[2]]
            if match:
                latest_entry = match[0]  # the same Checkpoint object in both places
            else:
                retained.append(latest_entry)

        history = _read_history(fs, f"{run_path}/{METRICS_FILE}")
        if history:
            metrics = history[-1]
        else:
            metrics = latest_entry[1] if latest_entry is not None else None
        return cls(metrics=metrics, checkpoint=latest_entry[0] if latest_entry is not None else None,
                   error=None, path=run_path, best_checkpoints=[(ckpt, m) for ckpt, m, _ in retained],
                   _storage_filesystem=shown, _metrics_history=history or None)


def _get_metrics_dataframe(self: Result) -> Any:
    """pandas DataFrame of the run's rank-0 reports, built on first access; None when there is none."""
    if self._metrics_dataframe is None and self._metrics_history:
        try:
            import pandas
        except ImportError as exc:
            raise ImportError("Result.metrics_dataframe needs pandas: pip install pandas") from exc
        self._metrics_dataframe = pandas.DataFrame(list(self._metrics_history))
    return self._metrics_dataframe


def _set_metrics_dataframe(self: Result, value: Any) -> None:
    self._metrics_dataframe = value


# A property with the field's name: the generated __init__ (default None, captured above) assigns through
# the setter, so `Result(metrics_dataframe=df)` works as in Ray while the default is computed lazily.
Result.metrics_dataframe = property(_get_metrics_dataframe, _set_metrics_dataframe,
                                    doc=_get_metrics_dataframe.__doc__)


def _flatten(metrics: dict, prefix: str = "") -> dict:
    """`{"a": {"b": 1}}` -> `{"a": {"b": 1}, "a/b": 1}`: nested values addressable as "a/b"."""
    flat: dict = {}
    for key, value in metrics.items():
        name = f"{prefix}{key}"
        flat[name] = value
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{name}/"))
    return flat


def _read_json(fs: fsspec.AbstractFileSystem, location: str) -> dict:
    try:
        data = json.loads(fs.cat_file(location).decode("utf-8"))
    except ValueError as exc:
        raise ValueError(f"{location} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ValueError(f"{location} must hold a JSON object, got {type(data).__name__}.")
    return data


def _read_history(fs: fsspec.AbstractFileSystem, location: str) -> list:
    """The `metrics` of each line of metrics.jsonl; a torn last line (a crash mid-write) is ignored."""
    if not fs.exists(location):
        return []
    try:
        entries, _ = split_metrics_lines(fs.cat_file(location).decode("utf-8"))
    except ValueError as exc:
        raise ValueError(f"{location}: {exc}") from None
    return [entry["metrics"] for entry in entries]
