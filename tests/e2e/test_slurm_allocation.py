"""Slurm mode against a real Slurm (tests/slurm_cluster.py: munged, slurmctld, a slurmd per network
namespace): a batch job's driver takes its hosts from the allocation and starts its agents as job
steps with srun; DDP trains across both nodes; a node's step that dies is a lost node, and the run
restarts inside the allocation from its last checkpoint."""

from __future__ import annotations

import json
import os
import pathlib
import shlex
import subprocess
import sys
import threading
import time

import psutil
import pytest

from minitrain.storage.layout import INDEX_NAME

pytestmark = [pytest.mark.e2e, pytest.mark.cluster]
ROOT = pathlib.Path(__file__).resolve().parents[2]
TRAINING = pathlib.Path(__file__).resolve().parent / "slurm_training.py"


def _script(body: str) -> str:
    """A batch script that runs `body` with this checkout's minitrain and this interpreter."""
    path = os.pathsep.join([str(ROOT), str(TRAINING.parent)])
    return (f"#!/bin/bash\nset -e\ncd {shlex.quote(str(ROOT))}\nexport PYTHONPATH={shlex.quote(path)}\n"
            f"export MINITRAIN_STATUS=lines MINITRAIN_DASHBOARD=0\n{body}\n")


def _records(out: pathlib.Path, pattern: str) -> list[dict]:
    return [json.loads(path.read_text()) for path in sorted(out.glob(pattern))]


def _wait_for(condition, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"{what() if callable(what) else what} did not happen within {timeout} s")
        time.sleep(0.05)
    return value


def _log(path: pathlib.Path) -> str:
    return path.read_text(errors="replace") if path.exists() else "(no output)"


def test_a_batch_job_trains_ddp_across_both_nodes_with_its_agents_as_steps(slurm_cluster, tmp_path):
    out, log = tmp_path / "out", tmp_path / "job.log"
    out.mkdir()
    config = json.dumps({"out": str(out), "steps": 3})
    launch = shlex.join([sys.executable, "-m", "minitrain.launch", "--num-workers", "2", "--name", "ddp",
                         "--storage-path", str(tmp_path / "results"), "--config", config,
                         f"{TRAINING}:train_ddp"])
    job = slurm_cluster.sbatch(_script(launch), "--nodes=2", f"--output={log}", "--open-mode=append")
    record = slurm_cluster.wait_job(job, 120)

    assert record["JobState"] == "COMPLETED" and record["ExitCode"] == "0:0", _log(log)
    assert "minitrain.launch: finished; metrics: " in _log(log)
    metrics = json.loads(_log(log).split("minitrain.launch: finished; metrics: ")[1].split("; run directory")[0])
    assert metrics == {"step": 2, "world": 2, "params_equal": True}
    ranks = {r["rank"]: r for r in _records(out, "rank_*.json")}
    assert sorted(ranks) == [0, 1]
    assert [ranks[r]["node"] for r in (0, 1)] == slurm_cluster.nodes  # one rank per node, in the node order
    assert ranks[0]["netns"] != ranks[1]["netns"]  # really two hosts
    assert {r["job"] for r in ranks.values()} == {job}
    # each node's agent (and so its workers) ran in a job step of its own, not in the batch step
    assert ranks[0]["step"] != ranks[1]["step"] and all(r["step"].isdigit() for r in ranks.values())
    assert slurm_cluster.steps(job) == []


class Watcher:
    """Reads, every 100 ms while the test runs, the command line and environment of every process that srun,
    slurmstepd or minitrain started (the driver, srun, the steps' agents and workers), as they live."""

    NAMES = ("srun", "slurmstepd", "minitrain", "slurm_training")

    def __init__(self):
        self.seen: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self):
        while not self._stop.is_set():
            for process in psutil.process_iter(["cmdline"]):
                cmdline = " ".join(process.info["cmdline"] or [])
                if any(name in cmdline for name in self.NAMES):
                    try:
                        environ = open(f"/proc/{process.pid}/environ", "rb").read().decode(errors="replace")
                    except OSError:
                        continue
                    self.seen += [cmdline, environ]
            time.sleep(0.1)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def test_a_nodes_step_that_dies_restarts_the_attempt_from_the_last_checkpoint(slurm_cluster, tmp_path):
    """...and the run token is on no command line and in no environment of the run, first agents or
    relaunched."""
    out, log = tmp_path / "out", tmp_path / "job.log"
    out.mkdir()
    steps = 16  # 8 s left after the second checkpoint: the cancel always lands mid-run
    driver = shlex.join([sys.executable, str(TRAINING), str(out), str(tmp_path / "results"), str(steps), "0.5"])
    with Watcher() as watcher:
        job = slurm_cluster.sbatch(_script(driver), "--nodes=2", f"--output={log}", "--open-mode=append")
        _lose_the_second_nodes_step(slurm_cluster, job, tmp_path, out, log, steps)
    token = json.loads((out / "token").read_text())["token"]
    assert any("minitrain.agent" in text for text in watcher.seen), "the watcher saw no agent: it proves nothing"
    assert not any(token in text for text in watcher.seen)


