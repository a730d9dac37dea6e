"""A real S3-compatible HTTP server on loopback for tests: moto's ThreadedMotoServer, with s3fs as client.

Not a conftest: tests/conftest.py builds the ``s3`` fixture on top of this, and a test that needs a
server of its own (say, to see that the port is closed afterwards) uses :func:`s3_server` directly::

    with s3_server() as srv:
        srv.make_bucket("ckpts")
        fs = srv.filesystem()                     # a fresh s3fs.S3FileSystem
        fs.pipe_file("ckpts/run/a.txt", b"hello")
        opts = srv.storage_options()              # plain values: fsspec.filesystem("s3", **opts)

What this does and does not do:

* The server listens on 127.0.0.1 only, on a port the OS picks (port 0), so parallel pytest-xdist
  workers never collide. Each ``s3_server()`` is its own server thread and socket; leaving the
  ``with`` block shuts the server down, joins its thread and closes the listening socket, so the
  port refuses connections afterwards.
* Credentials and region are dummy values passed explicitly to every client. Nothing is read from
  or written to ``~/.aws`` by this module and nothing is set in ``os.environ``. (botocore itself may
  still *look* at ``AWS_*`` variables and ``~/.aws/config`` for settings not passed here -- e.g. a
  stray ``AWS_PROFILE`` naming a missing profile would break client creation -- but explicit
  key/secret/endpoint/region always win.)
* moto keeps its S3 state in module-level globals, i.e. per *process*, not per server: two servers
  alive in one process see the same buckets. Use unique bucket names (the ``s3`` fixture does).
* The region is ``us-west-2``, not ``us-east-1``: s3fs's ``mkdir(bucket)`` sends the client region
  as ``LocationConstraint``, which S3 (and moto) reject for ``us-east-1``.
* werkzeug logs every request at INFO on the ``werkzeug`` logger; with ``quiet=True`` (default) that
  logger is raised to WARNING (process-wide logging state, but nothing else global).
* Leaving the server takes ~0.5 s: werkzeug's ``serve_forever`` polls for shutdown every 0.5 s.
  Prefer one server per module with a fresh bucket per test over one server per test.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import socket
import threading
from typing import Any, Iterator

ACCESS_KEY = "minitrain-test-key"  # dummy; moto accepts any credentials
SECRET_KEY = "minitrain-test-secret"
REGION = "us-west-2"
HOST = "127.0.0.1"
START_TIMEOUT_S = 30.0


@dataclasses.dataclass(frozen=True)
class S3Server:
    """Where a running test server is and how to talk to it. ``bucket`` is set by the ``s3`` fixture."""

    endpoint_url: str
    host: str
    port: int
    access_key: str = ACCESS_KEY
    secret_key: str = SECRET_KEY
    region: str = REGION
    bucket: str | None = None

    def storage_options(self) -> dict[str, Any]:
        """Plain, picklable/JSON-able kwargs: ``fsspec.filesystem("s3", **options)`` rebuilds the client.

        Listing and instance caches are off so that every call asks the server (tests, and processes
        writing the same bucket, see each other's writes at once).
        """
        return {
            "key": self.access_key,
            "secret": self.secret_key,
            "client_kwargs": {"endpoint_url": self.endpoint_url, "region_name": self.region},
            "use_listings_cache": False,
            "skip_instance_cache": True,
        }

    def filesystem(self):
        """A fresh ``s3fs.S3FileSystem`` pointed at this server (never a cached instance)."""
        import s3fs

        return s3fs.S3FileSystem(**self.storage_options())

    @functools.cached_property
    def admin_fs(self):
        """One shared filesystem for bucket housekeeping (a new client costs ~80 ms, a request ~10 ms)."""
        return self.filesystem()

    def make_bucket(self, name: str) -> str:
        """Create bucket ``name`` (S3 rules: 3-63 chars, lowercase, digits, '-', '.'); returns it."""
        self.admin_fs.mkdir(name)
        return name

    def remove_bucket(self, name: str) -> None:
        """Delete bucket ``name`` and every key in it."""
        self.admin_fs.rm(name, recursive=True)

    def with_bucket(self, name: str) -> "S3Server":
        return dataclasses.replace(self, bucket=name)

    def url(self, path: str = "") -> str:
        """``s3://<bucket>/<path>`` for the fixture's bucket."""
        if self.bucket is None:
            raise ValueError("no bucket chosen; use make_bucket() or the s3 fixture")
        return f"s3://{self.bucket}/{path.lstrip('/')}" if path else f"s3://{self.bucket}"


def skip_unless_available() -> None:
    """pytest.skip (module-level safe) when s3fs or moto[server] cannot be imported, saying why."""
    import pytest

    for module, extra in (("s3fs", "'.[s3]' or '.[dev]'"), ("moto.server", "'.[dev]' (moto[server])")):
        try:
            __import__(module)
        except ImportError as exc:  # missing, or present but broken (e.g. mismatched fsspec/flask)
            pytest.skip(f"S3 tests need {module}: {exc!r}; pip install -e {extra}", allow_module_level=True)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def _start(server_cls, port: int):
    """Start a ThreadedMotoServer, but give up after START_TIMEOUT_S instead of hanging.

    ThreadedMotoServer.start() waits on an event that its server thread sets only after binding; if
    binding raises (port taken), the thread dies and start() would wait forever. So start() runs in
    a helper thread we can time out on.
    """
    server = server_cls(ip_address=HOST, port=port, verbose=False)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            server.start()
        except BaseException as exc:  # pragma: no cover - start() itself hardly ever raises
            errors.append(exc)

    starter = threading.Thread(target=run, name="s3server-start", daemon=True)
    starter.start()
    starter.join(START_TIMEOUT_S)
    if starter.is_alive() or errors:
        # The daemon starter thread may stay blocked; nothing is listening, so nothing else leaks.
        raise RuntimeError(f"moto server did not start on {HOST}:{port}: {errors or 'timed out'}")
    return server


@contextlib.contextmanager
def s3_server(*, quiet: bool = True) -> Iterator[S3Server]:
    """Run a moto S3 server on 127.0.0.1 for the duration of the ``with`` block."""
    from moto.server import ThreadedMotoServer

    if quiet:
        logging.getLogger("werkzeug").setLevel(logging.WARNING)

    if hasattr(ThreadedMotoServer, "get_host_and_port"):
        # moto >= 5.0.x: bind port 0 and ask the server which port it got -- no race.
        server = _start(ThreadedMotoServer, 0)
        host, port = server.get_host_and_port()
    else:
        # Older moto cannot report its port: pick a free one, close it, then let moto bind it.
        # Small race: another process may grab the port in between; then the start times out/fails
        # and we retry with another port.
        for attempt in range(3):
            port = _free_port()
            try:
                server = _start(ThreadedMotoServer, port)
                break
            except RuntimeError:
                if attempt == 2:
                    raise
        host = HOST

    try:
        yield S3Server(endpoint_url=f"http://{host}:{port}", host=host, port=port)
    finally:
        # shutdown() + join of the server thread; werkzeug's serve_forever closes the socket on exit.
        server.stop()
