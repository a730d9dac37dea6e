"""Fault tolerance end to end: Ctrl-C, a killed driver, hangs, lost agents, detection latency.

Drivers that must be interrupted or killed run as separate processes (scripts written into
tmp_path); every test proves afterwards that no process of the run survived.
"""

from __future__ import annotations

import json
import logging
import os
import pathlib
import re
import select
import signal
import socket
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

import minitrain
from minitrain import FailureConfig, RunConfig, ScalingConfig
from minitrain.procs import wait_until_gone
from minitrain.torch import TorchTrainer

pytestmark = pytest.mark.e2e
ROOT = pathlib.Path(__file__).resolve().parents[2]

# A driver whose training writes pids and progress notes, checkpoints at step 0, then trains "forever".
DRIVER = textwrap.dedent("""
    import json, os, signal, sys, tempfile, time
    import minitrain
    from minitrain import FailureConfig, RunConfig, ScalingConfig
    from minitrain.torch import TorchTrainer

    OUT = sys.argv[1]

    def train(config):
        import torch.distributed as dist
        rank = minitrain.get_context().get_world_rank()
        if config["ignore_sigterm"]:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        open(os.path.join(OUT, f"pid_{os.getpid()}"), "w").close()
        open(os.path.join(OUT, f"pid_{os.getppid()}"), "w").close()
        resumed = minitrain.get_checkpoint() is not None
        with tempfile.TemporaryDirectory() as tmp:
            open(os.path.join(tmp, f"rank{rank}.txt"), "w").close()
            minitrain.report({"step": 0, "resumed": resumed}, checkpoint=minitrain.Checkpoint.from_directory(tmp))
        dist.barrier()
        if rank == 0:
            with open(os.path.join(OUT, "progress.json"), "w") as handle:
                json.dump({"resumed": resumed}, handle)
        if config["finish"]:
            return
        while True:
            time.sleep(0.05)

    if __name__ == "__main__":
        config = json.loads(sys.argv[2])
        try:
            TorchTrainer(train, train_loop_config=config, scaling_config=ScalingConfig(num_workers=2),
                         run_config=RunConfig(name="ft", storage_path=os.path.join(OUT, "results"),
                                              failure_config=FailureConfig(
                                                  worker_stop_grace_s=config["grace"],
                                                  preemption_signals=tuple(config["preemption_signals"])))).fit()
        except KeyboardInterrupt:
            print("DRIVER: KeyboardInterrupt", flush=True)
            sys.exit(130)
        print("DRIVER: finished", flush=True)
""")


def _start_driver(tmp_path, **config):
    config = {"ignore_sigterm": False, "finish": False, "grace": 5.0, "preemption_signals": ["SIGUSR2", "SIGTERM"],
              **config}
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    return subprocess.Popen([sys.executable, str(script), str(tmp_path), json.dumps(config)], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, start_new_session=True)