def _lose_the_second_nodes_step(slurm_cluster, job, tmp_path, out, log, steps):
    # once two checkpoints are committed, cancel the agent's step on the second node (scancel JOB.STEP)
    index = tmp_path / "results" / "lost_step" / INDEX_NAME
    _wait_for(lambda: index.exists() and len(json.loads(index.read_text())["checkpoint_results"]) >= 2, 90,
              lambda: f"two committed checkpoints ({_log(log)})")
    second = slurm_cluster.nodes[1]
    step = _wait_for(lambda: [s for s in slurm_cluster.steps(job)
                              if s["name"] == "minitrain-agent" and s["nodes"] == second], 10,
                     "the agent step on the second node")[0]
    killed_at = time.time()
    slurm_cluster.run(["scancel", step["id"]])

    record = slurm_cluster.wait_job(job, 120)
    assert record["JobState"] == "COMPLETED" and record["ExitCode"] == "0:0", _log(log)
    result = json.loads((out / "result.json").read_text())
    assert result["metrics"]["step"] == steps - 1
    starts = _records(out, "start_*.json")
    first = [s for s in starts if s["start"] == 0]
    resumed = [s for s in starts if s["start"] > 0]
    assert len(first) == 2 and len(resumed) == 2, starts  # two attempts of two ranks; no fresh start
    assert len({s["start"] for s in resumed}) == 1  # both ranks resumed from the same committed round
    assert {s["node"] for s in resumed} == set(slurm_cluster.nodes)  # the lost node came back as a new step
    new_step = next(s for s in resumed if s["node"] == second)["step"]
    assert f"{job}.{new_step}" != step["id"]
    firsts = [r["time"] for r in _records(out, "first_step_*.json") if r["pid"] in {s["pid"] for s in resumed}]
    print(f"slurm step killed -> first step of the new attempt: {max(firsts) - killed_at:.2f} s")
    assert slurm_cluster.steps(job) == []


def test_the_example_batch_script_trains_as_documented(slurm_cluster, tmp_path):
    """examples/slurm/train.sbatch as a user submits it from the repository root (its #SBATCH lines:
    --requeue, --signal, --open-mode=append), with this interpreter and a small run."""
    log = tmp_path / "job.log"
    export = ",".join(["ALL", f"PYTHON={sys.executable}", f"PYTHONPATH={ROOT}", "NUM_WORKERS=2", "EPOCHS=2",
                       f"STORAGE={tmp_path / 'results'}", "MINITRAIN_DASHBOARD=0"])
    script = (ROOT / "examples" / "slurm" / "train.sbatch").read_text()
    job = slurm_cluster.sbatch(script, f"--chdir={ROOT}", f"--output={log}", f"--export={export}")
    record = slurm_cluster.wait_job(job, 180)
    assert record["JobState"] == "COMPLETED" and record["ExitCode"] == "0:0", _log(log)
    assert record["JobName"] == "minitrain-quickstart" and record["TimeLimit"] == "00:30:00"  # its #SBATCH lines
    assert f"job {job} on {record['NodeList']}, restart 0" in _log(log)
    assert "minitrain.launch: finished; metrics: " in _log(log)
    assert (tmp_path / "results" / f"quickstart-{job}" / INDEX_NAME).exists()


