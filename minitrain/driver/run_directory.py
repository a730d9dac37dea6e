"""The driver's side of a run directory, before and after a `fit()` (L3): where it is, whether this
run may use it, its lock, what is uploaded when the run ends, and what is deleted when it never started.

Every refusal is a `ConfigError` naming the `RunConfig` field, the value and the fix, raised before any
process starts: a `storage_path` that is a file, `memory://` storage on a multi-host cluster, a run
directory reached through a symbolic link, a directory that holds someone's files but no run index, a
run directory another `fit()` holds (`RunLockedError`), or storage the driver cannot write.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
from typing import Any, Iterator

from minitrain.config import RunConfig
from minitrain.driver import messages as fit_notes
from minitrain.errors import ConfigError
from minitrain.hosts.cluster import ClusterConfig
from minitrain.storage.checkpoint_manager import INDEX_NAME, CheckpointManager
from minitrain.storage.filesystem import Storage, StorageError
from minitrain.storage.layout import LOGS_DIR, is_own_name
from minitrain.storage.mirror import lives_in_this_process
from minitrain.storage.run_lock import RunLock

logger = logging.getLogger("minitrain")


def storage_at(path: str, storage_filesystem: Any = None) -> Storage:
    """The run directory at `path` (its parent is the storage path, its last component the run's name)."""
    parent, _, name = path.rstrip("/").rpartition("/")
    return Storage.for_run(parent or ".", name, storage_filesystem)


def prepare_storage(run_config: RunConfig, cluster: ClusterConfig) -> Storage:
    """The run directory, refused (ConfigError) when it cannot be used or is not minitrain's to use."""
    if run_config.storage_filesystem is None and (error := fit_notes.file_in_storage_path(run_config.storage_path)):
        raise error
    try:
        storage = Storage.for_run(run_config.storage_path, run_config.name, run_config.storage_filesystem)
    except (ValueError, ImportError) as exc:
        raise ConfigError(f"RunConfig.storage_path={run_config.storage_path!r} cannot be used: {exc}") from None
    if lives_in_this_process(storage) and not cluster.all_local:
        remote = ", ".join(host.name for host in cluster.hosts if not host.local)
        raise ConfigError(
            f"RunConfig.storage_path={run_config.storage_path!r}: memory:// storage lives inside this process, "
            f"so it works on this node only, and the cluster has other hosts ({remote}). Use storage every "
            "host can reach: an NFS directory or an object store such as s3://.")
    try:
        check_ownership(storage, run_config)
    except StorageError as exc:
        raise ConfigError(f"RunConfig.storage_path={run_config.storage_path!r} is not usable: {exc}") from None
    return storage


def check_ownership(storage: Storage, run_config: RunConfig) -> None:
    """Refuse a run directory reached through a symbolic link, and an existing directory that holds
    files but is not a minitrain run (no index): minitrain writes into and deletes from its own run
    directories only."""
    where = f"RunConfig(name={run_config.name!r}, storage_path={run_config.storage_path!r})"
    if storage.is_local and os.path.islink(storage.root):
        target = os.path.realpath(storage.root)
        raise ConfigError(
            f"{where}: the run directory {storage.root} is a symbolic link to {target}. minitrain does not "
            "run in (or delete from) a directory reached through a link anyone who can write the storage "
            f"path could plant. Use the real path: storage_path={os.path.dirname(target)!r}, "
            f"name={os.path.basename(target)!r}.")
    entries = storage.list_entries()
    if not entries or INDEX_NAME in entries:
        return
    foreign = [name for name in entries if not is_own_name(name)]
    if foreign:
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        raise ConfigError(
            f"{where}: the directory {storage.url()} already holds files that are not a minitrain run "
            f"({shown}), and it has no {INDEX_NAME}. minitrain never writes into or deletes from a "
            "directory it did not create. Choose another RunConfig(name=...) or storage_path, or move "
            "those files away.")


@contextlib.contextmanager
def locked(storage: Storage, run_config: RunConfig) -> Iterator[None]:
    """Hold the run directory's lock (RunLockedError, a ConfigError, names the holder)."""
    lock = RunLock(storage)
    try:
        lock.acquire()
    except StorageError as exc:
        raise ConfigError(f"RunConfig.storage_path={run_config.storage_path!r} is not usable: {exc}") from None
    try:
        yield
    finally:
        lock.release()


def validate_writable(storage: Storage, run_config: RunConfig) -> None:
    """Refuse storage the driver cannot write (ConfigError naming `storage_path`)."""
    try:
        storage.validate_writable()
    except StorageError as exc:
        raise ConfigError(f"RunConfig.storage_path={run_config.storage_path!r} is not usable: {exc}") from None


def load_checkpoints(storage: Storage, run_config: RunConfig) -> CheckpointManager:
    """The run's checkpoint index (a new one when the run directory has none)."""
    # A corrupted index is an error here, before any process starts; it never silently starts fresh.
    return CheckpointManager.load(storage, run_config.checkpoint_config)


def upload_logs(storage: Storage, logs_dir: str) -> None:
    """Copy the workers' logs kept in the local `logs_dir` into the run directory (remote storage), then
    delete `logs_dir`; a failure is logged, never raised (the run's result matters more)."""
    try:
        storage.upload_dir(logs_dir, LOGS_DIR)
    except Exception as exc:  # the run's result matters more than its logs
        logger.error("could not upload the worker logs from %s to %s: %s", logs_dir, storage.url(LOGS_DIR), exc)
        return
    shutil.rmtree(logs_dir, ignore_errors=True)


def remove_unstarted_run(storage: Storage) -> None:
    """Delete the entries minitrain names (lock, marker, index) in a run directory that this fit()
    created and in which no attempt started, then the directory when it is empty. Never raises:
    the error that ended fit() matters more."""
    try:
        for name in storage.list_entries():
            if is_own_name(name):
                storage.remove_tree(name)
        if storage.is_local:
            os.rmdir(storage.root)
    except Exception:  # noqa: BLE001 - a leftover is better than hiding the real error
        pass
