"""`python -m minitrain.launch --join` and the Kubernetes mode as real processes: what they say and
exit with before any run exists (no token, a master that never answers), the joiner's retry loop
against a port that starts listening late, and a joiner refused because another agent serves its node."""

from __future__ import annotations

import os
import pathlib
import queue
import socket
import subprocess
import sys
import threading
import time

import pytest

from minitrain.coordinator.facts import events as ev
from minitrain.coordinator.transport.server import CoordinatorServer
from minitrain.coordinator.transport.service import CoordinatorService, Hub
from minitrain.rpc import auth
from minitrain.rpc._gen import minitrain_pb2 as pb
from minitrain.rpc._gen import minitrain_pb2_grpc as pb_grpc
from minitrain.rpc.channel import client_channel

REPO = str(pathlib.Path(__file__).resolve().parents[2])
SCRIPT = str(pathlib.Path(REPO) / "examples" / "kubernetes" / "train.py")


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MINITRAIN_JOIN", "PET_"))
           and k not in ("WORLD_SIZE", "RANK", "MASTER_ADDR", "MASTER_PORT")}
    env.update(PYTHONPATH=REPO, **extra)
    return env


def _launch(args: list, env: dict, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "minitrain.launch", *args], env=env, capture_output=True,
                          text=True, timeout=timeout, cwd=REPO)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_a_pod_without_the_token_secret_stops_with_exit_2_saying_where_to_put_it():
    for rank in ("0", "1"):
        done = _launch([SCRIPT], _env(WORLD_SIZE="2", RANK=rank, MASTER_ADDR="job-master-0", MASTER_PORT="29500"))
        assert done.returncode == 2, done.stderr
        assert "MINITRAIN_JOIN_TOKEN_FILE" in done.stderr and "does not invent one" in done.stderr


def test_a_token_on_the_command_line_is_not_an_option():
    done = _launch(["--join", "h:1", "--node-id", "a", "--run-id", "r", "--token", "x" * 40], _env())
    assert done.returncode == 2 and "--token" in done.stderr


def test_a_joiner_whose_master_never_answers_exits_4_after_its_timeout(tmp_path):
    token = tmp_path / "token"
    token.write_text("k" * 43)
    done = _launch(["--join", f"127.0.0.1:{_free_port()}", "--node-id", "pod-1", "--run-id", "job",
                    "--token-file", str(token)], _env(MINITRAIN_JOIN_TIMEOUT_S="1.5"))
    assert done.returncode == 4, done.stderr
    assert "no coordinator at 127.0.0.1:" in done.stderr and "nothing answers" in done.stderr


def test_a_joiner_started_before_its_master_waits_for_it(tmp_path):
    """The joiner retries until the port listens; then it speaks gRPC to what it found (here a bare
    listener that says nothing, so its lease ends: exit 1, "went away"), not a refusal or a timeout."""
    token = tmp_path / "token"
    token.write_text("k" * 43)
    port = _free_port()
    joiner = subprocess.Popen([sys.executable, "-m", "minitrain.launch", "--join", f"127.0.0.1:{port}",
                               "--node-id", "pod-1", "--run-id", "job", "--token-file", str(token)],
                              env=_env(MINITRAIN_JOIN_TIMEOUT_S="60"), stderr=subprocess.PIPE, text=True, cwd=REPO)
    listener = socket.socket()
    try:
        time.sleep(2)  # the straggle under test: the joiner retries meanwhile
        assert joiner.poll() is None
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", port))
        listener.listen()
        _, stderr = joiner.communicate(timeout=60)
    finally:
        listener.close()
        if joiner.poll() is None:
            joiner.kill()
            joiner.wait()
    assert joiner.returncode == 1, stderr
    assert "went away" in stderr and "no coordinator" not in stderr


