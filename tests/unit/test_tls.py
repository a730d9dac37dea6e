"""The per-run TLS identity (minitrain.rpc.tls), the connection limits (minitrain.rpc.limits) and the
rendezvous socket (minitrain.worker.distributed.listening_socket), on real in-process gRPC servers."""

from __future__ import annotations

import datetime
import ipaddress
import os
import resource
import time
from concurrent import futures

import grpc
import psutil
import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec

from minitrain.coordinator.transport.server import CoordinatorServer
from minitrain.coordinator.transport.service import Hub
from minitrain.rpc import channel as channel_module
from minitrain.rpc import limits, tls
from minitrain.worker.distributed import listening_socket


def test_identity_is_a_fresh_p256_self_signed_certificate_naming_the_bind_addresses():
    started = time.perf_counter()
    identity = tls.new_run_identity(["10.1.2.3", "fd00::7", "node-a"])
    elapsed = time.perf_counter() - started
    cert = x509.load_pem_x509_certificate(identity.cert_pem)
    assert isinstance(cert.public_key(), ec.EllipticCurvePublicKey)
    assert cert.public_key().curve.name == "secp256r1"
    assert cert.issuer == cert.subject  # self-signed
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("10.1.2.3"),
                                                        ipaddress.ip_address("fd00::7")]
    assert sans.get_values_for_type(x509.DNSName) == ["node-a"]
    now = datetime.datetime.now(datetime.timezone.utc)
    assert cert.not_valid_before_utc < now < cert.not_valid_after_utc
    assert b"PRIVATE KEY" in identity.key_pem and b"PRIVATE KEY" not in identity.cert_pem
    assert "key_pem" not in repr(identity)  # never in a log line by accident
    other = tls.new_run_identity(["10.1.2.3"])
    assert other.cert_pem != identity.cert_pem and other.key_pem != identity.key_pem
    assert elapsed < 5  # generous on a loaded machine; typically about a millisecond


def _tls_server(identity: tls.RunIdentity):
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    handler = grpc.method_handlers_generic_handler(
        "probe.Probe", {"Ping": grpc.unary_unary_rpc_method_handler(lambda request, context: b"pong")})
    server.add_generic_rpc_handlers((handler,))
    port = server.add_secure_port("127.0.0.1:0", tls.server_credentials(identity))
    server.start()
    return server, f"127.0.0.1:{port}"


def _ping(channel: grpc.Channel):
    with channel:
        try:
            return channel.unary_unary("/probe.Probe/Ping")(b"ping", timeout=10)
        except grpc.RpcError as error:
            return error.code()


def test_a_client_trusts_only_the_certificate_it_pinned():
    this_run, other_run = tls.new_run_identity(["127.0.0.1"]), tls.new_run_identity(["127.0.0.1"])
    server, address = _tls_server(this_run)
    try:
        assert _ping(grpc.secure_channel(address, tls.channel_credentials(this_run.cert_pem))) == b"pong"
        assert _ping(grpc.secure_channel(address, tls.channel_credentials(other_run.cert_pem))) == \
            grpc.StatusCode.UNAVAILABLE  # another run's certificate: the handshake fails
        assert _ping(grpc.secure_channel(address, grpc.ssl_channel_credentials())) == grpc.StatusCode.UNAVAILABLE
        assert _ping(grpc.insecure_channel(address)) == grpc.StatusCode.UNAVAILABLE  # plaintext
    finally:
        server.stop(grace=None)


def test_the_address_dialled_must_be_in_the_certificate():
    identity = tls.new_run_identity(["10.9.9.9"])  # the server's real address, 127.0.0.1, is not in it
    server, address = _tls_server(identity)
    try:
        assert _ping(grpc.secure_channel(address, tls.channel_credentials(identity.cert_pem))) == \
            grpc.StatusCode.UNAVAILABLE
    finally:
        server.stop(grace=None)


@pytest.mark.parametrize("host, expected", [("127.0.0.1", False), ("127.3.4.5", False), ("::1", False),
                                            ("[::1]", False), ("localhost", False), ("10.0.0.1", True),
                                            ("fd00::1", True), ("gpu-node-7", True)])
def test_everything_but_loopback_is_tls(host, expected):
    assert tls.uses_tls(host) is expected


def test_no_plaintext_fallback_where_the_server_speaks_tls():
    with pytest.raises(ValueError, match="10.0.0.1:5000.*TLS.*certificate"):
        channel_module.client_channel("10.0.0.1:5000")
    channel_module.client_channel("127.0.0.1:5000").close()  # loopback: plaintext, no certificate needed
    with pytest.raises(ValueError, match="10.0.0.1.*not loopback.*identity"):
        CoordinatorServer(service=None, hub=Hub(), token="t", hosts=("127.0.0.1", "10.0.0.1"))


def test_the_connection_cap_leaves_room_for_files():
    assert limits.max_incoming_connections(256) == (256 - limits.FD_RESERVE) // 2 == 96
    assert limits.max_incoming_connections(1 << 20) == ((1 << 20) - limits.FD_RESERVE) // 2
    assert limits.max_incoming_connections(40) == limits.MIN_CONNECTIONS
    assert limits.max_incoming_connections(resource.RLIM_INFINITY) < 2 ** 31  # a gRPC int argument
    options = dict(channel_module.server_options())
    assert options["grpc.max_allowed_incoming_connections"] == limits.max_incoming_connections()
    assert options["grpc.server_handshake_timeout_ms"] < 5000  # under the agent's lease


def test_the_fd_limit_is_raised_to_the_hard_limit_once(monkeypatch):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    lowered = min(soft, hard, 512)
    if lowered == hard:
        pytest.skip(f"the hard limit ({hard}) leaves nothing to raise")
    resource.setrlimit(resource.RLIMIT_NOFILE, (lowered, hard))
    monkeypatch.setattr(limits, "_raised", False)
    try:
        assert limits.raise_fd_limit() == (hard, hard)
        assert resource.getrlimit(resource.RLIMIT_NOFILE) == (hard, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (lowered, hard))
        limits.raise_fd_limit()  # once per process: a later call changes nothing
        assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == lowered
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_the_rendezvous_socket_listens_on_the_given_address_only():
    fd = listening_socket("127.0.0.1")
    try:
        mine = [c for c in psutil.Process().net_connections("inet")
                if c.fd == fd and c.status == psutil.CONN_LISTEN]
        assert len(mine) == 1 and mine[0].laddr.ip == "127.0.0.1" and mine[0].laddr.port > 0
    finally:
        os.close(fd)
