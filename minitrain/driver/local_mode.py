"""Local mode (`ScalingConfig(num_workers=0)`): the training function runs in the driver's own process, as
Ray's local mode does: no workers, no run directory, the last report kept in memory (L3)."""

from __future__ import annotations

import logging
from typing import Any, Callable, Optional

from minitrain import _session
from minitrain.checkpoint import Checkpoint
from minitrain.config import DataConfig, RunConfig
from minitrain.context import TrainContext
from minitrain.errors import ConfigError
from minitrain.metrics import encode_metrics
from minitrain.result import Result

logger = logging.getLogger("minitrain")


def fit(train_loop_per_worker: Callable, takes_config: bool, train_loop_config: Optional[dict],
        run_config: RunConfig, datasets: Optional[dict], dataset_config: DataConfig) -> Result:
    """Run `train_loop_per_worker` (with `train_loop_config`, or {}, when `takes_config`) in this thread
    with a local session bound; the Result holds its last report and its return value. RunConfig.callbacks
    are refused (ConfigError): local mode has no run directory and no report rounds."""
    if run_config.callbacks:
        raise ConfigError("RunConfig.callbacks are not called in local mode (ScalingConfig(num_workers=0)): "
                          "it has no run directory and no report rounds. Use num_workers >= 1, or remove "
                          "the callbacks.")
    session = _LocalSession(TrainContext(experiment_name=run_config.name, local_mode=True))
    if datasets:
        from minitrain.data.staging import make_shards, plan_datasets

        session.dataset_shards = make_shards(plan_datasets(datasets, dataset_config), session.context)
    name = getattr(train_loop_per_worker, "__name__", "the training function")
    # Said like a run's start and end lines: local mode used to print nothing at all.
    logger.info("local mode (ScalingConfig(num_workers=0)): running %s in this process, without workers "
                "or a run directory", name)
    with _session.bound(session):  # this thread's only: local fit()s on two threads stay apart
        if takes_config:
            value = train_loop_per_worker(train_loop_config or {})
        else:
            value = train_loop_per_worker()
    logger.info("local mode: %s returned; last report: %s", name, session.last_metrics)
    return Result(metrics=session.last_metrics, checkpoint=session.last_checkpoint, error=None,
                  path=None, return_value=value)


class _LocalSession:
    """Local mode's session: remembers the last report (metrics and checkpoint), like Ray's."""

    def __init__(self, context: TrainContext):
        self.context = context
        self.last_metrics: Optional[dict] = None
        self.last_checkpoint: Any = None
        self.dataset_shards: dict = {}  # name -> minitrain.data.DataIterator over all rows

    def report(self, metrics: dict, checkpoint: Any = None, checkpoint_dir_name: Optional[str] = None,
               **options: Any) -> None:
        """Remember the last metrics and checkpoint (nothing is uploaded in local mode, as in Ray)."""
        encode_metrics(metrics)  # the same JSON-safety rule as in workers
        if checkpoint is not None and not isinstance(checkpoint, Checkpoint):
            raise TypeError(f"minitrain.report(checkpoint=...) expects a minitrain.Checkpoint, got "
                            f"{type(checkpoint).__name__}; use minitrain.Checkpoint.from_directory(path).")
        self.last_metrics = dict(metrics)
        self.last_checkpoint = checkpoint

    def get_checkpoint(self) -> Any:
        """The last reported checkpoint argument (None after a metrics-only report), as Ray's local mode."""
        return self.last_checkpoint
