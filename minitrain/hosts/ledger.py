"""The host's resource ledger: what every minitrain run on this machine holds now (L1: stdlib + psutil).

Every run of every user on a host claims the GPUs it uses (and the CPUs and memory its
`resources_per_worker` names) in one directory, ``MINITRAIN_LEDGER_DIR`` (default
``/var/tmp/minitrain-ledger``), before its workers start, and gives them back when it ends:

- **one claim file per run per host**, ``claim-<uid>-<pid>-<random>.json`` (`Claim`: the run, the
  user, the holder's pid, since when, the GPU indices, CPUs and memory), held with an exclusive
  ``flock`` by the process that claimed it (the driver for this machine, the holder that
  `minitrain.hosts.hold` runs over SSH for a remote host) for as long as the run lasts. The lock is
  the claim's life: when its holder dies, SIGKILL included, the kernel drops the lock at once, and
  every reader counts a claim file whose lock is free as stale (removed when the reader may);
- **atomic claims**: a claim is decided and written under the ledger-wide lock (``flock`` on
  ``.lock``, exclusive), on a snapshot read under it, and a claim file becomes visible only complete
  and locked (written under a temporary name, then renamed), so two runs that start in the same
  millisecond never both get the last GPU;
- **shared and protected**: the directory is created mode 1777 (sticky, like /tmp: every user can
  claim, nobody but a file's owner can remove it; its owner could, so an administrator should create
  it as root: ``install -d -m 1777 /var/tmp/minitrain-ledger``). Every name is opened relative to
  the directory without following links;
- **never trusted blindly**: a live claim of another user counts only if it parses, its file
  belongs to the uid it names, and its pid is a process of that uid. A claim that is corrupt,
  foreign-owned or a symbolic link is refused: left out of the count, and named with why in
  `Snapshot.problems` (which the waiting line and ``--status`` show).

The ledger decides nothing about placement: `Ledger.claim` runs the caller's `choose` on a fresh
`Snapshot` under the lock and writes what it returns (`minitrain.hosts.reserve` plans).
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import pwd
import secrets
import stat
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Optional

import psutil

from minitrain.errors import LaunchError
from minitrain.hosts.gpus import Gpu

log = logging.getLogger("minitrain")

VERSION = 1
LOCK_NAME = ".lock"
CLAIM_PREFIX = "claim-"
CLAIM_SUFFIX = ".json"
TEMP_PREFIX = ".tmp-"
_MAX_CLAIM_BYTES = 64 * 1024
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class LedgerError(LaunchError):
    """The ledger directory cannot be used (a link, not shared, not a directory); the message names
    it and the fix."""


def _printable(text: str) -> str:
    """`text` with every non-printable character (terminal escapes, newlines) as '?': another user's claim
    is shown on this user's terminal."""
    return "".join(c if c.isprintable() else "?" for c in text)


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


