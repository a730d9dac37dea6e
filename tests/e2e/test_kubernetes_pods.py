"""The Kubernetes contract with "pods" as network-namespace hosts (scripts/netns_cluster.py) carrying a
PyTorchJob's or a TrainJob's variables: every pod runs the same ``python -m minitrain.launch
bench/kubernetes_jobs.py`` (the `kubernetes` benchmark's script: what it records is in its docstring); pod 0
is the driver and coordinator, the others join it over TLS with the token from a file (the Secret). No
Kubernetes API, as minitrain uses none."""

from __future__ import annotations

import glob
import json
import os
import pathlib
import secrets
import signal
import subprocess
import sys
import time

import pytest

from bench.kubernetes_jobs import RUN_NAME

REPO = str(pathlib.Path(__file__).resolve().parents[2])
SCRIPT = str(pathlib.Path(REPO) / "bench" / "kubernetes_jobs.py")
PORT = 29500
RUN_S = 300  # the most a pod may run; a pod still running then is a failure, not a wait
GRACE_S = 30  # Kubernetes' default terminationGracePeriodSeconds: SIGTERM, then SIGKILL after it


def _variables(flavor: str, pods: int, rank: int, master: str) -> dict:
    if flavor == "TrainJob":
        return {"PET_NNODES": str(pods), "PET_NODE_RANK": str(rank), "PET_MASTER_ADDR": master,
                "PET_MASTER_PORT": str(PORT), "PET_NPROC_PER_NODE": "1"}
    return {"WORLD_SIZE": str(pods), "RANK": str(rank), "MASTER_ADDR": master, "MASTER_PORT": str(PORT)}


class Pods:
    """The pods of one job: start one (`start(rank)`), wait for all, read their logs."""

    def __init__(self, cluster, tmp_path, flavor: str, steps: int = 4, step_s: float = 0.05, max_failures: int = 0):
        self.cluster, self.flavor, self.tmp = cluster, flavor, tmp_path
        self.pods = len(cluster.hosts)
        self.master = cluster.hosts[0].ip
        self.out, self.storage = tmp_path / "out", tmp_path / "storage"
        self.out.mkdir(exist_ok=True)
        self.storage.mkdir(exist_ok=True)
        self.token_file = tmp_path / "token"  # the Secret, mounted as a file on every pod
        if not self.token_file.exists():
            self.token_file.write_text(secrets.token_urlsafe(32))
            self.token_file.chmod(0o600)
        self.args = [str(self.out), str(self.storage), str(steps), str(step_s), str(max_failures)]
        self.running: dict[int, subprocess.Popen] = {}
        self.started: list[int] = []
        self.incarnation = 0

    def env(self, rank: int, **extra) -> dict:
        env = {key: value for key, value in os.environ.items()
               if key not in ("WORLD_SIZE", "RANK", "MASTER_ADDR", "MASTER_PORT") and not key.startswith("PET_")}
        env.update(_variables(self.flavor, self.pods, rank, self.master), PYTHONPATH=REPO, MINITRAIN_DASHBOARD="0",
                   MINITRAIN_JOIN_TOKEN_FILE=str(self.token_file), MINITRAIN_STATUS="off", **extra)
        return env

    def log(self, rank: int) -> pathlib.Path:
        return self.tmp / f"pod{rank}.{self.incarnation}.{len(self.started)}.log"

    def start(self, rank: int, secret_as: str = "file") -> subprocess.Popen:
        """Start pod `rank`, its token Secret mounted as a file or given as a variable (`secret_as`)."""
        env = self.env(rank)
        if secret_as == "variable":
            del env["MINITRAIN_JOIN_TOKEN_FILE"]
            env["MINITRAIN_JOIN_TOKEN"] = self.token_file.read_text()
        self.started.append(rank)
        self.last_log = {**getattr(self, "last_log", {}), rank: self.log(rank)}
        with open(self.log(rank), "wb") as log:
            process = self.cluster.popen_in(self.cluster.hosts[rank], [sys.executable, "-m", "minitrain.launch",
                                                                       SCRIPT, *self.args],
                                            env=env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
        self.running[rank] = process
        return process

    def wait_all(self) -> dict[int, int]:
        codes = {}
        for rank, process in sorted(self.running.items()):
            try:
                codes[rank] = process.wait(timeout=RUN_S)
            except subprocess.TimeoutExpired:
                process.kill()
                codes[rank] = process.wait()
        return codes

    def kill_all(self) -> None:
        for host in self.cluster.hosts:
            self.cluster.kill_namespace_processes(host)
        for process in self.running.values():
            process.wait(timeout=30)
        self.running.clear()
        self.incarnation += 1

    def logs(self) -> str:
        return "\n".join(f"--- {path.name}\n{path.read_text(errors='replace')[-3000:]}"
                         for path in sorted(self.tmp.glob("pod*.log")))

    def ranks(self) -> list[dict]:
        return [json.loads(pathlib.Path(path).read_text()) for path in sorted(glob.glob(str(self.out / "rank_*.json")))]


def _wait_for(condition, what: str, timeout_s: float = 120, pods: Pods = None):
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"{what} did not happen within {timeout_s} s\n{pods.logs() if pods else ''}")
        time.sleep(0.1)


