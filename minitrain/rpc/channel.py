"""Channel options shared by the coordinator's server and its clients (L1).

Keepalive pings make a silently dead peer (host cut off, no FIN/RST) show up as a broken stream in a
few seconds instead of at the TCP timeout. A cut link is caught by TCP_USER_TIMEOUT (gRPC sets it
from the keepalive timeout), but a peer whose kernel still acknowledges TCP while the process answers
nothing (stopped, hung host) is caught only by the HTTP/2 ping's own deadline, `ping_timeout_ms`,
which defaults to 60 s: it is set to the keepalive timeout too, so such a peer is noticed in about
KEEPALIVE_TIME_MS + KEEPALIVE_TIMEOUT_MS. Message limits allow large pickled training functions.

Connection floods (see `minitrain.rpc.limits`): the server closes a connection whose handshake (TLS,
then the client's HTTP/2 preface and SETTINGS) is not done within HANDSHAKE_TIMEOUT_MS, and one that
has held no call for IDLE_CONNECTION_MS; `server_options()` adds the cap on accepted connections.
Every peer of a run holds its one stream open for its whole life, so neither ever touches it.
Clients wait for a refused connection to come back (`wait_for_ready` on their stream, reconnecting
at least every MAX_RECONNECT_BACKOFF_MS) instead of failing: a flood delays them, it cannot fail
them; their own deadlines (the agent's lease, the worker's assignment wait) still bound the wait.
"""

from __future__ import annotations

from typing import Optional

import grpc

from minitrain.rpc import limits, tls

MAX_MESSAGE_BYTES = 1 << 30  # train functions may close over sizeable objects

KEEPALIVE_TIME_MS = 1000
KEEPALIVE_TIMEOUT_MS = 3000
# Under the agent's 4 s lease (minitrain.lease): a peer turned away by a full server still gets in in time.
HANDSHAKE_TIMEOUT_MS = 3000
IDLE_CONNECTION_MS = 5000
MAX_RECONNECT_BACKOFF_MS = 1000

SERVER_OPTIONS = (
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
    ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.ping_timeout_ms", KEEPALIVE_TIMEOUT_MS),
    ("grpc.http2.min_ping_interval_without_data_ms", KEEPALIVE_TIME_MS // 2),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.so_reuseport", 0),
    ("grpc.server_handshake_timeout_ms", HANDSHAKE_TIMEOUT_MS),
    ("grpc.max_connection_idle_ms", IDLE_CONNECTION_MS),
)


def server_options() -> tuple:
    """SERVER_OPTIONS plus the cap on accepted connections for this process's descriptor limit."""
    return SERVER_OPTIONS + (("grpc.max_allowed_incoming_connections", limits.max_incoming_connections()),)

CLIENT_OPTIONS = (
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
    ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.ping_timeout_ms", KEEPALIVE_TIMEOUT_MS),
    ("grpc.http2.max_pings_without_data", 0),
    # No call is retried by gRPC; callers decide. A refused connection is retried soon (wait_for_ready).
    ("grpc.enable_retries", 0),
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", MAX_RECONNECT_BACKOFF_MS),
)


END_OF_STREAM = object()


def client_channel(address: str, cert_pem: Optional[bytes] = None) -> grpc.Channel:
    """A channel to the coordinator at `address` (host:port, or unix:/path) with the shared options.

    Loopback addresses are plaintext; any other address is TLS trusting only `cert_pem`, the run's
    certificate (`minitrain.rpc.tls`), and ValueError is raised when it is missing. The run token
    authenticates the caller in both cases. A Unix socket ("unix:/path") is plaintext too (the node
    agent's relay is not gRPC: `minitrain.rpc.local_stream`). Stream calls on it should pass `wait_for_ready=True`.
    """
    tls.require_cert(address, cert_pem)
    if not tls.is_local_socket(address) and tls.uses_tls(tls.host_of(address)):
        return grpc.secure_channel(address, tls.channel_credentials(cert_pem), options=CLIENT_OPTIONS)
    return grpc.insecure_channel(address, options=CLIENT_OPTIONS)
