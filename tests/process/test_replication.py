"""Peer replication of checkpoint shards between node agents (minitrain.agent.replication), over real sockets.

A `ReplicaServer` on 127.0.0.1 (plaintext) or on this machine's non-loopback address (TLS, its certificate
derived from the run token) serves a tier root in tmp_path. The clients are `push_dir` / `fetch_dir`, and,
where a test needs a peer that misbehaves (dies mid-transfer, never answers, sends a bad path), a raw client
or server written here from the wire format in the module's docstring.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import socket
import struct
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from minitrain.agent import replication
from minitrain.agent.replication import ReplicaServer, ReplicationError, fetch_dir, push_dir
from minitrain.rpc import tls

TOKEN = "run-token-for-the-replication-tests"
REL = "attempt_0/rank_1/checkpoint_000003"
WAIT_S = 10.0  # the most any wait here takes when the code is broken; none takes it when it works
REPO_ROOT = Path(__file__).resolve().parents[2]


class Tier:
    """What the server's reserve/release callbacks saw; `refuse` makes reserve answer False."""

    def __init__(self, refuse: bool = False):
        self.refuse = refuse
        self.reserved: list[tuple[str, int]] = []
        self.released: list[str] = []
        self.release_seen = threading.Event()

    def reserve(self, rel: str, total: int) -> bool:
        self.reserved.append((rel, total))
        return not self.refuse

    def release(self, rel: str) -> None:
        self.released.append(rel)
        self.release_seen.set()


@pytest.fixture
def tier_root(tmp_path):
    root = tmp_path / "tier"
    root.mkdir(mode=0o700)
    return root


def serve(tier_root: Path, tier: Tier, host: str = "127.0.0.1", **options) -> ReplicaServer:
    server = ReplicaServer(str(tier_root), TOKEN, host, tier.reserve, tier.release, **options)
    server.start()
    return server


@pytest.fixture
def tier():
    return Tier()


@pytest.fixture
def server(tier_root, tier):
    server = serve(tier_root, tier)
    yield server
    server.close()
    assert not [t for t in threading.enumerate() if t.name.startswith("replica-")], "close() left threads"


def make_shard(root: Path) -> dict[str, bytes]:
    """A checkpoint directory with nested files, an empty file and a 20 MiB file; returns path -> bytes."""
    files = {
        "model/weights.bin": os.urandom(20 << 20),
        "model/layers/0/bias.bin": os.urandom(4096),
        ".metadata": b'{"step": 3}',
        "empty": b"",
    }
    for relative, data in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return files


