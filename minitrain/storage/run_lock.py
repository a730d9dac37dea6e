"""One `fit()` at a time per run directory (L1: storage).

Two drivers writing one run directory would delete each other's uploads and overwrite each other's
index. `RunLock` is held for the whole `fit()`:

- Local and NFS storage: an exclusive open-file-description lock (`F_OFD_SETLK`, Linux; NFS carries
  it to the server's lock manager like a POSIX record lock) on `<run>/.minitrain_lock`. The kernel
  drops it when the holder dies, however it dies, so the lock of a dead driver is taken over at once
  and safely. Not a classic POSIX `lockf`: that one is dropped as soon as the process closes ANY
  descriptor of the file (a copy of the run directory, a look at the holder), which silently let a
  second driver in. Where OFD locks are missing (not Linux), `flock`. The file holds who has it
  (host, pid, since) for the error message.
- Object stores and other fsspec filesystems: a lease object `<run>/.minitrain_lock` written with a
  conditional create (`pipe_file(mode="create")`, S3's `If-None-Match: *`), renewed every
  `LEASE_RENEW_S` by the holder; a lease not renewed for `LEASE_EXPIRY_S` belongs to a dead driver
  and is taken over (delete, then a conditional create: two takers cannot both win the create, but
  a holder frozen for longer than the expiry loses its lease). Every lease carries a random token:
  a holder renews and releases only a lease that still holds its token, so one that lost its lease
  never overwrites or deletes the new holder's (it logs an error naming the new holder and stops
  renewing). Where the filesystem has no conditional create the same steps run as a best effort (an
  existence check before the write).
- Within one process, a registry refuses a second lock of the same directory with a message that
  says so (the file lock would refuse it too, naming this process as the holder).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import socket
import struct
import threading
import time
import uuid
from typing import Any, Optional

from minitrain.errors import ConfigError
from minitrain.storage.filesystem import Storage, StorageError
from minitrain.storage.layout import LOCK_NAME, RESERVED_NAMES

logger = logging.getLogger("minitrain")

LEASE_RENEW_S = 10.0
LEASE_EXPIRY_S = 60.0

_held_lock = threading.Lock()
_held: set[str] = set()  # run directory URLs locked by this process


def _lock_exclusive(fd: int) -> None:
    """An exclusive lock on the whole file that belongs to this open file description; OSError
    (EAGAIN/EACCES) when another description holds it."""
    if hasattr(fcntl, "F_OFD_SETLK"):
        # struct flock: l_type, l_whence, l_start, l_len (0: to the end), l_pid (0 for OFD locks)
        fcntl.fcntl(fd, fcntl.F_OFD_SETLK, struct.pack("hhqqi4x", fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0))
    else:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)


class RunLockedError(ConfigError):
    """Another `fit()` runs in the same run directory; the message names it and the fix."""


def _holder_text(holder: dict, url: str) -> str:
    since = holder.get("since")
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(since)) if isinstance(since, (int, float)) else "?"
    return (f"The run directory {url} is in use by another fit() (host {holder.get('host', '?')}, pid "
            f"{holder.get('pid', '?')}, since {when}). Two runs in one directory would delete each "
            "other's uploads. Wait for that run to end (a crashed driver's lock is released at once), "
            "or choose another RunConfig(name=...).")


class RunLock:
    """The lock of one run directory; `acquire()` before anything is written, `release()` at the end."""

    def __init__(self, storage: Storage):
        self._storage = storage
        self._url = storage.url()
        self._fd: Optional[int] = None
        self._renewer: Optional[threading.Thread] = None
        self._stop = threading.Event()
        self._holder = {"host": socket.gethostname(), "pid": os.getpid(), "since": time.time(),
                        "token": uuid.uuid4().hex}
        self.lost_lease = False  # set by the renewer when another driver took the lease over

    def __enter__(self) -> "RunLock":
        self.acquire()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()

    def acquire(self) -> None:
        """Take the lock, or raise `RunLockedError` naming the holder (StorageError when storage fails)."""
        with _held_lock:
            if self._url in _held:
                raise RunLockedError(_holder_text({**self._holder, "pid": f"{os.getpid()} (this process)"},
                                                  self._url))
            _held.add(self._url)
        try:
            self._storage.makedirs()
            # Links or other users' entries under minitrain's own names (a shared storage_path) are
            # refused before anything is written; every later write refuses them again, one by one.
            self._storage.refuse_planted(RESERVED_NAMES)
            if self._storage.is_local:
                self._lock_file()
            else:
                self._take_lease()
        except BaseException:
            with _held_lock:
                _held.discard(self._url)
            raise

    def release(self) -> None:
        """Give the lock up (idempotent)."""
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join(timeout=5)
            self._renewer = None
        if self._fd is not None:
            os.close(self._fd)  # drops the fcntl lock; the file stays (deleting it would race a taker)
            self._fd = None
        elif not self._storage.is_local and self._still_ours():
            try:
                self._storage.fs.rm(self._storage.path(LOCK_NAME))
            except (OSError, FileNotFoundError):
                pass
        with _held_lock:
            _held.discard(self._url)

    # ------------------------------------------------------------------ local and NFS

    def _lock_file(self) -> None:
        fd = self._storage.open_local(LOCK_NAME, os.O_RDWR | os.O_CREAT)  # no link followed
        try:
            _lock_exclusive(fd)
        except OSError:
            holder = _parse_holder(os.pread(fd, 4096, 0))
            os.close(fd)
            raise RunLockedError(_holder_text(holder, self._url)) from None
        data = json.dumps(self._holder).encode()
        os.ftruncate(fd, 0)
        os.pwrite(fd, data, 0)
        self._fd = fd

    # ------------------------------------------------------------------ object stores

    def _take_lease(self) -> None:
        fs, path = self._storage.fs, self._storage.path(LOCK_NAME)
        for _ in range(2):
            if self._create(fs, path):
                self._renewer = threading.Thread(target=self._renew, name="minitrain-run-lease", daemon=True)
                self._renewer.start()
                return
            try:
                holder = _parse_holder(fs.cat_file(path))
            except FileNotFoundError:
                continue  # released meanwhile: try again
            renewed = holder.get("renewed_at", holder.get("since", 0))
            if not isinstance(renewed, (int, float)) or time.time() - renewed <= LEASE_EXPIRY_S:
                raise RunLockedError(_holder_text(holder, self._url))
            try:  # a dead driver's lease: take it over
                fs.rm(path)
            except FileNotFoundError:
                pass
        raise RunLockedError(_holder_text({}, self._url))

    def _create(self, fs: Any, path: str) -> bool:
        data = json.dumps({**self._holder, "renewed_at": time.time()}).encode()
        try:
            fs.pipe_file(path, data, mode="create")
            return True
        except FileExistsError:
            return False
        except (TypeError, NotImplementedError):  # no conditional create: a best effort
            if fs.exists(path):
                return False
            fs.pipe_file(path, data)
            return True
        except OSError as exc:
            if "precondition" in str(exc).lower():  # S3's 412 for If-None-Match
                return False
            raise StorageError(f"could not take the run lock {self._storage.url(LOCK_NAME)}: {exc}") from exc

    def _still_ours(self) -> bool:
        """True when the lease object holds this lock's token (a read: best effort, no conditional write)."""
        try:
            self._storage.fs.invalidate_cache(self._storage.path(LOCK_NAME))
            holder = _parse_holder(self._storage.fs.cat_file(self._storage.path(LOCK_NAME)))
        except FileNotFoundError:
            return False
        except Exception:  # noqa: BLE001 - unknown: act as before (renew, or delete at release)
            return True
        if holder.get("token") == self._holder["token"]:
            return True
        if not self.lost_lease:
            self.lost_lease = True
            logger.error("The run lock of %s was taken over by another fit() (host %s, pid %s): this driver's lease "
                         "went unrenewed for over %.0f s (the process was frozen or cut off from storage). Two runs "
                         "in one directory may now delete each other's uploads; this driver no longer renews or "
                         "releases the lock.", self._url, holder.get("host", "?"), holder.get("pid", "?"),
                         LEASE_EXPIRY_S)
        return False

    def _renew(self) -> None:
        fs, path = self._storage.fs, self._storage.path(LOCK_NAME)
        while not self._stop.wait(LEASE_RENEW_S):
            if not self._still_ours():
                return
            try:
                fs.pipe_file(path, json.dumps({**self._holder, "renewed_at": time.time()}).encode())
            except Exception:  # noqa: BLE001 - the next renewal tries again
                pass


def _parse_holder(data: bytes) -> dict:
    try:
        holder = json.loads(data.decode("utf-8") or "{}")
    except ValueError:
        return {}
    return holder if isinstance(holder, dict) else {}
