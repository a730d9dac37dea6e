"""Vocabulary of `report()` with checkpoints (L0): upload modes and reported-checkpoint records."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any


class CheckpointUploadMode(str, enum.Enum):
    """How `report(checkpoint=...)` persists the checkpoint (as `ray.train.CheckpointUploadMode`).

    SYNC: upload, then return. ASYNC: return at once; uploads run in order on a background thread, and
    a failed upload fails the worker. NO_UPLOAD: the checkpoint already lies in the run directory.
    """

    SYNC = "SYNC"
    ASYNC = "ASYNC"
    NO_UPLOAD = "NO_UPLOAD"

    def default_delete_local_checkpoint_after_upload(self) -> bool:
        """Ray's default: delete the local directory after an ASYNC upload only."""
        return self is CheckpointUploadMode.ASYNC


class CheckpointConsistencyMode(str, enum.Enum):
    """Accepted for Ray compatibility: every listed checkpoint is committed (there is no validation)."""

    COMMITTED = "COMMITTED"
    VALIDATED = "VALIDATED"


class ReportedCheckpointStatus(str, enum.Enum):
    """The state of a listed checkpoint; minitrain lists committed checkpoints only."""

    COMMITTED = "COMMITTED"


@dataclass(frozen=True)
class ReportedCheckpoint:
    """One committed checkpoint of the run with the rank-0 metrics it was reported with."""

    checkpoint: Any
    metrics: dict
    status: ReportedCheckpointStatus = ReportedCheckpointStatus.COMMITTED
