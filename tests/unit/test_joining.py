"""Agents that join: the Kubernetes variables, the run token's sources, the derived TLS identity, the
retry loop of a joiner (minitrain.hosts.joining, minitrain.hosts.kubernetes_env, minitrain.agent.join)."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from minitrain.agent import join as joiner
from minitrain.errors import ConfigError
from minitrain.hosts.cluster import ClusterConfig, HostSpec
from minitrain.hosts.joining import JoinConfig, read_token
from minitrain.hosts.kubernetes_env import pod_from_environment
from minitrain.launch.join_cli import kubernetes_cluster
from minitrain.rpc import tls

TOKEN = "t" * 43


# ---------------------------------------------------------------------------------- Kubernetes variables

def test_a_pytorchjob_pod_is_read_from_its_four_variables():
    pod = pod_from_environment({"WORLD_SIZE": "3", "RANK": "2", "MASTER_ADDR": "mnist-master-0",
                                "MASTER_PORT": "23456"})
    assert (pod.flavor, pod.pods, pod.rank, pod.master_host, pod.master_port) == \
        ("PyTorchJob", 3, 2, "mnist-master-0", 23456)
    assert pod.job_name == "mnist" and pod.node_id == "pod-2" and pod.address == "mnist-master-0:23456"


def test_a_trainjob_pod_is_read_from_pet_variables_which_win_over_pytorchjobs():
    pod = pod_from_environment({"PET_NNODES": "4", "PET_NODE_RANK": "0", "PET_MASTER_ADDR": "llm-node-0-0.llm",
                                "PET_MASTER_PORT": "29500", "WORLD_SIZE": "8", "RANK": "5",
                                "MASTER_ADDR": "x", "MASTER_PORT": "1"})
    assert (pod.flavor, pod.pods, pod.rank, pod.job_name, pod.address, pod.slots) == \
        ("TrainJob", 4, 0, "llm", "llm-node-0-0.llm:29500", None)


@pytest.mark.parametrize("value, slots", [("8", 8), ("auto", None), ("gpu", None), ("0", None)])
def test_a_trainjobs_processes_per_node_caps_the_workers_of_each_pod(value, slots):
    pod = pod_from_environment({"PET_NNODES": "2", "PET_NODE_RANK": "0", "PET_MASTER_ADDR": "j-node-0-0.j",
                                "PET_MASTER_PORT": "29500", "PET_NPROC_PER_NODE": value})
    assert pod.slots == slots
    assert {host.slots for host in kubernetes_cluster(pod, TOKEN).hosts} == {slots}


def test_an_address_without_a_name_gives_a_job_name_from_the_address():
    pod = pod_from_environment({"WORLD_SIZE": "2", "RANK": "0", "MASTER_ADDR": "10.1.2.3", "MASTER_PORT": "9"})
    assert pod.job_name == "job-10-1-2-3"


@pytest.mark.parametrize("environ", [{}, {"MASTER_ADDR": "h", "MASTER_PORT": "1"},
                                     {"PET_NNODES": "2", "PET_NODE_RANK": "1", "PET_MASTER_ADDR": " "}])
def test_an_incomplete_contract_is_no_pod(environ):
    assert pod_from_environment({**environ, "PET_MASTER_PORT": "1"} if "PET_NNODES" in environ else environ) is None


@pytest.mark.parametrize("name, value, words", [("RANK", "3", "not below WORLD_SIZE=3"),
                                                ("RANK", "-1", "integer >= 0"),
                                                ("WORLD_SIZE", "0", "integer >= 1"),
                                                ("MASTER_PORT", "70000", "not a port")])
def test_a_malformed_variable_is_named_with_its_value(name, value, words):
    environ = {"WORLD_SIZE": "3", "RANK": "1", "MASTER_ADDR": "a-master-0", "MASTER_PORT": "1234", name: value}
    with pytest.raises(ConfigError, match=name) as error:
        pod_from_environment(environ)
    assert words in str(error.value)


def test_pod_zeros_cluster_is_itself_and_the_pods_that_join():
    pod = pod_from_environment({"WORLD_SIZE": "3", "RANK": "0", "MASTER_ADDR": "j-master-0", "MASTER_PORT": "80"})
    cluster = kubernetes_cluster(pod, TOKEN)
    assert [(h.name, h.local) for h in cluster.hosts] == [("pod-0", True), ("pod-1", False), ("pod-2", False)]
    assert cluster.launcher == "join" and cluster.join.run_id == "j" and cluster.join.port == 80
    assert TOKEN not in repr(cluster)


# ---------------------------------------------------------------------------------- the token

@pytest.mark.parametrize(("host", "bound"), [("mnist-master-0", "0.0.0.0"), ("10.1.2.3", "0.0.0.0"),
                                             ("127.0.0.1", "127.0.0.1"), ("localhost", "localhost")])
def test_a_joined_coordinator_serves_tls_on_every_interface_but_a_loopback_address_alone_in_plaintext(host, bound):
    """Agents dial loopback without TLS (tls.uses_tls): a coordinator serving TLS there lost its own agent."""
    from minitrain.hosts.joining import JoinLauncher

    cluster = kubernetes_cluster(pod_from_environment({"WORLD_SIZE": "2", "RANK": "0", "MASTER_ADDR": host,
                                                       "MASTER_PORT": "29500"}), TOKEN)
    launcher = JoinLauncher(cluster, local_launcher=None)
    assert launcher.bind_hosts() == (bound,) and launcher.bind_host_for("pod-0") == bound
    assert tls.uses_tls(bound) == tls.uses_tls(host)  # the server and its agents agree


def test_the_token_comes_from_the_file_first_then_the_environment(tmp_path):
    path = tmp_path / "token"
    path.write_text("f" * 40 + "\n")
    environ = {"MINITRAIN_JOIN_TOKEN": "e" * 40, "MINITRAIN_JOIN_TOKEN_FILE": str(path)}
    assert read_token(environ=environ) == "f" * 40
    assert read_token(environ={"MINITRAIN_JOIN_TOKEN": "e" * 40}) == "e" * 40
    assert read_token(str(path), environ={"MINITRAIN_JOIN_TOKEN": "e" * 40}) == "f" * 40


def test_no_token_is_refused_rather_than_invented():
    with pytest.raises(ConfigError, match="does not invent one"):
        read_token(environ={})


def test_a_short_token_or_a_missing_file_is_refused_naming_the_source(tmp_path):
    with pytest.raises(ConfigError, match="MINITRAIN_JOIN_TOKEN must be a run token of at least 32"):
        read_token(environ={"MINITRAIN_JOIN_TOKEN": "secret"})
    with pytest.raises(ConfigError, match="cannot read the token file"):
        read_token(str(tmp_path / "absent"), environ={})


def test_join_config_checks_its_fields():
    with pytest.raises(ConfigError, match="JoinConfig.address must be HOST:PORT"):
        JoinConfig(address="nohostport", run_id="r", token=TOKEN)
    with pytest.raises(ConfigError, match="JoinConfig.run_id"):
        JoinConfig(address="h:1", run_id="has space", token=TOKEN)
    with pytest.raises(ConfigError, match="JoinConfig.token"):
        JoinConfig(address="h:1", run_id="r", token="short")
    with pytest.raises(ConfigError, match="ClusterConfig.join must be a JoinConfig exactly when launcher='join'"):
        ClusterConfig(hosts=(HostSpec("a"),), launcher="join")


# ---------------------------------------------------------------------------------- the derived identity

def test_every_host_derives_the_same_certificate_from_the_token_and_the_dialled_host():
    first, again = tls.join_identity(TOKEN, "job-master-0"), tls.join_identity(TOKEN, "job-master-0")
    assert first.cert_pem == again.cert_pem and first.key_pem == again.key_pem
    assert tls.join_identity("u" * 43, "job-master-0").cert_pem != first.cert_pem  # another run's token
    assert tls.join_identity(TOKEN, "other-master-0").cert_pem != first.cert_pem


def test_the_derived_certificate_names_the_dialled_host():
    from cryptography import x509

    cert = x509.load_pem_x509_certificate(tls.join_identity(TOKEN, "10.0.0.7").cert_pem)
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in names.get_values_for_type(x509.IPAddress)] == ["10.0.0.7"]


# ---------------------------------------------------------------------------------- the retry loop

class _Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds


def test_a_master_whose_name_resolves_only_after_40_seconds_is_still_reached():
    clock, tries = _Clock(), []

    def connect(host, port, timeout):
        tries.append(clock.now)
        if clock.now < 40:
            raise socket.gaierror(-2, "Name or service not known")

    assert joiner.wait_for_coordinator("job-master-0", 1, 600, connect=connect, clock=clock,
                                       sleep=clock.sleep) is None
    assert 40 <= tries[-1] <= 40 + joiner.RETRY_MAX_S + 1e-9  # found within one pause of appearing
    assert all(b - a <= joiner.RETRY_MAX_S + 1e-9 for a, b in zip(tries, tries[1:]))


def test_the_loop_gives_up_at_its_deadline_saying_what_failed_last():
    clock = _Clock()

    def connect(host, port, timeout):
        raise ConnectionRefusedError(111, "Connection refused")

    why = joiner.wait_for_coordinator("h", 7, 30, connect=connect, clock=clock, sleep=clock.sleep)
    assert "nothing answers at h:7" in why and "in 30 s" in why and clock.now == pytest.approx(30)


def test_a_real_listener_that_appears_late_is_found():
    """Process-level: the real connect on loopback, a port that starts listening after a while."""
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    tried = threading.Event()
    original = joiner._connect_once

    def connect(host, port_, timeout):
        try:
            original(host, port_, timeout)
        finally:
            tried.set()

    def listen_later():
        tried.wait(10)  # the joiner has failed once: the listener appears only now
        listener.bind(("127.0.0.1", port))
        listener.listen()

    thread = threading.Thread(target=listen_later)
    thread.start()
    try:
        assert joiner.wait_for_coordinator("127.0.0.1", port, 30, connect=connect) is None
    finally:
        thread.join()
        listener.close()


@pytest.mark.parametrize("reason, words", [
    ("the connection broke: UNAUTHENTICATED (missing or wrong minitrain run token)", "wrong token"),
    ("the connection broke: FAILED_PRECONDITION (this coordinator serves run 'b', not 'a' (that run is over))",
     "refused this agent: this coordinator serves run 'b', not 'a' (that run is over)"),
    ("the connection broke: UNAVAILABLE", None)])
def test_a_refusal_is_told_apart_from_a_lost_coordinator(reason, words):
    told = joiner.refusal(reason)
    assert (told is None) if words is None else (words in told)


def _coordinator(hosts: tuple, identity=None):
    import queue

    from minitrain.coordinator.transport.server import CoordinatorServer
    from minitrain.coordinator.transport.service import CoordinatorService, Hub

    hub = Hub()
    service = CoordinatorService("job", queue.SimpleQueue(), hub, None, lease_timeout_s=60.0)
    return CoordinatorServer(service, hub, TOKEN, hosts=hosts, identity=identity)


def test_a_tls_coordinator_is_told_from_a_plaintext_one():
    """What a plaintext joiner asks after its stream failed: a joined run's coordinator serving TLS on
    every interface answers the TLS probe on loopback too; a loopback one (plaintext) and a port with
    nothing behind it do not."""
    with _coordinator(("0.0.0.0",), tls.join_identity(TOKEN, "job-master-0")) as served:
        assert joiner.speaks_tls("127.0.0.1", int(served.address.rpartition(":")[2]))
    with _coordinator(("127.0.0.1",)) as plaintext:
        port = int(plaintext.address.rpartition(":")[2])
        started = time.monotonic()
        assert not joiner.speaks_tls("127.0.0.1", port)
        assert time.monotonic() - started < joiner.CONNECT_TIMEOUT_S  # closed at the hello, not timed out
    assert not joiner.speaks_tls("127.0.0.1", port)  # nothing listens any more


def test_the_tls_mismatch_names_the_address_and_the_fix():
    told = joiner.plaintext_to_tls("127.0.0.1:29500")
    assert "127.0.0.1:29500 serves TLS" in told and "loopback" in told and "MASTER_ADDR" in told