def _join(pods: Pods, rank: int, *, run_id: str, token_file) -> subprocess.CompletedProcess:
    """A joiner started by hand from pod `rank`'s namespace (`--join`), run to its end."""
    env = pods.env(rank, MINITRAIN_JOIN_TIMEOUT_S="30")
    return pods.cluster.run_in(pods.cluster.hosts[rank], [
        sys.executable, "-m", "minitrain.launch", "--join", f"{pods.master}:{PORT}", "--node-id", f"pod-{rank}",
        "--run-id", run_id, "--token-file", str(token_file)], env=env, capture_output=True, text=True, timeout=60,
        cwd=REPO)


def _forget_starts(pods: Pods) -> None:
    """Remove the ranks' start records, so that `pods.ranks()` holds the next incarnation's alone."""
    for record in pods.ranks():
        os.unlink(pods.out / f"rank_{record['rank']}_start_{record['start']}.json")


def _assert_trained(pods: Pods, codes: dict[int, int]) -> None:
    assert codes == {rank: 0 for rank in range(pods.pods)}, pods.logs()
    result = json.loads((pods.out / "result.json").read_text())
    assert result["metrics"]["world"] == pods.pods and result["metrics"]["params_equal"] is True
    namespaces = {record["netns"] for record in pods.ranks()}
    assert len(namespaces) == pods.pods  # one worker in every pod's own network


@pytest.mark.parametrize("netns_cluster", [3], indirect=True)
def test_a_pytorchjob_of_three_pods_trains_ddp_and_refuses_a_wrong_token_and_a_stale_run(netns_cluster, tmp_path):
    pods = Pods(netns_cluster, tmp_path, "PyTorchJob")
    pods.start(0)
    _wait_for(lambda: "to join at" in pods.last_log[0].read_text(), "pod 0's coordinator listening", pods=pods)
    wrong = tmp_path / "wrong-token"
    wrong.write_text(secrets.token_urlsafe(32))
    refused = _join(pods, 1, run_id="job-" + pods.master.replace(".", "-"), token_file=wrong)
    assert refused.returncode == 3 and "certificate derived from this agent's run token" in refused.stderr, refused.stderr
    stale = _join(pods, 2, run_id="an-earlier-job", token_file=pods.token_file)
    assert stale.returncode == 3, stale.stderr
    assert "this coordinator serves run" in stale.stderr and "'an-earlier-job'" in stale.stderr
    pods.start(1, secret_as="variable")
    pods.start(2, secret_as="variable")
    _assert_trained(pods, pods.wait_all())
    assert not any(record["token_variable"] for record in pods.ranks())  # taken out before workers start


@pytest.mark.parametrize("netns_cluster", [3], indirect=True)
def test_a_trainjob_whose_pods_straggle_trains_ddp_and_every_pod_exits_0(netns_cluster, tmp_path):
    """Pod 2 starts first and retries while pod 0 does not exist yet; pod 0 comes 10 s later, pod 1 with
    it (joins 0 and 10 s apart; 40 s, either way, is tests/e2e/test_join_straggle.py, on loopback, in the soak tier)."""
    pods = Pods(netns_cluster, tmp_path, "TrainJob")
    pods.start(2)
    time.sleep(10)  # the straggle under test, not a wait for something
    assert pods.running[2].poll() is None, pods.logs()  # still retrying: the master is not there
    pods.start(0)
    pods.start(1)
    _assert_trained(pods, pods.wait_all())


