"""The srun side of the launcher and the pre-flight, run against a recording `srun` first on PATH, which
writes down its argv, environment and stdin and then runs the step's command here (what slurmstepd would
do on the node). The step's command line itself: tests/unit/test_slurm_launch.py; the real Slurm:
tests/e2e/test_slurm_allocation.py."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

import minitrain
from minitrain.hosts.cluster import ClusterConfig, HostSpec
from minitrain.hosts.launcher import ClusterLauncher
from minitrain.hosts.ssh import PreflightError, preflight

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "t0ken-" + "x" * 40
CLUSTER = ClusterConfig(hosts=(HostSpec("n01", 2, local=False), HostSpec("n02", 2, local=False)),
                        launcher="srun", slurm_job_id="77")

# Records argv (one JSON list per call), environ and stdin; then runs what follows `--` (or fails).
FAKE_SRUN = """#!{python}
import json, os, sys
record = os.environ["FAKE_SRUN_RECORD"]
with open(record, "a") as out:
    out.write(json.dumps({{"argv": sys.argv, "env": dict(os.environ)}}) + "\\n")
if os.environ.get("FAKE_SRUN_FAIL"):
    sys.stderr.write("srun: error: Unable to create step for job 77: Invalid node name specified\\n")
    sys.exit(1)
if os.environ.get("FAKE_SRUN_STDIN"):
    with open(os.environ["FAKE_SRUN_STDIN"], "ab") as out:
        out.write(sys.stdin.buffer.read())
    sys.exit(0)
command = sys.argv[sys.argv.index("--") + 1:]
chdir = [a.split("=", 1)[1] for a in sys.argv if a.startswith("--chdir=")]
os.chdir(chdir[0])
os.execvp(command[0], command)
"""


@pytest.fixture
def fake_srun(tmp_path, monkeypatch):
    """A recording srun first on PATH; returns a function giving the recorded calls."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    srun = bin_dir / "srun"
    srun.write_text(FAKE_SRUN.format(python=sys.executable))
    srun.chmod(srun.stat().st_mode | stat.S_IXUSR)
    record = tmp_path / "srun_calls.jsonl"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SRUN_RECORD", str(record))

    def calls() -> list[dict]:
        return [json.loads(line) for line in record.read_text().splitlines()] if record.exists() else []
    return calls


# ---------------------------------------------------------------------------------- the launcher


def test_agents_start_as_steps_and_the_token_travels_only_on_stdin(fake_srun, tmp_path, monkeypatch):
    stdin_file = tmp_path / "stdin"
    monkeypatch.setenv("FAKE_SRUN_STDIN", str(stdin_file))
    monkeypatch.setenv("SLURM_GPUS_PER_TASK", "1")  # the user's own steps' shape: not the agent's
    launcher = ClusterLauncher(CLUSTER, pythonpath=("/shared/code",))
    # The coordinator's local socket is for an agent on its own machine: remote steps dial gRPC.
    agents = launcher.start(["n01", "n02"], lambda node: f"10.0.0.1:5000", TOKEN, "run1", tls_cert=b"CERT",
                            local_stream="local:/tmp/minitrain-coordinator-x/agents.sock")
    try:
        for agent in agents.agents:
            agent.process.wait(timeout=30)
    finally:
        agents.stop(timeout_s=5)
    calls = fake_srun()
    assert len(calls) == 2
    # The two steps start concurrently: their records come in either order.
    calls.sort(key=lambda call: next(a for a in call["argv"] if a.startswith("--nodelist=")))
    for call, node in zip(calls, ["n01", "n02"]):
        argv = call["argv"]
        assert f"--nodelist={node}" in argv and "--jobid=77" in argv and "--overlap" in argv
        assert argv[argv.index("--") + 1:] == [sys.executable, "-m", "minitrain.agent", "--coordinator",
                                               "10.0.0.1:5000", "--node-id", node, "--run-id", "run1"]
        assert TOKEN not in json.dumps(call)  # neither on argv nor in the environment the step inherits
        assert call["env"]["PYTHONPATH"].split(os.pathsep)[0] == "/shared/code"
        assert "SLURM_GPUS_PER_TASK" not in call["env"]
    assert stdin_file.read_bytes() == (TOKEN.encode() + b"\nCERT") * 2


def test_a_step_that_ends_is_a_dead_agent_and_can_be_relaunched(fake_srun, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_SRUN_FAIL", "1")
    agents = ClusterLauncher(CLUSTER).start(["n01"], lambda node: "10.0.0.1:5000", TOKEN, "run1")
    try:
        agents.agents[0].process.wait(timeout=30)
        why = agents.dead_agents()["n01"]
        assert why.startswith("the agent process exited with code 1")
        assert "Invalid node name specified" in why  # srun's own error, relayed
        assert agents.relaunch("n01")
        agents.agents[-1].process.wait(timeout=30)
        assert len(fake_srun()) == 2
    finally:
        agents.stop(timeout_s=5)


# ---------------------------------------------------------------------------------- the pre-flight


def test_preflight_runs_as_steps(fake_srun):
    preflight(CLUSTER, expected_version=minitrain.__version__, pythonpath=(str(ROOT),))
    calls = fake_srun()
    assert sorted(next(a for a in c["argv"] if a.startswith("--nodelist=")) for c in calls) == \
        ["--nodelist=n01", "--nodelist=n02"]
    assert all("--job-name=minitrain-preflight" in c["argv"] for c in calls)


def test_preflight_names_the_node_and_srun_s_error(fake_srun, monkeypatch):
    monkeypatch.setenv("FAKE_SRUN_FAIL", "1")
    with pytest.raises(PreflightError) as caught:
        preflight(CLUSTER, expected_version=minitrain.__version__)
    assert caught.value.failures == {
        node: ["srun failed: Unable to create step for job 77: Invalid node name specified (exit 1)"]
        for node in ("n01", "n02")}


def test_preflight_without_srun_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no srun anywhere
    with pytest.raises(PreflightError, match="srun is not installed here"):
        preflight(CLUSTER, expected_version=minitrain.__version__)


# ---------------------------------------------------------------------------------- a bad allocation


def test_a_bad_allocation_stops_the_launcher_before_anything_starts(tmp_path):
    """`python -m minitrain.launch` inside an allocation whose node list does not parse: exit 2, one line
    naming the variable, its value and the fix; no run directory, no process."""
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "MINITRAIN_HOSTS"))},
           "SLURM_JOB_ID": "9", "SLURM_JOB_NODELIST": "gpu[01-", "SLURM_JOB_CPUS_PER_NODE": "4",
           "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "minitrain.launch", "--num-workers", "2", "--storage-path",
                           str(tmp_path / "results"), "examples/quickstart.py:train_func"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        "minitrain.launch: SLURM_JOB_NODELIST='gpu[01-': has a '[' that is never closed. Expected a Slurm "
        "hostlist such as 'gpu[01-04,07],cpu5' (what `scontrol show hostnames` expands); check the variable, "
        "or name the hosts explicitly with minitrain.init(hosts=...)"]
    assert not (tmp_path / "results").exists()
