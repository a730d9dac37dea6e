"""Everything a worker started is gone when its attempt ends (minitrain/agent/descendants.py).

Real processes throughout: daemons that leave the worker's process group (a `setsid` grandchild and a
double-forked daemon), each holding a listening socket, one of them ignoring SIGTERM. After the
attempt ends (fit() returns, or the attempt fails and the run restarts) they are gone and their ports
are free. The cleanup itself is also driven directly in small stand-in agents, with cgroups and without,
two at once: neither kills the other's processes, nor a process it did not start.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

import minitrain
from minitrain import FailureConfig, RunConfig, ScalingConfig
from minitrain.agent import cgroups
from minitrain.procs import wait_until_gone
from minitrain.torch import TorchTrainer

DEADLINE_S = 60.0
ROOT = Path(__file__).resolve().parents[2]

# A daemon: listens on a port of 127.0.0.1, writes "pid port" to argv[1] (atomically), then sleeps.
# With argv[2] == "stubborn" it ignores SIGTERM, so only SIGKILL ends it.
LISTENER = textwrap.dedent("""
    import os, signal, socket, sys, time
    if len(sys.argv) > 2 and sys.argv[2] == "stubborn":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    with open(sys.argv[1] + ".tmp", "w") as note:
        note.write(f"{os.getpid()} {server.getsockname()[1]}")
    os.rename(sys.argv[1] + ".tmp", sys.argv[1])
    while True:
        time.sleep(60)
""")

# The classic daemon: fork, setsid, fork again, the middle process exits (the daemon is an orphan).
DOUBLE_FORK = textwrap.dedent("""
    import os, sys
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            os.execv(sys.executable, [sys.executable, "-c", sys.argv[1], *sys.argv[2:]])
        os._exit(0)
    os.wait()
