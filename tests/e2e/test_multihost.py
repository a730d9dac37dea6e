"""Multi-host runs over real SSH: hosts are network namespaces on a bridge, each with its own IP and
sshd (scripts/netns_cluster.py). Gloo traffic crosses the veth links; the coordinator runs here in
the root namespace, bound to the bridge address.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
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

pytestmark = [pytest.mark.e2e, pytest.mark.cluster]
ROOT = pathlib.Path(__file__).resolve().parents[2]


def _init(cluster, hosts=None, slots: int = 2) -> None:
    """minitrain.init() for the fake cluster (its throwaway key, its known_hosts, strictly)."""
    workdir = pathlib.Path(cluster.workdir)
    minitrain.init(hosts=[f"{h.ip}:{slots}" for h in (hosts or cluster.hosts)], ssh_user="root",
                   ssh_identity_file=str(workdir / "id_ed25519"), ssh_known_hosts_file=str(workdir / "known_hosts"),
                   ssh_options=("IdentitiesOnly=yes", "GlobalKnownHostsFile=/dev/null"))


@pytest.fixture(autouse=True)
def _forget_cluster():
    yield
    minitrain.shutdown()


def _minitrain_processes(also_ssh: bool = False) -> list[psutil.Process]:
    found = []
    for process in psutil.process_iter(["cmdline", "name"]):
        cmdline = " ".join(process.info["cmdline"] or [])
        if "minitrain.agent" in cmdline or "minitrain.worker" in cmdline or (
                also_ssh and process.info["name"] == "ssh"):
            found.append(process)
    return found


def _record(config) -> None:
    context = minitrain.get_context()
    info = {"rank": context.get_world_rank(), "local_rank": context.get_local_rank(),
            "node_rank": context.get_node_rank(), "world": context.get_world_size(),
            "host_ip": os.environ.get("MASTER_ADDR"),
            "ifname": os.environ.get("GLOO_SOCKET_IFNAME"), "pid": os.getpid(), "agent": os.getppid(),
            "forwarded": {k: os.environ.get(k) for k in ("NCCL_DEBUG", "MT_FORWARDED", "MT_NOT_FORWARDED")},
            "netns": os.readlink(f"/proc/{os.getpid()}/ns/net")}
    with open(os.path.join(config["out"], f"rank_{info['rank']}.json"), "w") as handle:
        json.dump(info, handle)


def train_across_hosts(config):
    import torch
    import torch.distributed as dist

    _record(config)
    total = torch.tensor([float(minitrain.get_context().get_world_rank())])
    dist.all_reduce(total)
    for step in range(config.get("steps", 3)):
        dist.all_reduce(torch.ones(1))
        minitrain.report({"sum": total.item(), "step": step})
        time.sleep(config.get("step_s", 0))


def _fit(tmp_path, fn=train_across_hosts, num_workers=4, **config):
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    failure = FailureConfig(max_failures=config.pop("max_failures", 0))
    return TorchTrainer(fn, train_loop_config={"out": str(out), **config},
                        scaling_config=ScalingConfig(num_workers=num_workers),
                        run_config=RunConfig(name="mh", storage_path=str(tmp_path / "results"),
                                             failure_config=failure)).fit()


def test_training_across_two_hosts(netns_cluster, tmp_path, monkeypatch):
    _init(netns_cluster)
    minitrain.init(hosts=[f"{h.ip}:2" for h in netns_cluster.hosts], ssh_user="root",
                   ssh_identity_file=str(pathlib.Path(netns_cluster.workdir) / "id_ed25519"),
                   ssh_known_hosts_file=str(pathlib.Path(netns_cluster.workdir) / "known_hosts"),
                   ssh_options=("IdentitiesOnly=yes", "GlobalKnownHostsFile=/dev/null"),
                   env_vars_to_forward=("MT_FORWARDED",))
    monkeypatch.setenv("NCCL_DEBUG", "WARN")  # NCCL_*/GLOO_*/CUDA_* travel to every worker
    monkeypatch.setenv("MT_FORWARDED", "yes")  # listed in env_vars_to_forward
    monkeypatch.setenv("MT_NOT_FORWARDED", "no")  # neither: stays on the driver
    result = _fit(tmp_path)

    assert result.metrics == {"sum": 6.0, "step": 2}  # 0+1+2+3 all-reduced across both hosts
    ranks = {json.load(open(p))["rank"]: json.load(open(p)) for p in (tmp_path / "out").glob("rank_*.json")}
    assert sorted(ranks) == [0, 1, 2, 3]
    h0, h1 = netns_cluster.hosts
    assert [ranks[r]["node_rank"] for r in range(4)] == [0, 0, 1, 1]
    assert [ranks[r]["local_rank"] for r in range(4)] == [0, 1, 0, 1]
    assert ranks[0]["netns"] == ranks[1]["netns"] != ranks[2]["netns"] == ranks[3]["netns"]
    assert {info["host_ip"] for info in ranks.values()} == {h0.ip}  # MASTER_ADDR: rank 0's host address
    assert {info["ifname"] for info in ranks.values()} == {"eth0"}  # the interface of that address
    for info in ranks.values():
        assert info["forwarded"] == {"NCCL_DEBUG": "WARN", "MT_FORWARDED": "yes", "MT_NOT_FORWARDED": None}
    log = (tmp_path / "results" / "mh" / "logs" / "attempt_0" / "rank_3.log")
    assert log.exists()
    assert wait_until_gone([p for info in ranks.values() for p in (info["pid"], info["agent"])], 15) == []


def test_the_token_is_on_no_command_line_and_in_no_environment(netns_cluster, tmp_path):
    import threading

    _init(netns_cluster)
    seen: list[str] = []
    stop = threading.Event()

    def watch():  # every process of the run, as it lives: command lines and environments
        while not stop.is_set():
            for process in _minitrain_processes(also_ssh=True):
                try:
                    seen.append(" ".join(process.cmdline()))
                    seen.append(open(f"/proc/{process.pid}/environ", "rb").read().decode(errors="replace"))
                except (psutil.Error, OSError):
                    pass
            time.sleep(0.05)

    from minitrain.rpc import auth

    tokens = []
    original = auth.new_token

    def capture():
        tokens.append(original())
        return tokens[-1]

    auth.new_token = capture
    import minitrain.coordinator.run as run_module

    run_module.new_token = capture
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        _fit(tmp_path, steps=10, step_s=0.1)
    finally:
        stop.set()
        watcher.join(timeout=10)
        auth.new_token = original
        run_module.new_token = original
    assert tokens and len(seen) > 10, "the watcher saw nothing: the test would prove nothing"
    assert any("minitrain.agent" in text for text in seen) and any("minitrain.worker" in text for text in seen)
    assert not any(tokens[0] in text for text in seen)


def test_an_unreachable_host_fails_pre_flight_naming_it(netns_cluster, tmp_path):
    h0, h1 = netns_cluster.hosts
    netns_cluster.cut(h1)
    _init(netns_cluster)
    with pytest.raises(minitrain.LaunchError) as caught:
        _fit(tmp_path)
    text = str(caught.value)
    assert h1.ip in text and "ssh" in text and h0.ip not in text.split("\n", 1)[-1]
    ours = [p for p in psutil.Process().children(recursive=True) if "minitrain" in " ".join(p.cmdline())]
    assert ours == [] and not (tmp_path / "results" / "mh" / "logs").exists()  # nothing started


def train_kills_agent_on_host_1(config):
    import torch.distributed as dist

    _record(config)
    dist.barrier()
    context = minitrain.get_context()
    if context.get_node_rank() == 1 and context.get_local_rank() == 0 and not os.path.exists(config["marker"]):
        open(config["marker"], "w").close()
        os.kill(os.getppid(), signal.SIGKILL)  # this worker's agent, on host h1
        time.sleep(600)
    for step in range(3):
        dist.barrier()
        minitrain.report({"step": step, "world": context.get_world_size()})


def test_sigkill_of_one_hosts_agent_with_no_room_left_fails_naming_the_host(netns_cluster, tmp_path):
    h0, h1 = netns_cluster.hosts
    _init(netns_cluster)
    with pytest.raises(minitrain.WorkerGroupError) as caught:
        _fit(tmp_path, fn=train_kills_agent_on_host_1, marker=str(tmp_path / "killed"), max_failures=1)
    # h1 is lost and kept out (backoff); h0 alone (2 slots) cannot hold 4 workers: no restart.
    text = str(caught.value)
    assert "NodeLostError" in text and h1.ip in text and "No restart was possible" in text, text
    assert any(isinstance(e, minitrain.NodeLostError) for e in caught.value.worker_failures.values())
    pids = [json.load(open(p))[key] for p in (tmp_path / "out").glob("rank_*.json") for key in ("pid", "agent")]
    assert wait_until_gone(pids, 20) == []


def train_checkpoint_then_lose_host_1(config):
    import tempfile

    import torch.distributed as dist

    context = minitrain.get_context()
    rank = context.get_world_rank()
    checkpoint = minitrain.get_checkpoint()
    if checkpoint is not None:  # the restart: what it resumes from, and where it reads it
        with checkpoint.as_directory() as directory:
            files = {name: open(os.path.join(directory, name)).read() for name in sorted(os.listdir(directory))}
        with open(os.path.join(config["out"], f"resumed_{rank}.json"), "w") as handle:
            json.dump({"path": checkpoint.path, "files": files, "host": context.get_node_rank()}, handle)
        minitrain.report({"resumed": True})
        return
    with tempfile.TemporaryDirectory() as directory:
        with open(os.path.join(directory, f"rank{rank}.txt"), "w") as handle:
            handle.write(f"written by rank {rank} on host {context.get_node_rank()}")
        minitrain.report({"step": 0}, checkpoint=minitrain.Checkpoint.from_directory(directory))
    # report() returned on this rank: the round is committed in memory, so replicated to the other host.
    if context.get_node_rank() == 1 and not os.path.exists(config["marker"]):
        open(config["marker"], "w").close()
        os.kill(os.getppid(), signal.SIGKILL)  # this worker's agent, with host h1's memory tier
        time.sleep(600)
    dist.barrier()  # held here until the attempt is stopped
    time.sleep(600)


def test_a_lost_host_s_part_of_a_checkpoint_is_restored_from_its_replica(netns_cluster, tmp_path):
    """One rank per host; the round is committed in memory (replicated), then h1's agent is SIGKILLed with
    its tier. The restart, on h0 alone, resumes from that round, read from h0's memory tier: rank 1's part
    comes from the replica h1 had made there, and the round still ends up on storage, whole."""
    h0, h1 = netns_cluster.hosts
    _init(netns_cluster)
    out = tmp_path / "out"
    out.mkdir()
    result = TorchTrainer(
        train_checkpoint_then_lose_host_1,
        train_loop_config={"out": str(out), "marker": str(tmp_path / "killed")},
        scaling_config=ScalingConfig(num_workers=2, placement_strategy="SPREAD"),
        run_config=RunConfig(name="replica", storage_path=str(tmp_path / "results"),
                             failure_config=FailureConfig(max_failures=1))).fit()
    assert (tmp_path / "killed").exists()
    assert result.metrics == {"resumed": True}
    expected = {f"rank{r}.txt": f"written by rank {r} on host {r}" for r in range(2)}
    h0_tiers = netns_cluster.tmp_dir(h0)  # where h0's agent keeps its memory tier (its sshd's SetEnv)
    for rank in range(2):
        resumed = json.load(open(out / f"resumed_{rank}.json"))
        assert resumed["host"] == 0 and resumed["files"] == expected
        assert resumed["path"].startswith(h0_tiers + "/minitrain-tier-"), resumed["path"]  # memory, not storage
    committed = tmp_path / "results" / "replica" / "checkpoint_000000"
    assert {name: (committed / name).read_text() for name in os.listdir(committed)} == expected


@pytest.mark.parametrize("netns_cluster", [3], indirect=True)
def test_cutting_a_hosts_link_mid_training_finishes_on_the_other_two(netns_cluster, tmp_path):
    h0, h1, h2 = netns_cluster.hosts
    _init(netns_cluster)
    marker = tmp_path / "cut"

    def cut_when_training_runs():
        deadline = time.monotonic() + 120
        while not (tmp_path / "out" / "rank_3.json").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        netns_cluster.cut(h1)
        marker.write_text(repr(time.time()))

    import threading

    cutter = threading.Thread(target=cut_when_training_runs, daemon=True)
    cutter.start()
    try:
        result = _fit(tmp_path, steps=40, step_s=0.1, max_failures=1)
    finally:
        cutter.join(timeout=5)
        netns_cluster.restore(h1, wait=False)
    assert marker.exists()
    assert result.metrics["sum"] == 6.0 and result.metrics["step"] == 39
    # The last attempt ran on h0 and h2 only.
    log_dirs = sorted((tmp_path / "results" / "mh" / "logs").iterdir())
    assert len(log_dirs) == 2


DRIVER = textwrap.dedent("""
    import json, os, sys, time
    import minitrain
    from minitrain import RunConfig, ScalingConfig
    from minitrain.torch import TorchTrainer

    def train(config):
        with open(os.path.join(config["out"], f"pid_{os.getpid()}"), "w"):
            pass
        with open(os.path.join(config["out"], f"pid_{os.getppid()}"), "w"):
            pass
        while True:
            time.sleep(0.1)

    if __name__ == "__main__":
        settings = json.loads(sys.argv[1])
        minitrain.init(**settings["init"])
        TorchTrainer(train, train_loop_config={"out": settings["out"]}, scaling_config=ScalingConfig(num_workers=4),
                     run_config=RunConfig(name="killed", storage_path=settings["storage"])).fit()
