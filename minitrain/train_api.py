"""The per-worker functions a training function calls: `report`, `get_checkpoint`, `get_context`, ...

Each is valid only inside a training function (a worker, or the driver in local mode); elsewhere it
raises the RuntimeError Ray raises. They are thin: the current session does the work.
"""

from __future__ import annotations

from typing import Any, Optional

from minitrain import _session
from minitrain.context import TrainContext


def report(metrics: dict, checkpoint: Any = None, checkpoint_dir_name: Optional[str] = None,
           checkpoint_upload_mode: Any = None, delete_local_checkpoint_after_upload: Optional[bool] = None,
           checkpoint_upload_fn: Any = None, validation: Any = False) -> None:
    """Report this rank's metrics (and, later, a checkpoint) for the current round.

    Without a checkpoint the call returns at once: it never waits for the other ranks (unlike Ray,
    where every report is a barrier). Metrics must be JSON-safe; a value that is not (a tensor, say)
    raises ValueError naming its key. Rank 0's reports form the run's metrics history, and
    `Result.metrics` is rank 0's last report.
    """
    options = {}
    if checkpoint_upload_mode is not None:
        options["checkpoint_upload_mode"] = checkpoint_upload_mode
    if delete_local_checkpoint_after_upload is not None:
        options["delete_local_checkpoint_after_upload"] = delete_local_checkpoint_after_upload
    if checkpoint_upload_fn is not None:
        options["checkpoint_upload_fn"] = checkpoint_upload_fn
    if validation:
        options["validation"] = validation
    _session.current("report").report(metrics, checkpoint, checkpoint_dir_name, **options)


def get_checkpoint() -> Any:
    """The checkpoint to resume from: the latest committed one at the start of an attempt, else None."""
    return _session.current("get_checkpoint").get_checkpoint()


def get_context() -> TrainContext:
    """This worker's `TrainContext` (ranks, world sizes, experiment name)."""
    return _session.current("get_context").context


def get_dataset_shard(dataset_name: Optional[str] = None) -> Any:
    """This rank's shard of `TorchTrainer(datasets=...)[dataset_name]`.

    Raises KeyError, as Ray does, when no dataset of that name was given to the trainer.
    """
    session = _session.current("get_dataset_shard")
    shards = getattr(session, "dataset_shards", {}) or {}
    if dataset_name not in shards:
        raise KeyError(f"Dataset shard for '{dataset_name}' not found. Please ensure that the dataset "
                       "is passed through the Trainer `datasets` argument.")
    return shards[dataset_name]
