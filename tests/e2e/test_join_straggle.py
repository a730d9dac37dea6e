"""Joins that straggle by 40 s, for real: pods whose joins are 40 s apart, either way, still train and exit 0.

tests/e2e/test_kubernetes_pods.py shows 0 and 10 s on network-namespace pods, and tests/unit/test_joining.py
the joiner's retry loop against a master that appears after 40 s of a fake clock. Here the 40 s are real,
on both sides at once, and nothing else is added: two 2-pod PyTorchJob-variable jobs on loopback (pods as
processes of this machine; no root, no namespaces), started together, each training two DDP steps with
the pods' script (bench/kubernetes_jobs.py):

- "joiner first": pod 1 starts 40 s before pod 0, so its joiner retries the master for 40 s;
- "driver first": pod 0 starts 40 s before pod 1, so its coordinator waits 40 s for the agent to join.

Pod 0's address is loopback here, which also covers a joined coordinator on a loopback address: it serves
plaintext, as its agents dial it (served TLS there, it would lose its own agent at once).

Both straggles share the same 40 s of wall time; the rest is the two jobs' start and two steps.
"""

from __future__ import annotations

import json
import os
import pathlib
import secrets
import signal
import socket
import subprocess
import sys
import time

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = str(REPO / "bench" / "kubernetes_jobs.py")
STRAGGLE_S = 40.0
JOIN_TIMEOUT_S = 120  # far above the straggle; a run that breaks fails well within pytest-timeout
# How long both jobs may take, from the second start, to train and exit: under a loaded CI machine (two test
# workers beside DeepSpeed and fault-injection runs) both jobs took 65 s here, and a CI run reached 120 s.
EXIT_DEADLINE_S = 200


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class _Job:
    """A 2-pod job on loopback: its pods are `python -m minitrain.launch` processes with PyTorchJob variables."""

    def __init__(self, tmp: pathlib.Path, name: str):
        self.dir = tmp / name
        self.out, self.storage = self.dir / "out", self.dir / "storage"
        self.out.mkdir(parents=True)
        self.token = self.dir / "token"
        self.token.write_text(secrets.token_urlsafe(32))
        self.port = _free_port()
        self.pods: dict[int, subprocess.Popen] = {}

    def log(self, rank: int) -> pathlib.Path:
        return self.dir / f"pod{rank}.log"

    def start(self, rank: int) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("MINITRAIN_JOIN", "PET_"))
               and k not in ("WORLD_SIZE", "RANK", "MASTER_ADDR", "MASTER_PORT")}
        # PYTHONFAULTHANDLER: a pod that has not exited by the deadline is stopped with SIGABRT (`kill`), which
        # then writes every thread's stack into its log: the failure message shows where it was.
        env.update(WORLD_SIZE="2", RANK=str(rank), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(self.port),
                   PYTHONPATH=str(REPO), PYTHONFAULTHANDLER="1", MINITRAIN_DASHBOARD="0", MINITRAIN_STATUS="off",
                   MINITRAIN_JOIN_TOKEN_FILE=str(self.token), MINITRAIN_JOIN_TIMEOUT_S=str(JOIN_TIMEOUT_S))
        with open(self.log(rank), "wb") as log:
            self.pods[rank] = subprocess.Popen(
                [sys.executable, "-m", "minitrain.launch", SCRIPT, str(self.out), str(self.storage), "2", "0.05"],
                env=env, stdout=log, stderr=subprocess.STDOUT, cwd=str(REPO))

    def logs(self) -> str:
        return "\n".join(f"--- {self.dir.name}/{path.name}\n{path.read_text(errors='replace')[-12000:]}"
                         for path in sorted(self.dir.glob("pod*.log")))

    def wait(self, deadline: float) -> dict[int, int]:
        codes = {}
        for rank, pod in sorted(self.pods.items()):
            try:
                codes[rank] = pod.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                codes[rank] = None
        return codes

    def kill(self) -> None:
        """Stop the pods still running: SIGABRT first, so that each writes its threads' stacks to its log."""
        for pod in self.pods.values():
            if pod.poll() is None:
                pod.send_signal(signal.SIGABRT)
                try:
                    pod.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    pod.kill()
                    pod.wait()


@pytest.mark.e2e
@pytest.mark.soak  # 40 s of real straggle: the default run has it at 10 s (tests/e2e/test_kubernetes_pods.py)
@pytest.mark.timeout(300)
def test_pods_that_straggle_by_40_s_either_way_train_and_every_pod_exits_0(tmp_path):
    joiner_first, driver_first = _Job(tmp_path, "joiner-first"), _Job(tmp_path, "driver-first")
    try:
        joiner_first.start(1)
        driver_first.start(0)
        started = time.time()
        time.sleep(STRAGGLE_S)  # the straggle under test, not a wait for something
        for job in (joiner_first, driver_first):
            # still waiting on both sides: the joiner retrying a master that is not there, the driver for it
            assert all(pod.poll() is None for pod in job.pods.values()), job.logs()
        assert not list(driver_first.out.glob("rank_*")), driver_first.logs()  # no worker before pod 1 joined
        joiner_first.start(0)
        driver_first.start(1)
        deadline = time.monotonic() + EXIT_DEADLINE_S
        codes = {job.dir.name: job.wait(deadline) for job in (joiner_first, driver_first)}
    finally:
        joiner_first.kill()
        driver_first.kill()
    assert codes == {"joiner-first": {0: 0, 1: 0}, "driver-first": {0: 0, 1: 0}}, \
        joiner_first.logs() + driver_first.logs()
    for job in (joiner_first, driver_first):
        metrics = json.loads((job.out / "result.json").read_text())["metrics"]
        assert metrics["world"] == 2 and metrics["step"] == 1 and metrics["params_equal"] is True, metrics
        first = min(json.loads(path.read_text())["time"] for path in job.out.glob("rank_*_start_0.json"))
        assert first - started >= STRAGGLE_S  # the workers started once both pods were up, not before