def contents(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


# ------------------------------------------------------------------------------------ a raw peer


def frame(obj: dict) -> bytes:
    body = json.dumps(obj).encode()
    return struct.pack(">I", len(body)) + body


def recv_exact(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionError(f"closed after {len(data)} of {size} bytes")
        data += chunk
    return data


def read_frame(sock: socket.socket) -> dict:
    (length,) = struct.unpack(">I", recv_exact(sock, 4))
    return json.loads(recv_exact(sock, length))


def answer(challenge: bytes, token: str = TOKEN) -> bytes:
    return hmac.new(token.encode(), challenge + replication.AUTH_CONTEXT, hashlib.sha256).digest()


def raw_client(port: int) -> socket.socket:
    """A client past authentication on 127.0.0.1, ready to send a request."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=WAIT_S)
    sock.sendall(answer(recv_exact(sock, replication.CHALLENGE_BYTES)))
    assert read_frame(sock) == {"ok": True}
    return sock


def closed_by_peer(sock: socket.socket) -> bool:
    """True once the peer closed the connection (reading to EOF; a reset counts)."""
    try:
        while sock.recv(65536):
            pass
    except ConnectionResetError:
        pass
    return True


# ------------------------------------------------------------------------------------ tests


def test_push_then_fetch_round_trips_a_directory(server, tier, tier_root, tmp_path):
    source = tmp_path / "source"
    files = make_shard(source)
    total = sum(len(data) for data in files.values())

    assert push_dir(("127.0.0.1", server.port), TOKEN, str(source), REL) == total
    assert contents(tier_root / REL) == files
    assert tier.reserved == [(REL, total)] and tier.released == []
    assert os.listdir(tier_root) == ["attempt_0"]  # no temporary directory left beside it

    restored = tmp_path / "restored" / "checkpoint_000003"
    assert fetch_dir(("127.0.0.1", server.port), TOKEN, REL, str(restored)) == total
    assert contents(restored) == files
    assert os.listdir(restored.parent) == ["checkpoint_000003"]


def test_a_second_push_replaces_the_directory_whole(server, tier_root, tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    make_shard(first)
    (second / "only").mkdir(parents=True)
    (second / "only" / "file").write_bytes(b"new")
    push_dir(("127.0.0.1", server.port), TOKEN, str(first), REL)
    push_dir(("127.0.0.1", server.port), TOKEN, str(second), REL)
    assert contents(tier_root / REL) == {"only/file": b"new"}
    assert os.listdir(tier_root) == ["attempt_0"]  # the old directory, set aside, is gone


def test_a_wrong_token_is_refused_before_anything_is_written(server, tier, tier_root, tmp_path):
    source = tmp_path / "source"
    make_shard(source)
    with pytest.raises(ReplicationError) as raised:
        push_dir(("127.0.0.1", server.port), "another-runs-token", str(source), REL)
    message = str(raised.value)
    assert "authentication failed" in message and f"127.0.0.1:{server.port}" in message
    assert os.listdir(tier_root) == [] and tier.reserved == []

    with pytest.raises(ReplicationError, match="authentication failed"):
        fetch_dir(("127.0.0.1", server.port), "another-runs-token", REL, str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()


def test_a_full_tier_refuses_the_push_and_nothing_is_written(tier_root, tmp_path):
    tier = Tier(refuse=True)
    source = tmp_path / "source"
    make_shard(source)
    with serve(tier_root, tier) as server:
        with pytest.raises(ReplicationError, match="full") as raised:
            push_dir(("127.0.0.1", server.port), TOKEN, str(source), REL)
    assert f"127.0.0.1:{server.port}" in str(raised.value)
    assert os.listdir(tier_root) == [] and len(tier.reserved) == 1 and tier.released == []


def test_a_client_that_dies_mid_transfer_leaves_nothing_and_the_reservation_is_released(server, tier, tier_root):
    size = 2 << 20
    with raw_client(server.port) as sock:
        sock.sendall(frame({"op": "put", "rel": REL, "total_bytes": size}))
        assert read_frame(sock) == {"ok": True}
        sock.sendall(frame({"path": "weights.bin", "size": size}) + os.urandom(size // 2))
    assert tier.release_seen.wait(WAIT_S), "the server never released the reservation"
    assert tier.released == [REL]
    assert os.listdir(tier_root) == []  # neither the temporary directory nor a partial shard


def test_a_client_that_falls_silent_mid_transfer_is_dropped(tier_root, tier):
    with serve(tier_root, tier, io_timeout_s=0.2) as server, raw_client(server.port) as sock:
        sock.sendall(frame({"op": "put", "rel": REL, "total_bytes": 10}))
        assert read_frame(sock) == {"ok": True}
        sock.sendall(frame({"path": "weights.bin", "size": 10}) + b"12345")
        assert closed_by_peer(sock)  # a socket timeout (WAIT_S) would raise instead
        assert tier.release_seen.wait(WAIT_S) and os.listdir(tier_root) == []


def test_a_directory_whose_checksum_differs_is_not_kept(server, tier, tier_root):
    with raw_client(server.port) as sock:
        sock.sendall(frame({"op": "put", "rel": REL, "total_bytes": 3}))
        assert read_frame(sock) == {"ok": True}
        sock.sendall(frame({"path": "f", "size": 3}) + b"abc" + frame({"end": True, "sha256": "0" * 64}))
        reply = read_frame(sock)
    assert reply["ok"] is False and "SHA-256" in reply["reason"]
    assert tier.release_seen.wait(WAIT_S) and os.listdir(tier_root) == []


def test_a_client_that_never_answers_the_challenge_is_closed(tier_root, tier):
    with serve(tier_root, tier, auth_timeout_s=0.2) as server:
        with socket.create_connection(("127.0.0.1", server.port), timeout=WAIT_S) as sock:
            assert len(recv_exact(sock, replication.CHALLENGE_BYTES)) == replication.CHALLENGE_BYTES
            assert closed_by_peer(sock)  # a socket timeout (WAIT_S) would raise instead
    assert tier.reserved == []


def test_connections_beyond_the_limit_are_closed_at_once(tier_root, tier):
    with serve(tier_root, tier, max_connections=2) as server:
        held = [socket.create_connection(("127.0.0.1", server.port), timeout=WAIT_S) for _ in range(2)]
        try:
            for sock in held:  # both are served: each got its challenge
                recv_exact(sock, replication.CHALLENGE_BYTES)
            with socket.create_connection(("127.0.0.1", server.port), timeout=WAIT_S) as extra:
                assert extra.recv(replication.CHALLENGE_BYTES) == b""
        finally:
            for sock in held:
                sock.close()


@pytest.mark.parametrize("bad", ["../x", "/abs", "a/../../b", "a//b", ".replica-put-x", "a/b c", "a/b/c/d/e", ""])
def test_a_rel_outside_the_tier_root_is_refused(server, tier, tier_root, tmp_path, bad):
    source = tmp_path / "source"
    source.mkdir()
    (source / "f").write_bytes(b"x")
    with pytest.raises(ReplicationError, match="rel"):  # refused by the client before it connects
        push_dir(("127.0.0.1", server.port), TOKEN, str(source), bad)
    for request in ({"op": "put", "rel": bad, "total_bytes": 1}, {"op": "get", "rel": bad}):
        with raw_client(server.port) as sock:  # and by the server, from a client that does not check
            sock.sendall(frame(request))
            reply = read_frame(sock)
            assert reply["ok"] is False and "rel" in reply["reason"]
            assert closed_by_peer(sock)
    assert tier.reserved == [] and os.listdir(tier_root) == []
    assert sorted(os.listdir(tmp_path)) == ["source", "tier"]


@pytest.mark.parametrize("bad", ["../x", "/abs", "a/../../b", "../../../../tmp/evil"])
def test_a_file_path_outside_the_directory_is_refused(server, tier, tier_root, tmp_path, bad):
    with raw_client(server.port) as sock:
        sock.sendall(frame({"op": "put", "rel": REL, "total_bytes": 1}))
        assert read_frame(sock) == {"ok": True}
        sock.sendall(frame({"path": bad, "size": 1}) + b"x")
        reply = read_frame(sock)
    assert reply["ok"] is False and "file path" in reply["reason"]
    assert tier.release_seen.wait(WAIT_S) and os.listdir(tier_root) == []
    assert sorted(os.listdir(tmp_path)) == ["tier"]


def test_a_file_path_sent_by_a_server_outside_the_directory_is_refused(tmp_path):
    """fetch_dir checks the paths a server sends as the server checks a client's, and leaves nothing."""
    listener = socket.create_server(("127.0.0.1", 0))

    def bad_server():
        conn, _ = listener.accept()
        with conn:
            conn.sendall(b"c" * replication.CHALLENGE_BYTES)
            recv_exact(conn, 32)
            conn.sendall(frame({"ok": True}))
            read_frame(conn)
            file_frame = frame({"path": "../escaped", "size": 1}) + b"x"
            conn.sendall(frame({"ok": True, "total_bytes": 1}) + file_frame
                         + frame({"end": True, "sha256": hashlib.sha256(file_frame).hexdigest()}))
            closed_by_peer(conn)

    thread = threading.Thread(target=bad_server)
    thread.start()
    try:
        with pytest.raises(ReplicationError, match="file path"):
            fetch_dir(("127.0.0.1", listener.getsockname()[1]), TOKEN, REL, str(tmp_path / "out" / "shard"),
                      timeout_s=WAIT_S)
    finally:
        thread.join(WAIT_S)
        listener.close()
    assert os.listdir(tmp_path / "out") == [] and not (tmp_path / "escaped").exists()


def test_a_fetch_cut_short_leaves_nothing_behind(tmp_path):
    listener = socket.create_server(("127.0.0.1", 0))
    size = 2 << 20

    def dying_server():
        conn, _ = listener.accept()
        with conn:
            conn.sendall(b"c" * replication.CHALLENGE_BYTES)
            recv_exact(conn, 32)
            conn.sendall(frame({"ok": True}))
            read_frame(conn)
            conn.sendall(frame({"ok": True, "total_bytes": size}) + frame({"path": "w", "size": size}))
            conn.sendall(os.urandom(size // 2))

    thread = threading.Thread(target=dying_server)
    thread.start()
    try:
        with pytest.raises(ReplicationError, match="connection lost"):
            fetch_dir(("127.0.0.1", listener.getsockname()[1]), TOKEN, REL, str(tmp_path / "shard"), timeout_s=WAIT_S)
    finally:
        thread.join(WAIT_S)
        listener.close()
    assert os.listdir(tmp_path) == []


def test_fetching_an_absent_directory_is_refused(server, tmp_path):
    with pytest.raises(ReplicationError, match="not found"):
        fetch_dir(("127.0.0.1", server.port), TOKEN, REL, str(tmp_path / "shard"))
    assert os.listdir(tmp_path) == ["tier"]


def _non_loopback_address() -> str | None:
    """This machine's address on its default route (no packet is sent), if it has one and it can be bound."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("10.255.255.255", 1))
        address = probe.getsockname()[0]
    except OSError:
        return None
    finally:
        probe.close()
    if not tls.uses_tls(address) or address == "0.0.0.0":
        return None
    try:
        socket.create_server((address, 0)).close()
    except OSError:
        return None
    return address


@pytest.fixture
def tls_host():
    address = _non_loopback_address()
    if address is None:
        pytest.skip("this machine has no non-loopback IPv4 address to serve TLS on")
    return address


def test_over_tls_the_round_trip_works_and_another_tokens_pin_fails_the_handshake(tls_host, tier, tier_root,
                                                                                   tmp_path):
    source = tmp_path / "source"
    (source / "d").mkdir(parents=True)
    (source / "d" / "f").write_bytes(os.urandom(1 << 20))
    with serve(tier_root, tier, host=tls_host) as server:
        address = (tls_host, server.port)
        push_dir(address, TOKEN, str(source), REL)
        fetch_dir(address, TOKEN, REL, str(tmp_path / "back"))
        assert contents(tmp_path / "back") == contents(source)

        with pytest.raises(ReplicationError, match="TLS handshake failed") as raised:
            push_dir(address, "another-runs-token", str(source), "attempt_0/rank_2/x")
        assert f"{tls_host}:{server.port}" in str(raised.value)

        # A plaintext client gets no challenge from a TLS server: the server speaks TLS first.
        with socket.create_connection(address, timeout=WAIT_S) as sock:
            sock.sendall(answer(b"\0" * 32))
            assert closed_by_peer(sock)
    assert sorted(os.listdir(tier_root / "attempt_0")) == ["rank_1"]
    assert tier.reserved == [(REL, 1 << 20)]


def test_the_module_imports_neither_protobuf_nor_torch():
    code = ("import sys, minitrain.agent.replication\n"
            "bad = sorted(m for m in sys.modules if m.startswith(('google.protobuf', 'torch', 'minitrain.coordinator',"
            " 'minitrain.worker')))\n"
            "assert not bad, bad\n")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO_ROOT, timeout=60)