@dataclass(frozen=True)
class Claim:
    """What one run holds on one host. `gpus` are NVML (physical) indices; `cpus` and `memory_bytes`
    are 0 when the run did not name them. `file` is its name in the ledger ("" before it is written)."""

    run: str
    user: str
    uid: int
    pid: int
    since: float
    gpus: tuple[int, ...] = ()
    cpus: float = 0.0
    memory_bytes: int = 0
    file: str = ""

    def to_json(self) -> str:
        """The claim file's content."""
        return json.dumps({"version": VERSION, "run": self.run, "user": self.user, "uid": self.uid,
                           "pid": self.pid, "since": self.since, "gpus": list(self.gpus), "cpus": self.cpus,
                           "memory_bytes": self.memory_bytes}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str, file: str = "") -> "Claim":
        """The claim in a file's `text`; ValueError saying what is wrong."""
        data = json.loads(text)
        if not isinstance(data, dict) or data.get("version") != VERSION:
            raise ValueError(f"not a version-{VERSION} claim")
        ints = {"uid": data.get("uid"), "pid": data.get("pid"), "memory_bytes": data.get("memory_bytes", 0)}
        for name, value in ints.items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} is {value!r}, not a whole number >= 0")
        gpus = data.get("gpus", [])
        if not isinstance(gpus, list) or not all(isinstance(g, int) and not isinstance(g, bool) and g >= 0
                                                 for g in gpus):
            raise ValueError(f"gpus is {gpus!r}, not a list of GPU indices")
        numbers = {"since": data.get("since"), "cpus": data.get("cpus", 0.0)}
        for name, value in numbers.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
                raise ValueError(f"{name} is {value!r}, not a number >= 0")
        if not isinstance(data.get("run"), str) or not isinstance(data.get("user"), str):
            raise ValueError("run and user must be strings")
        return cls(_printable(data["run"][:200]), _printable(data["user"][:64]), ints["uid"], ints["pid"],
                   float(numbers["since"]), tuple(gpus), float(numbers["cpus"]), ints["memory_bytes"], file)

    def holds(self) -> str:
        """'2 GPUs (0,1), 4 CPUs, 8.0 GiB'."""
        parts = []
        if self.gpus:
            parts.append(f"{len(self.gpus)} GPU{'s' if len(self.gpus) != 1 else ''} "
                         f"({','.join(map(str, self.gpus))})")
        if self.cpus:
            parts.append(f"{self.cpus:g} CPUs")
        if self.memory_bytes:
            parts.append(f"{self.memory_bytes / 2**30:.1f} GiB")
        return ", ".join(parts) or "nothing"

    def who(self) -> str:
        """'run X (alice, pid 123, since 12:03)'."""
        return f"run {self.run} ({self.user}, pid {self.pid}, since {time.strftime('%H:%M', time.localtime(self.since))})"


@dataclass(frozen=True)
class Totals:
    """What a host has: its GPUs (`minitrain.hosts.gpus.host_gpus`), CPUs and memory in bytes."""

    gpus: tuple[Gpu, ...]
    cpus: float
    memory_bytes: int


@dataclass(frozen=True)
class Snapshot:
    """A host's ledger at one moment: its `totals`, the live and trusted `claims`, and the `problems`
    (entries refused, with why). `foreign_taken`: GPUs busy with a process outside any claim count as
    taken (``MINITRAIN_LEDGER_FOREIGN_GPUS=taken``) instead of only being reported."""

    host: str
    totals: Totals
    claims: tuple[Claim, ...] = ()
    problems: tuple[str, ...] = ()
    foreign_taken: bool = False

    def claimed_gpus(self) -> set[int]:
        return {g for claim in self.claims for g in claim.gpus}

    def foreign_busy(self) -> dict[int, tuple[int, ...]]:
        """GPU index -> pids computing on it, for GPUs that no claim holds (busy with a program that is
        not a minitrain run, or with a run of an older minitrain)."""
        claimed = self.claimed_gpus()
        return {g.index: g.busy_pids for g in self.totals.gpus if g.busy_pids and g.index not in claimed}

    def free_gpus(self) -> list[int]:
        """GPU indices no claim holds (nor, with `foreign_taken`, a foreign process), lowest first."""
        taken = self.claimed_gpus() | (set(self.foreign_busy()) if self.foreign_taken else set())
        return sorted(g.index for g in self.totals.gpus if g.index not in taken)

    def free_cpus(self) -> float:
        return self.totals.cpus - sum(c.cpus for c in self.claims)

    def free_memory(self) -> int:
        return self.totals.memory_bytes - sum(c.memory_bytes for c in self.claims)


