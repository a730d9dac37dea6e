"""minitrain.procs against tiny real processes (python -c scripts); no mocks of os or signal. What needs
no process (exit statuses, the OOM kill count from cgroup files): tests/unit/test_procs_status.py.

Every test registers what it starts with the `tracked` fixture, which SIGKILLs those process groups
(and lone pids) on the way out, so a failing assertion leaves nothing behind. Waits are on
conditions with deadlines, never fixed sleeps.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest
from procs_support import living_descendants

from minitrain import procs

REPO_ROOT = str(Path(__file__).resolve().parents[2])
DEADLINE_S = 10.0  # generous: a 2-core machine under xdist can be slow to start python


class Tracker:
    """Remembers process groups and pids started by a test and kills them all at teardown."""

    def __init__(self) -> None:
        self.popens: list[subprocess.Popen] = []
        self.pids: list[psutil.Process] = []

    def spawn(self, script: str, **kwargs) -> subprocess.Popen:
        proc = procs.spawn([sys.executable, "-c", textwrap.dedent(script)], env=_env(), **kwargs)
        self.popens.append(proc)
        return proc

    def add_pid(self, pid: int) -> int:
        # psutil.Process remembers the start time, so kill() at teardown cannot hit a reused pid.
        self.pids.append(psutil.Process(pid))
        return pid

    def cleanup(self) -> None:
        for proc in self.popens:
            # While the leader is unreaped, or its group has members, the pgid cannot be reused.
            if proc.poll() is None or procs.group_members(proc.pid):
                _ignore_gone(os.killpg, proc.pid, signal.SIGKILL)
        for process in self.pids:
            _ignore_gone(process.kill)
        for proc in self.popens:
            proc.wait(timeout=DEADLINE_S)
            for stream in (proc.stdin, proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()
        assert procs.wait_until_gone([p.pid for p in self.pids], DEADLINE_S) == []


def _ignore_gone(kill, *args) -> None:
    try:
        kill(*args)
    except (ProcessLookupError, psutil.NoSuchProcess):
        pass


@pytest.fixture
def tracked():
    tracker = Tracker()
    try:
        yield tracker
    finally:
        tracker.cleanup()


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    env["PYTHONPATH"] = REPO_ROOT
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _read_lines(proc: subprocess.Popen, count: int, timeout: float = DEADLINE_S) -> list[str]:
    """Read `count` lines from proc.stdout (binary pipe) within `timeout`, without blocking past it."""
    fd, buf, deadline = proc.stdout.fileno(), b"", time.monotonic() + timeout
    while buf.count(b"\n") < count:
        remaining = deadline - time.monotonic()
        ready, _, _ = select.select([fd], [], [], max(0.0, remaining))
        if not ready:
            raise AssertionError(f"timed out waiting for {count} lines; got {buf!r}")
        chunk = os.read(fd, 4096)
        if not chunk:
            raise AssertionError(f"EOF after {buf!r}; exit status {proc.poll()}")
        buf += chunk
    return buf.decode().splitlines()[:count]


IGNORE_TERM = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN)"

SPAWN_GRANDCHILD = """
    import signal, subprocess, sys, time
    gc = subprocess.Popen([sys.executable, "-c", {gc_script!r}])
    print(gc.pid, flush=True)   # the grandchild prints 'ready' on the same pipe
    time.sleep(120)
