"""`Result`: what `TorchTrainer.fit()` returns (L3)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional


@dataclass
class Result:
    """The outcome of a finished run, as `ray.train.Result`.

    `metrics` is rank 0's last report (a deliberate difference from Ray v2, where it is the metrics of
    the last checkpoint); `path` is the run directory `<storage_path>/<name>` (None in local mode);
    `return_value` is what rank 0's training function returned, when it could be sent back.
    """

    metrics: Optional[dict]
    checkpoint: Any
    error: Optional[BaseException]
    path: Optional[str]
    metrics_dataframe: Any = None
    best_checkpoints: list = field(default_factory=list)
    _storage_filesystem: Any = None
    return_value: Any = None

    @property
    def filesystem(self) -> Any:
        """The storage filesystem of `path` (an fsspec filesystem), or None for a local path."""
        return self._storage_filesystem

    @property
    def config(self):
        """Removed in Ray Train v2; raises `DeprecationWarning` as Ray does."""
        raise DeprecationWarning("Result.config was removed in Ray Train v2 (which minitrain mirrors); "
                                 "keep your train_loop_config yourself.")
