"""Process control for the node agent (L1: stdlib + psutil).

Every child starts in its own session, so its pid is also its process-group id and one `killpg`
reaches everything it started (DataLoader workers, compile helpers) unless they start sessions of
their own. Stopping is SIGTERM -> grace -> SIGKILL -> bounded wait, by process group, never by name
pattern: a name pattern also matches other users' jobs (DeepSpeed's `pkill -f` is the cautionary tale).
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Optional
from pathlib import Path

import psutil

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>
_PR_SET_CHILD_SUBREAPER = 36
_POLL_MIN_S = 0.005
_POLL_MAX_S = 0.05


def spawn(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    cwd: str | os.PathLike[str] | None = None,
    stdin=subprocess.PIPE,
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    pass_fds: Sequence[int] = (),
) -> subprocess.Popen:
    """Start `argv` in a new session (its own process group, pgid == pid) and return the Popen.

    `env` is the child's complete environment (nothing is inherited implicitly). File descriptors
    other than 0-2 and `pass_fds` are closed in the child. The caller owns the Popen: it must reap it (`wait`) or
    pass it to `stop_process_group`.
    """
    # start_new_session is done by the C fork/exec helper. preexec_fn would run Python code between
    # fork and exec, which can deadlock in a process with threads (the agent runs gRPC threads):
    # a lock held by another thread at fork time is never released in the child.
    return subprocess.Popen(
        list(argv),
        env=dict(env),
        cwd=cwd,
        stdin=stdin,
        stdout=stdout,
        stderr=stderr,
        start_new_session=True,
        close_fds=True,
        pass_fds=tuple(pass_fds),
    )


def die_with_parent(sig: int = signal.SIGKILL, *, expected_parent: int | None = None) -> None:
    """Ask the kernel to send `sig` to this process when its parent dies (Linux PR_SET_PDEATHSIG).

    Call it first thing in a child. If the parent is already gone by the time the request is in
    place, exit at once with status 1. `expected_parent` is the parent's pid as the parent knows it
    (e.g. passed in the environment); without it, the parent is whoever `os.getppid()` says at entry,
    which misses a parent that died before this call. On other platforms this is a no-op.

    Caveat: Linux fires the signal when the parent *thread* that forked this process exits, not the
    whole parent process; spawn workers from a thread that lives as long as the agent.
    """
    parent = os.getppid() if expected_parent is None else expected_parent
    if not sys.platform.startswith("linux"):
        log.debug("die_with_parent: no PR_SET_PDEATHSIG on %s; relying on the lease", sys.platform)
        return
    # CDLL(None) is the running interpreter, which links libc; find_library("c") would fork ldconfig.
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_PDEATHSIG) failed: {os.strerror(err)}")
    # The parent may have died before prctl took effect: we were then re-parented and no signal will
    # ever come. Checking after the request closes that race.
    if os.getppid() != parent:
        os._exit(1)


def become_subreaper() -> bool:
    """Make this process the reaper of its orphaned descendants (Linux PR_SET_CHILD_SUBREAPER).

    A process whose parent exits is then re-parented to this one instead of init: the agent adopts
    the workers a fork server double-forks, and they become its own children (it can wait for them,
    they die with it). The caller must reap every child it adopts (`reap_orphans`). Returns False
    where the kernel offers no subreaper (other platforms).
    """
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


def reap_orphans(keep: Iterable[int]) -> list[int]:
    """Reap this process's zombie children whose pid is not in `keep` (children someone else waits
    for, through a Popen or an `AdoptedChild`); returns the pids reaped. For a subreaper, whose
    adopted orphans (a dead worker's DataLoader children, say) would otherwise stay zombies."""
    if not _has_dead_child():
        return []  # the common case, one system call: the scan below reads every process on the host
    keep = set(keep)
    reaped = []
    try:
        children = psutil.Process().children()
    except psutil.Error:
        return reaped
    for child in children:
        if child.pid in keep:
            continue
        try:
            if child.status() == psutil.STATUS_ZOMBIE and os.waitpid(child.pid, os.WNOHANG)[0] == child.pid:
                reaped.append(child.pid)
        except (psutil.Error, ChildProcessError):
            continue
    return reaped


def _has_dead_child() -> bool:
    """Whether any child of this process has exited and is not reaped yet; reaps nothing (WNOWAIT).

    psutil's `children()` reads the stat file of every process on the machine: 4 ms each time on an
    idle 2-core VM, which an agent polling every COMMAND_POLL_S took from the training (2% of a core)."""
    try:
        return os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:  # no children at all
        return False
    except (AttributeError, OSError):  # no waitid here: let the scan decide
        return True


def signal_orphans(keep: Iterable[int], sig: Optional[int]) -> list[int]:
    """For a subreaper: reap this process's dead children whose pid is not in `keep`, send `sig`
    (None: no signal) to the living ones, and return their pids.

    Only children are signalled, never deeper descendants: a child stays ours until we reap it, so
    its pid cannot name anyone else while we look, and the child's own children come to us (the
    subreaper) when it dies, to be signalled in the next call. The caller must make sure nothing
    else reaps these children meanwhile, and that `keep` holds every child it started on purpose
    (workers, fork servers, a child being started right now)."""
    keep = set(keep)
    living = []
    try:
        children = psutil.Process().children()
    except psutil.Error:
        return living
    for child in children:
        if child.pid in keep:
            continue
        try:
            if child.status() == psutil.STATUS_ZOMBIE:
                os.waitpid(child.pid, os.WNOHANG)
                continue
            if sig is not None:
                os.kill(child.pid, sig)
            living.append(child.pid)
        except (psutil.Error, ProcessLookupError, ChildProcessError):
            continue
    return living


class AdoptedChild:
    """A child process this process did not fork itself (a subreaper adopted it), with the part of
    `subprocess.Popen`'s interface the agent uses: `pid`, `returncode`, `poll()`, `wait(timeout)`
    and the `stdin`/`stdout`/`stderr` file objects of its pipes (None when not given).

    Like Popen, `returncode` is the exit code, or -N after death by signal N; `wait` may be called
    from several threads at once (one reaps, the others see the result).
    """

    def __init__(self, pid: int, *, stdin=None, stdout=None, stderr=None):
        self.pid = pid
        self.returncode: int | None = None
        self.stdin, self.stdout, self.stderr = stdin, stdout, stderr
        self._reaping = threading.Lock()

    def poll(self) -> int | None:
        """The return code if the process has exited (it is reaped then), else None."""
        return self._try_reap(block=False)

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the exit and return the return code; `subprocess.TimeoutExpired` after `timeout`."""
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = _POLL_MIN_S / 10
        while self._try_reap(block=deadline is None) is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired([str(self.pid)], timeout)
            time.sleep(delay)
            delay = min(delay * 2, _POLL_MAX_S)
        return self.returncode

    def _try_reap(self, block: bool) -> int | None:
        if self.returncode is not None or not self._reaping.acquire(blocking=False):
            return self.returncode  # another thread is reaping it: its result shows up here
        try:
            if self.returncode is None:
                pid, status = os.waitpid(self.pid, 0 if block else os.WNOHANG)
                if pid == self.pid:
                    self.returncode = os.waitstatus_to_exitcode(status)
        except ChildProcessError:
            # Reaped by someone else (a bug): its status is lost. Once it is gone, report it as
            # killed rather than waiting forever.
            if not psutil.pid_exists(self.pid):
                self.returncode = -signal.SIGKILL
        finally:
            self._reaping.release()
        return self.returncode


def decode_returncode(returncode: int) -> tuple[int | None, int | None]:
    """Split a Popen returncode into (exit_code, signal): 3 -> (3, None), -9 -> (None, 9).

    Popen reports death by signal N as -N. A shell in between would report 128+N as an exit code;
    minitrain execs workers directly, so that case does not arise and is not guessed at.
    """
    if returncode < 0:
        return None, -returncode
    return returncode, None


@dataclass(frozen=True, slots=True)
class StopResult:
    """What `stop_process_group` observed.

    `exit_code`/`signal` describe the leader (both None when unknown: the leader was given as a bare
    pid, or it would not die). `sigkill_sent` is True when anything in the group outlived the grace.
    `survivors` are the pids (leader included) still alive when the bounded wait ended; non-empty
    means processes stuck in uninterruptible sleep, whose host is suspect (a wedged GPU or NIC).
    """

    pid: int
    exit_code: int | None
    signal: int | None
    sigkill_sent: bool
    survivors: tuple[int, ...] = ()


def stop_process_group(
    proc_or_pid: subprocess.Popen | AdoptedChild | int, *, grace_s: float, kill_wait_s: float = 5.0
) -> StopResult:
    """Stop the process group led by `proc_or_pid` (a session leader, so pgid == pid).

    SIGTERM to the group; wait up to `grace_s` for the leader and every group member to exit; then
    SIGKILL the group and wait at most `kill_wait_s` more. Never blocks longer than about
    `grace_s + kill_wait_s`: a process in uninterruptible sleep is logged and returned in
    `survivors` instead. A Popen or AdoptedChild leader is reaped (no zombie left); a bare pid is
    not (its owner must reap it). Members that left the group (their own `setsid`) are out of reach by design.
    """
    proc = proc_or_pid if isinstance(proc_or_pid, (subprocess.Popen, AdoptedChild)) else None
    pgid = proc.pid if proc is not None else int(proc_or_pid)
    if proc is not None and proc.poll() is not None and not group_members(pgid):
        # Leader reaped and group empty: its pid may already belong to someone else; signal nothing.
        return StopResult(pgid, *decode_returncode(proc.returncode), sigkill_sent=False)
    _signal_group(pgid, signal.SIGTERM)
    # A stopped process (SIGSTOP, a debugger) keeps SIGTERM pending until it runs again: wake it so
    # the SIGTERM takes effect now instead of after the whole grace period.
    _signal_group(pgid, signal.SIGCONT)
    alive = _wait_group(proc, pgid, time.monotonic() + grace_s)
    sigkill_sent = bool(alive)
    if alive:
        _signal_group(pgid, signal.SIGKILL)
        alive = _wait_group(proc, pgid, time.monotonic() + kill_wait_s)
    if alive:
        log.warning(
            "process group %d: pids %s still alive %.1fs after SIGKILL (uninterruptible sleep?);"
            " giving up on them", pgid, alive, kill_wait_s,
        )
    exit_code, sig = _leader_status(proc)
    return StopResult(pgid, exit_code, sig, sigkill_sent, tuple(alive))


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass  # the whole group is already gone


def _wait_group(proc: subprocess.Popen | None, pgid: int, deadline: float) -> list[int]:
    """Wait until the leader and the group are gone or the deadline passes; return the living."""
    leader_alive = _wait_leader(proc, pgid, deadline)
    members = [p for p in group_members(pgid) if p != pgid]
    alive = wait_until_gone(members, max(0.0, deadline - time.monotonic()))
    return ([pgid] if leader_alive else []) + alive


def _wait_leader(proc: subprocess.Popen | None, pid: int, deadline: float) -> bool:
    """True when the leader is still alive at the deadline. A Popen leader is reaped."""
    timeout = max(0.0, deadline - time.monotonic())
    if proc is None:
        return bool(wait_until_gone([pid], timeout))
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        return True
    return False


def _leader_status(proc: subprocess.Popen | None) -> tuple[int | None, int | None]:
    if proc is None or proc.returncode is None:
        return None, None
    return decode_returncode(proc.returncode)


def group_members(pgid: int) -> list[int]:
    """Pids of living processes whose process group is `pgid` (zombies excluded: they hold no
    resources and cannot be killed further; their parent must reap them)."""
    members = []
    for pid in psutil.pids():
        try:
            if os.getpgid(pid) == pgid and not _is_zombie(pid):
                members.append(pid)
        except (ProcessLookupError, psutil.NoSuchProcess):
            continue  # exited while we looked
    return members


def wait_until_gone(pids: Iterable[int], timeout: float) -> list[int]:
    """Poll until every pid has exited (or is a zombie); return those still alive at the deadline.

    Never reaps: a zombie child belongs to whoever holds its Popen, and stealing its status would
    make that Popen report a wrong exit code.
    """
    deadline = time.monotonic() + timeout
    alive = list(pids)
    delay = _POLL_MIN_S
    while True:
        alive = [p for p in alive if _is_alive(p)]
        remaining = deadline - time.monotonic()
        if not alive or remaining <= 0:
            return alive
        time.sleep(min(delay, remaining))
        delay = min(delay * 2, _POLL_MAX_S)


def _is_alive(pid: int) -> bool:
    try:
        return not _is_zombie(pid)
    except psutil.NoSuchProcess:
        return False


def _is_zombie(pid: int) -> bool:
    """Raises psutil.NoSuchProcess when `pid` does not exist."""
    return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def oom_kill_count(proc_self: str | os.PathLike[str] = "/proc/self") -> int | None:
    """The kernel's OOM-kill counter for this process's memory cgroup, or None when unavailable.

    cgroup v2: `oom_kill` in `memory.events` (counts kills in descendant cgroups too); cgroup v1:
    `oom_kill` in `memory.oom_control`. Workers share the agent's cgroup, so a counter that grew
    across a worker's SIGKILL death makes "likely killed by the OOM killer" a fair annotation.
    `proc_self` is injectable for tests. Never raises for a missing or unreadable file.
    """
    try:
        cgroups = Path(proc_self, "cgroup").read_text()
        mounts = Path(proc_self, "mountinfo").read_text()
    except OSError:
        return None
    for path in _memory_counter_files(cgroups, mounts):
        count = _read_key(path, "oom_kill")
        if count is not None:
            return count
    return None


def _memory_counter_files(cgroups: str, mounts: str) -> list[Path]:
    """Candidate counter files, cgroup v2 first: one per mounted hierarchy that has memory."""
    v2_path = v1_path = None
    for line in cgroups.splitlines():
        hier, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hier == "0" and controllers == "":
            v2_path = path
        elif "memory" in controllers.split(","):
            v1_path = path
    files = []
    for mount_root, mount_point, fstype, options in cgroup_mounts(mounts):
        if fstype == "cgroup2" and v2_path is not None:
            files.append(cgroup_dir(mount_point, mount_root, v2_path) / "memory.events")
        elif fstype == "cgroup" and "memory" in options and v1_path is not None:
            files.append(cgroup_dir(mount_point, mount_root, v1_path) / "memory.oom_control")
    files.sort(key=lambda f: f.name != "memory.events")
    return files


def cgroup_mounts(mounts: str) -> list[tuple[str, str, str, list[str]]]:
    """(root, mount point, fstype, super options) for each cgroup mount in the text of
    /proc/self/mountinfo."""
    found = []
    for line in mounts.splitlines():
        head, sep, tail = line.partition(" - ")
        fields, tail_fields = head.split(), tail.split()
        if sep and len(fields) >= 5 and len(tail_fields) >= 3 and tail_fields[0] in ("cgroup", "cgroup2"):
            found.append((fields[3], fields[4], tail_fields[0], tail_fields[2].split(",")))
    return found


def cgroup_dir(mount_point: str, mount_root: str, cgroup_path: str) -> Path:
    """The directory of cgroup `cgroup_path` (as /proc/<pid>/cgroup names it) in the hierarchy
    mounted at `mount_point`, whose mount shows the subtree `mount_root`."""
    # A container may mount only a subtree of the hierarchy: the mount's root is then a prefix of the
    # path in /proc/self/cgroup, and must be cut off.
    if mount_root != "/" and (cgroup_path + "/").startswith(mount_root.rstrip("/") + "/"):
        cgroup_path = cgroup_path[len(mount_root.rstrip("/")):]
    return Path(mount_point, cgroup_path.lstrip("/"))


def _read_key(path: Path, key: str) -> int | None:
    try:
        text = path.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == key and value.strip().isdigit():
            return int(value)
    return None


_PF_EXITING = 0x4  # include/linux/sched.h: set at the very start of do_exit()


def _is_exiting(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            fields = handle.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return True  # no such process any more
    return fields[0] in (b"Z", b"X") or bool(int(fields[6]) & _PF_EXITING)


def has_exited(pid: int) -> bool:
    """True when child `pid` has begun to exit, has exited, or is gone; it is never reaped here.

    Unlike `Popen.poll()`, this answers correctly while another thread is blocked in `Popen.wait()`
    (poll() then returns None, "unknown"). It also sees a process that is still tearing down: its
    sockets close (so its peers fail) before it becomes a zombie, and during that window it is
    already flagged PF_EXITING.
    """
    try:
        if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
            return True
    except ChildProcessError:
        return True  # already reaped
    return _is_exiting(pid)