"""


def _with_grandchild(tracked: Tracker, gc_script: str) -> tuple[subprocess.Popen, int]:
    leader = tracked.spawn(SPAWN_GRANDCHILD.format(gc_script=gc_script))
    pid_line, ready = _read_lines(leader, 2)
    assert ready == "ready"
    return leader, tracked.add_pid(int(pid_line))


def test_spawn_starts_a_new_session(tracked):
    proc = tracked.spawn("import time; print('ready', flush=True); time.sleep(120)")
    assert _read_lines(proc, 1) == ["ready"]
    assert os.getsid(proc.pid) == proc.pid
    assert os.getpgid(proc.pid) == proc.pid
    assert procs.group_members(proc.pid) == [proc.pid]


def test_sigterm_is_enough_for_a_cooperative_child(tracked):
    proc = tracked.spawn("import time; print('ready', flush=True); time.sleep(120)")
    _read_lines(proc, 1)
    result = procs.stop_process_group(proc, grace_s=DEADLINE_S)
    assert result == procs.StopResult(proc.pid, None, signal.SIGTERM, sigkill_sent=False)
    assert proc.returncode == -signal.SIGTERM  # reaped


def test_child_ignoring_sigterm_is_killed_after_grace(tracked):
    proc = tracked.spawn(IGNORE_TERM + "; print('ready', flush=True); time.sleep(120)")
    _read_lines(proc, 1)
    start = time.monotonic()
    result = procs.stop_process_group(proc, grace_s=0.5)
    assert time.monotonic() - start >= 0.5
    assert result.sigkill_sent and result.survivors == ()
    assert (result.exit_code, result.signal) == (None, signal.SIGKILL)


@pytest.mark.parametrize("by", ["popen", "pid"])
def test_grandchild_in_the_group_is_stopped_too(tracked, by):
    leader, gc = _with_grandchild(tracked, "import time; print('ready', flush=True); time.sleep(120)")
    assert sorted(procs.group_members(leader.pid)) == sorted([leader.pid, gc])
    assert [p.pid for p in living_descendants(leader.pid)] == [gc]
    result = procs.stop_process_group(leader if by == "popen" else leader.pid, grace_s=DEADLINE_S)
    assert not result.sigkill_sent
    assert procs.wait_until_gone([leader.pid, gc], DEADLINE_S) == []
    if by == "pid":  # a bare pid is not reaped by stop_process_group, and its status is unknown
        assert (result.exit_code, result.signal) == (None, None)
        assert leader.wait(timeout=DEADLINE_S) == -signal.SIGTERM


def test_grandchild_that_outlives_its_leader_is_killed(tracked):
    leader, gc = _with_grandchild(tracked, IGNORE_TERM + "; print('ready', flush=True); time.sleep(120)")
    result = procs.stop_process_group(leader, grace_s=0.5)
    assert result.signal == signal.SIGTERM  # the leader obeyed...
    assert result.sigkill_sent  # ...the grandchild had to be killed
    assert result.survivors == ()
    assert procs.wait_until_gone([gc], DEADLINE_S) == []
    assert procs.group_members(leader.pid) == []


def test_stopping_an_already_reaped_leader_signals_nothing(tracked):
    proc = tracked.spawn("raise SystemExit(4)")
    assert proc.wait(timeout=DEADLINE_S) == 4
    result = procs.stop_process_group(proc, grace_s=1.0)
    assert result == procs.StopResult(proc.pid, 4, None, sigkill_sent=False)


INTERMEDIATE = """
    import os, sys, time
    from minitrain import procs
    child = procs.spawn(
        [sys.executable, "-c", {child!r}], env=os.environ, stdin=None, stdout=None, stderr=None)
    print(child.pid, flush=True)
    time.sleep(120)
"""
CHILD_OF_INTERMEDIATE = """
import time
from minitrain import procs
procs.die_with_parent()
print("ready", flush=True)
time.sleep(120)
"""


def test_die_with_parent_kills_child_when_parent_is_sigkilled(tracked):
    script = INTERMEDIATE.format(child=CHILD_OF_INTERMEDIATE)
    intermediate = tracked.spawn(script)
    pid_line, ready = _read_lines(intermediate, 2)
    assert ready == "ready"
    child = tracked.add_pid(int(pid_line))  # its own session: the intermediate's group kill misses it
    assert psutil.Process(child).ppid() == intermediate.pid
    os.kill(intermediate.pid, signal.SIGKILL)  # the pid only, not the group
    assert intermediate.wait(timeout=DEADLINE_S) == -signal.SIGKILL
    assert procs.wait_until_gone([child], DEADLINE_S) == []


def test_die_with_parent_exits_when_parent_already_changed(tracked):
    not_my_parent = 1 if os.getpid() != 1 else 2
    proc = tracked.spawn(
        f"import time; from minitrain import procs; procs.die_with_parent(expected_parent={not_my_parent});"
        " time.sleep(120)"
    )
    assert proc.wait(timeout=DEADLINE_S) == 1


SEGFAULT = """
    import ctypes, resource
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE=0: no core file, even via a pipe handler
    ctypes.string_at(0)
