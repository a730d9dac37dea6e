"""Channel options shared by the coordinator's server and its clients (L1).

Keepalive pings make a silently dead peer (host cut off, no FIN/RST) show up as a broken stream in a
few seconds instead of at the TCP timeout. A cut link is caught by TCP_USER_TIMEOUT (gRPC sets it
from the keepalive timeout), but a peer whose kernel still acknowledges TCP while the process answers
nothing (stopped, hung host) is caught only by the HTTP/2 ping's own deadline, `ping_timeout_ms`,
which defaults to 60 s: it is set to the keepalive timeout too, so such a peer is noticed in about
KEEPALIVE_TIME_MS + KEEPALIVE_TIMEOUT_MS. Message limits allow large pickled training functions.
"""

from __future__ import annotations

import queue

import grpc

MAX_MESSAGE_BYTES = 1 << 30  # train functions may close over sizeable objects

KEEPALIVE_TIME_MS = 1000
KEEPALIVE_TIMEOUT_MS = 3000

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
)

CLIENT_OPTIONS = (
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
    ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.ping_timeout_ms", KEEPALIVE_TIMEOUT_MS),
    ("grpc.http2.max_pings_without_data", 0),
    # One connection attempt fails fast; callers decide whether to retry.
    ("grpc.enable_retries", 0),
)


END_OF_STREAM = object()


def queued_requests(outbox: "queue.SimpleQueue"):
    """The request iterator of a client stream: yields what is put into `outbox` until END_OF_STREAM.

    gRPC's own thread pulls from it, so putting a message never waits on the network.
    """
    while True:
        item = outbox.get()
        if item is END_OF_STREAM:
            return
        yield item


def client_channel(address: str) -> grpc.Channel:
    """An insecure channel to `address` (host:port) with the shared options.

    The channel is plaintext: the run token authenticates callers, and the coordinator binds only to
    the interface its nodes use (127.0.0.1 for a local run).
    """
    return grpc.insecure_channel(address, options=CLIENT_OPTIONS)
