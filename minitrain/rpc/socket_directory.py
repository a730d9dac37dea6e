"""Private directories that hold one Unix socket each (L1): the one owner of how they are made, owned and
swept.

A local stream's socket (a node agent's relay, `minitrain.agent.transport.relay`; the coordinator's socket for the
agent on its own machine, `minitrain.coordinator.transport.local_agents`) lives in a directory of its own, made by
`mkdtemp` (mode 0700: only this user, and root, can reach the socket; the run token is checked too).

A process killed outright (SIGKILL, the OOM killer) cannot remove its directory. Each directory holds an
`owner.lock` file that its owner keeps flock'ed for its life (the kernel drops the lock when the process
dies, whatever kills it), so `create()` first removes the directories of the same kind and user whose lock
is free: those of dead owners, and only their socket, lock file and the then empty directory.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import tempfile
from typing import Optional

logger = logging.getLogger("minitrain")

LOCK_NAME = "owner.lock"  # flock'ed by the owning process for its life: free means the owner is gone
MAX_SOCKET_PATH = 107  # sun_path holds 108 bytes, the last one a NUL


class SocketDirectory:
    """A private directory named `prefix`* in the temporary directory, holding `socket_name`.

    `create()` makes it (sweeping dead owners' first) and holds its lock; `socket_path` is then where
    to bind; `remove()` (idempotent) removes the socket, the lock and the directory if that left it
    empty, then releases the lock.
    """

    def __init__(self, prefix: str, socket_name: str):
        self.prefix = prefix
        self.socket_name = socket_name
        self.path: Optional[str] = None
        self._lock_fd = -1

    @property
    def socket_path(self) -> str:
        """`path`/`socket_name` (after `create()`)."""
        if self.path is None:
            raise RuntimeError(f"the {self.prefix}* directory has not been created")
        return os.path.join(self.path, self.socket_name)

    def create(self) -> str:
        """Make the directory (0700) with its held lock; returns the socket's path. Raises OSError (and
        leaves nothing behind) when the path is too long for a Unix socket."""
        remove_stale(tempfile.gettempdir(), self.prefix, self.socket_name)
        self.path = tempfile.mkdtemp(prefix=self.prefix)  # mode 0700, ours alone
        self._lock_fd = hold_owner_lock(self.path)
        socket_path = self.socket_path
        if len(socket_path.encode()) > MAX_SOCKET_PATH:
            self.remove()
            raise OSError(f"the socket path {socket_path!r} is longer than a Unix socket allows "
                          f"({MAX_SOCKET_PATH} bytes); set TMPDIR to a shorter directory")
        return socket_path

    def remove(self) -> None:
        """Remove what `create()` made (idempotent); the lock goes last, so a sweeper never sees the
        directory without its owner."""
        path, self.path = self.path, None
        if path is not None:
            _remove(path, self.socket_name)
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1


def hold_owner_lock(directory: str) -> int:
    """Create `directory`/owner.lock already locked (made under another name, locked, then renamed:
    a sweeper never finds it unlocked while we live) and return its descriptor, held for our life."""
    temporary = os.path.join(directory, LOCK_NAME + ".new")
    fd = os.open(temporary, os.O_CREAT | os.O_EXCL | os.O_RDWR | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.rename(temporary, os.path.join(directory, LOCK_NAME))
    return fd


def _remove(directory: str, socket_name: str) -> None:
    """Remove the socket and lock in `directory`, then the directory if that left it empty."""
    for name in (socket_name, LOCK_NAME):
        try:
            os.unlink(os.path.join(directory, name))
        except FileNotFoundError:
            pass
    try:
        os.rmdir(directory)  # only an empty one: whatever else is there is not ours to delete
    except FileNotFoundError:
        pass
    except OSError as exc:
        logger.warning("could not remove the socket directory %s: %s", directory, exc)


def remove_stale(parent: str, prefix: str, socket_name: Optional[str]) -> list[str]:
    """Remove the `prefix`* directories in `parent` left by dead owners of this user; return them.

    A directory counts only when it is named like ours, is a real directory owned by this user, and
    has an owner.lock that nobody holds (its owner died: the kernel released the lock). A live
    owner's lock is held, so its directory is never touched; a directory without the lock file is
    being created, or is not ours, and is left alone. `socket_name=None` removes the whole directory
    (a node's memory tier, `minitrain.storage.memory_tier`, which holds files of the dead owner's run).
    """
    removed = []
    try:
        names = os.listdir(parent)
    except OSError:
        return removed
    for name in names:
        if not name.startswith(prefix):
            continue
        directory = os.path.join(parent, name)
        try:
            info = os.lstat(directory)
            if not os.path.isdir(directory) or os.path.islink(directory) or info.st_uid != os.getuid():
                continue
            fd = os.open(os.path.join(directory, LOCK_NAME), os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)  # held: its owner lives
            continue
        try:
            if socket_name is None:
                shutil.rmtree(directory, ignore_errors=True)
            else:
                _remove(directory, socket_name)
            removed.append(directory)
        finally:
            os.close(fd)
    return removed
