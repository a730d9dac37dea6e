"""Preemption with real processes and real signals (docs/preemption.md): a signal to the driver or to
a node agent gives one agreed round on every rank, its checkpoint commits, fit() raises
PreemptionError and leaves nothing running; twice, during an upload, during a commit, after the last
step, with ranks drifting apart, and with a function that never asks. The driver program is
preemption_training.py."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import psutil
import pytest

from minitrain.procs import wait_until_gone

pytestmark = pytest.mark.e2e
ROOT = pathlib.Path(__file__).resolve().parents[2]
PROGRAM = pathlib.Path(__file__).with_name("preemption_training.py")


def _start(tmp_path, **config) -> subprocess.Popen:
    config = {"steps": 400, "step_s": 0.02, **config}
    return subprocess.Popen([sys.executable, str(PROGRAM), str(tmp_path), json.dumps(config)], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, start_new_session=True)


def _wait_for(path: pathlib.Path, driver: subprocess.Popen, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if driver.poll() is not None:
            raise AssertionError(f"the driver exited before {path.name}:\n{driver.stdout.read()}")
        assert time.monotonic() < deadline, f"{path.name} never appeared"
        time.sleep(0.01)


def _finish(driver: subprocess.Popen, timeout: float = 90.0) -> str:
    try:
        output, _ = driver.communicate(timeout=timeout)
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait()
    return output


def _outcome(output: str) -> dict:
    line = next((l for l in output.splitlines() if l.startswith("DRIVER: preempted ")), None)
    assert line is not None, output
    return json.loads(line[len("DRIVER: preempted "):])


def _agent_pid(driver: subprocess.Popen, node_id: str = "") -> int:
    for child in psutil.Process(driver.pid).children(recursive=True):
        command = " ".join(child.cmdline())
        if "minitrain.agent" in command and f"--node-id {node_id}" in command:
            return child.pid
    raise AssertionError(f"no agent {node_id} among the driver's children")


def _seen(tmp_path) -> dict[int, dict]:
    return {int(p.stem[len("seen_rank"):]): json.loads(p.read_text()) for p in tmp_path.glob("seen_rank*.json")}


def _nothing_left(tmp_path) -> None:
    pids = sorted(int(p.name.split("_")[1]) for p in tmp_path.glob("pid_*"))
    assert wait_until_gone(pids, timeout=10) == []


def _index(tmp_path) -> dict:
    return json.loads((tmp_path / "results" / "p" / "checkpoint_manager_snapshot.json").read_text())


def _assert_committed(tmp_path, dir_name: str, ranks=(0, 1)) -> int:
    """`dir_name` is the index's latest checkpoint, complete (every rank's file); returns its step."""
    index = _index(tmp_path)
    assert index["latest_checkpoint_result"]["checkpoint_dir_name"] == dir_name
    directory = tmp_path / "results" / "p" / dir_name
    steps = {json.loads((directory / f"rank{r}.json").read_text())["step"] for r in ranks}
    assert len(steps) == 1, steps
    return steps.pop()


def _assert_agreed(tmp_path, outcome: dict, ranks=(0, 1)) -> dict:
    seen = _seen(tmp_path)
    assert sorted(seen) == list(ranks), seen
    assert {s["reports"] for s in seen.values()} == {outcome["round"]}  # same report count on every rank
    assert {s["round"] for s in seen.values()} == {outcome["round"]}
    return seen


def test_a_signal_to_the_driver_agrees_commits_stops_and_the_run_resumes_losing_nothing(tmp_path):
    driver = _start(tmp_path)
    _wait_for(tmp_path / "progress", driver)
    driver.send_signal(signal.SIGUSR2)
    output = _finish(driver)
    assert driver.returncode == 143, output
    outcome = _outcome(output)
    assert outcome["drain_timed_out"] is False and outcome["resumable"] is True and outcome["signal"] == "SIGUSR2"
    seen = _assert_agreed(tmp_path, outcome)
    step = _assert_committed(tmp_path, outcome["checkpoint_dir"])
    assert {s["step"] for s in seen.values()} == {step}
    assert outcome["nodes"] == {"localhost": [0, 1]}  # the driver's signal preempts every node
    assert "preempted" in output and "Training was preempted (SIGUSR2 on the driver)" in output
    _nothing_left(tmp_path)
    assert _index(tmp_path)["preemptions"] == 1

    for path in [*tmp_path.glob("seen_rank*.json"), tmp_path / "progress"]:
        path.unlink()
    again = _start(tmp_path, steps=step + 4)
    output = _finish(again)
    assert again.returncode == 0, output
    finished = json.loads(output.split("DRIVER: finished ", 1)[1].splitlines()[0])
    assert finished["start"] == step + 1  # nothing done before the signal is done again
    assert finished["metrics"] == {"step": step + 3}


def test_a_signal_to_an_agent_with_ranks_drifting_apart_gives_one_round(tmp_path):
    # rank 1 is 6x slower and nothing synchronises the ranks: rank 0 races ahead.
    driver = _start(tmp_path, step_s=0.01, slow_rank=1, slow=6, signal_after=15)
    _wait_for(tmp_path / "progress", driver)
    os.kill(_agent_pid(driver), signal.SIGUSR2)
    output = _finish(driver)
    assert driver.returncode == 143, output
    outcome = _outcome(output)
    assert "SIGUSR2 on node localhost" in output and outcome["drain_timed_out"] is False
    seen = _assert_agreed(tmp_path, outcome)
    assert _assert_committed(tmp_path, outcome["checkpoint_dir"]) == seen[0]["step"]
    _nothing_left(tmp_path)


def test_a_signal_to_every_process_of_the_node_still_gives_the_agreed_round(tmp_path):
    """Slurm's --signal (and scancel --signal) reaches every process of a job step: the agent and its
    workers get SIGUSR2 at once. The workers must not die of it (its default action), or the round the
    agent's report agrees would be lost."""
    driver = _start(tmp_path)
    _wait_for(tmp_path / "progress", driver)
    agent = psutil.Process(_agent_pid(driver))
    workers = agent.children(recursive=True)
    assert workers, "no worker under the agent"
    for process in [agent, *workers]:
        process.send_signal(signal.SIGUSR2)
    output = _finish(driver)
    assert driver.returncode == 143, output
    outcome = _outcome(output)
    assert "SIGUSR2 on node localhost" in output and outcome["drain_timed_out"] is False
    seen = _assert_agreed(tmp_path, outcome)
    assert _assert_committed(tmp_path, outcome["checkpoint_dir"]) == seen[0]["step"]
    _nothing_left(tmp_path)


