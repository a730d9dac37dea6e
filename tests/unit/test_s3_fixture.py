"""The ``s3`` fixture: a real moto S3 server on loopback, served from a thread, driven through fsspec/s3fs
over HTTP.

These tests pin the s3fs behaviour minitrain's storage code relies on: objects round-trip, pipe_file
overwrites, recursive put merges into a prefix, "directories" are only key prefixes, and the server
leaves no port or thread behind. A pickled filesystem in another process: tests/process/test_s3_server.py.
"""

from __future__ import annotations

import json
import socket
import threading
import uuid

import fsspec
import pytest

from s3server import s3_server, skip_unless_available

skip_unless_available()


def _tree(root, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def test_fixture_is_a_real_loopback_http_server(s3):
    assert s3.endpoint_url == f"http://127.0.0.1:{s3.port}"
    assert s3.bucket and s3.bucket.startswith("mt-")
    # Plain HTTP to the socket, no boto at all: moto answers as S3 does for an unsigned request.
    with socket.create_connection(("127.0.0.1", s3.port), timeout=5) as sock:
        sock.sendall(f"GET /{s3.bucket} HTTP/1.0\r\nHost: 127.0.0.1:{s3.port}\r\n\r\n".encode())
        assert sock.recv(64).startswith(b"HTTP/1.")
    fs = s3.filesystem()
    assert fs.exists(s3.bucket)
    assert fs.ls(s3.bucket) == []
    assert s3.url("a/b") == f"s3://{s3.bucket}/a/b"


def test_write_read_list_delete(s3):
    fs = s3.filesystem()
    b = s3.bucket
    with fs.open(f"{b}/run/params.json", "wb") as f:
        f.write(b'{"lr": 0.1}')
    fs.pipe_file(f"{b}/run/result.json", b"{}")

    assert fs.cat_file(f"{b}/run/params.json") == b'{"lr": 0.1}'
    with fs.open(f"{b}/run/params.json", "rb") as f:
        assert json.load(f) == {"lr": 0.1}
    assert sorted(fs.ls(f"{b}/run")) == [f"{b}/run/params.json", f"{b}/run/result.json"]
    assert fs.info(f"{b}/run/params.json")["size"] == 11

    fs.rm(f"{b}/run/params.json")
    assert not fs.exists(f"{b}/run/params.json")
    assert fs.ls(f"{b}/run") == [f"{b}/run/result.json"]
    with pytest.raises(FileNotFoundError):
        fs.cat_file(f"{b}/run/params.json")

    # The same through fsspec's generic entry points and s3:// URLs.
    of = fsspec.open(s3.url("run/via_url.txt"), "wt", **s3.storage_options())
    with of as f:
        f.write("hi")
    assert fsspec.filesystem("s3", **s3.storage_options()).cat(s3.url("run/via_url.txt")) == b"hi"


def test_pipe_file_replaces_a_key(s3):
    fs = s3.filesystem()
    key = f"{s3.bucket}/latest"
    fs.pipe_file(key, b"checkpoint_000001")
    fs.pipe_file(key, b"checkpoint_000002")
    assert fs.cat_file(key) == b"checkpoint_000002"
    assert fs.ls(s3.bucket) == [key]


def test_put_directory_merges_into_prefix_and_get_brings_it_back(s3, tmp_path):
    fs = s3.filesystem()
    prefix = f"{s3.bucket}/run/checkpoint_000001"
    fs.pipe_file(f"{prefix}/already_there.txt", b"keep me")
    fs.pipe_file(f"{prefix}/model.pt", b"old")

    local = tmp_path / "ckpt"
    _tree(local, {"model.pt": b"new", "optim/state.bin": b"\x00\x01", "meta.json": b"{}"})
    # Trailing slash on the source = "copy the *contents*": lands in prefix whether or not the prefix
    # already has keys. (Without it, fsspec nests as prefix/ckpt/... once the prefix exists -- see
    # test_put_without_trailing_slash_is_not_idempotent.)
    fs.put(f"{local}/", f"{prefix}/", recursive=True)

    assert sorted(fs.find(prefix)) == [
        f"{prefix}/already_there.txt",
        f"{prefix}/meta.json",
        f"{prefix}/model.pt",
        f"{prefix}/optim/state.bin",
    ]
    assert fs.cat_file(f"{prefix}/model.pt") == b"new"  # overwritten
    assert fs.cat_file(f"{prefix}/already_there.txt") == b"keep me"  # merged, not replaced

    back = tmp_path / "back"
    fs.get(f"{prefix}/", f"{back}/", recursive=True)
    got = {p.relative_to(back).as_posix(): p.read_bytes() for p in back.rglob("*") if p.is_file()}
    assert got == {
        "already_there.txt": b"keep me",
        "meta.json": b"{}",
        "model.pt": b"new",
        "optim/state.bin": b"\x00\x01",
    }


def test_put_without_trailing_slash_is_not_idempotent(s3, tmp_path):
    """fsspec's cp/put rule: 'src' into an existing target dir nests as target/src. On S3 a prefix
    'exists' only once it has keys, so the 1st and 2nd upload of the same dir land differently."""
    fs = s3.filesystem()
    local = tmp_path / "ckpt"
    _tree(local, {"a": b"a"})
    target = f"{s3.bucket}/t"
    fs.put(str(local), target, recursive=True)
    assert fs.find(target) == [f"{target}/a"]
    fs.put(str(local), target, recursive=True)
    assert sorted(fs.find(target)) == [f"{target}/a", f"{target}/ckpt/a"]


def test_prefixes_are_directories_only_while_they_hold_keys(s3):
    """What a list_dirs of checkpoint directories under a prefix sees."""
    fs = s3.filesystem()
    run = f"{s3.bucket}/run"
    fs.pipe_file(f"{run}/checkpoint_000001/model.pt", b"1")
    fs.pipe_file(f"{run}/checkpoint_000002/model.pt", b"2")
    fs.pipe_file(f"{run}/result.json", b"{}")

    # Immediately after the writes (listing cache off): prefixes exist and are dirs.
    assert fs.exists(run) and fs.isdir(run)
    assert fs.isdir(f"{run}/checkpoint_000001") and not fs.isfile(f"{run}/checkpoint_000001")
    entries = {e["name"]: e["type"] for e in fs.ls(run, detail=True)}
    assert entries == {
        f"{run}/checkpoint_000001": "directory",
        f"{run}/checkpoint_000002": "directory",
        f"{run}/result.json": "file",
    }

    # mkdir/makedirs of a key prefix writes nothing: empty "directories" do not exist on S3.
    fs.makedirs(f"{run}/checkpoint_000003", exist_ok=True)
    fs.mkdir(f"{run}/checkpoint_000004")
    assert not fs.exists(f"{run}/checkpoint_000003")
    assert f"{run}/checkpoint_000003" not in fs.ls(run)

    # Removing the last key under a prefix makes the "directory" vanish.
    fs.rm(f"{run}/checkpoint_000001", recursive=True)
    assert not fs.exists(f"{run}/checkpoint_000001")
    assert sorted(fs.ls(run)) == [f"{run}/checkpoint_000002", f"{run}/result.json"]


def test_server_port_is_closed_and_thread_gone_after_exit():
    before = set(threading.enumerate())
    with s3_server() as srv:
        fs = srv.filesystem()
        bucket = srv.make_bucket(f"mt-closing-{uuid.uuid4().hex[:12]}")
        fs.pipe_file(f"{bucket}/x", b"x")
        assert fs.cat_file(f"{bucket}/x") == b"x"
        port = srv.port
        fs.rm(bucket, recursive=True)
    new = [t for t in set(threading.enumerate()) - before if t.is_alive()]
    assert not [t for t in new if "_server_entry" in t.name or t.name == "s3server-start"], new
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(5)
        with pytest.raises(ConnectionRefusedError):
            sock.connect(("127.0.0.1", port))
