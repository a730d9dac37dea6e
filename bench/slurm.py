"""Workload `slurm` (optional: needs root, network namespaces and Debian's Slurm, which it installs when
missing): minitrain in Slurm mode on a real Slurm of 2 nodes on this machine (`scripts/slurm_cluster.py`:
munged, slurmctld, one slurmd per network namespace). Without them it is skipped and says why. The batch
job's driver is `bench/slurm_jobs.py`.

Each repetition submits one batch job (2 nodes, 2 workers, a checkpoint every STEP_S): its driver takes
the nodes from the allocation and starts the agents as job steps. Once two checkpoints are committed the
agent step of the second node is cancelled (`scancel JOB.STEP`); the run restarts inside the allocation
and finishes from the last checkpoint.

    sbatch -> first step: submission -> the first attempt's first step (pre-flight steps, agent steps,
        workers, rendezvous); the latest rank's time.
    step killed -> first step: the scancel -> the new attempt's first step (detection, the attempt torn
        down, a new agent step on the node, its worker cold, rendezvous); the latest rank's time.
        Target: <= 5 s.
    requeue: one more job, submitted with --requeue, gets `scancel --signal=USR2` once two checkpoints are
        committed: signal -> the driver's fit() raised PreemptionError (the round agreed and committed, the
        job requeued); requeue -> the requeued job's first step (Slurm's cred_expire hold, the job's
        start-up, the resume). Target: <= cred_expire + 15 s.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
from pathlib import Path

from bench.common import BenchError, say, summary, tail
from bench.table import Row, WorkloadResult
from minitrain.storage.layout import INDEX_NAME

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "slurm_cluster.py"
STEPS, STEP_S = 10, 0.2
KILL_AFTER_CHECKPOINTS = 2
JOB_TIMEOUT_S = 180.0
TARGET_RESTART_S = 5.0


def slurm_cluster_module():
    """scripts/slurm_cluster.py as the module `slurm_cluster_script`, or None when it is missing."""
    if not SCRIPT.exists():
        return None
    if (mod := sys.modules.get("slurm_cluster_script")) is None:
        spec = importlib.util.spec_from_file_location("slurm_cluster_script", SCRIPT)
        mod = importlib.util.module_from_spec(spec)
        sys.modules["slurm_cluster_script"] = mod
        spec.loader.exec_module(mod)
    return mod


def _wait(condition, timeout_s: float, what: str, log: Path, job: dict):
    deadline = time.monotonic() + timeout_s
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise BenchError(f"{what} did not happen within {timeout_s:g} s; the job: {job}; its output:\n"
                             f"{tail(str(log))}")
        time.sleep(0.05)
    return value


def _committed(index: Path) -> int:
    try:
        return len(json.loads(index.read_text())["checkpoint_results"])
    except (OSError, ValueError, KeyError):
        return 0


def loss_once(slurm, tmp: Path, number: int) -> dict:
    """One batch job whose second node's agent step is cancelled mid-run; its two figures."""
    out, results, log = tmp / f"job{number}", tmp / f"results{number}", tmp / f"job{number}.log"
    out.mkdir()
    script = (f"#!/bin/bash\nset -e\ncd {ROOT}\nexport PYTHONPATH={ROOT}\n"
              f"export MINITRAIN_DASHBOARD=0 MINITRAIN_STATUS=lines\n"
              f"exec {sys.executable} -m bench.slurm_jobs {out} {results} {STEPS} {STEP_S}\n")
    submitted = time.time()
    job = slurm.sbatch(script, "--nodes=2", f"--output={log}")
    index = results / "bench" / INDEX_NAME
    record: dict = {}

    def ready() -> bool:  # two checkpoints committed; a job that ended before is an error at once
        if _committed(index) >= KILL_AFTER_CHECKPOINTS:
            return True
        record.update(slurm.job(job))
        if record.get("JobState") in slurm_cluster_module().ENDED:
            raise BenchError(f"job {job} ended before two checkpoints were committed: {record}; its output:\n"
                             f"{tail(str(log))}")
        return False

    _wait(ready, JOB_TIMEOUT_S, "two committed checkpoints", log, record)
    second = slurm.nodes[1]
    step = _wait(lambda: [s for s in slurm.steps(job) if s["name"] == "minitrain-agent" and s["nodes"] == second],
                 10, "the second node's agent step", log, record)[0]
    killed = time.time()
    slurm.run(["scancel", step["id"]])
    record = slurm.wait_job(job, JOB_TIMEOUT_S)
    if record.get("JobState") != "COMPLETED" or not (out / "result.json").exists():
        raise BenchError(f"job {job} ended {record.get('JobState')}; its output:\n{tail(str(log))}")
    firsts = [json.loads(path.read_text()) for path in out.glob("first_step_*.json")]
    first = [f["time"] for f in firsts if f["start"] == 0]
    again = [f["time"] for f in firsts if f["start"] > 0]
    if len(first) != 2 or len(again) != 2:
        raise BenchError(f"job {job}: expected 2 ranks in each of 2 attempts, got {firsts}")
    run = {"job": job, "startup_s": max(first) - submitted, "restart_s": max(again) - killed,
           "resumed_at_step": min(f["start"] for f in firsts if f["start"] > 0)}
    say(f"  job {job}: sbatch -> first step {run['startup_s']:.2f} s; step killed -> first step of the new "
        f"attempt {run['restart_s']:.2f} s (resumed at step {run['resumed_at_step']})")
    return run


