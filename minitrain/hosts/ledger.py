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
- **a bounded lock**: runs hold the ledger-wide lock for the milliseconds a claim takes, and a claim
  waits for it at most `LOCK_WAIT_S` (non-blocking attempts against a deadline), so any user can hold
  it (flock needs only read access) without freezing anyone: the claim raises `LedgerBusyError`
  naming who holds it (its pid and user from /proc/locks), and the run's wait goes on within its
  limit. ``.lock`` is opened without following links and checked on its descriptor: a link, a
  directory, anything but a regular file with one name, or one no run can read is a `LedgerError`
  naming it and the fix; one replaced while we waited for it is opened again;
- **shared and protected**: the directory is created mode 1777 (sticky, like /tmp: every user can
  claim, nobody but a file's owner can remove it; its owner could, so an administrator should create
  it as root: ``install -d -m 1777 /var/tmp/minitrain-ledger``). Every name is opened relative to
  the directory without following links;
- **never trusted blindly**: a live claim of another user counts only if it parses, every value is
  of its type and in range (`Claim.from_json`: finite numbers, JSON's Infinity and NaN refused,
  bounded integers), it asks for no more CPUs or memory than the host has, its file belongs to the
  uid it names, and its pid is a process of that uid. A claim that is corrupt, out of range, larger
  than the host, foreign-owned or a symbolic link is refused: left out of the count, logged once,
  and named with why (the file and the field) in `Snapshot.problems` (which the waiting line and
  ``--status`` show). Nothing in a claim can make a reader fail.

The ledger decides nothing about placement: `Ledger.claim` runs the caller's `choose` on a fresh
`Snapshot` under the lock and writes what it returns (`minitrain.hosts.reserve` plans).
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import math
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
# How long one claim waits for the ledger-wide lock: a run holds it for the milliseconds a claim takes, so a
# lock held longer is another process's doing (hung, or hostile): LedgerBusyError then, and the run waits on.
LOCK_WAIT_S = 0.5
_LOCK_PAUSES_S = (0.001, 0.02)  # between two attempts at the lock: the first pause, and the longest
_PROC_LOCKS = "/proc/locks"
_PROC_LOCKS_MOST_BYTES = 8 * 2**20
# The bounds of a claim's values (`Claim.from_json`): what any host can have, so that no value read from
# another user's file can overflow a float, a time or a sum.
_MOST_UID = 2**32 - 2
_MOST_PID = 2**22  # Linux's PID_MAX_LIMIT
_MOST_BYTES = 2**63 - 1
_MOST_CPUS = 2.0**20
_MOST_GPUS = 1024  # GPUs one claim may name; each an index below this
_SINCE_SLACK_S = 86400.0  # a claim's `since` may be this far ahead of this host's clock, no further
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class LedgerError(LaunchError):
    """The ledger directory or its lock file cannot be used (a link, not shared, not a directory, not a
    regular file, not readable); the message names it and the fix."""


class LedgerBusyError(LedgerError):
    """The ledger-wide lock stayed held by another process for the whole wait of a claim (`LOCK_WAIT_S` at
    most): nothing was claimed. The message says who holds it ('pid 4242 (bob), which holds the ledger's
    lock ...'), for the waiting line; the run looks again, within its wait limit."""


class _NotANumber:
    """JSON's Infinity, -Infinity or NaN in a claim, kept as the word so that the field's check names it."""

    def __init__(self, word: str):
        self.word = word

    def __repr__(self) -> str:
        return self.word


