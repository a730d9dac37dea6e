"""Each attempt's workers in a cgroup v2 of their own, so that everything they started can be killed.

A worker's child that starts its own session (a daemon: `Popen(start_new_session=True)`, a double
fork) leaves the worker's process group, and a process group stop no longer reaches it. Its cgroup
it cannot leave (short of writing to cgroup files as root): `cgroup.kill` (Linux >= 5.14) SIGKILLs
every process in a cgroup at once, atomically, however the processes are related.

Layout: the agent creates one directory in its own cgroup, `minitrain-<run>-<pid>-<random>`, and in
it one `attempt-<n>` directory per attempt; it moves each worker there before the worker runs user
code (before its bootstrap line). The agent itself stays where it is. It signals only processes in
directories it created, removes only those directories, and never touches anything else in the
hierarchy: two runs on one host each have their own directory.

`open_agent_cgroup` says why cgroups cannot be used when they cannot (no cgroup v2 hierarchy, not
writable, a systemd unit that did not delegate its subtree, a kernel without `cgroup.kill`); the
agent then falls back to its subreaper sweep (minitrain.agent.descendants).
"""

from __future__ import annotations

import errno
import logging
import os
import re
import secrets
import signal
import time
from pathlib import Path
from typing import Optional

from minitrain import procs

logger = logging.getLogger("minitrain.agent")

_SYSTEMD_UNIT = re.compile(r"\.(slice|scope|service)$")
_DELEGATE_XATTRS = ("trusted.delegate", "user.delegate")  # systemd marks delegated subtrees so
_UNSAFE_NAME = re.compile(r"[^A-Za-z0-9_.-]")


def own_cgroup_dir(proc_self: str = "/proc/self") -> tuple[Optional[Path], str]:
    """(directory of this process's cgroup v2, "") or (None, why there is none)."""
    try:
        cgroups = Path(proc_self, "cgroup").read_text()
        mounts = Path(proc_self, "mountinfo").read_text()
    except OSError as exc:
        return None, f"cannot read {proc_self}/cgroup: {exc}"
    path = next((line[3:] for line in cgroups.splitlines() if line.startswith("0::")), None)
    if path is None:
        return None, "no cgroup v2 hierarchy (cgroup v1 only)"
    for mount_root, mount_point, fstype, _options in procs.cgroup_mounts(mounts):
        if fstype == "cgroup2":
            return procs.cgroup_dir(mount_point, mount_root, path), ""
    return None, "the cgroup v2 hierarchy is not mounted here"


def _delegation_problem(directory: Path) -> str:
    """Why writing below `directory` would break its manager's rules, or "" when it would not.

    systemd owns the cgroups of its units; a unit's subtree is ours to divide only when delegated
    (`Delegate=yes`, which systemd records in an extended attribute of the directory)."""
    units = [part for part in directory.parts if _SYSTEMD_UNIT.search(part)]
    if not units:
        return ""  # not systemd's (a container's own root, a hand-made cgroup)
    for candidate in (directory, *directory.parents):
        for name in _DELEGATE_XATTRS:
            try:
                if os.getxattr(candidate, name) in (b"1", b"yes"):
                    return ""
            except OSError:
                continue
    return (f"cgroup {directory} belongs to systemd unit {units[-1]}, which did not delegate it "
            "(start the agent from a unit with Delegate=yes, e.g. systemd-run --scope -p Delegate=yes)")


def open_agent_cgroup(run_id: str, proc_self: str = "/proc/self") -> tuple[Optional["AgentCgroup"], str]:
    """Create this agent's cgroup directory: (AgentCgroup, "") or (None, why cgroups are not used)."""
    directory, reason = own_cgroup_dir(proc_self)
    if directory is None:
        return None, reason
    problem = _delegation_problem(directory)
    if problem:
        return None, problem
    run_part = _UNSAFE_NAME.sub('_', run_id)[:40]
    _collect_stale(directory, run_part)
    name = f"minitrain-{run_part}-{os.getpid()}-{secrets.token_hex(4)}"
    root = directory / name
    try:
        root.mkdir(mode=0o755)
    except OSError as exc:
        return None, f"cannot create a cgroup in {directory}: {exc.strerror or exc}"
    if not (root / "cgroup.kill").exists():
        _rmdir(root)
        return None, f"the kernel ({os.uname().release}) has no cgroup.kill (Linux >= 5.14 needed)"
    return AgentCgroup(root), ""


_AGENT_DIR = re.compile(r"^minitrain-(.+)-(\d+)-[0-9a-f]{8}$")