""")


def spawn_daemons(directory: str, name: str) -> list[str]:
    """Start a setsid grandchild (stubborn) and a double-forked daemon; return their note files."""
    notes = [os.path.join(directory, f"{name}-setsid"), os.path.join(directory, f"{name}-double")]
    quiet = {"stdin": subprocess.DEVNULL, "stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    subprocess.Popen([sys.executable, "-c", LISTENER, notes[0], "stubborn"], start_new_session=True, **quiet)
    subprocess.run([sys.executable, "-c", DOUBLE_FORK, LISTENER, notes[1]], check=True, **quiet)
    deadline = time.monotonic() + DEADLINE_S
    while not all(os.path.exists(note) for note in notes):
        assert time.monotonic() < deadline, f"the daemons never wrote {notes}"
        time.sleep(0.02)
    return notes


def read_note(path: str) -> tuple[int, int]:
    pid, port = Path(path).read_text().split()
    return int(pid), int(port)


def port_is_free(port: int) -> bool:
    probe = socket.socket()
    try:
        probe.bind(("127.0.0.1", port))
        return True
    except OSError:
        return False
    finally:
        probe.close()


def wait_until_free(ports: list[int], timeout_s: float) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while True:
        taken = [port for port in ports if not port_is_free(port)]
        if not taken or time.monotonic() >= deadline:
            return taken
        time.sleep(0.05)


def assert_gone(notes: list[str]) -> None:
    pids, ports = zip(*(read_note(note) for note in notes))
    survivors = wait_until_gone(pids, DEADLINE_S)
    assert survivors == [], f"daemons started by workers outlived their attempt: {survivors}"
    assert wait_until_free(list(ports), DEADLINE_S) == [], "a daemon's port is still taken"


def _kill_leftovers(notes) -> None:
    """A failing test must not leave its daemons running (their pids are ours: the notes say so)."""
    for note in notes:
        try:
            pid, _ = read_note(note)
            os.kill(pid, signal.SIGKILL)
        except (OSError, ValueError):
            pass


# ---------------------------------------------------------------------------------- through fit()


def train_spawns_daemons(config):
    rank = minitrain.get_context().get_world_rank()
    spawn_daemons(config["dir"], f"rank{rank}")
    minitrain.report({"rank": rank})


def test_daemons_of_workers_are_gone_when_fit_returns(tmp_path):
    result = TorchTrainer(train_spawns_daemons, train_loop_config={"dir": str(tmp_path)},
                          scaling_config=ScalingConfig(num_workers=2),
                          run_config=RunConfig(name="daemons", storage_path=str(tmp_path / "runs"))).fit()
    notes = sorted(str(p) for p in tmp_path.glob("rank*-*") if not p.name.endswith(".tmp"))
    try:
        assert result.error is None and len(notes) == 4
        assert_gone(notes)
    finally:
        _kill_leftovers(notes)


def train_fails_once_leaving_daemons(config):
    """Attempt 0 starts daemons and fails; attempt 1 notes whether they were still there when it began.

    Each rank marks its own attempt 0 done once its daemons are up, and rank 0 fails only when rank 1's
    are up too: otherwise a rank 1 that starts late (a loaded machine) is stopped halfway through
    starting its daemons, or sees rank 0's mark and skips attempt 0's branch."""
    rank = minitrain.get_context().get_world_rank()
    marks = [os.path.join(config["dir"], f"first_attempt_done_rank{r}") for r in (0, 1)]
    if not os.path.exists(marks[rank]):
        spawn_daemons(config["dir"], f"attempt0-rank{rank}")
        open(marks[rank], "w").close()
        if rank == 0:
            deadline = time.monotonic() + DEADLINE_S
            while not os.path.exists(marks[1]):
                assert time.monotonic() < deadline, "rank 1 never started its daemons"
                time.sleep(0.02)
            raise RuntimeError("attempt 0 fails, its daemons stay behind")
        time.sleep(600)  # stopped by the restart
    notes = sorted(str(p) for p in Path(config["dir"]).glob("attempt0-*") if not p.name.endswith(".tmp"))
    alive = [note for note in notes if psutil.pid_exists(read_note(note)[0])
             and psutil.Process(read_note(note)[0]).status() != psutil.STATUS_ZOMBIE]
    # A daemon's port counts as kept only while the daemon lives: once it is dead its ephemeral port is
    # free by definition, and on a busy machine another process (a parallel test's gRPC server) may
    # have been given the same number since, which says nothing about the daemon.
    taken = [note for note in alive if not port_is_free(read_note(note)[1])]
    with open(os.path.join(config["dir"], f"seen_by_rank{rank}.json"), "w") as seen:
        json.dump({"notes": notes, "alive": alive, "taken": taken}, seen)
    minitrain.report({"rank": rank})


def test_a_failed_attempts_daemons_are_gone_before_the_next_attempt_starts(tmp_path):
    try:
        result = TorchTrainer(
            train_fails_once_leaving_daemons, train_loop_config={"dir": str(tmp_path)},
            scaling_config=ScalingConfig(num_workers=2),
            run_config=RunConfig(name="restart", storage_path=str(tmp_path / "runs"),
                                 failure_config=FailureConfig(max_failures=1, worker_stop_grace_s=1.0))).fit()
        assert result.error is None
        for rank in (0, 1):
            seen = json.loads((tmp_path / f"seen_by_rank{rank}.json").read_text())
            assert len(seen["notes"]) == 4, seen  # both ranks' two daemons of attempt 0
            assert seen["alive"] == [] and seen["taken"] == [], seen
    finally:
        _kill_leftovers(tmp_path.glob("attempt0-*"))


# ---------------------------------------------------------------------------------- the cleanup itself

# A stand-in agent: a subreaper (or not, argv[3]) with a Descendants (cgroups or not, argv[2]) that
# starts one "worker" of attempt 1, which starts two daemons and exits. On "end\n" from stdin it ends
# attempt 1 and prints what it did; on "close\n" it closes.
STAND_IN_AGENT = textwrap.dedent("""
    import json, os, subprocess, sys, threading
    from minitrain import procs
    from minitrain.agent.descendants import Descendants
    directory, use_cgroups, subreaper = sys.argv[1], sys.argv[2] == "cgroups", sys.argv[3] == "subreaper"
    if subreaper:
        procs.become_subreaper()
    lock = threading.Lock()
    descendants = Descendants("standin", lambda: set(), lock, use_cgroups=use_cgroups)
    worker = subprocess.Popen([sys.executable, "-c", "import sys, test_descendants as t; "
                               "t.spawn_daemons(sys.argv[1], sys.argv[2])", directory, sys.argv[4]],
                              stdin=subprocess.PIPE, start_new_session=True)
    descendants.add_worker(worker.pid, 1)
    worker.stdin.close()
    assert worker.wait() == 0
    print(json.dumps({"mechanism": descendants.mechanism,
                      "cgroup": str(descendants.cgroup.root) if descendants.cgroup else None}), flush=True)
    for line in sys.stdin:
        if line.strip() == "end":
            print(json.dumps({"survivors": descendants.end_attempt(1, grace_s=1.0)}), flush=True)
        elif line.strip() == "close":
            print(json.dumps({"survivors": descendants.close(grace_s=1.0)}), flush=True)
