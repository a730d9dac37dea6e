"""Runs the coordinator's asyncio gRPC server on a background thread."""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Optional

from grpc import aio

from minitrain.coordinator.service import CoordinatorService, Hub
from minitrain.rpc._gen import minitrain_pb2_grpc as pb_grpc
from minitrain.rpc.auth import AioTokenAuthInterceptor
from minitrain.rpc.channel import SERVER_OPTIONS

logger = logging.getLogger("minitrain.coordinator")

HEARTBEAT_INTERVAL_S = 1.0


class CoordinatorServer:
    """An authenticated gRPC server serving `service`, bound only to `hosts` (local addresses), each
    on a free port; 127.0.0.1 alone for a run on this machine.

    `start()` returns once the server listens; `address_for(host)` is then what a client dials.
    `stop()` ends every stream and joins the thread. Usable as a context manager.
    """

    def __init__(self, service: CoordinatorService, hub: Hub, token: str,
                 hosts: "tuple[str, ...] | str" = ("127.0.0.1",)):
        self._service = service
        self._hub = hub
        self._token = token
        self._hosts = (hosts,) if isinstance(hosts, str) else tuple(hosts)
        self._ports: dict[str, int] = {}
        self._thread: Optional[threading.Thread] = None
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._server: Optional[aio.Server] = None
        self._ready = threading.Event()
        self._startup_error: Optional[BaseException] = None
        self._stopped: Optional[asyncio.Event] = None

    @property
    def address(self) -> str:
        """host:port of the first bound address."""
        return self.address_for(self._hosts[0])

    @property
    def port(self) -> Optional[int]:
        """The port of the first bound address (None before start)."""
        return self._ports.get(self._hosts[0])

    def address_for(self, host: str) -> str:
        """host:port that a client reaching this machine at `host` dials."""
        bracketed = f"[{host}]" if ":" in host else host
        return f"{bracketed}:{self._ports[host]}"

    def start(self) -> "CoordinatorServer":
        """Start serving; raises if the server cannot bind."""
        self._thread = threading.Thread(target=self._run, name="minitrain-coordinator-grpc", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._startup_error is not None:
            raise self._startup_error
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
                                      options=SERVER_OPTIONS)
            pb_grpc.add_CoordinatorServicer_to_server(self._service, self._server)
            for host in self._hosts:
                bracketed = f"[{host}]" if ":" in host else host
                self._ports[host] = self._server.add_insecure_port(f"{bracketed}:0")
            await self._server.start()
        except BaseException as exc:  # surfaced by start()
            self._startup_error = exc
            self._ready.set()
            return
        self._ready.set()
        leases = asyncio.ensure_future(self._service.watch_leases(HEARTBEAT_INTERVAL_S))
        await self._stopped.wait()
        leases.cancel()
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

    def __enter__(self) -> "CoordinatorServer":
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()
