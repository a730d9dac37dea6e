"""A node's memory tier: checkpoint shards in host memory, owned by the node's agent (L1).

When a rank reports a checkpoint, its files are copied (or, when the caller gave the directory up and it
sits on the same filesystem, renamed) into the tier of its node, and `report()` returns once they are
there. The agent, which outlives its workers, then writes them to storage in round order, keeps them for
a restart to read back, and drops them when the coordinator says they are no longer needed
(docs/checkpoints.md, "The memory tier"). The worker and the agent share this module; they never
import each other.

A tier is one private directory (mode 0700, this user's alone) in `MINITRAIN_MEMORY_TIER_DIR`
(default `/dev/shm`, a tmpfs: host memory), made by the agent for its life:

- `attempt_<a>/rank_<r>/<checkpoint dir>/` (`minitrain.storage.layout.shard_dir`): one rank's shard;
  it appears by one rename once complete, so whoever sees it sees all of it;
- `views/attempt_<a>/<checkpoint dir>/`: the merged view a restart reads (every rank's shard of attempt
  `a` hard-linked into one directory in rank order: a later rank's file of the same name wins, as at a
  commit); no bytes copied; made once, never changed while it exists (readers may be in it);
- `.ledger`: the bytes each shard holds or reserved, as JSON, changed under an flock; the sum never
  exceeds the tier's capacity, so a full tier refuses a shard before a byte of it is written (the
  writer then takes the storage path);
- `owner.lock`: flock'ed by the agent for its life; an agent that starts removes the tiers of this
  user's dead agents (`minitrain.rpc.socket_directory.remove_stale`), so a SIGKILLed agent's memory is
  given back by the next agent on the host.

Nothing here is pickled or executed: a tier holds the user's files only.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import shutil
import tempfile
import uuid
from typing import Iterable, Optional

from minitrain.rpc import socket_directory
from minitrain.storage.layout import shard_dir

logger = logging.getLogger("minitrain")

PREFIX = "minitrain-tier-"
LEDGER_NAME = ".ledger"
VIEWS_DIR = "views"
DEFAULT_BASE = "/dev/shm"
# The default capacity: a quarter of the host's memory, and never more than half of what the tier's
# filesystem has free when the agent starts (tmpfs pages count against the host's memory and can be
# swapped, so the tier must stay well below both).
DEFAULT_MEMORY_FRACTION = 0.25
DEFAULT_FREE_FRACTION = 0.5


def default_capacity(base: str, memory_bytes: int) -> int:
    """The capacity of a tier in `base` on a host with `memory_bytes`: the smaller of a quarter of the
    memory and half the free space of `base`'s filesystem (0 when `base` is not usable)."""
    try:
        stats = os.statvfs(base)
    except OSError:
        return 0
    free = stats.f_bavail * stats.f_frsize
    return int(min(memory_bytes * DEFAULT_MEMORY_FRACTION, free * DEFAULT_FREE_FRACTION))


def tree_bytes(path: str) -> int:
    """The bytes of every regular file under `path` (links followed, as a copy follows them)."""
    total = 0
    for root, _dirs, files in os.walk(path, followlinks=True):
        for name in files:
            try:
                total += os.stat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


class TierFull(Exception):
    """The shard does not fit in the tier's capacity (what is held plus what it needs)."""


