"""The per-worker functions a training function calls: `report`, `get_checkpoint`, `get_context`, ...

Each is valid only inside a training function (a worker, or the driver in local mode); elsewhere it
raises the RuntimeError Ray raises. They are thin: the current session does the work. The exception
is `get_preemption_info`, which needs no session and works anywhere.
"""

from __future__ import annotations

from typing import Any, Optional

from minitrain import _session, waits
from minitrain.context import TrainContext
from minitrain.records import PreemptionInfo
from minitrain.reporting import CheckpointUploadMode, ReportedCheckpoint


def report(metrics: dict, checkpoint: Any = None, checkpoint_dir_name: Optional[str] = None,
           checkpoint_upload_mode: CheckpointUploadMode = CheckpointUploadMode.SYNC,
           delete_local_checkpoint_after_upload: Optional[bool] = None,
           checkpoint_upload_fn: Any = None, validation: Any = False) -> None:
    """Report this rank's metrics, and optionally a checkpoint, for the current round.

    Without a checkpoint the call returns at once: it never waits for the other ranks (unlike Ray,
    where every report is a barrier). It waits only when this rank has 256 reports in flight that the
    coordinator has not recorded yet (backpressure: a coordinator that cannot keep up slows the loop
    down instead of the reports queueing without bound). Metrics must be JSON-safe; a value that is
    not (a tensor, say) raises ValueError naming its key. Rank 0's reports form the run's metrics
    history (also in `<run>/metrics.jsonl`), and `Result.metrics` is rank 0's last report.

    With a checkpoint, this rank's directory is uploaded into `<run>/<checkpoint_dir_name>/` (every
    rank of the round merges into that one directory; the default name comes from the round number,
    so ranks agree without talking) and the call returns once the coordinator recorded the report.
    The round is committed when every rank has reported it: the index is replaced atomically, then
    checkpoints evicted by `CheckpointConfig` are deleted. `checkpoint_upload_mode`: SYNC (upload,
    then return), ASYNC (return at once; uploads run in order in the background, and a failed upload
    fails the worker), NO_UPLOAD (the directory already lies in the run directory).
    `delete_local_checkpoint_after_upload` defaults to True for ASYNC, False otherwise. Ranks of one
    round may use different modes (and a `checkpoint_upload_fn` on some ranks only): the commit merges
    every rank's files into the one directory. A NO_UPLOAD writer or an upload function finds the run
    directory through `get_context().get_storage()`. `validation` takes only Ray's default, False:
    asynchronous checkpoint validation is not supported (ValueError naming the fix: evaluate in the
    training function and report the metrics with the checkpoint).

    Each call ends one step of the rank's telemetry (step time is the interval between calls; the
    time inside the call, waiting for a checkpoint round's commit included, is its report wait).
    """
    with waits.reporting():
        _session.current("report").report(
            metrics, checkpoint, checkpoint_dir_name, checkpoint_upload_mode=checkpoint_upload_mode,
            delete_local_checkpoint_after_upload=delete_local_checkpoint_after_upload,
            checkpoint_upload_fn=checkpoint_upload_fn, validation=validation)


def set_progress_total(total: int) -> None:
    """Declare how many `report()` calls the run makes in all, like tqdm's `total=`: the driver's
    console then shows progress (rounds reported / total) and an ETA. Count every report of the run,
    also those made before a restart or a resume (the console counts the run's report rounds). Call
    it on rank 0 (other ranks' values are used only until rank 0's arrives), before the loop or
    whenever the total changes. A minitrain extension (Ray has none). It travels with the rank's
    telemetry, so it has no effect with MINITRAIN_TELEMETRY=0.

    Raises ValueError for a total that is not a positive int, RuntimeError outside a training function.
    """
    _session.current("set_progress_total")
    if isinstance(total, bool) or not isinstance(total, int) or total <= 0:
        raise ValueError(f"set_progress_total(total={total!r}): the total must be a positive int, the number "
                         "of report() calls the run makes (e.g. epochs * steps_per_epoch).")
    waits.set_total(total)


def get_checkpoint() -> Any:
    """The checkpoint to resume from: the latest committed one at the start of an attempt, else None."""
    return _session.current("get_checkpoint").get_checkpoint()


def get_context() -> TrainContext:
    """This worker's `TrainContext` (ranks, world sizes, experiment name, and `get_storage()`: the run
    directory's `StorageContext`)."""
    return _session.current("get_context").context


def get_preemption_info() -> Optional[PreemptionInfo]:
    """A `PreemptionInfo` once the run is preempted and this rank has made the agreed number of
    reports (`info.round`), else None. Every rank sees it first after the same number of reports, so
    the next report, with a checkpoint, is one round that commits on every rank; after that report
    the rank is held until minitrain stops it (docs/preemption.md).

    Unlike Ray, it is not a collective: a rank that never calls it is not waited for, and calling it
    costs an attribute read until a preemption signal comes (then it waits, milliseconds, for the
    agreed round). It never raises: outside a training function and in local mode it returns None.
    """
    session = _session.current_or_none()
    asker = getattr(session, "get_preemption_info", None)
    return asker() if asker is not None else None


def get_all_reported_checkpoints(consistency_mode: Any = None,
                                 timeout_s: Optional[float] = None) -> list[ReportedCheckpoint]:
    """The run's committed checkpoints (across attempts and resumed runs) with their metrics, in
    retention order, once this rank's earlier reports have been recorded. Empty in local mode."""
    session = _session.current("get_all_reported_checkpoints")
    lister = getattr(session, "get_all_reported_checkpoints", None)
    return lister(timeout_s) if lister is not None else []


def get_dataset_shard(dataset_name: Optional[str] = None) -> Any:
    """This rank's shard of `TorchTrainer(datasets=...)[dataset_name]`: a `minitrain.data.DataIterator`
    (`iter_torch_batches`, `iter_batches`, `iter_rows`), the same object on every call.

    A split dataset (`DataConfig.datasets_to_split`) gives each rank a disjoint, near-equal part of
    every epoch; an unsplit one gives every rank all rows; each pass over an iterator is one epoch
    (see `minitrain.data.iterator`). Raises KeyError, as Ray does, when no dataset of that name was
    given to the trainer (also for the default name None).
    """
    session = _session.current("get_dataset_shard")
    shards = getattr(session, "dataset_shards", {}) or {}
    if dataset_name not in shards:
        raise KeyError(f"Dataset shard for '{dataset_name}' not found. Please ensure that the dataset "
                       "is passed through the Trainer `datasets` argument.")
    return shards[dataset_name]