def test_salloc_runs_the_driver_outside_the_nodes(slurm_cluster, tmp_path):
    """The salloc recipe: the driver runs where salloc runs (here the root namespace, as on a login node,
    a host that is none of the nodes), reads the allocation salloc made and starts the agents as steps."""
    out = tmp_path / "out"
    out.mkdir()
    launch = [sys.executable, "-m", "minitrain.launch", "--num-workers", "2", "--name", "salloc",
              "--storage-path", str(tmp_path / "results"), "--config", json.dumps({"out": str(out), "steps": 2}),
              f"{TRAINING}:train_ddp"]
    env = {**slurm_cluster.env, "PYTHONPATH": os.pathsep.join([str(ROOT), str(TRAINING.parent)]),
           "MINITRAIN_DASHBOARD": "0", "MINITRAIN_STATUS": "lines"}
    done = subprocess.run(["salloc", "--nodes=2", *launch], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=120, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "minitrain.launch: finished; metrics: " in done.stdout
    ranks = {r["rank"]: r for r in _records(out, "rank_*.json")}
    assert [ranks[r]["node"] for r in (0, 1)] == slurm_cluster.nodes
    assert os.readlink("/proc/self/ns/net") not in {r["netns"] for r in ranks.values()}  # not where the driver ran


@pytest.mark.soak  # the precedence itself is tests/unit/test_slurm_env.py's, in process
def test_explicit_hosts_override_the_allocation(slurm_cluster, tmp_path):
    """MINITRAIN_HOSTS inside an allocation wins: the run uses those hosts (here the batch node alone, as
    localhost), not the allocation's nodes, and starts no agent step."""
    out, log = tmp_path / "out", tmp_path / "job.log"
    out.mkdir()
    launch = shlex.join([sys.executable, "-m", "minitrain.launch", "--num-workers", "2", "--name", "explicit",
                         "--storage-path", str(tmp_path / "results"),
                         "--config", json.dumps({"out": str(out), "steps": 1}), f"{TRAINING}:train_ddp"])
    job = slurm_cluster.sbatch(_script(f"export MINITRAIN_HOSTS=localhost:2\n{launch}"), "--nodes=2",
                               f"--output={log}")
    record = slurm_cluster.wait_job(job, 120)
    assert record["JobState"] == "COMPLETED", _log(log)
    ranks = [r for r in _records(out, "rank_*.json")]
    assert [r["node"] for r in ranks] == [slurm_cluster.nodes[0]] * 2  # both on the batch node
    assert "minitrain-agent" not in _log(log) and ranks[0]["netns"] == ranks[1]["netns"]


def _seeded_job(slurm_cluster, tmp_path, name: str, *sbatch_args: str) -> tuple[str, pathlib.Path, pathlib.Path]:
    out, log = tmp_path / name, tmp_path / f"{name}.log"
    out.mkdir()
    config = json.dumps({"out": str(out), "steps": 12, "step_s": 0.3})
    launch = shlex.join([sys.executable, "-m", "minitrain.launch", "--num-workers", "2", "--name", "seeded",
                         "--storage-path", str(tmp_path / f"{name}_results"), "--config", config,
                         f"{TRAINING}:train_seeded"])
    job = slurm_cluster.sbatch(_script(launch), "--nodes=2", f"--output={log}", "--open-mode=append", *sbatch_args)
    return job, out, log


def test_a_preemption_signal_gives_one_agreed_checkpoint_and_a_requeue_that_ends_bit_identical(slurm_cluster,
                                                                                                 tmp_path):
    """scancel --signal=USR2 reaches every process of the job's steps (agents and workers): the ranks agree a
    round, it commits, the driver asks Slurm to requeue the job (scontrol requeue), and the requeued job (same
    id, SLURM_RESTART_COUNT=1) resumes from the agreed checkpoint and ends with the same parameter bits as
    the same job run without interruption."""
    baseline, baseline_out, baseline_log = _seeded_job(slurm_cluster, tmp_path, "uninterrupted")
    record = slurm_cluster.wait_job(baseline, 120)
    assert record["JobState"] == "COMPLETED", _log(baseline_log)

    job, out, log = _seeded_job(slurm_cluster, tmp_path, "preempted", "--requeue")
    _wait_for(lambda: (out / "progress.json").exists() and json.loads((out / "progress.json").read_text())["step"] >= 3,
              90, lambda: f"step 3 of the first run ({_log(log)})")
    signalled_at = time.time()
    slurm_cluster.run(["scancel", "--signal=USR2", job])
    record = slurm_cluster.wait_job(job, 180)
    text = _log(log)
    assert record["JobState"] == "COMPLETED" and record["ExitCode"] == "0:0", text
    assert record.get("Restarts") == "1", record
    assert "requeued" in text and "preempted" in text.lower()
    starts = _records(out, "start_*.json")
    first = [s for s in starts if s["restart"] in (None, "0")]
    resumed = [s for s in starts if s["restart"] == "1"]
    assert len(first) == 2 and len(resumed) == 2, starts
    assert {s["start"] for s in first} == {0}
    agreed = {s["start"] for s in resumed}
    assert len(agreed) == 1 and agreed.pop() >= 4, resumed  # both ranks resumed after the same agreed round
    final = json.loads((out / "final_params.json").read_text())["hex"]
    assert final == json.loads((baseline_out / "final_params.json").read_text())["hex"]
    resumed_at = max(p.stat().st_mtime for p in out.glob("start_*.json"))
    print(f"signal -> resumed job's first start record: {resumed_at - signalled_at:.1f} s; Slurm's record: "
          f"EligibleTime {record.get('EligibleTime')}, StartTime {record.get('StartTime')}, "
          f"signalled {time.strftime('%Y-%m-%dT%H:%M:%S', time.localtime(signalled_at))}")
    assert slurm_cluster.steps(job) == []
