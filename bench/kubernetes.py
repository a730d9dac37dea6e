"""Workload `kubernetes` (optional: needs root, iproute2 and openssh-server for the namespaces): the
Kubernetes contract on "pods" that are network namespaces (`scripts/netns_cluster.py`) carrying a
PyTorchJob's variables, every pod running ``python -m minitrain.launch bench/kubernetes_jobs.py``; pod 0
is the driver, the other pods' agents join it over TLS (docs/kubernetes.md). Without them it is skipped
and says why.

Each repetition starts PODS pods (one worker each, a checkpoint every STEP_S); once two checkpoints are
committed every pod's processes are SIGKILLed (the job's pods are lost) and all pods are started again,
in rank order, as a recreated job's are:

    all pods recreated -> first resumed step: the last pod's start -> the latest rank's first step of the
        resumed attempt (pod 0's driver reads the run directory, its coordinator listens, the joiners
        reach it, workers start cold, rendezvous, the step). Target: <= 10 s.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

from bench.common import BenchError, say, summary, tail
from bench.kubernetes_jobs import RUN_NAME
from bench.multihost import netns_cluster
from bench.table import Row, WorkloadResult
from minitrain.storage.layout import INDEX_NAME

ROOT = Path(__file__).resolve().parents[1]
PODS, STEPS, STEP_S, PORT = 2, 40, 0.2, 29500
KILL_AFTER_CHECKPOINTS = 2
JOB_TIMEOUT_S = 180.0
TARGET_S = 10.0


def _committed(index: Path) -> int:
    try:
        return len(json.loads(index.read_text())["checkpoint_results"])
    except (OSError, ValueError, KeyError):
        return 0


def _wait(condition, timeout_s: float, what: str, logs: list):
    deadline = time.monotonic() + timeout_s
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise BenchError(f"{what} did not happen within {timeout_s:g} s; pod logs:\n"
                             + "\n".join(tail(str(log)) for log in logs))
        time.sleep(0.05)
    return value


def _start(cluster, rank: int, args: list, token: Path, log: Path) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "MASTER_ADDR", "MASTER_PORT")}
    env.update(WORLD_SIZE=str(PODS), RANK=str(rank), MASTER_ADDR=cluster.hosts[0].ip, MASTER_PORT=str(PORT),
               PYTHONPATH=str(ROOT), MINITRAIN_DASHBOARD="0", MINITRAIN_STATUS="off",
               MINITRAIN_JOIN_TOKEN_FILE=str(token))
    with open(log, "ab") as handle:
        return cluster.popen_in(cluster.hosts[rank], [sys.executable, "-m", "minitrain.launch",
                                                      str(ROOT / "bench" / "kubernetes_jobs.py"), *args],
                                env=env, stdout=handle, stderr=subprocess.STDOUT, cwd=str(ROOT))


def recreate_once(cluster, tmp: Path, number: int) -> dict:
    """One job whose pods are all killed after two checkpoints and started again; its figure."""
    out, storage = tmp / f"out{number}", tmp / f"storage{number}"
    out.mkdir()
    token = tmp / "token"
    token.write_text(secrets.token_urlsafe(32))
    args = [str(out), str(storage), str(STEPS), str(STEP_S)]
    logs = [tmp / f"job{number}-pod{rank}.log" for rank in range(PODS)]
    pods = [_start(cluster, rank, args, token, logs[rank]) for rank in range(PODS)]
    try:
        _wait(lambda: _committed(storage / RUN_NAME / INDEX_NAME) >= KILL_AFTER_CHECKPOINTS, JOB_TIMEOUT_S,
              "two committed checkpoints", logs)
        for host in cluster.hosts:
            cluster.kill_namespace_processes(host)
        for pod in pods:
            pod.wait(timeout=30)
        pods = [_start(cluster, rank, args, token, logs[rank]) for rank in range(PODS)]
        last_started = time.time()
        codes = [pod.wait(timeout=JOB_TIMEOUT_S) for pod in pods]
    finally:
        for pod in pods:
            if pod.poll() is None:
                pod.kill()
                pod.wait()
    if codes != [0] * PODS:
        raise BenchError(f"the recreated pods exited {codes}; pod logs:\n" + "\n".join(tail(str(l)) for l in logs))
    firsts = [json.loads(path.read_text()) for path in out.glob("first_step_*.json")]
    again = [f["time"] for f in firsts if f["start"] > 0]
    if len(again) != PODS:
        raise BenchError(f"expected {PODS} ranks in the resumed attempt, got {firsts}")
    run = {"recreated_s": max(again) - last_started, "resumed_at_step": min(f["start"] for f in firsts if f["start"])}
    say(f"  job {number}: all pods recreated -> first resumed step {run['recreated_s']:.2f} s "
        f"(resumed at step {run['resumed_at_step']})")
    return run


def bench_kubernetes(tmp: str, repeats: int) -> WorkloadResult:
    """The whole workload on fresh "pods"; skipped (a row saying why) where none can be made."""
    module = netns_cluster()
    reason = "scripts/netns_cluster.py not found" if module is None else module.unavailable_reason()
    if reason:
        say(f"  skipped: cannot make network-namespace pods here ({reason}); nothing was measured")
        return WorkloadResult("kubernetes", [Row("kubernetes", "pods as network namespaces", f"skipped: {reason}")],
                              {"skipped": reason})
    try:
        with module.NetnsCluster(PODS, Path(tmp) / "pods") as cluster:
            runs = [recreate_once(cluster, Path(tmp), number) for number in range(repeats)]
    except module.ClusterError as exc:
        raise BenchError(f"the network-namespace pods failed: {exc}") from exc
    stats = summary([r["recreated_s"] for r in runs])
    rows = [Row("kubernetes", f"all {PODS} pods recreated (PyTorchJob variables, agents that join over TLS) -> "
                f"first resumed step, median (min-max) of {len(runs)}",
                f"{stats['median_s']:.2f} s ({stats['min_s']:.2f}-{stats['max_s']:.2f})", "-", "-",
                f"<= {TARGET_S:g} s", stats["max_s"] <= TARGET_S)]
    return WorkloadResult("kubernetes", rows, {"runs": runs, "recreated": stats})