# The soak tier's: recreated pods that resume from storage are the default run's in the SIGTERM test below,
# and a SIGKILLed driver that leaves nothing in tests/e2e/test_fault_tolerance.py.
@pytest.mark.soak
@pytest.mark.parametrize("netns_cluster", [2], indirect=True)
def test_killing_pod_0_and_recreating_every_pod_resumes_from_storage(netns_cluster, tmp_path):
    pods = Pods(netns_cluster, tmp_path, "PyTorchJob", steps=12, step_s=0.5)
    pods.start(0)
    pods.start(1)
    checkpoints = pods.storage / RUN_NAME
    _wait_for(lambda: len(glob.glob(str(checkpoints / "checkpoint_*"))) >= 2, "a committed checkpoint", pods=pods)
    pods.kill_all()  # pod 0 killed; the job recreates every pod
    _forget_starts(pods)
    pods.start(0)
    pods.start(1)
    codes = pods.wait_all()
    assert codes == {0: 0, 1: 0}, pods.logs()
    starts = {record["start"] for record in pods.ranks()}
    assert len(starts) == 1 and starts.pop() >= 1, pods.ranks()  # resumed from a checkpoint, not from step 0
    assert json.loads((pods.out / "result.json").read_text())["metrics"]["step"] == 11


@pytest.mark.parametrize("netns_cluster", [2], indirect=True)
def test_a_pod_that_dies_and_is_restarted_joins_again_and_the_run_goes_on(netns_cluster, tmp_path):
    """Pod 1's processes are killed mid-run (a node lost) and the pod restarted: the run waits for its agent
    to join again (not for a backoff) and finishes on both pods, spending one failure."""
    pods = Pods(netns_cluster, tmp_path, "PyTorchJob", steps=10, step_s=0.5, max_failures=1)
    pods.start(0)
    pods.start(1)
    _wait_for(lambda: len(glob.glob(str(pods.storage / RUN_NAME / "checkpoint_*"))) >= 2, "a committed checkpoint",
              pods=pods)
    first = pods.running.pop(1)
    netns_cluster.kill_namespace_processes(netns_cluster.hosts[1])
    first.wait(timeout=30)
    pods.start(1)
    codes = pods.wait_all()
    assert codes == {0: 0, 1: 0}, pods.logs()
    result = json.loads((pods.out / "result.json").read_text())["metrics"]
    assert result["step"] == 9 and result["world"] == 2 and result["params_equal"] is True


@pytest.mark.parametrize("netns_cluster", [2], indirect=True)
def test_a_joiner_that_names_no_host_of_the_run_is_refused(netns_cluster, tmp_path):
    pods = Pods(netns_cluster, tmp_path, "PyTorchJob")
    pods.start(0)
    _wait_for(lambda: "to join at" in pods.last_log[0].read_text(), "pod 0's coordinator listening", pods=pods)
    env = pods.env(1, MINITRAIN_JOIN_TIMEOUT_S="30")
    stray = netns_cluster.run_in(netns_cluster.hosts[1], [
        sys.executable, "-m", "minitrain.launch", "--join", f"{pods.master}:{PORT}", "--node-id", "pod-7",
        "--run-id", "job-" + pods.master.replace(".", "-")], env=env, capture_output=True, text=True, timeout=60,
        cwd=REPO)
    assert stray.returncode == 3 and "'pod-7' is not one of this run's hosts (pod-0, pod-1)" in stray.stderr, \
        stray.stderr
    pods.start(1)
    _assert_trained(pods, pods.wait_all())


