"""A local working copy of a run directory that lives inside the driver process (L1: fsspec).

fsspec's `memory://` filesystem exists only in the process that made it, and workers are separate
processes: they could not read or write it. So a run on `memory://` storage works on a local
directory on the driver's node (the mirror), and the mirror is published into the memory filesystem
when `fit()` ends, however it ends. Nothing is lost by publishing only then: the memory filesystem
dies with the driver, so no other process could have seen it earlier, and the driver's own code is
blocked in `fit()` meanwhile. This works on one node only (the mirror is a local directory); the
trainer refuses `memory://` for several hosts.

Inside the mirror everything is what it is on local storage: atomic index writes, top-K evictions,
garbage collection of partial uploads. The memory run directory ends up with exactly the mirror's
files (deleted checkpoints are deleted there too).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

from fsspec.implementations.local import LocalFileSystem
from fsspec.implementations.memory import MemoryFileSystem

from minitrain.storage.filesystem import Storage, StorageError


def lives_in_this_process(storage: Storage) -> bool:
    """True when `storage` is a filesystem only this process can see (fsspec's `memory://`)."""
    return isinstance(storage.fs, MemoryFileSystem)


@contextmanager
def local_mirror(storage: Storage) -> Iterator[Storage]:
    """A local run directory holding a copy of `storage`'s run directory (if it has one), yielded
    for the run to use; on exit (also on an exception or KeyboardInterrupt) its content replaces the
    run directory in `storage`, and the local copy is deleted. If the copy cannot be made, the error
    is raised and `storage` is left as it was."""
    staging = tempfile.mkdtemp(prefix="minitrain_memory_run_")
    local = Storage(LocalFileSystem(), staging)
    try:
        if storage.isdir(""):
            storage.download_dir("", staging)
    except BaseException:  # an incomplete copy must never replace the run directory
        shutil.rmtree(staging, ignore_errors=True)
        raise
    try:
        yield local
    finally:
        try:
            publish(local, storage)
        finally:
            shutil.rmtree(staging, ignore_errors=True)


def publish(local: Storage, storage: Storage) -> None:
    """Make `storage`'s run directory an exact copy of the local run directory `local`."""
    try:
        if storage.fs.exists(storage.root):
            storage.fs.rm(storage.root, recursive=True)
    except OSError as exc:
        raise StorageError(f"could not replace {storage.url()} with the run's files: {exc}") from exc
    storage.upload_dir(local.path(), "")
