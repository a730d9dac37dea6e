"""Checkpoint directories that several ranks write into: who uploads them, and how to stage them.

Frameworks that shard checkpoints (FSDP, DeepSpeed, Lightning, Hugging Face) make every rank write
its part into one directory path, agreed between the ranks. On one node the ranks share that
directory; on several nodes each node has its own copy holding its ranks' parts. `report()` merges
the files of every rank that passes a checkpoint, so exactly one rank per physical directory must
pass it: two processes copying the same file into storage at once could interleave their writes.

Used by `minitrain.lightning` and `minitrain.huggingface.transformers`; useful in any training
function that saves with such a framework and then calls `minitrain.report`.
"""

from __future__ import annotations

import os
import shutil
from typing import Optional

import minitrain


def owns_directory(path: Optional[str]) -> bool:
    """True on exactly one rank for each distinct directory: the lowest rank with the same
    (node rank, real path). False where `path` is None (this rank has nothing to upload).

    A collective: every rank of the run must call it, in the same order as its other collectives
    (it is an `all_gather_object` over the default process group when the world size is above 1).
    Raises `RuntimeError` outside a training function.
    """
    context = minitrain.get_context()
    key = None if path is None else (context.get_node_rank(), os.path.realpath(path))
    if context.get_world_size() <= 1:
        return key is not None
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("owns_directory() needs the default process group (minitrain workers have it "
                           "from the start of the training function).")
    keys: list = [None] * dist.get_world_size()
    dist.all_gather_object(keys, key)
    return key is not None and keys.index(key) == dist.get_rank()


def link_or_copy_tree(source: str, destination: str) -> None:
    """Recreate the directory tree `source` at `destination` (which must not exist), hard-linking
    each file where the filesystem allows and copying it where it does not (another filesystem).

    Hard links make staging a large checkpoint free, and the staged tree survives the framework
    deleting `source` (checkpoint rotation). A file rewritten in place changes in both trees, so
    upload the staged tree before the framework saves again.
    """
    shutil.copytree(source, destination, copy_function=_link_or_copy, symlinks=False)


def _link_or_copy(source: str, destination: str) -> None:
    try:
        os.link(source, destination)
    except OSError:  # EXDEV (another filesystem), EPERM (no hard links), ...
        shutil.copy2(source, destination)