@pytest.mark.parametrize("netns_cluster", [2], indirect=True)
def test_a_driver_waits_for_an_agent_started_with_join_and_trains_with_it(netns_cluster, tmp_path):
    """Outside Kubernetes: the driver's ClusterConfig(launcher="join") and a joiner a person starts with
    `python -m minitrain.launch --join`, started 3 s after the driver."""
    pods = Pods(netns_cluster, tmp_path, "PyTorchJob")
    env = {key: value for key, value in pods.env(0).items() if key not in ("WORLD_SIZE", "RANK", "MASTER_ADDR",
                                                                            "MASTER_PORT")}
    address = f"{pods.master}:{PORT}"
    log = tmp_path / "driver.log"
    with open(log, "wb") as handle:
        driver = netns_cluster.popen_in(netns_cluster.hosts[0], [
            sys.executable, str(pathlib.Path(__file__).with_name("join_driver.py")), str(pods.out),
            str(pods.storage), address, "llm-7b"], env=env, stdout=handle, stderr=subprocess.STDOUT, cwd=REPO)
    try:
        time.sleep(3)  # the joiner comes later, as a person's would
        joiner = netns_cluster.run_in(netns_cluster.hosts[1], [
            sys.executable, "-m", "minitrain.launch", "--join", address, "--node-id", "gpu-a", "--run-id", "llm-7b",
            "--token-file", str(pods.token_file)], env=env, capture_output=True, text=True, timeout=RUN_S, cwd=REPO)
        assert driver.wait(timeout=RUN_S) == 0, log.read_text()
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
    assert joiner.returncode == 0, joiner.stderr
    result = json.loads((pods.out / "result.json").read_text())["metrics"]
    assert result["world"] == 2 and result["params_equal"] is True
    assert len({record["netns"] for record in pods.ranks()}) == 2


def _index(pods: Pods) -> dict:
    return json.loads((pods.storage / RUN_NAME / "checkpoint_manager_snapshot.json").read_text())


# SIGTERM to pod 1 alone is the soak tier's: a signal to one of two agents is checked in the default run
# by tests/e2e/test_preemption_signals.py, and the recreated pods' resume by "every pod" here.
@pytest.mark.parametrize("signalled", ["every pod", pytest.param("pod 1", marks=pytest.mark.soak)])
@pytest.mark.parametrize("netns_cluster", [2], indirect=True)
def test_sigterm_takes_the_preemption_path_and_recreated_pods_resume_after_the_agreed_checkpoint(
        netns_cluster, tmp_path, signalled):
    """SIGTERM to the launch process (a container's PID 1) of every pod, as Kubernetes sends on a deletion
    or an eviction, or of pod 1 alone (its node drained): one agreed checkpoint commits, and every pod
    exits 143 (retryable: `restartPolicy: ExitCode` or `OnFailure` restarts it, so the pods the resumed
    run needs come back). Recreating the pods resumes at the step after that checkpoint."""
    pods = Pods(netns_cluster, tmp_path, "PyTorchJob", steps=20, step_s=0.2)
    pods.start(0)
    pods.start(1)
    _wait_for(lambda: len(glob.glob(str(pods.storage / RUN_NAME / "checkpoint_*"))) >= 2, "a committed checkpoint",
              pods=pods)
    targets = [0, 1] if signalled == "every pod" else [1]
    signalled_at = time.monotonic()
    for rank in targets:
        pods.running[rank].send_signal(signal.SIGTERM)
    codes = pods.wait_all()
    assert codes == {0: 143, 1: 143}, pods.logs()
    assert time.monotonic() - signalled_at < GRACE_S, pods.logs()  # before Kubernetes' SIGKILL
    index = _index(pods)
    assert index["preemptions"] == 1, index
    agreed = index["latest_checkpoint_result"]["metrics"]["step"]
    computed = [json.loads((pods.out / f"done_{rank}.json").read_text())["step"] for rank in (0, 1)]
    assert computed == [agreed, agreed], (computed, agreed)  # every rank stopped at the agreed step, none past it
    assert agreed < 19
    driver_log = pods.last_log[0].read_text()
    assert "every rank checkpoints at report round" in driver_log and "second signal" not in driver_log, pods.logs()
    _forget_starts(pods)
    pods.running.clear()
    pods.incarnation += 1
    pods.start(1)  # recreated in any order
    pods.start(0)
    assert pods.wait_all() == {0: 0, 1: 0}, pods.logs()
    assert {record["start"] for record in pods.ranks()} == {agreed + 1}  # nothing lost, nothing redone
    assert json.loads((pods.out / "result.json").read_text())["metrics"]["step"] == 19