def _wait_for(path: pathlib.Path, driver: subprocess.Popen, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if driver.poll() is not None:
            raise AssertionError(f"the driver exited early:\n{driver.stdout.read()}")
        assert time.monotonic() < deadline, f"{path.name} never appeared"
        time.sleep(0.02)


def _run_pids(tmp_path) -> list[int]:
    return sorted({int(p.name.split("_")[1]) for p in tmp_path.glob("pid_*")})


def _kill_tree(driver: subprocess.Popen) -> None:
    if driver.poll() is None:
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait()


def test_ctrl_c_stops_gracefully_keeps_the_index_and_the_run_resumes(tmp_path):
    driver = _start_driver(tmp_path)
    try:
        _wait_for(tmp_path / "progress.json", driver)
        driver.send_signal(signal.SIGINT)
        output, _ = driver.communicate(timeout=60)
    finally:
        _kill_tree(driver)
    assert driver.returncode == 130 and "DRIVER: KeyboardInterrupt" in output, output
    assert wait_until_gone(_run_pids(tmp_path), timeout=10) == []
    index = json.loads((tmp_path / "results" / "ft" / "checkpoint_manager_snapshot.json").read_text())
    assert index["latest_checkpoint_result"]["checkpoint_dir_name"] == "checkpoint_000000"

    (tmp_path / "progress.json").unlink()
    again = _start_driver(tmp_path, finish=True)
    try:
        output, _ = again.communicate(timeout=120)
    finally:
        _kill_tree(again)
    assert "DRIVER: finished" in output, output
    assert json.loads((tmp_path / "progress.json").read_text()) == {"resumed": True}


def test_second_ctrl_c_kills_at_once(tmp_path):
    # The workers ignore SIGTERM and the grace is 60 s: only the second Ctrl-C ends this quickly.
    driver = _start_driver(tmp_path, ignore_sigterm=True, grace=60.0)
    try:
        _wait_for(tmp_path / "progress.json", driver)
        driver.send_signal(signal.SIGINT)
        seen = _read_until(driver, "press Ctrl-C again", timeout=30)  # the graceful stop is under way
        driver.send_signal(signal.SIGINT)
        output, _ = driver.communicate(timeout=30)  # far less than the 60 s grace
        output = seen + output
    finally:
        _kill_tree(driver)
    assert driver.returncode == 130, output
    assert wait_until_gone(_run_pids(tmp_path), timeout=10) == []


def _read_until(driver: subprocess.Popen, text: str, timeout: float) -> str:
    """The driver's output up to `text` (raw reads: nothing hides in a reader's buffer)."""
    deadline = time.monotonic() + timeout
    seen = b""
    fd = driver.stdout.fileno()
    while text.encode() not in seen:
        remaining = deadline - time.monotonic()
        ready, _, _ = select.select([fd], [], [], max(remaining, 0))
        chunk = os.read(fd, 65536) if ready else b""
        if not chunk:
            raise AssertionError(f"{text!r} never appeared:\n{seen.decode(errors='replace')}")
        seen += chunk
    return seen.decode(errors="replace")


def test_sigkill_of_the_driver_leaves_no_process(tmp_path):
    driver = _start_driver(tmp_path)
    try:
        _wait_for(tmp_path / "progress.json", driver)
        pids = _run_pids(tmp_path)
        os.kill(driver.pid, signal.SIGKILL)  # the driver only: agents and workers are in their own sessions
        driver.wait()
        # Agents see their lease break at once (the connection closes) and kill their workers.
        assert wait_until_gone(pids, timeout=15) == [], "agent or worker outlived a SIGKILLed driver"
    finally:
        _kill_tree(driver)


# ---------------------------------------------------------------------------------- in-process runs


class _FailureClock(logging.Handler):
    """Records when the controller logged that it learned of a failure or a lost node."""

    def __init__(self):
        super().__init__()
        self.times: list[tuple[float, str]] = []

    def emit(self, record):
        message = record.getMessage()
        if "stopping every rank of the attempt" in message or "lost:" in message:
            self.times.append((time.time(), message))


@pytest.fixture
def failure_clock():
    handler = _FailureClock()
    logger = logging.getLogger("minitrain")
    logger.addHandler(handler)
    yield handler
    logger.removeHandler(handler)


def train_dies_at_a_known_time(config):
    import torch.distributed as dist

    dist.barrier()
    if minitrain.get_context().get_world_rank() == 1:
        with open(config["stamp"], "w") as handle:
            handle.write(repr(time.time()))
        if config["how"] == "agent":
            os.kill(os.getppid(), signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(600)


@pytest.mark.parametrize("how", ["worker", "agent"])
def test_detection_latency_of_a_dead_worker_and_a_dead_agent(tmp_path, failure_clock, how):
    stamp = tmp_path / "stamp"
    with pytest.raises(minitrain.WorkerGroupError) as caught:
        TorchTrainer(train_dies_at_a_known_time, train_loop_config={"stamp": str(stamp), "how": how},
                     scaling_config=ScalingConfig(num_workers=2),
                     run_config=RunConfig(name="detect", storage_path=str(tmp_path))).fit()
    killed_at = float(stamp.read_text())
    seen_at, message = failure_clock.times[0]
    latency = seen_at - killed_at
    print(f"{how} death detected after {latency * 1000:.0f} ms: {message}")
    # Bounds far above the measured figures (see `python -m bench --only restart,detect`) but far below what a
    # collective timeout would take: they prove detection does not wait on gloo or TCP timeouts.
    assert latency < (2.0 if how == "worker" else 6.0)
    expected = minitrain.WorkerProcessError if how == "worker" else minitrain.NodeLostError
    assert any(isinstance(e, expected) for e in caught.value.worker_failures.values())


def train_one_rank_stops(config):
    import torch
    import torch.distributed as dist

    for step in range(100):
        dist.all_reduce(torch.ones(1))
        minitrain.report({"step": step})
        if step == 2 and minitrain.get_context().get_world_rank() == 1:
            os.kill(os.getpid(), signal.SIGSTOP)  # frozen: no report, no exit
        time.sleep(0.05)


@pytest.mark.parametrize("failure_config, rule", [
    # A fixed deadline's wording is checked in process (tests/unit/test_controller.py): the soak tier's here.
    pytest.param(FailureConfig(worker_hang_timeout_s=2), "worker_hang_timeout_s=2", marks=pytest.mark.soak),
    # The default ("auto"), its floor lowered from 600 s so that the test is quick: the deadline comes
    # from the rank's own pace, known after its first reports.
    (FailureConfig(worker_hang_floor_s=2), "worker_hang_timeout_s='auto'"),
], ids=["fixed", "auto"])
def test_a_hung_rank_is_named_and_every_stack_is_dumped(tmp_path, failure_config, rule):
    with pytest.raises(minitrain.WorkerGroupError) as caught:
        TorchTrainer(train_one_rank_stops, scaling_config=ScalingConfig(num_workers=2),
                     run_config=RunConfig(name="hang", storage_path=str(tmp_path),
                                          failure_config=failure_config)).fit()
    text = str(caught.value)
    assert "Root cause: rank 1 " in text and "WorkerHangError" in text
    hung = caught.value.worker_failures[1]
    assert isinstance(hung, minitrain.WorkerHangError) and "did not answer" in hung.stacks  # it is stopped
    # The culprit's host, its last completed report, the rule that fired, and who merely waits for it.
    # (Its round-2 report may still sit in its send queue when SIGSTOP freezes it: metrics-only
    # reports do not wait for the coordinator.)
    message = str(hung)
    assert re.search(rf"rank 1 on {re.escape(socket.gethostname())} \(pid \d+\)", message) and rule in message
    assert re.search(r"its last report was round [12];", message)
    assert "rank(s) 0 wait for it in a collective" in message
    # Every rank's stacks were dumped: rank 0 sits in the all_reduce that waits for rank 1.
    log = (tmp_path / "hang" / "logs" / "attempt_0" / "rank_0.log").read_text()
    assert "every thread's stack of rank 0" in log and "all_reduce" in log
    leftovers = [p for p in psutil.Process().children(recursive=True) if "minitrain" in " ".join(p.cmdline())]
    assert not leftovers


def train_kills_its_agent_once(config):
    import torch.distributed as dist

    dist.barrier()
    if minitrain.get_context().get_world_rank() == 1 and not os.path.exists(config["marker"]):
        open(config["marker"], "w").close()
        os.kill(os.getppid(), signal.SIGKILL)
        time.sleep(600)
    minitrain.report({"done": True})


def test_a_killed_agent_is_replaced_and_training_finishes(tmp_path):
    result = TorchTrainer(train_kills_its_agent_once, train_loop_config={"marker": str(tmp_path / "m")},
                          scaling_config=ScalingConfig(num_workers=2),
                          run_config=RunConfig(name="agent", storage_path=str(tmp_path),
                                               failure_config=FailureConfig(max_failures=1))).fit()
    assert result.metrics == {"done": True}
    leftovers = [p for p in psutil.Process().children(recursive=True) if "minitrain" in " ".join(p.cmdline())]
    assert not leftovers


# ---------------------------------------------------------------------------------- restarts from the fork server


def train_fails_once_then_reports_how_it_was_started(config):
    import numpy
    import torch
    import torch.distributed as dist

    rank = minitrain.get_context().get_world_rank()
    agent = psutil.Process(os.getppid())
    if not os.path.exists(config["marker"]):
        if rank == 1:
            # Fail only once the agent runs its fork server, so that the restart can use it.
            deadline = time.monotonic() + 120
            while not any("--fork-server" in c.cmdline() for c in agent.children()):
                assert time.monotonic() < deadline, "the agent started no fork server"
                time.sleep(0.05)
            open(config["marker"], "w").close()
            os._exit(3)
        dist.barrier()  # broken by rank 1's exit
    model = minitrain.torch.prepare_model(torch.nn.Linear(4, 1))
    model(torch.ones(8, 4)).sum().backward()  # DDP's all-reduce works in a forked worker
    seen = {"forked": b"--fork-server" in open("/proc/self/cmdline", "rb").read().split(b"\0"),
            "parent_is_agent": agent.pid == os.getppid() and "minitrain.agent" in " ".join(agent.cmdline()),
            "own_session": os.getsid(0) == os.getpid(), "numpy_draw": int(numpy.random.randint(1 << 30))}
    with open(os.path.join(config["dir"], f"rank{rank}.json"), "w") as handle:
        json.dump(seen, handle)
    minitrain.report({"done": True})


def test_a_restart_forks_its_workers_from_the_fork_server(tmp_path, caplog):
    before = set(procs_below_me())
    began = time.time()
    with caplog.at_level(logging.INFO, logger="minitrain"):
        result = TorchTrainer(train_fails_once_then_reports_how_it_was_started,
                              train_loop_config={"marker": str(tmp_path / "failed"), "dir": str(tmp_path)},
                              scaling_config=ScalingConfig(num_workers=2),
                              run_config=RunConfig(name="fork_server", storage_path=str(tmp_path),
                                                   failure_config=FailureConfig(max_failures=1))).fit()
    fit_s = time.time() - began
    assert result.metrics == {"done": True}
    _check_the_goodput_of_a_restart(result, fit_s, tmp_path / "fork_server", caplog.text)
    seen = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    for rank_seen in seen:
        assert rank_seen["forked"] and rank_seen["parent_is_agent"] and rank_seen["own_session"], seen
    assert seen[0]["numpy_draw"] != seen[1]["numpy_draw"]  # each fork has its own random state
    assert set(procs_below_me()) == before  # agent, fork server and workers are all gone


def _check_the_goodput_of_a_restart(result, fit_s: float, run_dir: pathlib.Path, log: str) -> None:
    """The goodput ledger of a 2-rank run whose attempt 0 failed in its training function before any
    report: every worker-second of both attempts has a cause, the failed attempt's time is start-up and
    stopping (no compute), the restart is counted, and the run directory gives the same ledger."""
    from minitrain.monitoring.monitor import RunMonitor
    from minitrain.storage.filesystem import Storage

    goodput = result.goodput
    assert goodput.worker_seconds == pytest.approx(goodput.wall_s * 2, rel=0.01)  # wall x ranks
    assert 0 < goodput.wall_s <= fit_s
    first, second = goodput.by_attempt
    assert (first["attempt"], first["world_size"], second["attempt"], second["world_size"]) == (0, 2, 1, 2)
    assert first["seconds"]["startup"] > 0 and first["seconds"]["dist_init"] > 0
    assert first["seconds"]["stopping"] > 0 and first["seconds"]["restarting"] == 0
    assert first["seconds"]["compute"] == first["seconds"]["lost_work"] == 0  # it never reported
    # The next attempt starts as soon as the failed one's processes are gone: its restart is short.
    assert second["seconds"]["restarting"] >= 0 and second["seconds"]["startup"] > 0
    assert sorted(goodput.by_rank) == [0, 1]
    assert re.search(r"goodput \d+\.\d%: .*stopping \d+\.\d%", log), log
    rebuilt = RunMonitor.from_run_dir(Storage.for_run(str(run_dir.parent), run_dir.name)).goodput()
    for cause, seconds in goodput.total.items():
        assert rebuilt["total"][cause] == pytest.approx(seconds, rel=0.01, abs=0.01), cause


def procs_below_me() -> list[int]:
    return [p.pid for p in psutil.Process().children(recursive=True) if "minitrain" in " ".join(p.cmdline())]


# ---------------------------------------------------------------------------------- out-of-memory kill

OOM_DRIVER = textwrap.dedent("""
    import sys
    import minitrain
    from minitrain import RunConfig, ScalingConfig
    from minitrain.torch import TorchTrainer

    def train():
        if minitrain.get_context().get_world_rank() == 1:
            hog = []
            while True:  # the kernel's OOM killer ends this (SIGKILL) once the cgroup's limit is reached
                hog.append(bytearray(64 << 20))
                for offset in range(0, 64 << 20, 4096):
                    hog[-1][offset] = 1

    if __name__ == "__main__":
        try:
            TorchTrainer(train, scaling_config=ScalingConfig(num_workers=2),
                         run_config=RunConfig(name="oom", storage_path=sys.argv[1])).fit()
        except minitrain.WorkerGroupError as exc:
            print(exc)
""")


def _own_memory_cgroup_v1() -> pathlib.Path | None:
    """This process's cgroup-v1 memory directory when it can hold a child cgroup (root), else None."""
    for line in pathlib.Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            directory = pathlib.Path("/sys/fs/cgroup/memory") / path.lstrip("/")
            if (directory / "memory.limit_in_bytes").exists() and os.access(directory, os.W_OK):
                return directory
    return None


def test_a_worker_killed_by_the_oom_killer_is_named_so(tmp_path):
    """A real kernel OOM kill: the whole run (driver, agent, workers) is placed in a memory cgroup with
    a 1.5 GiB limit and rank 1 allocates until the OOM killer SIGKILLs it."""
    parent = _own_memory_cgroup_v1()
    if parent is None:
        pytest.skip("needs a writable cgroup-v1 memory hierarchy (root) to give the run a memory limit")
    cgroup = parent / f"minitrain-oom-test-{os.getpid()}"
    cgroup.mkdir()
    try:
        (cgroup / "memory.limit_in_bytes").write_text(str(3 << 29))
        script = tmp_path / "oom_driver.py"
        script.write_text(OOM_DRIVER)
        enter = f'echo $$ > {cgroup}/cgroup.procs && exec "$0" "$@"'
        done = subprocess.run(["sh", "-c", enter, sys.executable, str(script), str(tmp_path / "results")],
                              capture_output=True, text=True, timeout=240, cwd=ROOT)
        out = done.stdout + done.stderr
        root_line = next((line for line in out.splitlines() if line.startswith("Root cause: ")), out)
        assert "rank 1" in root_line and "SIGKILL" in root_line and "out-of-memory" in root_line, out
    finally:
        deadline = time.monotonic() + 30
        while (cgroup / "cgroup.procs").read_text().strip() and time.monotonic() < deadline:
            time.sleep(0.05)  # the run's processes are exiting; the directory can go once they are gone
        cgroup.rmdir()


# A training function whose rank 0 fails the same way at every start, noting when.
FAILS_AT_EVERY_START = textwrap.dedent("""
    import os, time
    import minitrain

    def train(config):
        if minitrain.get_context().get_world_rank() == 0:
            with open(os.path.join(config["out"], "failures"), "a") as handle:
                handle.write(f"{time.time()}\\n")
            raise RuntimeError("CUDA error: an illegal memory access")
""")


def test_a_rank_failing_at_every_start_stops_the_run_after_three_attempts_with_exit_93(tmp_path):
    """`max_failures=-1` restarts forever; the default `max_attempts_without_progress=3` stops the run at the
    third attempt in a row without a committed round, within 5 s of its failure, with `NoProgressError` and
    the CLI's exit code 93 (not to be restarted by a scheduler)."""
    (tmp_path / "fails.py").write_text(FAILS_AT_EVERY_START)
    command = [sys.executable, "-m", "minitrain.launch", "--num-workers", "2", "--max-failures", "-1",
               f"{tmp_path / 'fails.py'}:train", "--config", json.dumps({"out": str(tmp_path)}),
               "--name", "stalled", "--storage-path", str(tmp_path / "runs")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=90, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    ended = time.time()
    failures = [float(line) for line in (tmp_path / "failures").read_text().split()]
    assert done.returncode == 93, done.stderr[-3000:]
    assert len(failures) == 3, f"{len(failures)} attempts ran"
    assert ended - failures[-1] < 5.0, f"the run stopped {ended - failures[-1]:.1f} s after the last failure"
    assert re.search(r"Training stopped: no progress in the last 3 attempts: each failed during training with "
                     r"RuntimeError: CUDA error: an illegal memory access \(rank 0 on \S+\); no round committed yet",
                     done.stderr), done.stderr[-3000:]
    assert re.search(r"3 attempts failed on host \S+: 3x rank 0 during training: RuntimeError: CUDA error",
                     done.stderr)