def test_a_plaintext_joiner_of_a_tls_run_exits_3_naming_the_mismatch(tmp_path):
    """A joined run whose address is not loopback serves TLS on every interface; a joiner that dials it
    on loopback speaks plaintext and can never connect. It exits 3 (not retryable) saying so and what to
    dial, not 1 ("went away", which Kubernetes retries forever)."""
    import queue

    from minitrain.coordinator.transport.server import CoordinatorServer
    from minitrain.coordinator.transport.service import CoordinatorService, Hub
    from minitrain.rpc import tls

    secret = "k" * 43
    token = tmp_path / "token"
    token.write_text(secret)
    hub = Hub()
    service = CoordinatorService("job", queue.SimpleQueue(), hub, None, lease_timeout_s=60.0, node_ids=("pod-1",))
    with CoordinatorServer(service, hub, secret, hosts=("0.0.0.0",),
                           identity=tls.join_identity(secret, "job-master-0")) as server:
        port = server.address.rpartition(":")[2]
        done = _launch(["--join", f"127.0.0.1:{port}", "--node-id", "pod-1", "--run-id", "job",
                        "--token-file", str(token)], _env(MINITRAIN_JOIN_TIMEOUT_S="10"))
    assert done.returncode == 3, done.stderr
    assert f"the coordinator at 127.0.0.1:{port} serves TLS" in done.stderr and "MASTER_ADDR" in done.stderr
    assert "went away" not in done.stderr


def _address_off_loopback() -> str:
    """An address of this machine that is not loopback (the route's source address), or "" when none."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("10.255.255.255", 1))
            address = probe.getsockname()[0]
        except OSError:
            return ""
    return "" if address.startswith("127.") else address


def test_a_tls_joiner_of_a_plaintext_listener_exits_3_naming_the_mismatch(tmp_path):
    """The reverse mismatch: a joiner dials a non-loopback address (so over TLS) where what answers does not
    speak TLS (a plaintext coordinator reached through a forward, a name that resolves to this machine). It
    exits 3 at once, saying so and what to dial, instead of retrying until its timeout and exiting 4
    ("nothing answers")."""
    address = _address_off_loopback()
    if not address:
        pytest.skip("this machine has no address off loopback to listen on")
    token = tmp_path / "token"
    token.write_text("k" * 43)
    listener = socket.socket()
    listener.bind((address, 0))
    listener.listen()
    port = listener.getsockname()[1]

    def answer_in_plaintext() -> None:  # as a plaintext HTTP/2 server answers a TLS hello: not TLS bytes
        while True:
            try:
                connection, _ = listener.accept()
            except OSError:
                return
            with connection:
                connection.recv(4096)
                connection.sendall(b"\x00\x00\x12\x04\x00\x00\x00\x00\x00" + b"\x00" * 18)

    threading.Thread(target=answer_in_plaintext, daemon=True).start()
    try:
        done = _launch(["--join", f"{address}:{port}", "--node-id", "pod-1", "--run-id", "job",
                        "--token-file", str(token)], _env(MINITRAIN_JOIN_TIMEOUT_S="5"))
    finally:
        listener.close()
    assert done.returncode == 3, done.stderr
    assert f"the coordinator at {address}:{port} does not speak TLS" in done.stderr and "JoinConfig" in done.stderr


class _NoLogs:
    def write(self, *args) -> None:
        pass

    def open(self, *args) -> None:
        pass


def test_a_joiner_for_a_node_another_agent_serves_exits_3_naming_that_agent(tmp_path):
    """Two pods sharing one Secret and one node id: the second joiner is refused at its hello and exits 3
    with the coordinator's reason; the first agent keeps the node (its stream stays open)."""
    token = "k" * 43
    (tmp_path / "token").write_text(token)
    events: queue.SimpleQueue = queue.SimpleQueue()
    hub = Hub()
    server = CoordinatorServer(CoordinatorService("job", events, hub, _NoLogs(), lease_timeout_s=60.0),
                               hub, token).start()
    channel = client_channel(server.address)
    hold = threading.Event()

    def first_agent():  # says hello as pod-1, then stays (its stream open) until the test ends
        yield pb.AgentMessage(run_id="job", node_id="pod-1", sent_at=time.time(),
                              hello=pb.AgentHello(hostname="host-a", pid=7, cpus=1, memory_bytes=1 << 30))
        hold.wait()

    call = pb_grpc.CoordinatorStub(channel).AgentStream(first_agent(), metadata=auth.call_metadata(token),
                                                        wait_for_ready=True)
    try:
        assert isinstance(events.get(timeout=30), ev.AgentConnected)
        done = _launch(["--join", server.address, "--node-id", "pod-1", "--run-id", "job",
                        "--token-file", str(tmp_path / "token")], _env())
        assert done.returncode == 3, done.stderr
        assert ("minitrain.launch --join: the coordinator refused this agent: node 'pod-1' is already served by "
                "the agent on host 'host-a'") in done.stderr
        assert hub.agent_ids() == ["pod-1"] and events.empty()  # the first one is still the node's agent
    finally:
        hold.set()
        call.cancel()
        channel.close()
        server.stop()