class HeldClaim:
    """A claim this process holds: its lock lives in `_fd` until `release()` (or this process's death)."""

    def __init__(self, ledger: "Ledger", claim: Claim, fd: int):
        self.ledger = ledger
        self.claim = claim
        self._fd: Optional[int] = fd

    def release(self) -> None:
        """Remove the claim file, then drop the lock. Idempotent; never raises."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            dir_fd = self.ledger._open_dir()
            try:
                os.unlink(self.claim.file, dir_fd=dir_fd)
            finally:
                os.close(dir_fd)
        except OSError as exc:  # the claim dies with the lock anyway: readers count it stale
            log.debug("could not remove the claim %s: %s", self.claim.file, exc)
        os.close(fd)

    def __enter__(self) -> "HeldClaim":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


@dataclass
class Ledger:
    """The ledger in `directory` of host `host` (a name for messages). See the module doc."""

    directory: str
    host: str = "localhost"
    foreign_taken: bool = False
    _warned: set = field(default_factory=set, repr=False)

    # ------------------------------------------------------------------ the directory

    def _open_dir(self) -> int:
        """The ledger directory's descriptor: created mode 1777 when missing; a link, a non-directory,
        or a directory other users cannot claim in (and that this user cannot repair) is refused."""
        path = self.directory
        created = False
        try:
            os.mkdir(path, 0o700)  # made shared (1777) below, through its descriptor: the umask would cut it
            created = True
        except FileExistsError:
            pass
        except OSError as exc:
            raise LedgerError(f"cannot create the resource ledger {path}: {exc.strerror}. Set "
                              f"MINITRAIN_LEDGER_DIR to a directory every user of this host can write.") from None
        try:
            fd = os.open(path, _DIR_FLAGS)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                kind = "a symbolic link" if os.path.islink(path) else "not a directory"
                raise LedgerError(f"the resource ledger {path} is {kind}: refused (a link could point the "
                                  f"claims of every run elsewhere). Remove it (rm {path}), or set "
                                  f"MINITRAIN_LEDGER_DIR to another directory.") from None
            raise LedgerError(f"cannot open the resource ledger {path}: {exc.strerror}") from None
        st = os.fstat(fd)
        if st.st_mode & 0o1777 != 0o1777:
            if st.st_uid == os.geteuid():
                os.fchmod(fd, 0o1777)
                if not created:
                        log.info("the resource ledger %s had mode %o; made it 1777 so every user's runs can claim "
                             "there", path, st.st_mode & 0o7777)
            else:
                os.close(fd)
                raise LedgerError(
                    f"the resource ledger {path} has mode {st.st_mode & 0o7777:o} and belongs to "
                    f"{_user_name(st.st_uid)}: runs of other users cannot record what they hold there. Ask its "
                    f"owner or root to run `chmod 1777 {path}`, or set MINITRAIN_LEDGER_DIR elsewhere.")
        return fd

    @contextmanager
    def _locked(self, dir_fd: int) -> Iterator[None]:
        """The ledger-wide lock (exclusive) while inside."""
        try:
            fd = os.open(LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=dir_fd)
        except PermissionError:  # another user's lock file: flock needs only read access
            try:
                fd = os.open(LOCK_NAME, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
            except PermissionError:
                raise LedgerError(f"{os.path.join(self.directory, LOCK_NAME)} is not readable by this user: no "
                                  f"run can take the ledger's lock. Its owner should run `chmod 644` on it (or "
                                  f"remove it; the next run makes a new one).") from None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise LedgerError(f"{os.path.join(self.directory, LOCK_NAME)} is a symbolic link: refused. "
                                  f"Remove it; the next run makes a new one.") from None
            raise
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise LedgerError(f"{os.path.join(self.directory, LOCK_NAME)} is not a regular file: refused. "
                                  f"Remove it; the next run makes a new one.")
            if st.st_uid == os.geteuid() and st.st_mode & 0o777 != 0o644:
                os.fchmod(fd, 0o644)  # readable by all, whatever the creator's umask
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # drops the lock

    # ------------------------------------------------------------------ reading

    def snapshot(self, totals: Totals) -> Snapshot:
        """The live, trusted claims now (no ledger lock: a claim file appears only complete and locked)."""
        dir_fd = self._open_dir()
        try:
            return self._read(dir_fd, totals)
        finally:
            os.close(dir_fd)

    def _read(self, dir_fd: int, totals: Totals, locked: bool = False) -> Snapshot:
        claims, problems = [], []
        for name in sorted(os.listdir(dir_fd)):
            if name.startswith(TEMP_PREFIX):
                if locked:  # a claim is being written only under the ledger lock: this one's writer died
                    _remove_if_stale(dir_fd, name)
            elif name.startswith(CLAIM_PREFIX) and name.endswith(CLAIM_SUFFIX):
                claim, problem = self._read_claim(dir_fd, name)
                if claim is not None:
                    claims.append(claim)
                elif problem:
                    problems.append(problem)
                    if problem not in self._warned:
                        self._warned.add(problem)
                        log.warning("resource ledger of %s: %s", self.host, problem)
        return Snapshot(self.host, totals, tuple(claims), tuple(problems), self.foreign_taken)

    def _read_claim(self, dir_fd: int, name: str) -> tuple[Optional[Claim], str]:
        """(the claim, "") when live and trusted; (None, why) when refused; (None, "") when stale or gone."""
        path = os.path.join(self.directory, name)
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
        except FileNotFoundError:
            return None, ""  # released while we listed
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                if _owned_by_me(dir_fd, name):
                    _unlink(dir_fd, name)
                    return None, ""
                return None, f"{path} is a symbolic link: refused (its owner should remove it)"
            return None, f"{path} cannot be read ({exc.strerror}): refused"
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                return None, f"{path} is not a regular file: refused"
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                pass  # its holder lives
            else:  # nobody holds it: its run died; the file goes if we may remove it
                _unlink(dir_fd, name)
                return None, ""
            text = os.read(fd, _MAX_CLAIM_BYTES).decode("utf-8", "replace")
        finally:
            os.close(fd)
        owner = _user_name(st.st_uid)
        try:
            claim = Claim.from_json(text, file=name)
        except ValueError as exc:
            return None, (f"{path} (owned by {owner}) is held but corrupt ({exc}): refused, its resources "
                          f"counted free; its owner should stop the process holding it or remove the file")
        if claim.uid != st.st_uid:
            return None, (f"{path} says it is uid {claim.uid}'s but belongs to {owner} (uid {st.st_uid}): "
                          f"refused as foreign")
        try:
            process_uid = psutil.Process(claim.pid).uids().real
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            process_uid = None
        if process_uid != claim.uid:
            return None, (f"{path} names pid {claim.pid}, which is not a process of {owner} on this host: "
                          f"refused as foreign")
        return claim, ""

    # ------------------------------------------------------------------ claiming

    def claim(self, totals: Totals, run: str, choose: Callable[[Snapshot], Optional[Claim]]) -> Optional[HeldClaim]:
        """Under the ledger-wide lock: `choose(snapshot)` returns what to hold (a `Claim`; its run, user,
        uid, pid and since are filled in here) or None (nothing fits now: None is returned, nothing held)."""
        dir_fd = self._open_dir()
        try:
            with self._locked(dir_fd):
                wanted = choose(self._read(dir_fd, totals, locked=True))
                if wanted is None:
                    return None
                uid = os.geteuid()
                claim = Claim(run, _user_name(uid), uid, os.getpid(), time.time(), tuple(wanted.gpus),
                              wanted.cpus, wanted.memory_bytes,
                              f"{CLAIM_PREFIX}{uid}-{os.getpid()}-{secrets.token_hex(4)}{CLAIM_SUFFIX}")
                return HeldClaim(self, claim, _write_locked(dir_fd, claim))
        finally:
            os.close(dir_fd)


def _write_locked(dir_fd: int, claim: Claim) -> int:
    """Write `claim` under a temporary name, lock it, rename it into place; the locked descriptor."""
    temp = f"{TEMP_PREFIX}{claim.file}"
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=dir_fd)
    try:
        os.fchmod(fd, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.write(fd, claim.to_json().encode())
        os.rename(temp, claim.file, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        _unlink(dir_fd, temp)
        os.close(fd)
        raise
    return fd


def _owned_by_me(dir_fd: int, name: str) -> bool:
    try:
        return os.lstat(name, dir_fd=dir_fd).st_uid == os.geteuid()
    except OSError:
        return False


def _unlink(dir_fd: int, name: str) -> None:
    try:
        os.unlink(name, dir_fd=dir_fd)
    except OSError:  # gone already, or another user's file in the sticky directory: left to its owner
        pass


def _remove_if_stale(dir_fd: int, name: str) -> None:
    """A temporary claim file whose writer died before renaming it (its lock is free) is removed."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return  # being written now
    finally:
        os.close(fd)
    _unlink(dir_fd, name)