def _shown(value: object) -> str:
    """`value` for a message, short: a huge number by its digit count, anything else cut at 40 characters."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**40:
        return f"a {len(str(abs(value)))}-digit number"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _whole(data: dict, name: str, most: int, default: object = None) -> int:
    value = data.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= most:
        raise ValueError(f"{name} is {_shown(value)}, not a whole number from 0 to {most}")
    return value


def _number(data: dict, name: str, most: float, default: object = None) -> float:
    value = data.get(name, default)
    # an int is compared before it becomes a float: float() of a 400-digit int raises OverflowError
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= most \
            or not math.isfinite(value):
        raise ValueError(f"{name} is {_shown(value)}, not a number from 0 to {most:.0f}")
    return float(value)


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
        """The claim in a file's `text`, every value checked: uid, pid and memory_bytes whole numbers in
        range (at most 2**32-2, 2**22, 2**63-1), since and cpus finite numbers >= 0 (since at most a day
        ahead of this host's clock, cpus at most 2**20), gpus a list of at most 1024 distinct indices below
        1024, run and user strings; JSON's Infinity and NaN are refused. ValueError naming the field and
        its value (shortened) otherwise: another user writes this text, and no value of it may overflow
        a float, a time or a sum later."""
        try:
            data = json.loads(text, parse_constant=_NotANumber)
        except RecursionError:  # '[[[[...': 64 KiB of nesting
            raise ValueError("nested too deeply to be a claim") from None
        if not isinstance(data, dict) or data.get("version") != VERSION:
            raise ValueError(f"not a version-{VERSION} claim")
        uid, pid = _whole(data, "uid", _MOST_UID), _whole(data, "pid", _MOST_PID)
        memory_bytes = _whole(data, "memory_bytes", _MOST_BYTES, default=0)
        gpus = data.get("gpus", [])
        if not isinstance(gpus, list) or len(gpus) > _MOST_GPUS \
                or not all(isinstance(g, int) and not isinstance(g, bool) and 0 <= g < _MOST_GPUS for g in gpus) \
                or len(set(gpus)) != len(gpus):
            raise ValueError(f"gpus is {_shown(gpus)}, not a list of distinct GPU indices below {_MOST_GPUS}")
        since = _number(data, "since", time.time() + _SINCE_SLACK_S)
        cpus = _number(data, "cpus", _MOST_CPUS, default=0.0)
        if not isinstance(data.get("run"), str) or not isinstance(data.get("user"), str):
            raise ValueError("run and user must be strings")
        return cls(_printable(data["run"][:200]), _printable(data["user"][:64]), uid, pid, since, tuple(gpus),
                   cpus, memory_bytes, file)

    def beyond(self, totals: "Totals") -> str:
        """What this claim asks for that no run could hold on a host of `totals` ('' when nothing): more
        memory than it has, or more CPUs than it has (the host's CPUs, `os.cpu_count()`, which may be more
        than this process's affinity). Its GPUs are never beyond: a reader counts only the GPU indices it
        has, so a claim on another index takes nothing from it."""
        if self.memory_bytes > totals.memory_bytes:
            return (f"{self.memory_bytes / 2**30:.1f} GiB of memory, more than the host's "
                    f"{totals.memory_bytes / 2**30:.1f} GiB")
        host_cpus = max(totals.cpus, float(os.cpu_count() or 0))
        if self.cpus > host_cpus + 1e-9:
            return f"{self.cpus:g} CPUs, more than the host's {host_cpus:g}"
        return ""

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
        except (OSError, LedgerError) as exc:  # the claim dies with the lock anyway: readers count it stale
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
    def _locked(self, dir_fd: int, wait_s: float) -> Iterator[None]:
        """The ledger-wide lock (exclusive) while inside, waited for `wait_s` at most: LedgerBusyError
        (naming who holds it) past that, LedgerError when ``.lock`` is not a file every run can lock."""
        deadline = time.monotonic() + wait_s
        pause = _LOCK_PAUSES_S[0]
        while True:
            fd = self._open_lock(dir_fd)
            try:
                while True:
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        break
                    except BlockingIOError:
                        if time.monotonic() >= deadline:
                            raise LedgerBusyError(self._busy_text(fd)) from None
                        time.sleep(pause)
                        pause = min(pause * 2, _LOCK_PAUSES_S[1])
                # Its owner may have removed or replaced .lock while we waited (the sticky bit lets it): a lock
                # on a file no longer named .lock excludes nobody, so the one under the name is taken instead.
                if not _same_file(dir_fd, LOCK_NAME, fd):
                    continue
                yield
                return
            finally:
                os.close(fd)  # drops the lock

    def _lock_path(self) -> str:
        return os.path.join(self.directory, LOCK_NAME)

    def _open_lock(self, dir_fd: int) -> int:
        """``.lock``'s descriptor, created when missing; LedgerError naming it and the fix when it is a link,
        not a regular file, has another name (a hard link), or this user cannot read it. Another user's
        lock file is fine: flock needs only read access, and any user's run may have made it first."""
        flags = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC  # O_NONBLOCK: a FIFO made in advance must not hang us
        try:
            try:
                fd = os.open(LOCK_NAME, os.O_RDWR | os.O_CREAT | flags, 0o644, dir_fd=dir_fd)
            except PermissionError:  # another user's lock file (or fs.protected_regular): reading is enough
                fd = os.open(LOCK_NAME, os.O_RDONLY | flags, dir_fd=dir_fd)
        except OSError as exc:
            raise self._bad_lock(dir_fd, exc) from None
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
            os.close(fd)
            raise self._bad_lock(dir_fd, None)
        if st.st_uid == os.geteuid() and st.st_mode & 0o777 != 0o644:
            os.fchmod(fd, 0o644)  # readable by all, whatever the creator's umask
        return fd

    def _bad_lock(self, dir_fd: int, exc: Optional[OSError]) -> LedgerError:
        """The LedgerError for a ``.lock`` that cannot be used: what it is, whose, and the fix."""
        path = self._lock_path()
        try:
            st = os.lstat(LOCK_NAME, dir_fd=dir_fd)
        except OSError:
            st = None
        if st is None:
            what, owner = f"cannot be opened ({exc.strerror if exc else 'gone'})", None
        else:
            owner = st.st_uid
            if stat.S_ISLNK(st.st_mode):
                what = "is a symbolic link"
            elif stat.S_ISDIR(st.st_mode):
                what = "is a directory"
            elif not stat.S_ISREG(st.st_mode):
                what = "is not a regular file"
            elif st.st_nlink != 1:
                what = f"has {st.st_nlink} names (hard links)"
            elif isinstance(exc, PermissionError):
                what = "is not readable by this user"
            else:
                what = f"cannot be opened ({exc.strerror if exc else 'unknown'})"
        who = "" if owner is None else f" (owned by {_user_name(owner)})"
        fix = "remove it" if owner in (None, os.geteuid()) else f"its owner ({_user_name(owner)}) or root must remove it"
        fix += f" (rm -r {path}); the next run makes a new one"
        return LedgerError(f"the resource ledger's lock file {path}{who} {what}: refused, no run on this host can "
                           f"claim until it is a regular file every user can read. Fix: {fix}.")

    def _busy_text(self, fd: int) -> str:
        """Who holds the lock on `fd`: 'pid 4242 (bob), which holds the ledger's lock ...' from /proc/locks,
        or 'another process, which ...' when it cannot be found (another PID namespace, no /proc)."""
        holders = [f"pid {pid} ({_process_user(pid)})" for pid in _flock_holders(fd)]
        return (f"{' and '.join(holders) or 'another process'}, which holds the ledger's lock {self._lock_path()} on "
                f"{self.host} longer than any claim takes (no run can claim there until it lets go)")

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
                claim, problem = self._read_claim(dir_fd, name, totals)
                if claim is not None:
                    claims.append(claim)
                elif problem:
                    problems.append(problem)
                    if problem not in self._warned:
                        self._warned.add(problem)
                        log.warning("resource ledger of %s: %s", self.host, problem)
        return Snapshot(self.host, totals, tuple(claims), tuple(problems), self.foreign_taken)

    def _read_claim(self, dir_fd: int, name: str, totals: Totals) -> tuple[Optional[Claim], str]:
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
        beyond = claim.beyond(totals)
        if beyond:
            return None, (f"{path} (owned by {owner}) claims {beyond}: refused, no run could hold that; its "
                          f"resources counted free")
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

    def claim(self, totals: Totals, run: str, choose: Callable[[Snapshot], Optional[Claim]],
              lock_wait_s: float = LOCK_WAIT_S) -> Optional[HeldClaim]:
        """Under the ledger-wide lock: `choose(snapshot)` returns what to hold (a `Claim`; its run, user,
        uid, pid and since are filled in here) or None (nothing fits now: None is returned, nothing held).
        LedgerBusyError when another process holds the lock for `lock_wait_s`: nothing is held then."""
        dir_fd = self._open_dir()
        try:
            with self._locked(dir_fd, lock_wait_s):
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


def _same_file(dir_fd: int, name: str, fd: int) -> bool:
    """Whether `name` in the directory is still the file open on `fd` (not removed or replaced)."""
    try:
        named = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return False
    held = os.fstat(fd)
    return (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino)


def _flock_holders(fd: int) -> list[int]:
    """The pids /proc/locks names as holding a flock on the file open on `fd` (waiters left out), lowest
    first; [] when none can be found. Matched by device and inode, or by inode alone where the device the
    kernel names differs from fstat's (an overlay file system)."""
    st = os.fstat(fd)
    try:
        with open(_PROC_LOCKS, "rb") as handle:
            text = handle.read(_PROC_LOCKS_MOST_BYTES).decode("ascii", "replace")
    except OSError:
        return []
    exact, same_inode = set(), set()
    device = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    for line in text.splitlines():
        fields = line.split()  # '1: FLOCK  ADVISORY  WRITE 5827 fe:00:2147118 0 EOF' ('1: -> FLOCK ...' waits)
        if len(fields) < 6 or fields[1] != "FLOCK" or not fields[4].isdigit() or int(fields[4]) <= 0:
            continue
        if fields[5] == device:
            exact.add(int(fields[4]))
        elif fields[5].rsplit(":", 1)[-1] == str(st.st_ino):
            same_inode.add(int(fields[4]))
    return sorted(exact or same_inode)


def _process_user(pid: int) -> str:
    try:
        return _user_name(psutil.Process(pid).uids().real)
    except (psutil.Error, OverflowError):
        return "user unknown"


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
