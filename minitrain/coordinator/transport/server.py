"""Runs the coordinator's asyncio gRPC server on a background thread."""

from __future__ import annotations

import asyncio
import gc
import logging
import threading
from typing import Optional

from grpc import aio

from minitrain.coordinator.transport.local_agents import LocalAgentListener
from minitrain.coordinator.transport.service import CoordinatorService, Hub
from minitrain.lease import HEARTBEAT_INTERVAL_S, LEASE_CHECK_INTERVAL_S
from minitrain.rpc import limits, tls
from minitrain.rpc._gen import minitrain_pb2_grpc as pb_grpc
from minitrain.rpc.auth import AioTokenAuthInterceptor
from minitrain.rpc.channel import server_options

logger = logging.getLogger("minitrain.coordinator")

# While a server runs, the cyclic garbage collector's young generation is collected after this many
# net allocations instead of Python's default 700. Every message of every stream allocates a few
# tracked objects (futures, callbacks, events) that die within milliseconds; with 700, at 1024 workers
# reporting 10 times a second, the collector ran about 40 times a second, promoted those short-lived
# objects into older generations, and paused every thread for tens of milliseconds in full
# collections. With 10,000 they mostly die before a collection looks at them (see
# docs/benchmarks/scale.md, "The bottleneck, and what was fixed").
GC_YOUNG_THRESHOLD = 10_000


class _GcThreshold:
    """Raises the young-generation GC threshold for the server's life and puts it back at the end.

    A threshold the application already raised further is left alone; one the application changed
    meanwhile is not overwritten.
    """

    def __init__(self) -> None:
        self._saved: Optional[tuple[int, ...]] = None

    def raise_(self) -> None:
        """Raise the threshold to GC_YOUNG_THRESHOLD unless it is higher already (or collection is off)."""
        current = gc.get_threshold()
        if current[0] and current[0] < GC_YOUNG_THRESHOLD:  # 0: the application disabled collection
            self._saved = current
            gc.set_threshold(GC_YOUNG_THRESHOLD, *current[1:])

    def restore(self) -> None:
        """Put back the threshold `raise_` replaced (idempotent)."""
        if self._saved is not None and gc.get_threshold()[0] == GC_YOUNG_THRESHOLD:
            gc.set_threshold(*self._saved)
        self._saved = None


class CoordinatorServer:
    """An authenticated gRPC server serving `service`, bound only to `hosts` (local addresses), each
    on a free port (or `port` for all of them); 127.0.0.1 alone for a run on this machine.

    Every address that is not loopback (`tls.uses_tls`) serves TLS with `identity`, the run's
    certificate and key, which is then required (ValueError otherwise); loopback is plaintext.
    `start()` first raises the process's file-descriptor limit (`limits.raise_fd_limit`) and caps
    accepted connections below it (`channel.server_options`).

    With `local_agents`, the same service also serves agent streams on a Unix socket
    (`minitrain.coordinator.transport.local_agents`), whose `local_agent_address` an agent on this machine can dial
    instead ("" when there is none: not asked for, or it could not listen, which is logged).

    `start()` returns once the server listens; `address_for(host)` is then what a client dials.
    `stop()` ends every stream and joins the thread. Usable as a context manager. While it runs, the
    process's young-generation GC threshold is GC_YOUNG_THRESHOLD (restored by `stop()`).
    """

    def __init__(self, service: CoordinatorService, hub: Hub, token: str,
                 hosts: "tuple[str, ...] | str" = ("127.0.0.1",),
                 identity: Optional[tls.RunIdentity] = None, port: int = 0, local_agents: bool = False):
        self._service = service
        self._local = LocalAgentListener(service, token) if local_agents else None
        self._local_address = ""
        self._hub = hub
        self._token = token
        self._hosts = (hosts,) if isinstance(hosts, str) else tuple(hosts)
        networked = [host for host in self._hosts if tls.uses_tls(host)]
        if networked and identity is None:
            raise ValueError(f"the coordinator binds {', '.join(networked)}, which is not loopback: "
                             "TLS is required there; pass identity=tls.new_run_identity(hosts)")
        self._identity = identity
        self._port = port  # 0: a free port per host; else this one (the port joined agents dial)
        self._ports: dict[str, int] = {}
        self._thread: Optional[threading.Thread] = None
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._server: Optional[aio.Server] = None
        self._ready = threading.Event()
        self._startup_error: Optional[BaseException] = None
        self._stopped: Optional[asyncio.Event] = None
        self._gc = _GcThreshold()

    @property
    def address(self) -> str:
        """host:port of the first bound address."""
        return self.address_for(self._hosts[0])

    @property
    def port(self) -> Optional[int]:
        """The port of the first bound address (None before start)."""
        return self._ports.get(self._hosts[0])

    @property
    def local_agent_address(self) -> str:
        """"local:<socket path>" for an agent on this machine (after start), "" when there is none."""
        return self._local_address

    def address_for(self, host: str) -> str:
        """host:port that a client reaching this machine at `host` dials."""
        bracketed = f"[{host}]" if ":" in host else host
        return f"{bracketed}:{self._ports[host]}"

    def start(self) -> "CoordinatorServer":
        """Start serving; raises if the server cannot bind."""
        limits.raise_fd_limit()
        self._thread = threading.Thread(target=self._run, name="minitrain-coordinator-grpc", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._startup_error is not None:
            raise self._startup_error
        self._gc.raise_()
        return self

    def _run(self) -> None:
        self._loop = asyncio.new_event_loop()
        try:
            self._loop.run_until_complete(self._serve())
        finally:
            self._loop.close()

    async def _serve(self) -> None:
        try:
            self._stopped = asyncio.Event()
            self._hub.bind_loop(asyncio.get_running_loop())
            self._server = aio.server(interceptors=[AioTokenAuthInterceptor(self._token)],
                                      options=server_options())
            pb_grpc.add_CoordinatorServicer_to_server(self._service, self._server)
            for host in self._hosts:
                bracketed = f"[{host}]" if ":" in host else host
                if tls.uses_tls(host):
                    self._ports[host] = self._server.add_secure_port(
                        f"{bracketed}:{self._port}", tls.server_credentials(self._identity))
                else:
                    self._ports[host] = self._server.add_insecure_port(f"{bracketed}:{self._port}")
            await self._server.start()
        except BaseException as exc:  # surfaced by start()
            self._startup_error = exc
            self._ready.set()
            return
        if self._local is not None:
            try:
                await self._local.start()
                self._local_address = self._local.address
            except OSError as exc:  # the agents dial gRPC on loopback instead: slower, not wrong
                logger.warning("no local socket for this machine's agent (%s); it uses gRPC", exc)
                self._local = None
        self._ready.set()
        leases = asyncio.ensure_future(self._service.watch_leases(HEARTBEAT_INTERVAL_S, LEASE_CHECK_INTERVAL_S))
        await self._stopped.wait()
        leases.cancel()
        if self._local is not None:
            await self._local.stop()
        await self._server.stop(grace=0.5)

    def stop(self) -> None:
        """Stop the server and join its thread (idempotent)."""
        if self._loop is not None and self._stopped is not None and not self._loop.is_closed():
            try:
                self._loop.call_soon_threadsafe(self._stopped.set)
            except RuntimeError:
                pass
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._gc.restore()

    def __enter__(self) -> "CoordinatorServer":
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()