""")


def test_sigkill_of_the_driver_leaves_no_process_on_any_host(netns_cluster, tmp_path):
    workdir = pathlib.Path(netns_cluster.workdir)
    out = tmp_path / "out"
    out.mkdir()
    settings = {"out": str(out), "storage": str(tmp_path / "results"), "init": {
        "hosts": [f"{h.ip}:2" for h in netns_cluster.hosts], "ssh_user": "root",
        "ssh_identity_file": str(workdir / "id_ed25519"), "ssh_known_hosts_file": str(workdir / "known_hosts"),
        "ssh_options": ["IdentitiesOnly=yes", "GlobalKnownHostsFile=/dev/null"]}}
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    driver = subprocess.Popen([sys.executable, str(script), json.dumps(settings)], cwd=tmp_path,
                              env={**os.environ, "PYTHONPATH": str(ROOT)}, start_new_session=True,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while len(list(out.glob("pid_*"))) < 6 and time.monotonic() < deadline:  # 4 workers + 2 agents
            assert driver.poll() is None, "the driver exited early"
            time.sleep(0.05)
        pids = [int(p.name.split("_")[1]) for p in out.glob("pid_*")]
        assert len(pids) == 6
        os.kill(driver.pid, signal.SIGKILL)
        driver.wait()
        # Each agent sees its lease break (the connection closes) and stops its workers.
        assert wait_until_gone(pids, timeout=20) == [], "a process outlived the driver on a host"
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait()


def train_until_probed(config):
    """Rank 0 notes the addresses its process listens on (its TCPStore among them); every rank keeps
    training until the test has probed the coordinator."""
    import torch.distributed as dist

    _record(config)
    if minitrain.get_context().get_world_rank() == 0:
        listening = [[c.laddr.ip, c.laddr.port] for c in psutil.Process().net_connections("inet")
                     if c.status == psutil.CONN_LISTEN]
        with open(os.path.join(config["out"], "listening.json"), "w") as handle:
            json.dump({"listening": listening, "store_port": int(os.environ["MASTER_PORT"])}, handle)
    deadline = time.monotonic() + 120
    while not os.path.exists(config["probed"]) and time.monotonic() < deadline:
        time.sleep(0.05)
    dist.barrier()
    minitrain.report({"probed": os.path.exists(config["probed"])})


def _coordinator_address(timeout_s: float = 120) -> str:
    """The address the agents dial, from an ssh command line of this test's run (it is public)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for process in psutil.Process().children(recursive=True):
            try:
                words = " ".join(process.cmdline()).split()
            except psutil.Error:
                continue
            if "minitrain.agent" in words and "--coordinator" in words:
                return words[words.index("--coordinator") + 1].strip("'")
        time.sleep(0.05)
    raise AssertionError("no agent command line seen")


