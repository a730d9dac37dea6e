"""An HTTP server that a connection flood cannot turn against the driver (stdlib only).

The dashboard shares the driver's process, and so its file descriptors, with the run. A local user
holding hundreds of connections open to a thread-per-connection server once used every descriptor
of the driver: the next checkpoint commit failed with EMFILE and the run died, blamed on a lost node.
`BoundedHTTPServer` gives the dashboard the limits the coordinator's gRPC server has
(minitrain.rpc.limits):

- at most `max_connections` connections are served at once, each on its own thread (so at most that
  many threads); one beyond the cap is closed as soon as it is accepted, and the connections still
  waiting are the kernel's backlog, which costs the process no descriptor;
- a connection must deliver its request and take its reply within `deadline_s` of being accepted
  (a client that trickles bytes to stay under a per-read timeout is cut off too), and may stay
  silent for at most `idle_s` at a time;
- a client that goes away early costs one debug line, never a traceback in the driver's log.
"""

from __future__ import annotations

import logging
import socket
import sys
import threading
import time
from http.server import ThreadingHTTPServer
from typing import Any

logger = logging.getLogger("minitrain")

MAX_CONNECTIONS = 32  # a page, its polling and a Prometheus scraper need a handful
DEADLINE_S = 15.0  # from accept to the last byte of the reply (HTTP/1.0: one request per connection)
IDLE_S = 5.0  # the longest silence within a request


class BoundedHTTPServer(ThreadingHTTPServer):
    """A ThreadingHTTPServer with a connection cap, a per-connection deadline and quiet disconnects."""

    daemon_threads = False
    request_queue_size = 64  # the kernel's backlog: waiting there costs no descriptor
    block_on_close = True  # server_close() joins the request threads; the deadline bounds that wait

    def __init__(self, address: Any, handler: type, max_connections: int = MAX_CONNECTIONS,
                 deadline_s: float = DEADLINE_S, idle_s: float = IDLE_S):
        self.max_connections = max_connections
        self.deadline_s = deadline_s
        self.idle_s = idle_s
        self._open: dict[socket.socket, float] = {}  # served connection -> its deadline (monotonic)
        self._open_lock = threading.Lock()
        self.refused = 0  # connections closed at once because the cap was reached
        super().__init__(address, handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._open_lock:
            full = len(self._open) >= self.max_connections
            if not full:
                self._open[request] = time.monotonic() + self.deadline_s
        if full:
            self.refused += 1
            if self.refused == 1 or self.refused % 1000 == 0:
                logger.debug("dashboard: %d connection(s) refused so far (%d open, the cap)", self.refused,
                             self.max_connections)
            self.shutdown_request(request)
            return
        request.settimeout(self.idle_s)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self._open_lock:
            self._open.pop(request, None)
        super().shutdown_request(request)

    def service_actions(self) -> None:
        """Cut off the connections past their deadline (called by serve_forever every poll interval):
        the blocked read or write of their thread returns and the thread ends."""
        now = time.monotonic()
        with self._open_lock:
            overdue = [sock for sock, deadline in self._open.items() if deadline < now]
            for sock in overdue:
                self._open[sock] = float("inf")  # once
        for sock in overdue:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def handle_error(self, request: Any, client_address: Any) -> None:
        """One debug line for a client that went away or was cut off; a real fault of a handler is
        logged with its traceback once."""
        exc = sys.exc_info()[1]
        if isinstance(exc, OSError):  # ConnectionError, TimeoutError: the client went away or was cut off
            logger.debug("dashboard: connection from %s ended early: %s", client_address[0],
                         type(exc).__name__)
            return
        logger.warning("dashboard: a request from %s failed", client_address[0], exc_info=True)


class BoundedHTTPServerV6(BoundedHTTPServer):
    """The same on an IPv6 address."""

    address_family = socket.AF_INET6
