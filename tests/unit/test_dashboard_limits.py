"""The dashboard is no second door to the driver's file descriptors: a flood of persistent
connections is held to a cap of connections and threads, each connection has a deadline, the page serves
again once the flood is cut off, and a client that disconnects early leaves no traceback in the log."""

from __future__ import annotations

import http.client
import logging
import os
import socket
import struct
import threading
import time

from dashboard_support import FixedRun
from minitrain.dashboard import DashboardServer
from minitrain.dashboard.bounded_http import MAX_CONNECTIONS
from minitrain.dashboard.settings import DashboardAddress


def _get(port: int, target: str = "/") -> int:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request("GET", target)
        response = connection.getresponse()
        response.read()
        return response.status
    finally:
        connection.close()


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _open_connections(httpd) -> int:
    """How many connections the server is serving now (its table of served connections and deadlines)."""
    with httpd._open_lock:
        return len(httpd._open)


def test_a_persistent_connection_flood_is_capped_and_cut_off(tmp_path):
    flood = MAX_CONNECTIONS + 60
    with DashboardServer(FixedRun(), DashboardAddress()) as board:
        httpd = board._httpd
        httpd.deadline_s = 4.0
        threads_before = threading.active_count()
        fds_before = _fds()
        clients = []
        try:
            for _ in range(flood):
                sock = socket.create_connection(("127.0.0.1", board.port), timeout=10)
                sock.sendall(b"GET / HTTP/1.0\r\n")  # a request that never ends (slowloris)
                clients.append(sock)
            time.sleep(0.3)
            assert _open_connections(httpd) <= MAX_CONNECTIONS
            assert threading.active_count() - threads_before <= MAX_CONNECTIONS
            # the server's share of descriptors is the cap: every other one is a client socket of this test
            assert _fds() - fds_before - flood <= MAX_CONNECTIONS + 2
            assert httpd.refused >= flood - MAX_CONNECTIONS
            refused_clients = 0
            for sock in clients:  # the ones beyond the cap were closed at once
                sock.settimeout(0.05)
                try:
                    refused_clients += sock.recv(1) == b""
                except (TimeoutError, ConnectionError):
                    pass
            assert refused_clients >= flood - MAX_CONNECTIONS
            # the run's own I/O still works while the flood holds its connections
            (tmp_path / "commit.json").write_text("{}")
            deadline = time.monotonic() + 10
            while _open_connections(httpd) and time.monotonic() < deadline:
                time.sleep(0.1)
            assert _open_connections(httpd) == 0  # every flood connection was cut off at its deadline
            assert _get(board.port) == 200
        finally:
            for sock in clients:
                sock.close()


def test_a_client_that_disconnects_early_leaves_no_traceback(caplog, capfd):
    caplog.set_level(logging.DEBUG, logger="minitrain")
    with DashboardServer(FixedRun(), DashboardAddress()) as board:
        for _ in range(30):
            sock = socket.create_connection(("127.0.0.1", board.port), timeout=10)
            sock.sendall(b"GET / HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # RST on close
            sock.close()
        for _ in range(5):
            sock = socket.create_connection(("127.0.0.1", board.port), timeout=10)
            sock.sendall(b"GET / HTT")
            sock.close()
        assert _get(board.port) == 200
        board.stop()
    captured = capfd.readouterr()
    assert "Traceback" not in captured.err + captured.out
    assert not [r for r in caplog.records if r.exc_info or "Traceback" in r.getMessage()]
    assert all(r.levelno <= logging.DEBUG for r in caplog.records if "dashboard" in r.getMessage())


# ---------------------------------------------------------------------------------- MINITRAIN_DASHBOARD probes


import pytest  # noqa: E402

from minitrain.dashboard.settings import DashboardAddress, parse_address  # noqa: E402
from minitrain.errors import ConfigError  # noqa: E402


@pytest.mark.parametrize("value", ["\u0663\u0663", "127.0.0.1:\u0668\u0660", "\u00b9", "[]:80", "[1.2.3.4]:80",
                                   "\u00fcn\u00ef.example", "999.1.1.1", "1.2.3", "a" * 300, "x\x00y", "host:",
                                   "[::1]:80:90", "+80", "-1"])
def test_odd_dashboard_values_are_config_errors_naming_the_value(value):
    with pytest.raises(ConfigError) as info:
        parse_address(value)
    assert f"MINITRAIN_DASHBOARD={value!r}" in str(info.value)


@pytest.mark.parametrize("value, address", [
    ("[fe80::1%eth0]:80", DashboardAddress("fe80::1%eth0", 80)),  # a link-local IPv6 address with its zone
    (" 8265 ", DashboardAddress("127.0.0.1", 8265)),  # a port alone, blanks around it
    ("OFF\n", None),  # off, in any case, a newline after it
    ("[::ffff:127.0.0.1]:0", DashboardAddress("::ffff:127.0.0.1", 0)),
    ("1e3", DashboardAddress("1e3", 0)),  # a host name, not a number
    ("h-1.example", DashboardAddress("h-1.example", 0)),
])
def test_odd_but_meaningful_dashboard_values_still_parse(value, address):
    assert parse_address(value) == address
