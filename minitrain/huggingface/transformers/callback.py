"""`RayTrainReportCallback` for the `transformers.Trainer`: report every checkpoint it saves."""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any

import minitrain
from minitrain.checkpoint import Checkpoint
from minitrain.huggingface.transformers._compat import TrainerCallback, get_last_checkpoint
from minitrain.torch.checkpoint_dirs import link_or_copy_tree, owns_directory


class RayTrainReportCallback(TrainerCallback):
    """Each time the Trainer saves a checkpoint, `minitrain.report` it with the metrics logged so far.

    Metrics: every dict in `state.log_history` merged into one (later keys win), e.g. `loss`,
    `learning_rate`, `eval_loss`, `epoch`, `step`. Checkpoint: the newest `checkpoint-<step>` folder
    under `args.output_dir`, staged (hard links where possible) as `<dir>/checkpoint`
    (`CHECKPOINT_NAME`), so resuming is `trainer.train(resume_from_checkpoint=os.path.join(d,
    RayTrainReportCallback.CHECKPOINT_NAME))` with `d` from `minitrain.get_checkpoint().as_directory()`.

    Every rank reports once per save, after all ranks finished writing (a barrier), so shards written
    by several ranks (DeepSpeed, FSDP, per-rank RNG states) all arrive. One rank per physical folder
    uploads it (ranks on one node usually share `output_dir`); the staging copy is removed after
    the upload. Same name and behaviour as `ray.train.huggingface.transformers.RayTrainReportCallback`.
    """

    CHECKPOINT_NAME = "checkpoint"

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Report the newest checkpoint and the merged log history (all ranks call it)."""
        metrics: dict[str, Any] = {}
        for entry in state.log_history:
            metrics.update(entry)
        _barrier()  # every rank's files of this checkpoint are written
        source = get_last_checkpoint(args.output_dir) if os.path.isdir(args.output_dir) else None
        staging = None
        checkpoint = None
        if owns_directory(source):
            staging = tempfile.mkdtemp(prefix="minitrain-transformers-")
            link_or_copy_tree(source, os.path.join(staging, self.CHECKPOINT_NAME))
            checkpoint = Checkpoint.from_directory(staging)
        try:
            minitrain.report(metrics, checkpoint=checkpoint)
        finally:
            if staging is not None:
                shutil.rmtree(staging, ignore_errors=True)


def _barrier() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


MinitrainTrainReportCallback = RayTrainReportCallback