class MemoryTier:
    """The tier at `root` with `capacity` bytes; see the module docstring. The agent makes one with
    `create` (and removes it with `destroy`); a worker opens its agent's with `MemoryTier(root, capacity)`.
    Every method may be called from any process of the tier's user."""

    def __init__(self, root: str, capacity: int):
        if capacity < 0:
            raise ValueError(f"a memory tier's capacity must be >= 0 bytes, got {capacity!r}")
        self.root = root
        self.capacity = capacity
        self._lock_fd = -1

    @classmethod
    def create(cls, capacity: int, base: str = DEFAULT_BASE) -> "MemoryTier":
        """Make a fresh tier in `base` (0700, its owner lock held by this process), after removing the
        tiers of this user's dead agents there. OSError when `base` cannot hold one."""
        socket_directory.remove_stale(base, PREFIX, None)
        root = tempfile.mkdtemp(prefix=PREFIX, dir=base)
        tier = cls(root, capacity)
        tier._lock_fd = socket_directory.hold_owner_lock(root)
        with open(os.path.join(root, LEDGER_NAME), "x") as ledger:
            ledger.write("{}")
        return tier

    def destroy(self) -> None:
        """Remove the tier and everything in it (the agent, at its end); idempotent."""
        shutil.rmtree(self.root, ignore_errors=True)
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1

    # ------------------------------------------------------------------ accounting

    def _ledger(self):
        """The ledger, opened and flock'ed (exclusive) for the caller's with-block."""
        return _LockedLedger(os.path.join(self.root, LEDGER_NAME))

    def used_bytes(self) -> int:
        """The bytes every shard in the tier holds or reserved."""
        with self._ledger() as ledger:
            return sum(ledger.entries.values())

    def reserve(self, key: str, nbytes: int) -> bool:
        """Reserve `nbytes` for the shard `key` (a `shard_dir`); False, reserving nothing, when that
        would take the tier past its capacity. A key reserved again is replaced."""
        with self._ledger() as ledger:
            held = sum(size for name, size in ledger.entries.items() if name != key)
            if held + nbytes > self.capacity:
                return False
            ledger.entries[key] = nbytes
            ledger.changed = True
        return True

    def release(self, key: str) -> None:
        """Forget the reservation of `key` (its files are gone or were never written)."""
        with self._ledger() as ledger:
            if ledger.entries.pop(key, None) is not None:
                ledger.changed = True

    # ------------------------------------------------------------------ shards

    def shard_path(self, attempt: int, rank: int, dir_name: str) -> str:
        """Where rank `rank`'s shard of checkpoint `dir_name` of attempt `attempt` is (or would be)."""
        return os.path.join(self.root, shard_dir(attempt, rank, dir_name))

    def write_shard(self, attempt: int, rank: int, dir_name: str, source: str, *, move: bool = False) -> str:
        """Put the files of the local directory `source` into the tier as that shard; return its path.

        The bytes are reserved first (TierFull, nothing written, when they do not fit); the files go
        to a temporary directory in the tier and appear by one rename, so the shard is complete or
        absent. `move`: the caller gives `source` up, and its files are renamed when they are on the
        tier's filesystem (no bytes copied), else copied. A failure (a full tmpfs, say) removes what
        was written and releases the reservation. Links are followed, as an upload follows them.
        """
        key = shard_dir(attempt, rank, dir_name)
        final = os.path.join(self.root, key)
        incoming = os.path.join(os.path.dirname(final), f".incoming-{uuid.uuid4().hex}")
        # Reserved under the temporary name while it is written: a shard it replaces keeps its own bytes
        # reserved until the new one is in place, and a write that fails leaves that one's untouched.
        pending = f"{key}/{os.path.basename(incoming)}"
        if not self.reserve(pending, tree_bytes(source)):
            raise TierFull(f"the memory tier {self.root} holds {self.used_bytes()} of {self.capacity} bytes")
        try:
            os.makedirs(os.path.dirname(final), exist_ok=True)
            same_fs = move and os.stat(source).st_dev == os.stat(self.root).st_dev
            shutil.copytree(source, incoming, symlinks=False,
                            copy_function=_rename_file if same_fs else shutil.copyfile)
            if os.path.isdir(final):  # a shard the same rank wrote before it was restarted: replaced
                shutil.rmtree(final)
            os.rename(incoming, final)
        except BaseException:
            shutil.rmtree(incoming, ignore_errors=True)
            self.release(pending)
            raise
        with self._ledger() as ledger:
            ledger.entries[key] = ledger.entries.pop(pending, 0)
            ledger.changed = True
        return final

    def has_shard(self, attempt: int, rank: int, dir_name: str) -> bool:
        """Whether that shard is in the tier (complete: shards appear by a rename)."""
        return os.path.isdir(self.shard_path(attempt, rank, dir_name))

    def drop(self, shards: Iterable[tuple[int, int, str]]) -> None:
        """Remove the shards `(attempt, rank, dir_name)` and their reservations, and the views of those
        checkpoints; a shard that is not here is skipped."""
        for attempt, rank, dir_name in shards:
            key = shard_dir(attempt, rank, dir_name)
            shutil.rmtree(os.path.join(self.root, key), ignore_errors=True)
            shutil.rmtree(os.path.join(self.root, VIEWS_DIR, f"attempt_{attempt}", dir_name), ignore_errors=True)
            self.release(key)

    def remove_leftovers(self, before_attempt: int, local_ranks: dict[int, set[int]],
                         keep: set[tuple[int, int, str]], live: frozenset[int] = frozenset()) -> list[str]:
        """Remove what the workers of attempts before `before_attempt` (but those in `live`, whose
        workers on this node have not all exited) left behind, once they are all gone: shards still being written when their writer died (`.incoming-*`, and their reservations),
        and the shards of this node's own ranks (`local_ranks`: attempt -> ranks started here) that are
        not in `keep` (waiting to be written to storage, or read by the next attempt): rounds that never
        completed. Replicas of other nodes' shards are left alone (the coordinator drops them). Returns
        the shard keys removed."""
        removed = []
        for attempt_name in _names(self.root, "attempt_"):
            attempt = int(attempt_name[8:])
            if attempt >= before_attempt or attempt in live:
                continue
            for rank_name in _names(os.path.join(self.root, attempt_name), "rank_"):
                rank = int(rank_name[5:])
                rank_dir = os.path.join(self.root, attempt_name, rank_name)
                for name in os.listdir(rank_dir):
                    if name.startswith(".incoming-"):
                        shutil.rmtree(os.path.join(rank_dir, name), ignore_errors=True)
                    elif rank in local_ranks.get(attempt, ()) and (attempt, rank, name) not in keep:
                        self.drop([(attempt, rank, name)])
                        removed.append(shard_dir(attempt, rank, name))
        with self._ledger() as ledger:
            for key in [key for key in ledger.entries if "/.incoming-" in key]:
                attempt_name = key.split("/", 1)[0]
                if attempt_name[8:].isdigit() and int(attempt_name[8:]) < before_attempt and \
                        int(attempt_name[8:]) not in live:
                    del ledger.entries[key]
                    ledger.changed = True
        return removed

    def shards(self) -> list[tuple[int, int, str]]:
        """Every complete shard in the tier, as `(attempt, rank, dir_name)`."""
        found = []
        for attempt_name in _names(self.root, "attempt_"):
            for rank_name in _names(os.path.join(self.root, attempt_name), "rank_"):
                for dir_name in os.listdir(os.path.join(self.root, attempt_name, rank_name)):
                    if not dir_name.startswith("."):
                        found.append((int(attempt_name[8:]), int(rank_name[5:]), dir_name))
        return sorted(found)

    def build_view(self, dir_name: str, shards: Iterable[tuple[int, int]]) -> Optional[str]:
        """The merged view of checkpoint `dir_name` from its shards `(attempt, rank)` (all of one
        attempt), in that order (a later shard's file of the same name wins); None when a shard is not
        in the tier. Made of hard links (no bytes copied) in a temporary directory renamed into place;
        a view already there is the same one (several ranks may ask at once) and is returned as it is."""
        shards = list(shards)
        sources = [self.shard_path(attempt, rank, dir_name) for attempt, rank in shards]
        if not sources or not all(os.path.isdir(source) for source in sources):
            return None
        views = os.path.join(self.root, VIEWS_DIR, f"attempt_{shards[0][0]}")
        final = os.path.join(views, dir_name)
        if os.path.isdir(final):
            return final
        os.makedirs(views, exist_ok=True)
        incoming = os.path.join(views, f".incoming-{uuid.uuid4().hex}")
        try:
            for source in sources:
                shutil.copytree(source, incoming, dirs_exist_ok=True, copy_function=_link_replacing)
            try:
                os.rename(incoming, final)
            except OSError:
                if not os.path.isdir(final):
                    raise
                shutil.rmtree(incoming, ignore_errors=True)  # another process made it first: theirs stands
        except BaseException:
            shutil.rmtree(incoming, ignore_errors=True)
            raise
        return final