def test_a_signal_to_one_of_two_agents_names_its_node_and_every_rank_agrees(tmp_path):
    driver = _start(tmp_path, hosts="localhost:1,127.0.0.1:1")
    _wait_for(tmp_path / "progress", driver)
    os.kill(_agent_pid(driver, "127.0.0.1"), signal.SIGUSR2)
    output = _finish(driver)
    assert driver.returncode == 143, output
    outcome = _outcome(output)
    assert outcome["nodes"] == {"127.0.0.1": [1]} and "SIGUSR2 on node 127.0.0.1" in output
    seen = _assert_agreed(tmp_path, outcome)
    assert all(s["nodes"] == ["127.0.0.1"] and s["ranks"] == [1] for s in seen.values())
    _assert_committed(tmp_path, outcome["checkpoint_dir"])
    _nothing_left(tmp_path)


def test_a_second_signal_during_the_agreed_upload_stops_at_once_and_the_last_commit_stands(tmp_path):
    # Every file put takes 2 s: the agreed checkpoint's upload is under way when the second signal comes.
    # Without a memory tier the rank uploads itself (what this test stops); through the tier the agent
    # writes it after the round is committed, and a run that ends waits for that (the memory tier's tests).
    driver = _start(tmp_path, every=2, slow_upload_s=2.0, signal_after=1, step_s=0.05, memory_tier_bytes=0)
    _wait_for(tmp_path / "progress", driver)
    driver.send_signal(signal.SIGUSR2)
    _wait_for(tmp_path / "seen_rank0.json", driver)  # rank 0 is uploading the agreed checkpoint
    driver.send_signal(signal.SIGUSR2)
    output = _finish(driver)
    assert driver.returncode == 143, output
    outcome = _outcome(output)
    assert outcome["drain_timed_out"] is True and "a second signal stopped the run at once" in output
    index = _index(tmp_path)
    latest = index["latest_checkpoint_result"]
    if latest is not None:  # whatever was committed before is whole
        _assert_committed(tmp_path, latest["checkpoint_dir_name"])
    assert not (tmp_path / "results" / "p" / ".staging").exists()
    _nothing_left(tmp_path)


