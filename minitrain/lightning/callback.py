"""`RayTrainReportCallback` for Lightning: report metrics and a checkpoint at the end of every epoch."""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any, Optional

import torch

import minitrain
from minitrain.checkpoint import Checkpoint
from minitrain.lightning._compat import pl
from minitrain.reporting import CheckpointUploadMode
from minitrain.torch.checkpoint_dirs import owns_directory


class RayTrainReportCallback(pl.callbacks.Callback):
    """At the end of every training epoch, save a Lightning checkpoint and `minitrain.report` it.

    Metrics are `trainer.callback_metrics` as Python numbers, plus `"epoch"` (`trainer.current_epoch`)
    and `"step"` (`trainer.global_step`). The checkpoint is `trainer.save_checkpoint(...,
    weights_only=False)` at `<dir>/checkpoint.ckpt` (`CHECKPOINT_NAME`), so resuming is
    `trainer.fit(model, ckpt_path=os.path.join(d, RayTrainReportCallback.CHECKPOINT_NAME))` with `d`
    from `minitrain.get_checkpoint().as_directory()`.

    Every rank reports once per epoch. `<dir>` is one temporary path agreed by all ranks (rank 0
    chooses it), because Lightning's sharded strategies (FSDP `state_dict_type="sharded"`, DeepSpeed)
    make every rank write its part there; one rank per physical directory uploads it, so the parts of
    all ranks, on every node, merge into one checkpoint directory. The temporary files are removed
    after the upload. `checkpoint_upload_mode` (default `SYNC`) and `validation` are passed to
    `minitrain.report`. Same name and behaviour as `ray.train.lightning.RayTrainReportCallback`;
    must be created inside a training function (it raises `RuntimeError` elsewhere).
    """

    CHECKPOINT_NAME = "checkpoint.ckpt"

    def __init__(self, checkpoint_upload_mode: Optional[CheckpointUploadMode] = None,
                 validation: Any = False) -> None:
        super().__init__()
        self._context = minitrain.get_context()  # fails outside a training function, as Ray's does
        self._upload_mode = CheckpointUploadMode(checkpoint_upload_mode or CheckpointUploadMode.SYNC)
        self._validation = validation
        self._root: Optional[str] = None
        self._owner = False

    def on_train_epoch_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        """Save, report, wait for every rank, then delete the temporary checkpoint (all ranks call it)."""
        root = self._shared_root(trainer)
        directory = os.path.join(root, str(trainer.current_epoch))
        metrics = _metrics(trainer)
        trainer.save_checkpoint(os.path.join(directory, self.CHECKPOINT_NAME), weights_only=False)
        checkpoint = None
        if self._owner and os.path.isdir(directory):  # DDP: other nodes' copies stay empty
            checkpoint = Checkpoint.from_directory(directory)
        minitrain.report(metrics, checkpoint=checkpoint, checkpoint_upload_mode=self._upload_mode,
                         validation=self._validation)
        trainer.strategy.barrier("RayTrainReportCallback.on_train_epoch_end")
        if self._owner:
            shutil.rmtree(directory, ignore_errors=True)

    def teardown(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", stage: str) -> None:
        """Remove the temporary directory at the end of `fit`/`validate`/..."""
        if self._root is not None and self._owner:
            shutil.rmtree(self._root, ignore_errors=True)
        self._root, self._owner = None, False

    def _shared_root(self, trainer: "pl.Trainer") -> str:
        if self._root is None:
            chosen = None
            if trainer.global_rank == 0:
                chosen = tempfile.mkdtemp(prefix=f"minitrain-lightning-rank0-{os.getpid()}-")
            root = trainer.strategy.broadcast(chosen, src=0)
            os.makedirs(root, exist_ok=True)  # on other nodes
            self._owner = owns_directory(root)
            self._root = root
        return self._root


def _metrics(trainer: "pl.Trainer") -> dict[str, Any]:
    metrics = {}
    for key, value in trainer.callback_metrics.items():
        metrics[key] = value.item() if isinstance(value, torch.Tensor) else value
    metrics["epoch"] = trainer.current_epoch
    metrics["step"] = trainer.global_step
    return metrics


MinitrainTrainReportCallback = RayTrainReportCallback