def _probe(address: str, credentials=None) -> "grpc.StatusCode":
    """The status of one token-less WorkerStream call to `address` (plaintext without credentials)."""
    import grpc

    from minitrain.rpc._gen import minitrain_pb2 as pb
    from minitrain.rpc._gen import minitrain_pb2_grpc as pb_grpc

    channel = (grpc.secure_channel(address, credentials) if credentials is not None
               else grpc.insecure_channel(address))
    with channel:
        call = pb_grpc.CoordinatorStub(channel).WorkerStream(iter([pb.WorkerMessage(run_id="probe")]), timeout=10)
        try:
            list(call)
        except grpc.RpcError as error:
            return error.code()
    raise AssertionError("a token-less call was answered")


def test_traffic_between_hosts_is_tls_pinned_to_the_runs_certificate(netns_cluster, tmp_path, monkeypatch):
    import socket
    import threading

    import grpc

    from minitrain.rpc import tls

    h0, _ = netns_cluster.hosts
    _init(netns_cluster)
    made = []
    real_identity = tls.new_run_identity
    monkeypatch.setattr(tls, "new_run_identity", lambda hosts: made.append(real_identity(hosts)) or made[-1])
    probed = tmp_path / "probed"
    findings: dict = {}

    def probe():
        try:
            address = _coordinator_address()
            host, port = address.rsplit(":", 1)
            findings["address"] = address
            findings["plaintext"] = _probe(address)
            findings["other_run"] = _probe(address, tls.channel_credentials(real_identity([host]).cert_pem))
            findings["system_roots"] = _probe(address, grpc.ssl_channel_credentials())
            findings["this_run"] = _probe(address, tls.channel_credentials(made[0].cert_pem))
            with socket.create_connection((host, int(port)), timeout=10) as raw:
                raw.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0]))
                raw.settimeout(10)
                findings["preface_reply"] = raw.recv(64)
        finally:
            probed.write_text("done")

    prober = threading.Thread(target=probe, daemon=True)
    prober.start()
    result = _fit(tmp_path, fn=train_until_probed, probed=str(probed))
    prober.join(timeout=30)

    assert result.metrics == {"probed": True}
    assert len(made) == 1 and b"PRIVATE KEY" not in made[0].cert_pem
    host = findings["address"].rsplit(":", 1)[0]
    assert tls.uses_tls(host) and host == netns_cluster.driver_ip  # the bridge address, not loopback
    # The server speaks only TLS there, and only with this run's key: a plaintext client, a client pinned
    # to another run's certificate and one trusting the system's CAs all fail before any RPC.
    assert findings["plaintext"] == findings["other_run"] == findings["system_roots"] == grpc.StatusCode.UNAVAILABLE
    # The same probe pinned to this run's certificate gets through TLS and is refused by the token check.
    assert findings["this_run"] == grpc.StatusCode.UNAUTHENTICATED
    # Raw HTTP/2 gets no HTTP/2 answer: the connection closes, or a TLS alert record (type 21) comes back.
    reply = findings["preface_reply"]
    assert reply == b"" or reply[0] == 21, reply
    # Rank 0's TCPStore listens on its host's rendezvous address only, never on every interface.
    listening = json.loads((tmp_path / "out" / "listening.json").read_text())
    store = [ip for ip, port in listening["listening"] if port == listening["store_port"]]
    assert store == [h0.ip], listening
    assert not {ip for ip, _ in listening["listening"]} & {"0.0.0.0", "::"}, listening
