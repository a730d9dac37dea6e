"""Peer replication of memory-tier checkpoint shards between the node agents of one run (L2).

The agent-to-agent channel copies a directory of a tier root to another agent (`push_dir`) or back from
it (`fetch_dir`); each agent serves its own tier root to its peers with a `ReplicaServer`.

Each node agent keeps its workers' checkpoint files in a private directory in host memory, its tier
root (`<tier root>/attempt_<a>/rank_<r>/<checkpoint dir>/...`). Pushing each shard to one other host's
agent means a lost host loses nothing committed; fetching a shard back from a peer restores an agent
that lacks it (after a restart).

The wire, in order:

1. TCP, then TLS when `minitrain.rpc.tls.uses_tls(host)` (anything but loopback). The server's
   identity is `tls.join_identity(token, host)`, derived from the run token and the address it binds,
   so every peer computes and pins the same certificate without being handed it.
2. Authentication before anything is parsed: the server sends a CHALLENGE_BYTES random challenge;
   the client answers HMAC-SHA256(key=token, challenge + AUTH_CONTEXT) within `auth_timeout_s`; the
   server compares in constant time and answers with a reply frame (below), closing on a mismatch.
3. Frames: a 4-byte big-endian length and a JSON object of at most HEADER_LIMIT bytes. Anything
   malformed (too long, not JSON, not an object, fields of the wrong type) closes the connection.
   Replies are ``{"ok": true, ...}`` or ``{"ok": false, "reason": "..."}`` (then the server closes).
4. A request, ``{"op": "put", "rel": REL, "total_bytes": N}`` or ``{"op": "get", "rel": REL}``, and
   its reply (``put``: after `reserve(rel, N)`; ``get``: with ``total_bytes``).
5. The directory's files, each a frame ``{"path": PATH, "size": S}`` followed by exactly S bytes, then
   an end frame ``{"end": true, "sha256": HEX}``: the SHA-256 over every file frame (its 4 length bytes,
   its JSON, its content bytes) in order, so the receiver knows the whole directory arrived as sent.
6. ``put`` only: the server's final reply once `<tier_root>/<rel>` holds the new directory.

Paths: REL is 1 to MAX_REL_COMPONENTS components of [A-Za-z0-9._-], none "." or "..", none starting with
"." (the server's own temporary names start with TEMP_PREFIX, so no request can name them); a file's
PATH is 1 to MAX_FILE_DEPTH such components, where a leading dot is allowed (".metadata"). Only regular
files travel: empty subdirectories are not recreated, and a symlink in a directory refuses the transfer.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import hmac
import ipaddress
import json
import logging
import os
import re
import selectors
import shutil
import socket
import ssl
import stat
import struct
import tempfile
import threading
import time
from typing import Callable, Optional

from minitrain.rpc import tls

logger = logging.getLogger("minitrain")

CHUNK = 1 << 20  # the most bytes of a file held in memory at once, on either side
HEADER_LIMIT = 64 << 10  # a frame's JSON; a longer announced length closes the connection
CHALLENGE_BYTES = 32
AUTH_CONTEXT = b"minitrain replica client v1"  # binds the answer to this protocol: no other HMAC of the token fits
MAX_CONNECTIONS = 16  # served at once; a connection beyond them is closed at once
MAX_REL_COMPONENTS = 4  # attempt_<a>/rank_<r>/<checkpoint dir> and one more
MAX_FILE_DEPTH = 32
MAX_COMPONENT_LENGTH = 255  # NAME_MAX
MAX_FILES = 100_000  # per directory; bounds the work of a stream of empty files
MIN_RATE_BYTES_S = 1 << 20  # a transfer slower than this on average (after io_timeout_s of grace) is dropped
TEMP_PREFIX = ".replica-"  # the server's temporary and set-aside directories in the tier root
AUTH_TIMEOUT_S = 10.0
IO_TIMEOUT_S = 30.0
SOCKET_BUFFER_BYTES = 16 << 20

_COMPONENT = re.compile(r"[A-Za-z0-9._-]+")
_LENGTH = struct.Struct(">I")


class ReplicationError(Exception):
    """A push or fetch failed; the message names the peer, the directory and the reason (refused: the tier
    is full or the directory is absent, authentication failed, TLS handshake failed, connection lost)."""


class _Malformed(Exception):
    """The peer broke the protocol: the connection is closed."""


class _Refused(Exception):
    """A request the server refuses with a reason the client reads."""


# ------------------------------------------------------------------------------------------ paths


def validate_rel(rel: object) -> str:
    """Return `rel` when it names a directory under a tier root: 1 to MAX_REL_COMPONENTS components joined
    by "/", each of [A-Za-z0-9._-], none "." or "..", none starting with "."; raise ValueError otherwise."""
    return _validate(rel, "rel", MAX_REL_COMPONENTS, leading_dot=False)


def validate_file_path(path: object) -> str:
    """Return `path` when it names a file inside a transferred directory: 1 to MAX_FILE_DEPTH components of
    [A-Za-z0-9._-], none "." or ".." (a leading dot is allowed); raise ValueError otherwise."""
    return _validate(path, "file path", MAX_FILE_DEPTH, leading_dot=True)


def _validate(value: object, what: str, max_components: int, leading_dot: bool) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"the {what} {value!r} must be a non-empty string")
    parts = value.split("/")
    if len(parts) > max_components:
        raise ValueError(f"the {what} {value!r} has {len(parts)} components; at most {max_components} are allowed")
    for part in parts:
        if not part:
            raise ValueError(f"the {what} {value!r} is absolute or has an empty component; give a relative path")
        if part in (".", ".."):
            raise ValueError(f"the {what} {value!r} has a {part!r} component; give a path without one")
        if not _COMPONENT.fullmatch(part) or len(part) > MAX_COMPONENT_LENGTH:
            raise ValueError(f"the {what} {value!r} has the component {part!r}; components are 1 to "
                             f"{MAX_COMPONENT_LENGTH} characters of [A-Za-z0-9._-]")
        if part.startswith(".") and not leading_dot:
            raise ValueError(f"the {what} {value!r} has the component {part!r}; its components may not start with "
                             "'.' (the replica server's temporary names do)")
    return value


def _list_files(directory: str) -> list[tuple[str, str, int]]:
    """(relative path, absolute path, size) of every regular file under `directory`, sorted; ValueError for
    a symlink, a special file or a name that cannot travel (nothing is skipped silently)."""
    if not os.path.isdir(directory):
        raise ValueError(f"{directory!r} is not a directory")
    found = []
    for dirpath, dirnames, filenames in os.walk(directory, followlinks=False):
        for name in dirnames + filenames:
            full = os.path.join(dirpath, name)
            relative = os.path.relpath(full, directory).replace(os.sep, "/")
            validate_file_path(relative)
            info = os.lstat(full)
            if stat.S_ISDIR(info.st_mode):
                continue
            if not stat.S_ISREG(info.st_mode):
                raise ValueError(f"{full!r} is not a regular file (a symlink or a special file); only regular "
                                 "files are replicated")
            found.append((relative, full, info.st_size))
    if len(found) > MAX_FILES:
        raise ValueError(f"{directory!r} holds {len(found)} files; at most {MAX_FILES} travel in one directory")
    return sorted(found)


def _install(temporary: str, target: str, aside_dir: str) -> None:
    """Rename the complete directory `temporary` to `target`; an existing `target` is first renamed aside
    (into `aside_dir`, on the same filesystem) and deleted after, so a reader sees the old directory or the
    new one, whole, or briefly none, never a mix."""
    os.makedirs(os.path.dirname(target), mode=0o700, exist_ok=True)
    aside = None
    try:
        os.rename(temporary, target)
    except OSError as error:
        if error.errno not in (errno.EEXIST, errno.ENOTEMPTY, errno.EISDIR, errno.ENOTDIR):
            raise
        aside = tempfile.mkdtemp(prefix=TEMP_PREFIX + "old-", dir=aside_dir)
        os.rename(target, os.path.join(aside, "old"))
        try:
            os.rename(temporary, target)
        except OSError:
            os.rename(os.path.join(aside, "old"), target)  # put the old one back: never lose a committed shard
            raise
    finally:
        if aside is not None:
            shutil.rmtree(aside, ignore_errors=True)


# ------------------------------------------------------------------------------------------ the wire


@functools.lru_cache(maxsize=1)
def _buffer_sizes() -> dict[int, int]:
    """SO_SNDBUF / SO_RCVBUF values to set, only where they beat the kernel's autotuning.

    Setting a buffer turns Linux's autotuning off for it and is capped at net.core.{w,r}mem_max (the kernel
    then doubles it), while autotuning grows up to net.ipv4.tcp_{w,r}mem's maximum: where the latter is larger
    (often 6 MiB or more against a 208 KiB core cap), leaving the buffer alone is the large buffer.
    """
    sizes = {}
    for option, core, autotuned in ((socket.SO_SNDBUF, "core/wmem_max", "ipv4/tcp_wmem"),
                                    (socket.SO_RCVBUF, "core/rmem_max", "ipv4/tcp_rmem")):
        try:
            with open(f"/proc/sys/net/{core}") as f:
                cap = int(f.read().split()[-1])
            with open(f"/proc/sys/net/{autotuned}") as f:
                autotuned_max = int(f.read().split()[-1])
        except (OSError, ValueError):
            sizes[option] = SOCKET_BUFFER_BYTES  # not Linux: ask, the kernel caps it
            continue
        wanted = min(SOCKET_BUFFER_BYTES, cap)
        if 2 * wanted > autotuned_max:
            sizes[option] = wanted
    return sizes


def _tune(sock: socket.socket) -> None:
    """Large buffers (before connect or listen, so the TCP window scale is negotiated for them)."""
    for option, size in _buffer_sizes().items():
        try:
            sock.setsockopt(socket.SOL_SOCKET, option, size)
        except OSError:
            pass  # a smaller buffer is slower, not wrong


class _Wire:
    """One connection's framed I/O with the timeouts that keep a slow or silent peer from holding it:
    each receive or send of up to CHUNK bytes must finish within `timeout_s`."""

    def __init__(self, sock: socket.socket, timeout_s: float):
        self.sock = sock
        self.timeout_s = timeout_s

    def send(self, data) -> None:
        self.sock.settimeout(self.timeout_s)
        self.sock.sendall(data)  # the timeout bounds the whole sendall (Python 3.5+)

    def recv_into(self, view: memoryview, deadline: Optional[float] = None) -> None:
        """Fill `view` exactly, by `deadline` (default: `timeout_s` from now); ConnectionError on EOF."""
        deadline = time.monotonic() + self.timeout_s if deadline is None else deadline
        got, want = 0, len(view)
        while got < want:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("the peer sent nothing in time")
            self.sock.settimeout(remaining)
            count = self.sock.recv_into(view[got:], want - got)
            if count == 0:
                raise ConnectionError("the peer closed the connection")
            got += count

    def recv_exact(self, size: int, deadline: Optional[float] = None) -> bytes:
        buffer = bytearray(size)
        self.recv_into(memoryview(buffer), deadline)
        return bytes(buffer)

    def send_frame(self, obj: dict) -> bytes:
        """Send one frame; returns its bytes (what the stream's SHA-256 covers)."""
        body = json.dumps(obj, separators=(",", ":")).encode()
        frame = _LENGTH.pack(len(body)) + body
        self.send(frame)
        return frame

    def recv_frame(self, deadline: Optional[float] = None) -> tuple[bytes, dict]:
        """(the frame's bytes, its object); _Malformed for anything but a JSON object within HEADER_LIMIT."""
        prefix = self.recv_exact(_LENGTH.size, deadline)
        (length,) = _LENGTH.unpack(prefix)
        if length > HEADER_LIMIT:
            raise _Malformed(f"a frame of {length} bytes (at most {HEADER_LIMIT})")
        body = self.recv_exact(length, deadline)
        try:
            obj = json.loads(body)
        except (UnicodeDecodeError, ValueError) as error:
            raise _Malformed(f"a frame that is not JSON: {error}") from None
        if not isinstance(obj, dict):
            raise _Malformed("a frame that is not a JSON object")
        return prefix + body, obj

    def send_file(self, fd: int, size: int, digest, buffer: memoryview, deadline: float) -> None:
        """Send `size` bytes of the open file `fd` from its start, hashing them into `digest`.

        The bytes are read once into the reusable `buffer`, hashed there and sent from there, also over plain
        TCP: the end-to-end SHA-256 must see every byte, and sendfile(2) never shows them to user space, so it
        would need a second read of the file for the hash. Measured with both ends on one 2-core machine, a
        1 GiB file in /dev/shm over loopback: 1.1 GB/s read-hash-send from one buffer, 0.6 GB/s hash then
        sendfile. The SHA-256 (about 2 GB/s a core with the SHA extensions) bounds either end.

        What TLS costs: every byte is also encrypted by the sender and decrypted by the receiver in user space
        (AES-GCM with AES-NI, a few GB/s a core) and travels in records of at most 16 KiB, so each recv returns
        at most one record. The same 1 GiB push over this machine's non-loopback address with TLS: 0.7 GB/s.
        """
        sent = 0
        while sent < size:
            if time.monotonic() > deadline:
                raise TimeoutError("the transfer fell below the minimum rate")
            want = min(len(buffer), size - sent)
            count = os.preadv(fd, [buffer[:want]], sent)
            if count == 0:
                raise ValueError(f"the file shrank while being sent (at {sent} of {size} bytes)")
            chunk = buffer[:count]
            digest.update(chunk)
            self.send(chunk)
            sent += count

    def recv_file(self, fd: int, size: int, digest, buffer: memoryview, deadline: float) -> None:
        """Receive `size` bytes into the open file `fd`, hashing them into `digest`, CHUNK at a time."""
        done = 0
        while done < size:
            if time.monotonic() > deadline:
                raise TimeoutError("the transfer fell below the minimum rate")
            chunk = buffer[:min(len(buffer), size - done)]
            self.recv_into(chunk)
            digest.update(chunk)
            written = 0
            while written < len(chunk):
                written += os.write(fd, chunk[written:])
            done += len(chunk)


def _transfer_deadline(total_bytes: int, grace_s: float) -> float:
    return time.monotonic() + grace_s + total_bytes / MIN_RATE_BYTES_S


def _answer(token: str, challenge: bytes) -> bytes:
    return hmac.new(token.encode(), challenge + AUTH_CONTEXT, hashlib.sha256).digest()


@functools.lru_cache(maxsize=8)
def _identity(token: str, host: str) -> tls.RunIdentity:
    """The certificate a replica server on `host` presents (a millisecond to derive; cached)."""
    return tls.join_identity(token, host)


def _server_context(identity: tls.RunIdentity) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    # ssl loads a key only from a path: an anonymous memory file keeps it off every disk.
    fd = os.memfd_create("minitrain-replica-identity", os.MFD_CLOEXEC)
    try:
        os.write(fd, identity.cert_pem + identity.key_pem)
        path = f"/proc/self/fd/{fd}"
        context.load_cert_chain(path, path)
    finally:
        os.close(fd)
    return context


def _client_context(cert_pem: bytes) -> ssl.SSLContext:
    """Trust exactly `cert_pem` and nothing else; the handshake checks the peer holds its key, and the
    caller compares the presented certificate byte for byte."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.check_hostname = False  # pinned: the one certificate names the host already
    context.verify_mode = ssl.CERT_REQUIRED
    if hasattr(ssl, "VERIFY_X509_STRICT"):
        context.verify_flags &= ~ssl.VERIFY_X509_STRICT  # the derived certificate has no key identifiers
    context.load_verify_locations(cadata=cert_pem.decode())
    return context


def _der(cert_pem: bytes) -> bytes:
    return ssl.PEM_cert_to_DER_cert(cert_pem.decode())


# ------------------------------------------------------------------------------------------ the server


class ReplicaServer:
    """Serves PUT and GET of directories under `tier_root` to the run's other agents.

    `ReplicaServer(tier_root, token, host, reserve, release=None)`: `tier_root` is an existing private
    directory; `token` is the run token (authenticates every connection, and over TLS derives the server's
    certificate); `host` is the address it binds, the one peers dial (not a wildcard: the certificate names
    it). `reserve(rel, total_bytes) -> bool` is called before a PUT's bytes arrive: False refuses it ("the
    tier is full") with nothing written. A PUT that fails after its reservation deletes its temporary directory
    and calls `release(rel)`; a PUT that succeeds keeps the reservation for the new contents (the directory it
    replaced, if any, is deleted: `reserve` sees the same `rel`, so the caller can net it out).

    One server per tier root: `start()` deletes what an earlier one left there (its TEMP_PREFIX entries).
    `start()` binds an ephemeral port and returns it; connections are served one thread each, at most
    `max_connections` at once (more are closed at accept). `close()` stops accepting, ends the open
    connections and joins every thread. A connection that has not authenticated within `auth_timeout_s`, or
    whose peer sends or reads nothing for `io_timeout_s`, is closed.
    """

    def __init__(self, tier_root: str, token: str, host: str, reserve: Callable[[str, int], bool],
                 release: Optional[Callable[[str], None]] = None, *, auth_timeout_s: float = AUTH_TIMEOUT_S,
                 io_timeout_s: float = IO_TIMEOUT_S, max_connections: int = MAX_CONNECTIONS):
        if not token:
            raise ValueError("ReplicaServer needs the run token (token is empty)")
        host = host.strip("[]")
        try:
            wildcard = ipaddress.ip_address(host).is_unspecified
        except ValueError:
            wildcard = False  # a host name
        if wildcard:
            raise ValueError(f"ReplicaServer host {host!r} is a wildcard; give the address peers dial "
                             "(the server's certificate names it)")
        self.tier_root = os.path.abspath(tier_root)
        self.host = host
        self._token = token
        self._reserve = reserve
        self._release = release
        self.auth_timeout_s = auth_timeout_s
        self.io_timeout_s = io_timeout_s
        self.max_connections = max_connections
        self._slots = threading.BoundedSemaphore(max_connections)
        self._tls: Optional[ssl.SSLContext] = None
        self._expected = b""
        self._listener: Optional[socket.socket] = None
        self._wake_r: Optional[socket.socket] = None
        self._wake_w: Optional[socket.socket] = None
        self._accepter: Optional[threading.Thread] = None
        self._lock = threading.Lock()  # guards _connections, _threads and _closed
        self._install_lock = threading.Lock()  # one rename-aside-and-in at a time
        self._connections: dict[threading.Thread, socket.socket] = {}  # the ones serving, their sockets
        self._threads: set[threading.Thread] = set()  # every connection thread not yet joined
        self._closed = False
        self.port = 0

    def start(self) -> int:
        """Bind `host` on an ephemeral port, start serving, and return the port (once per server)."""
        if self._listener is not None or self._closed:
            raise RuntimeError("a ReplicaServer starts once")
        if not os.path.isdir(self.tier_root):
            raise ValueError(f"the tier root {self.tier_root!r} is not a directory; create it (0700) first")
        self._sweep()
        if tls.uses_tls(self.host):
            self._tls = _server_context(_identity(self._token, self.host))
        family, kind, proto, _, address = socket.getaddrinfo(self.host, 0, type=socket.SOCK_STREAM,
                                                             flags=socket.AI_PASSIVE)[0]
        listener = socket.socket(family, kind, proto)
        try:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            _tune(listener)  # accepted sockets inherit the buffers
            listener.bind(address)
            listener.listen(64)
            listener.setblocking(False)
        except OSError:
            listener.close()
            raise
        self._listener = listener
        self.port = listener.getsockname()[1]
        self._wake_r, self._wake_w = socket.socketpair()
        self._accepter = threading.Thread(target=self._accept_loop, name=f"replica-accept-{self.port}",
                                          daemon=True)
        self._accepter.start()
        return self.port

    def close(self) -> None:
        """Stop accepting, end the open connections (their PUTs are abandoned: temporary directory deleted,
        reservation released) and join every thread. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            open_connections = dict(self._connections)
            threads = set(self._threads)
        if self._wake_w is not None:
            self._wake_w.send(b"x")
        if self._accepter is not None:
            self._accepter.join()
        for sock in open_connections.values():
            try:
                # socket.socket's own shutdown, also on an SSLSocket (whose shutdown would drop its TLS
                # state under the thread using it): wakes a thread blocked in a handshake, recv or send.
                socket.socket.shutdown(sock, socket.SHUT_RDWR)
            except OSError:
                pass
        for thread in threads:  # also those past their socket, still ending (releasing a reservation)
            thread.join()
        for sock in (self._listener, self._wake_r, self._wake_w):
            if sock is not None:
                sock.close()

    def __enter__(self) -> "ReplicaServer":
        """Start (unless started already); `close()` on exit."""
        if self._listener is None:
            self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _sweep(self) -> None:
        """Delete what a previous server on this tier root left when it died mid-transfer."""
        for name in os.listdir(self.tier_root):
            if name.startswith(TEMP_PREFIX):
                shutil.rmtree(os.path.join(self.tier_root, name), ignore_errors=True)

    def _accept_loop(self) -> None:
        with selectors.DefaultSelector() as selector:
            selector.register(self._listener, selectors.EVENT_READ)
            selector.register(self._wake_r, selectors.EVENT_READ)
            while True:
                ready = {key.fileobj for key, _ in selector.select()}
                if self._wake_r in ready:
                    return
                try:
                    sock, peer = self._listener.accept()
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError as error:
                    logger.warning("replica server on %s:%s could not accept: %s", self.host, self.port, error)
                    time.sleep(0.1)  # out of descriptors: let connections end before trying again
                    continue
                if not self._slots.acquire(blocking=False):
                    logger.warning("replica server on %s:%s refused %s: %d connections are open",
                                   self.host, self.port, peer, self.max_connections)
                    sock.close()
                    continue
                thread = threading.Thread(target=self._serve, args=(sock, peer), daemon=True,
                                          name=f"replica-{peer[0]}:{peer[1]}")
                with self._lock:
                    if self._closed:
                        sock.close()
                        self._slots.release()
                        return
                    self._connections[thread] = sock
                    self._threads = {t for t in self._threads if t.is_alive()}
                    self._threads.add(thread)
                thread.start()

    def _serve(self, sock: socket.socket, peer) -> None:
        try:
            self._handle(sock, peer)
        except (OSError, _Malformed, ValueError) as error:  # ssl.SSLError and TimeoutError are OSErrors
            logger.info("replica server on %s:%s dropped %s: %s", self.host, self.port, peer[0], error)
        except Exception:  # a thread that dies silently would hide a bug
            logger.exception("replica server on %s:%s failed serving %s", self.host, self.port, peer[0])
        finally:
            with self._lock:
                served = self._connections.pop(threading.current_thread(), sock)
            served.close()  # the TLS socket once the handshake began (it took over the descriptor)
            sock.close()
            self._slots.release()

    def _handle(self, sock: socket.socket, peer) -> None:
        deadline = time.monotonic() + self.auth_timeout_s
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self._tls is not None:
            sock.settimeout(self.auth_timeout_s)  # bounds the whole handshake
            with self._lock:  # swapped in before any I/O, so close() can always shut it down
                if self._closed:
                    return
                sock = self._tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
                self._connections[threading.current_thread()] = sock
            sock.do_handshake()
        wire = _Wire(sock, self.io_timeout_s)
        challenge = os.urandom(CHALLENGE_BYTES)
        wire.send(challenge)
        answer = wire.recv_exact(hashlib.sha256().digest_size, deadline)
        if not hmac.compare_digest(answer, _answer(self._token, challenge)):
            logger.warning("replica server on %s:%s: %s failed authentication (another run's token?)",
                           self.host, self.port, peer[0])
            wire.send_frame({"ok": False, "reason": "authentication failed: the run token differs"})
            return
        wire.send_frame({"ok": True})
        _, request = wire.recv_frame()
        op = request.get("op")
        try:
            if op == "put":
                self._put(wire, request)
            elif op == "get":
                self._get(wire, request)
            else:
                raise _Malformed(f"an unknown request {op!r}")
        except _Refused as refusal:
            logger.info("replica server on %s:%s refused %s: %s", self.host, self.port, peer[0], refusal)
            try:  # the peer may be mid-send and never read it
                wire.send_frame({"ok": False, "reason": str(refusal)})
            except OSError:
                pass

    def _put(self, wire: _Wire, request: dict) -> None:
        rel = _field_rel(request)
        total = request.get("total_bytes")
        if type(total) is not int or total < 0:
            raise _Malformed(f"total_bytes {total!r}")
        try:
            granted = self._reserve(rel, total)
        except Exception as error:
            logger.exception("replica server on %s:%s: reserve(%r, %d) failed", self.host, self.port, rel, total)
            raise _Refused(f"the tier could not reserve {total} bytes for {rel!r}: {error}") from None
        if not granted:
            raise _Refused(f"the tier is full: no room for {total} bytes of {rel!r}")
        temporary = None
        done = False
        try:
            temporary = tempfile.mkdtemp(prefix=TEMP_PREFIX + "put-", dir=self.tier_root)
            wire.send_frame({"ok": True})
            _receive_files(wire, temporary, total, _transfer_deadline(total, self.io_timeout_s))
            with self._install_lock:
                _install(temporary, os.path.join(self.tier_root, rel), self.tier_root)
            done = True
            logger.info("replica server on %s:%s holds %r (%d bytes)", self.host, self.port, rel, total)
            wire.send_frame({"ok": True, "bytes": total})
        except OSError as error:
            if not done and error.errno in (errno.ENOSPC, errno.EDQUOT):
                raise _Refused(f"the tier is full: writing {rel!r} failed: {error}") from None
            raise
        finally:
            if not done:
                if temporary is not None:
                    shutil.rmtree(temporary, ignore_errors=True)
                if self._release is not None:
                    try:
                        self._release(rel)
                    except Exception:
                        logger.exception("replica server on %s:%s: release(%r) failed", self.host, self.port, rel)

    def _get(self, wire: _Wire, request: dict) -> None:
        rel = _field_rel(request)
        directory = os.path.join(self.tier_root, rel)
        try:
            if not stat.S_ISDIR(os.lstat(directory).st_mode):
                raise FileNotFoundError(directory)
            files = _list_files(directory)
        except FileNotFoundError:
            raise _Refused(f"not found: no directory {rel!r} here") from None
        except ValueError as error:
            raise _Refused(str(error)) from None
        total = sum(size for _, _, size in files)
        wire.send_frame({"ok": True, "total_bytes": total})
        _send_files(wire, files, _transfer_deadline(total, self.io_timeout_s))
        logger.info("replica server on %s:%s sent %r (%d bytes)", self.host, self.port, rel, total)


def _field_rel(request: dict) -> str:
    try:
        return validate_rel(request.get("rel"))
    except ValueError as error:
        raise _Refused(str(error)) from None


def _file_header(header: dict) -> tuple[str, int]:
    try:
        path = validate_file_path(header.get("path"))
    except ValueError as error:
        raise _Refused(str(error)) from None
    size = header.get("size")
    if type(size) is not int or size < 0:
        raise _Malformed(f"the size {size!r} of {path!r}")
    return path, size


def _send_files(wire: _Wire, files: list[tuple[str, str, int]], deadline: float) -> None:
    """Send each file's frame and bytes, then the end frame with the SHA-256 of it all."""
    digest = hashlib.sha256()
    buffer = memoryview(bytearray(CHUNK))
    for relative, full, size in files:
        fd = os.open(full, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            now = os.fstat(fd).st_size
            if now != size:
                raise ValueError(f"{full!r} changed size while being sent ({size} then {now} bytes)")
            digest.update(wire.send_frame({"path": relative, "size": size}))
            wire.send_file(fd, size, digest, buffer, deadline)
        finally:
            os.close(fd)
    wire.send_frame({"end": True, "sha256": digest.hexdigest()})


# ------------------------------------------------------------------------------------------ the clients


def _label(address: tuple[str, int]) -> str:
    host, port = address[0], address[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _connect(address: tuple[str, int], token: str, timeout_s: float, action: str) -> _Wire:
    """Connect, TLS when the host is not loopback (pinned to the run's derived certificate), authenticate;
    ReplicationError naming the peer and `action` on any failure."""
    host, port = address[0].strip("[]"), int(address[1])
    peer = _label((host, port))
    sock = None
    try:
        family, kind, proto, _, target = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
        _tune(sock)
        sock.settimeout(timeout_s)
        sock.connect(target)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if tls.uses_tls(host):
            pinned = _identity(token, host).cert_pem
            try:
                sock = _client_context(pinned).wrap_socket(sock, server_hostname=None)
            except ssl.SSLCertVerificationError as error:
                raise ReplicationError(
                    f"replica peer {peer} refused to {action}: TLS handshake failed: its certificate is not this "
                    f"run's (another run's token, or not a replica server): {error.verify_message}") from None
            if sock.getpeercert(binary_form=True) != _der(pinned):
                raise ReplicationError(f"replica peer {peer}: TLS handshake failed: it presented a certificate "
                                       "other than this run's")
        wire = _Wire(sock, timeout_s)
        challenge = wire.recv_exact(CHALLENGE_BYTES)
        wire.send(_answer(token, challenge))
        _, reply = wire.recv_frame()
        if reply.get("ok") is not True:
            raise ReplicationError(f"replica peer {peer} refused to {action}: {reply.get('reason')}")
        return wire
    except ReplicationError:
        if sock is not None:
            sock.close()
        raise
    except (OSError, _Malformed) as error:
        if sock is not None:
            sock.close()
        raise ReplicationError(f"replica peer {peer}: could not {action}: {_describe(error)}") from None


def _describe(error: BaseException) -> str:
    if isinstance(error, ssl.SSLError):
        return f"TLS failed: {error}"
    if isinstance(error, TimeoutError):
        return f"timed out ({error})"
    if isinstance(error, (ConnectionError, EOFError)):
        return f"connection lost ({error}); the peer may be at its connection limit or gone"
    return str(error)


def push_dir(address: tuple[str, int], token: str, local_dir: str, rel: str, timeout_s: float = 60) -> int:
    """Copy the regular files under `local_dir` to the replica server at `address` as `<its tier root>/<rel>`;
    returns the bytes of file content sent. The server shows the directory only once it all arrived intact,
    replacing any directory it had under `rel`.

    `timeout_s` bounds each wait on the peer (connect, handshake, every CHUNK), not the whole transfer.
    ReplicationError (naming the peer and the reason) when `rel` or a file name cannot travel, the peer
    refused (the tier is full, authentication failed, the TLS certificate is not this run's) or the
    connection was lost; the peer then keeps nothing of this push.
    """
    action = f"store {rel!r}"
    peer = _label(address)
    try:
        validate_rel(rel)
        files = _list_files(local_dir)
    except (ValueError, OSError) as error:
        raise ReplicationError(f"cannot push {local_dir!r} to replica peer {peer} as {rel!r}: {error}") from None
    total = sum(size for _, _, size in files)
    wire = _connect(address, token, timeout_s, action)
    try:
        wire.send_frame({"op": "put", "rel": rel, "total_bytes": total})
        _, reply = wire.recv_frame()
        if reply.get("ok") is not True:
            raise ReplicationError(f"replica peer {peer} refused to {action}: {reply.get('reason')}")
        try:
            _send_files(wire, files, float("inf"))
        except ValueError as error:  # a local file changed under us
            raise ReplicationError(f"cannot push {local_dir!r} to replica peer {peer}: {error}") from None
        except OSError as error:
            reason = _reason_after_failure(wire)
            raise ReplicationError(f"replica peer {peer}: could not {action}: "
                                   f"{reason or _describe(error)}") from None
        _, reply = wire.recv_frame()
        if reply.get("ok") is not True:
            raise ReplicationError(f"replica peer {peer} refused to {action}: {reply.get('reason')}")
        return total
    except (OSError, _Malformed) as error:
        raise ReplicationError(f"replica peer {peer}: could not {action}: {_describe(error)}") from None
    finally:
        wire.sock.close()


def _reason_after_failure(wire: _Wire) -> Optional[str]:
    """The server's refusal, when it sent one before closing on us mid-send (a full tier, a bad path)."""
    try:
        wire.timeout_s = 1.0
        _, reply = wire.recv_frame()
        return str(reply.get("reason")) if reply.get("ok") is False else None
    except (OSError, _Malformed):
        return None


def fetch_dir(address: tuple[str, int], token: str, rel: str, local_dir: str, timeout_s: float = 60) -> int:
    """Copy the directory `rel` of the replica server at `address` to `local_dir`; returns the bytes of file
    content received. The files land in a temporary sibling of `local_dir`, renamed into place (replacing
    any `local_dir`) only once all arrived intact; on failure nothing is left behind.

    `timeout_s` bounds each wait on the peer, as for `push_dir`. ReplicationError (naming the peer and the
    reason) when the peer refused (not found, authentication failed, TLS certificate not this run's), sent
    something malformed or altered, or the connection was lost.
    """
    action = f"send {rel!r}"
    peer = _label(address)
    try:
        validate_rel(rel)
    except ValueError as error:
        raise ReplicationError(f"cannot fetch {rel!r} from replica peer {peer}: {error}") from None
    local_dir = os.path.abspath(local_dir)
    parent = os.path.dirname(local_dir)
    wire = _connect(address, token, timeout_s, action)
    temporary = None
    try:
        wire.send_frame({"op": "get", "rel": rel})
        _, reply = wire.recv_frame()
        if reply.get("ok") is not True:
            raise ReplicationError(f"replica peer {peer} refused to {action}: {reply.get('reason')}")
        total = reply.get("total_bytes")
        if type(total) is not int or total < 0:
            raise _Malformed(f"total_bytes {total!r}")
        os.makedirs(parent, exist_ok=True)
        temporary = tempfile.mkdtemp(prefix=f".{os.path.basename(local_dir)}{TEMP_PREFIX}", dir=parent)
        received = _receive_files(wire, temporary, total, float("inf"))
        _install(temporary, local_dir, parent)
        temporary = None
        return received
    except _Refused as error:
        raise ReplicationError(f"replica peer {peer} sent {rel!r} wrong: {error}") from None
    except (OSError, _Malformed) as error:
        raise ReplicationError(f"replica peer {peer}: could not {action}: {_describe(error)}") from None
    finally:
        wire.sock.close()
        if temporary is not None:
            shutil.rmtree(temporary, ignore_errors=True)


def _receive_files(wire: _Wire, root: str, total: int, deadline: float) -> int:
    """Receive file frames into the fresh directory `root` until the end frame; returns the bytes received.
    _Refused names what was wrong: a bad path, a path sent twice, more files or bytes than allowed or
    announced, a SHA-256 other than the sender's."""
    digest = hashlib.sha256()
    buffer = memoryview(bytearray(CHUNK))
    received = files = 0
    while True:
        if time.monotonic() > deadline:
            raise TimeoutError("the transfer fell below the minimum rate")
        frame, header = wire.recv_frame()
        if header.get("end") is True:
            if header.get("sha256") != digest.hexdigest():
                raise _Refused("the directory arrived altered: its SHA-256 differs from the sender's")
            if received != total:
                raise _Refused(f"{received} bytes arrived, {total} were announced")
            return received
        digest.update(frame)
        path, size = _file_header(header)
        files += 1
        if files > MAX_FILES:
            raise _Refused(f"more than {MAX_FILES} files in one directory")
        if received + size > total:
            raise _Refused(f"{path!r} takes the directory past the {total} bytes announced")
        full = os.path.join(root, path)
        try:
            os.makedirs(os.path.dirname(full), mode=0o700, exist_ok=True)
            fd = os.open(full, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except (FileExistsError, NotADirectoryError, IsADirectoryError):
            raise _Refused(f"the file path {path!r} is sent twice or clashes with a directory") from None
        try:
            wire.recv_file(fd, size, digest, buffer, deadline)
        finally:
            os.close(fd)
        received += size