class _LockedLedger:
    """The ledger file under an exclusive flock for one with-block; `entries` (key -> bytes) is written
    back at the end when `changed` is set."""

    def __init__(self, path: str):
        self._path = path
        self.entries: dict[str, int] = {}
        self.changed = False
        self._fd = -1

    def __enter__(self) -> "_LockedLedger":
        self._fd = os.open(self._path, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        data = b""
        while chunk := os.read(self._fd, 1 << 16):
            data += chunk
        try:
            entries = json.loads(data or b"{}")
            self.entries = {str(k): int(v) for k, v in entries.items()}
            if any(v < 0 for v in self.entries.values()):
                raise ValueError("a negative reservation")
        except (ValueError, TypeError, AttributeError):
            # A writer died mid-write, or someone else wrote it: the reservations are forgotten.
            self.entries = {}
        return self

    def __exit__(self, *exc) -> None:
        try:
            if self.changed:
                data = json.dumps(self.entries).encode()
                os.lseek(self._fd, 0, os.SEEK_SET)
                os.ftruncate(self._fd, 0)
                os.write(self._fd, data)
        finally:
            os.close(self._fd)  # releases the flock


def _names(path: str, prefix: str) -> list[str]:
    try:
        return [name for name in os.listdir(path) if name.startswith(prefix) and name[len(prefix):].isdigit()]
    except OSError:
        return []


def _rename_file(source: str, destination: str) -> None:
    if os.path.islink(source):  # a link is followed (its bytes copied), never moved as a link
        shutil.copyfile(source, destination)
        return
    try:
        os.rename(source, destination)
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            raise
        shutil.copyfile(source, destination)


def _link_replacing(source: str, destination: str) -> None:
    if os.path.lexists(destination):
        os.unlink(destination)
    try:
        os.link(source, destination)
    except OSError:
        shutil.copyfile(source, destination)