def requeue_once(slurm, tmp: Path) -> dict:
    """One `--requeue` batch job preempted by `scancel --signal=USR2` once two checkpoints are committed:
    the agreed round commits, fit() requeues the job, and the requeued job resumes; its figures."""
    out, results, log = tmp / "requeue", tmp / "requeue_results", tmp / "requeue.log"
    out.mkdir()
    script = (f"#!/bin/bash\ncd {ROOT}\nexport PYTHONPATH={ROOT}\n"
              f"export MINITRAIN_DASHBOARD=0 MINITRAIN_STATUS=lines\n"
              f"exec {sys.executable} -m bench.slurm_jobs {out} {results} {STEPS * 3} {STEP_S}\n")
    job = slurm.sbatch(script, "--nodes=2", f"--output={log}", "--open-mode=append", "--requeue")
    index = results / "bench" / INDEX_NAME
    _wait(lambda: _committed(index) >= KILL_AFTER_CHECKPOINTS, JOB_TIMEOUT_S, "two committed checkpoints", log,
          {"job": job})
    signalled = time.time()
    slurm.run(["scancel", "--signal=USR2", job])
    record = slurm.wait_job(job, JOB_TIMEOUT_S)
    if record.get("JobState") != "COMPLETED" or record.get("Restarts") != "1":
        raise BenchError(f"requeue job {job} ended {record.get('JobState')} after {record.get('Restarts')} "
                         f"restart(s); its output:\n{tail(str(log))}")
    preempted = [json.loads(path.read_text()) for path in out.glob("preempted_*.json")]
    again = [json.loads(path.read_text()) for path in out.glob("first_step_*.json")]
    again = [f["time"] for f in again if f["start"] > 0]
    if len(preempted) != 1 or len(again) != 2:
        raise BenchError(f"requeue job {job}: expected one preempted driver and 2 resumed ranks, got "
                         f"{preempted} and {again}")
    run = {"job": job, "signal_to_requeue_s": preempted[0]["time"] - signalled,
           "requeue_to_first_step_s": max(again) - preempted[0]["time"], "agreed_round": preempted[0]["round"]}
    say(f"  job {job}: USR2 -> agreed, committed, requeued {run['signal_to_requeue_s']:.2f} s; requeue -> first "
        f"step of the requeued job {run['requeue_to_first_step_s']:.2f} s")
    return run


def _span(stats: dict) -> str:
    return f"{stats['median_s']:.2f} s ({stats['min_s']:.2f}-{stats['max_s']:.2f})"


def bench_slurm(tmp: str, repeats: int) -> WorkloadResult:
    """The whole workload on a fresh Slurm cluster; skipped (a row saying why) where none can be built."""
    module = slurm_cluster_module()
    reason = "scripts/slurm_cluster.py not found" if module is None else module.unavailable_reason(install=True)
    if reason:
        say(f"  skipped: cannot build a Slurm cluster here ({reason}); nothing was measured")
        return WorkloadResult("slurm", [Row("slurm", "Slurm cluster of 2 nodes", f"skipped: {reason}")],
                              {"skipped": reason})
    try:
        with module.SlurmCluster(Path(tmp) / "cluster") as slurm:
            say(f"  cluster: nodes {', '.join(slurm.nodes)} (up in {slurm.up_seconds:.2f} s)")
            runs = [loss_once(slurm, Path(tmp), number) for number in range(repeats)]
            requeue = requeue_once(slurm, Path(tmp))
            up_s = slurm.up_seconds
    except (module.SlurmError, module.netns_module().ClusterError) as exc:
        raise BenchError(f"the Slurm cluster failed: {exc}") from exc
    startup, restart = summary([r["startup_s"] for r in runs]), summary([r["restart_s"] for r in runs])
    figures = {"cluster_up_s": up_s, "runs": runs, "startup": startup, "restart": restart, "requeue": requeue}
    requeue_target = module.CRED_EXPIRE_S + 15.0
    rows = [
        Row("slurm", "Slurm cluster up (munged, slurmctld, 2 slurmd in network namespaces)", f"{up_s:.2f} s"),
        Row("slurm", f"sbatch -> first step, 2 nodes x 1 worker, agents as srun steps, median (min-max) of "
            f"{len(runs)}", _span(startup)),
        Row("slurm", f"Slurm step of one node killed -> first step of the new attempt, median (min-max) of "
            f"{len(runs)}", _span(restart), "-", "-", f"<= {TARGET_RESTART_S:g} s",
            restart["max_s"] <= TARGET_RESTART_S),
        Row("slurm", "scancel --signal=USR2 -> agreed round committed, job requeued (scontrol requeue), driver out",
            f"{requeue['signal_to_requeue_s']:.2f} s"),
        Row("slurm", f"requeue -> first step of the requeued job (cred_expire={module.CRED_EXPIRE_S:g} s hold "
            "included)", f"{requeue['requeue_to_first_step_s']:.2f} s", "-", "-",
            f"<= cred_expire + 15 s = {requeue_target:g} s", requeue["requeue_to_first_step_s"] <= requeue_target),
    ]
    return WorkloadResult("slurm", rows, figures)