def test_a_signal_during_a_periodic_upload_loses_nothing(tmp_path):
    driver = _start(tmp_path, every=3, slow_upload_s=0.5, step_s=0.02, signal_after=1)
    _wait_for(tmp_path / "uploading", driver)  # rank 0 started uploading checkpoint of step 3
    driver.send_signal(signal.SIGUSR2)
    output = _finish(driver)
    assert driver.returncode == 143, output
    outcome = _outcome(output)
    assert outcome["drain_timed_out"] is False
    _assert_agreed(tmp_path, outcome)
    step = _assert_committed(tmp_path, outcome["checkpoint_dir"])
    committed = {r["checkpoint_dir_name"] for r in _index(tmp_path)["checkpoint_results"]}
    assert "checkpoint_000003" in committed  # the upload in flight (report 3, of step 3) committed too
    assert step >= 3
    _nothing_left(tmp_path)


def test_a_signal_during_a_commit_is_acted_on_after_it(tmp_path):
    # The driver signals itself as the first periodic checkpoint's commit begins.
    driver = _start(tmp_path, every=3, signal_in_commit=True, signal_after=10**6)
    output = _finish(driver)
    assert driver.returncode == 143, output
    assert (tmp_path / "signalled_in_commit").exists()
    outcome = _outcome(output)
    assert outcome["drain_timed_out"] is False
    _assert_agreed(tmp_path, outcome)
    _assert_committed(tmp_path, outcome["checkpoint_dir"])
    committed = {r["checkpoint_dir_name"] for r in _index(tmp_path)["checkpoint_results"]}
    first = sorted(p.name[len("committing_"):] for p in tmp_path.glob("committing_*"))[0]
    assert first in committed  # the commit the signal interrupted completed
    _nothing_left(tmp_path)


def test_a_signal_after_the_last_step_finishes_normally(tmp_path):
    driver = _start(tmp_path, steps=5, step_s=0.01)
    _wait_for(tmp_path / "returned", driver)
    driver.send_signal(signal.SIGUSR2)
    output = _finish(driver)
    assert driver.returncode == 0, output
    assert "DRIVER: finished" in output and json.loads(
        output.split("DRIVER: finished ", 1)[1].splitlines()[0])["metrics"] == {"step": 4}
    _nothing_left(tmp_path)


def test_a_function_that_never_asks_stops_cleanly_at_the_last_commit(tmp_path):
    driver = _start(tmp_path, ask=False, every=4, signal_after=6)
    _wait_for(tmp_path / "progress", driver)
    driver.send_signal(signal.SIGUSR2)
    output = _finish(driver)
    assert driver.returncode == 143, output
    outcome = _outcome(output)
    assert outcome["drain_timed_out"] is False and not _seen(tmp_path)
    _assert_committed(tmp_path, outcome["checkpoint_dir"])  # the last periodic checkpoint, whole
    _nothing_left(tmp_path)


def test_sigterm_to_the_driver_is_a_preemption_by_default(tmp_path):
    driver = _start(tmp_path)
    _wait_for(tmp_path / "progress", driver)
    driver.send_signal(signal.SIGTERM)
    output = _finish(driver)
    assert driver.returncode == 143, output
    outcome = _outcome(output)
    assert outcome["signal"] == "SIGTERM" and outcome["drain_timed_out"] is False
    _assert_agreed(tmp_path, outcome)
    _nothing_left(tmp_path)


def test_the_launch_command_exits_143_when_preempted_and_1_past_the_budget(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(
        "import time, minitrain\n"
        "def train(config):\n"
        "    open(config['marker'], 'w').close()\n"
        "    for step in range(100000):\n"
        "        time.sleep(0.02)\n"
        "        if minitrain.get_preemption_info() is not None:\n"
        "            minitrain.report({'step': step})\n"
        "        else:\n"
        "            minitrain.report({'step': step})\n")
    marker = tmp_path / "started"
    command = [sys.executable, "-m", "minitrain.launch", "--num-workers", "1", "--name", "job",
               "--storage-path", str(tmp_path / "results"), f"{script}:train",
               "--config", json.dumps({"marker": str(marker)})]
    launch = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT)}, start_new_session=True)
    _wait_for(marker, launch)
    launch.send_signal(signal.SIGUSR2)
    output = _finish(launch)
    assert launch.returncode == 143 and "minitrain.launch: preempted" in output, output


def test_past_max_preemption_failures_the_error_is_not_resumable(tmp_path):
    driver = _start(tmp_path, max_preemption_failures=0)
    _wait_for(tmp_path / "progress", driver)
    driver.send_signal(signal.SIGUSR2)
    output = _finish(driver)
    outcome = _outcome(output)
    assert outcome["resumable"] is False and "more than FailureConfig.max_preemption_failures=0" in output
    assert _index(tmp_path)["preemptions"] == 1
    _nothing_left(tmp_path)