""")


class StandIn:
    def __init__(self, directory: Path, name: str, use_cgroups: bool, subreaper: bool = True):
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(Path(__file__).parent)])}
        self.process = subprocess.Popen(
            [sys.executable, "-c", STAND_IN_AGENT, str(directory), "cgroups" if use_cgroups else "tree",
             "subreaper" if subreaper else "plain", name],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=str(directory))
        self.started = self._answer()
        self.notes = [str(directory / f"{name}-setsid"), str(directory / f"{name}-double")]

    def _answer(self) -> dict:
        line = self.process.stdout.readline()
        assert line, f"the stand-in agent died (exit {self.process.wait()})"
        return json.loads(line)

    def ask(self, command: str) -> dict:
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()
        return self._answer()

    def stop(self) -> None:
        _kill_leftovers(self.notes)
        self.process.stdin.close()
        self.process.wait(timeout=DEADLINE_S)


def _alive(notes) -> list[int]:
    return [pid for pid, _ in map(read_note, notes) if wait_until_gone([pid], 0)]


def cgroups_usable() -> bool:
    agent_cgroup, _reason = cgroups.open_agent_cgroup("probe")
    if agent_cgroup is None:
        return False
    agent_cgroup.close()
    return True


@pytest.mark.parametrize("use_cgroups", [False, True], ids=["process-tree", "cgroup"])
def test_two_agents_at_once_end_only_their_own_leftovers(tmp_path, use_cgroups):
    if use_cgroups and not cgroups_usable():
        pytest.skip("cgroup v2 is not usable here: " + cgroups.open_agent_cgroup("probe")[1])
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    first = StandIn(tmp_path, "first", use_cgroups)
    second = StandIn(tmp_path, "second", use_cgroups)
    try:
        assert ("cgroup v2" in first.started["mechanism"]) == use_cgroups, first.started
        assert len(_alive(first.notes + second.notes)) == 4
        assert first.ask("end") == {"survivors": []}
        assert_gone(first.notes)
        # The other agent's daemons and a process nobody of them started are untouched.
        assert len(_alive(second.notes)) == 2 and bystander.poll() is None
        assert second.ask("close") == {"survivors": []}
        assert_gone(second.notes)
        assert bystander.poll() is None
        if use_cgroups:
            assert first.ask("close") == {"survivors": []}
            assert not Path(first.started["cgroup"]).exists() and not Path(second.started["cgroup"]).exists()
    finally:
        first.stop()
        second.stop()
        bystander.kill()
        bystander.wait()


def test_a_cgroup_reaches_daemons_that_escaped_the_process_tree(tmp_path):
    """Without a subreaper the daemons are re-parented to init: out of the process tree, still in the
    attempt's cgroup."""
    if not cgroups_usable():
        pytest.skip("cgroup v2 is not usable here: " + cgroups.open_agent_cgroup("probe")[1])
    agent = StandIn(tmp_path, "escaped", use_cgroups=True, subreaper=False)
    try:
        parents = {psutil.Process(pid).ppid() for pid, _ in map(read_note, agent.notes)}
        assert agent.process.pid not in parents  # escaped the agent's tree
        assert agent.ask("close") == {"survivors": []}
        assert_gone(agent.notes)
        assert not Path(agent.started["cgroup"]).exists()
    finally:
        agent.stop()


def test_a_relaunched_agent_ends_what_its_sigkilled_predecessor_left_and_nothing_of_other_runs(tmp_path):
    """A SIGKILLed agent cleans nothing up. The next agent of the same run on this host kills what is
    left in its predecessor's cgroups and removes them; another run's leftovers are not touched."""
    if not cgroups_usable():
        pytest.skip("cgroup v2 is not usable here: " + cgroups.open_agent_cgroup("probe")[1])
    directory, _ = cgroups.own_cgroup_dir()
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # a pid that names no living agent
    ours = cgroups.AgentCgroup(directory / f"minitrain-stale_run-{gone.pid}-0badcafe")
    theirs = cgroups.AgentCgroup(directory / f"minitrain-other_run-{gone.pid}-0badcafe")
    sleepers = []
    try:
        for stale in (ours, theirs):
            stale.root.mkdir()
            sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
            stale.add(sleeper.pid, 3)
            sleepers.append(sleeper)
        agent_cgroup, reason = cgroups.open_agent_cgroup("stale_run")
        assert agent_cgroup is not None, reason
        agent_cgroup.close()
        assert sleepers[0].wait(timeout=DEADLINE_S) == -signal.SIGKILL
        assert not ours.root.exists()
        assert sleepers[1].poll() is None and theirs.members(3) == [sleepers[1].pid]
    finally:
        for sleeper in sleepers:
            sleeper.kill()
            sleeper.wait()
        for stale in (ours, theirs):
            if stale.root.exists():
                stale.wait_empty(3, DEADLINE_S)
                stale.remove(3)
                stale.close()