def _collect_stale(directory: Path, run_part: str) -> None:
    """Remove what agents that died without cleaning up (SIGKILLed) left in `directory`: directories
    named like ours whose agent pid is gone. Their processes are killed only when they belong to this
    run (a relaunched agent inherits its predecessor's leftovers); another run's directory is removed
    only when empty (the kernel refuses to remove a cgroup that still has processes)."""
    try:
        entries = list(directory.iterdir())
    except OSError:
        return
    for entry in entries:
        match = _AGENT_DIR.match(entry.name)
        if match is None or _pid_alive(int(match.group(2))):
            continue
        stale = AgentCgroup(entry)
        for attempt in stale.attempts():
            if match.group(1) == run_part:
                stale.kill(attempt)
                stale.wait_empty(attempt, 5.0)
            _rmdir_quietly(stale.attempt_dir(attempt))
        _rmdir_quietly(entry)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _rmdir_quietly(path: Path) -> None:
    try:
        path.rmdir()
    except OSError:
        pass


def _rmdir(path: Path) -> bool:
    try:
        path.rmdir()
        return True
    except FileNotFoundError:
        return True
    except OSError as exc:
        logger.warning("could not remove cgroup %s: %s", path, exc)
        return False


class AgentCgroup:
    """This agent's cgroup directory and the attempt directories it creates in it. Thread-safe for
    different attempts; calls for one attempt come from one thread at a time (the agent's)."""

    def __init__(self, root: Path):
        self.root = root
        self._relative = "/" + root.name  # suffix of /proc/<pid>/cgroup lines of our members

    def attempt_dir(self, attempt: int) -> Path:
        """The directory of `attempt` (not created)."""
        return self.root / f"attempt-{attempt}"

    def add(self, pid: int, attempt: int) -> None:
        """Move process `pid` (a child of ours, not reaped, so the pid is surely it) into the
        attempt's cgroup, created on first use. OSError when the kernel refuses."""
        directory = self.attempt_dir(attempt)
        directory.mkdir(mode=0o755, exist_ok=True)
        try:
            (directory / "cgroup.procs").write_text(str(pid))
        except ProcessLookupError:
            pass  # it died already; its waiter reports how

    def members(self, attempt: int) -> list[int]:
        """Pids of the processes in the attempt's cgroup (zombies are not members)."""
        try:
            text = (self.attempt_dir(attempt) / "cgroup.procs").read_text()
        except OSError:
            return []
        return [int(pid) for pid in text.split()]

    def terminate(self, attempt: int) -> int:
        """SIGTERM (and SIGCONT, so stopped ones act on it) every member of the attempt's cgroup;
        returns how many were signalled. Each is checked to be a member through a pidfd before it is
        signalled, so a pid reused by an outsider after the listing is never hit."""
        signalled = 0
        for pid in self.members(attempt):
            if self._signal_member(pid, attempt, signal.SIGTERM):
                self._signal_member(pid, attempt, signal.SIGCONT)
                signalled += 1
        return signalled

    def _signal_member(self, pid: int, attempt: int, signum: int) -> bool:
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:
            return False  # gone
        try:
            line = Path(f"/proc/{pid}/cgroup").read_text()
            if not line.rstrip().endswith(f"{self._relative}/attempt-{attempt}"):
                return False  # the pid now names a process that is not ours
            signal.pidfd_send_signal(pidfd, signum)
            return True
        except OSError:
            return False
        finally:
            os.close(pidfd)

    def kill(self, attempt: int) -> None:
        """SIGKILL everything in the attempt's cgroup at once (cgroup.kill)."""
        try:
            (self.attempt_dir(attempt) / "cgroup.kill").write_text("1")
        except FileNotFoundError:
            pass

    def wait_empty(self, attempt: int, timeout_s: float) -> bool:
        """Poll until the attempt's cgroup has no process left; False at the deadline."""
        deadline = time.monotonic() + timeout_s
        delay = 0.005
        while self.members(attempt):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            time.sleep(min(delay, remaining))
            delay = min(delay * 2, 0.05)
        return True

    def remove(self, attempt: int) -> bool:
        """Remove the attempt's (empty) directory; True when it is gone."""
        return _rmdir(self.attempt_dir(attempt))

    def attempts(self) -> list[int]:
        """The attempts whose directory exists."""
        found = []
        try:
            for entry in self.root.iterdir():
                if entry.is_dir() and entry.name.startswith("attempt-") and entry.name[8:].isdigit():
                    found.append(int(entry.name[8:]))
        except OSError as exc:
            if exc.errno != errno.ENOENT:
                raise
        return sorted(found)

    def close(self) -> bool:
        """Remove the agent's directory (attempt directories must be removed first); True when gone."""
        return _rmdir(self.root)