"""


@pytest.mark.parametrize(
    ("script", "expected"),
    [
        ("raise SystemExit(3)", (3, None)),
        ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", (None, signal.SIGKILL)),
        (SEGFAULT, (None, signal.SIGSEGV)),
    ],
    ids=["exit3", "sigkill", "sigsegv"],
)
def test_decode_returncode_of_real_deaths(tracked, tmp_path, script, expected):
    proc = tracked.spawn(script, cwd=tmp_path)
    returncode = proc.wait(timeout=DEADLINE_S)
    assert procs.decode_returncode(returncode) == expected


def test_wait_until_gone_reports_the_living_at_the_deadline(tracked):
    proc = tracked.spawn("import time; time.sleep(120)")
    start = time.monotonic()
    assert procs.wait_until_gone([proc.pid], 0.2) == [proc.pid]
    assert 0.2 <= time.monotonic() - start < 2.0


def test_has_exited_sees_running_dead_and_reaped_children():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert procs.has_exited(child.pid) is False
        child.kill()
        deadline = time.monotonic() + 10
        while not procs.has_exited(child.pid):  # a zombie counts as exited, and is not reaped
            assert time.monotonic() < deadline, "the killed child never showed as exited"
            time.sleep(0.01)
        assert procs.has_exited(child.pid) is True
        # has_exited may answer while the child is still tearing down (PF_EXITING), before it is a
        # zombie: wait for the zombie. Its real status proves has_exited did not reap it (a child
        # reaped behind Popen's back reads as returncode 0).
        while child.poll() is None:
            assert time.monotonic() < deadline, "the killed child never became reapable"
            time.sleep(0.01)
        assert child.returncode == -signal.SIGKILL
    finally:
        child.kill()
        child.wait()


# ---------------------------------------------------------------------------------- subreaper, adopted children

# Runs in its own process: a subreaper adopts every orphan below it, which must not be pytest.
ADOPTION = textwrap.dedent("""
    import json, os, signal, subprocess, sys, time
    from minitrain import procs

    def orphan(script):
        # sh starts `script` in the background, prints its pid and exits: we adopt the orphan.
        out = subprocess.run(["sh", "-c", script + " >/dev/null 2>&1 & echo $!"], capture_output=True,
                             text=True).stdout
        return int(out)

    assert procs.become_subreaper()
    report = {}
    sleeper = procs.AdoptedChild(orphan("sleep 30"))
    report["parent_is_us"] = os.getppid() != sleeper.pid and \\
        int(open(f"/proc/{sleeper.pid}/stat").read().rsplit(")", 1)[1].split()[1]) == os.getpid()
    report["poll_while_alive"] = sleeper.poll()
    try:
        sleeper.wait(timeout=0.05)
        report["timed_out"] = False
    except subprocess.TimeoutExpired:
        report["timed_out"] = True
    os.kill(sleeper.pid, signal.SIGTERM)
    report["killed"] = sleeper.wait(timeout=10)
    report["exit_code"] = procs.AdoptedChild(orphan("sh -c 'sleep 0.3; exit 7'")).wait(timeout=10)

    kept = orphan("sleep 0.3")  # outlives sh, so it is adopted (a job that ended first is sh's to reap)
    dropped = orphan("sleep 0.3")
    deadline = time.monotonic() + 10
    reaped = []
    while dropped not in reaped and time.monotonic() < deadline:
        reaped += procs.reap_orphans(keep={kept})
        time.sleep(0.01)
    report["reaped_dropped"] = dropped in reaped
    report["kept_untouched"] = kept not in reaped and os.waitpid(kept, 0)[0] == kept
    print(json.dumps(report))
""")


def test_a_subreaper_waits_for_adopted_orphans_and_reaps_the_rest():
    done = subprocess.run([sys.executable, "-c", ADOPTION], capture_output=True, text=True, timeout=60,
                          cwd=REPO_ROOT)
    assert done.returncode == 0, done.stderr
    import json
    assert json.loads(done.stdout) == {
        "parent_is_us": True, "poll_while_alive": None, "timed_out": True,
        "killed": -signal.SIGTERM, "exit_code": 7, "reaped_dropped": True, "kept_untouched": True}


DEAD_CHILD_CHECK = textwrap.dedent("""
    import json, os, subprocess, sys, time
    from minitrain import procs
    seen = {"no_children": procs._has_dead_child()}
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    seen["alive"] = procs._has_dead_child()
    child.stdin.close()
    deadline = time.monotonic() + 10
    while not procs._has_dead_child() and time.monotonic() < deadline:
        time.sleep(0.01)
    seen["exited"] = procs._has_dead_child()
    seen["still_exited"] = procs._has_dead_child()  # the look reaped nothing
    seen["waited"] = child.wait(timeout=10)
    seen["reaped"] = procs._has_dead_child()
    print(json.dumps(seen))
""")


def test_the_dead_child_check_sees_an_exited_child_without_reaping_it():
    """reap_orphans scans the process table only when a child is dead: the check must see every dead
    child (or an orphan would stay a zombie) and reap none (a Popen waits for its own)."""
    done = subprocess.run([sys.executable, "-c", DEAD_CHILD_CHECK], capture_output=True, text=True,
                          timeout=60, cwd=REPO_ROOT)
    assert done.returncode == 0, done.stderr
    import json
    assert json.loads(done.stdout) == {"no_children": False, "alive": False, "exited": True,
                                       "still_exited": True, "waited": 0, "reaped": False}
