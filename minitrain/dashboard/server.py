"""The dashboard's HTTP server: the page, its static files, `/api/...`, `/parts` and `/metrics`.

A stdlib threading HTTP server on a thread of its own (the driver has no event loop to share, and a
page of a few kilobytes every two seconds needs nothing more), with the limits of
`bounded_http.BoundedHTTPServer`: a connection cap, a deadline per connection and quiet disconnects,
so no flood of connections can take the driver's file descriptors from the run. Each request is checked by
`auth.Access` before anything else is read from it. Routes:

    GET  /                         the page (pages.page_html)
    GET  /static/<file>            uPlot and the page's script and style, from the package
    GET  /api/<view>               JSON of one view (api.VIEWS)
    GET  /parts                    the page's server-rendered sections, as JSON {element id: html}
    GET  /metrics                  Prometheus text format (prometheus.RunCollector)
    POST /api/ranks/<rank>/stacks  every thread's stack of that rank, as text (live runs only)

A server may also be given extra GET `routes` (path -> handler of the query), answered before the
ones above and under the same access rules: minitrain.tune serves its sweep page that way, on a
server with no run view (then only the routes and the static files are served).
"""

from __future__ import annotations

import json
import logging
import math
import re
import socket
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from importlib import resources
from typing import Any, Callable, Optional
from urllib.parse import parse_qs, urlsplit

from prometheus_client import CONTENT_TYPE_LATEST

from minitrain.dashboard import pages
from minitrain.dashboard.api import BadQuery, RunView, api_view
from minitrain.dashboard.auth import Access, new_viewer_token
from minitrain.dashboard.bounded_http import IDLE_S, BoundedHTTPServer, BoundedHTTPServerV6
from minitrain.dashboard.prometheus import exposition, registry_for
from minitrain.dashboard.settings import DashboardAddress

logger = logging.getLogger("minitrain")

# rank -> every thread's stack of that rank; raises ValueError for a rank the run does not have (answered
# 400) and LookupError when the rank gives no answer (answered 404), each with a one-line reason.
StackDumper = Callable[[int], str]
# An extra GET route: the parsed query -> (body, content type); raises BadQuery for a bad parameter.
Route = Callable[[dict], "tuple[bytes, str]"]

_STATIC_TYPES = {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8",
                 ".LICENSE": "text/plain; charset=utf-8"}
_STACKS = re.compile(r"^/api/ranks/([^/]*)/stacks$")
# A rank in a path is ASCII digits, at most this many: enough for any world size, and far below the
# 4,300 digits past which int() raises (a 5,000-digit rank once wrote a traceback per request).
_RANK_DIGITS = 9
_SHOWN = 64  # characters of a client's path or value quoted in a reply or a log line
# The page loads only its own files; nothing may frame it; no referrer carries the token elsewhere.
_SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                               "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


def to_json(value: Any) -> str:
    """JSON that browsers parse: NaN and infinities (allowed in reports) become null."""
    return json.dumps(_finite(value), separators=(",", ":"))


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def _shown(text: str) -> str:
    """`text` cut to `_SHOWN` characters for a reply or a log line: a client chooses its length."""
    return text if len(text) <= _SHOWN else f"{text[:_SHOWN]}... ({len(text)} characters)"


def _rank_in_path(text: str) -> int:
    """The rank of `/api/ranks/<rank>/stacks`; BadQuery (400) naming the value unless it is 1 to
    `_RANK_DIGITS` ASCII digits (checked before int() sees it)."""
    if not (0 < len(text) <= _RANK_DIGITS and text.isascii() and text.isdigit()):
        raise BadQuery(f"rank {_shown(text)!r} in /api/ranks/<rank>/stacks is not a rank: "
                       f"use a rank of the current attempt, 0 to its world size - 1")
    return int(text)


def _static_files() -> dict[str, bytes]:
    """The package's static files by name, read once (a fixed set: no path from a request touches disk)."""
    root = resources.files("minitrain.dashboard") / "static"
    return {entry.name: entry.read_bytes() for entry in root.iterdir()
            if entry.is_file() and any(entry.name.endswith(ext) for ext in _STATIC_TYPES)}


class DashboardServer:
    """Serves one run's monitor at `address` until `stop()` (also a context manager).

    `live` adds the stacks action (through `dump_stacks`) and the page's polling; a post-hoc server
    (live=False) only reads. A non-loopback address gets a fresh viewer token (see auth)."""

    def __init__(self, view: Optional[RunView], address: DashboardAddress, live: bool = True,
                 dump_stacks: Optional[StackDumper] = None, routes: Optional[dict[str, Route]] = None):
        if view is None and not routes:
            raise ValueError("DashboardServer needs a run view, extra routes, or both")
        self.view = view
        self.live = live
        self.dump_stacks = dump_stacks
        self.routes = dict(routes or {})
        self.access = Access(None if address.is_loopback else new_viewer_token())
        self.registry = registry_for(view) if view is not None else None
        self.static = _static_files()
        self._address = address
        self._httpd: Optional[BoundedHTTPServer] = None
        self._thread: Optional[threading.Thread] = None

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> "DashboardServer":
        """Bind and serve on a daemon thread; OSError when the address cannot be bound."""
        server_class = BoundedHTTPServerV6 if ":" in self._address.host else BoundedHTTPServer
        # Request threads are joined by server_close(): nothing outlives stop(). Each connection serves
        # one request (HTTP/1.0) within the server's deadline, so that join is bounded.
        httpd = server_class((self._address.host, self._address.port), _handler_for(self))
        self._httpd = httpd
        self._thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.2},
                                        name="minitrain-dashboard", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving, close the socket and wait for the serving thread (idempotent)."""
        httpd, self._httpd = self._httpd, None
        if httpd is None:
            return
        httpd.shutdown()
        httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def __enter__(self) -> "DashboardServer":
        return self.start() if self._httpd is None else self

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def port(self) -> int:
        """The bound port (the one the system picked when the address said 0)."""
        assert self._httpd is not None, "start() first"
        return self._httpd.server_address[1]

    @property
    def url(self) -> str:
        """The page's URL, with the viewer token when one is needed. A wildcard bind is named by this
        machine's name, which other machines can reach it by."""
        host = self._address.host
        if host in ("0.0.0.0", "::", ""):
            host = socket.getfqdn()
        shown = f"[{host}]" if ":" in host else host
        token = f"?token={self.access.token}" if self.access.token else ""
        return f"http://{shown}:{self.port}/{token}"


def _handler_for(server: DashboardServer) -> type:
    class Handler(_Handler):
        dashboard = server
    return Handler


class _Handler(BaseHTTPRequestHandler):
    dashboard: DashboardServer
    server_version = "minitrain-dashboard"
    protocol_version = "HTTP/1.0"
    timeout = IDLE_S  # seconds a client may stay silent mid-request (the whole request has a deadline too)

    def log_message(self, format: str, *args) -> None:  # noqa: A002 - http.server's signature
        # The request line is the client's: cut, so one request costs one short debug line.
        shown = tuple(_shown(arg) if isinstance(arg, str) else arg for arg in args)
        logger.debug("dashboard %s: " + format, self.address_string(), *shown)

    def finish(self) -> None:
        # A client that went away leaves a reply that cannot be flushed: the server's handle_error
        # already says so in one debug line; a second traceback from here would only repeat it.
        try:
            super().finish()
        except OSError:
            pass

    # ------------------------------------------------------------------ dispatch

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self._dispatch("GET")

    def do_POST(self) -> None:  # noqa: N802
        self._dispatch("POST")

    def _dispatch(self, method: str) -> None:
        url = urlsplit(self.path)
        query = parse_qs(url.query)
        verdict = self.dashboard.access.check(method, query, self.headers)
        if verdict.status != 200:
            self._send(verdict.status, verdict.reason.encode(), "text/plain; charset=utf-8")
            return
        if method == "POST":  # nothing is read from an action's body; drain what is small, refuse the rest
            length_text = self.headers.get("Content-Length") or "0"
            length = int(length_text) if length_text.isdigit() else -1
            if not 0 <= length <= 65536:
                self._send(413, b"an action takes no body", "text/plain; charset=utf-8")
                return
            self.rfile.read(length)
        extra = {"Set-Cookie": self.dashboard.access.cookie_header()} if verdict.set_cookie else {}
        try:
            if method == "POST":
                self._post(url.path)
            else:
                self._get(url.path, query, extra)
        except BadQuery as exc:
            self._send(400, str(exc).encode(), "text/plain; charset=utf-8")
        except (ConnectionError, TimeoutError):  # the client went away: the server says so in one debug line
            raise
        except Exception:  # noqa: BLE001 - one bad request never stops the server
            logger.exception("dashboard: %s %s failed", method, _shown(url.path))
            self._send(500, b"internal error (see the driver's log)", "text/plain; charset=utf-8")

    def _get(self, path: str, query: dict, extra: dict) -> None:
        board = self.dashboard
        if path in board.routes:
            body, kind = board.routes[path](query)
            self._send(200, body, kind, extra)
        elif path.startswith("/static/") and path[len("/static/"):] in board.static:
            name = path[len("/static/"):]
            kind = next(t for ext, t in _STATIC_TYPES.items() if name.endswith(ext))
            self._send(200, board.static[name], kind)
        elif board.view is None:
            self._send(404, b"not found", "text/plain; charset=utf-8")
        elif path in ("/", "/index.html"):
            # backslashreplace: a lone surrogate in old run data shows as its escape, never a 500
            body = pages.page_html(board.view, board.live, to_json).encode("utf-8", "backslashreplace")
            self._send(200, body, "text/html; charset=utf-8", extra)
        elif path == "/parts":
            self._json(pages.parts(board.view, board.live))
        elif path.startswith("/api/"):
            try:
                self._json(api_view(board.view, path[len("/api/"):], query))
            except KeyError:
                self._send(404, b"no such view", "text/plain; charset=utf-8")
        elif path == "/metrics":
            self._send(200, exposition(board.registry), CONTENT_TYPE_LATEST)
        else:
            self._send(404, b"not found", "text/plain; charset=utf-8")

    def _post(self, path: str) -> None:
        match = _STACKS.match(path)
        if match is None:
            self._send(404, b"not found", "text/plain; charset=utf-8")
            return
        if not self.dashboard.live or self.dashboard.dump_stacks is None:
            self._send(409, b"stacks can only be taken while the run is live", "text/plain; charset=utf-8")
            return
        rank = _rank_in_path(match.group(1))
        try:
            text = self.dashboard.dump_stacks(rank)
        except ValueError as exc:  # a rank the run does not have
            raise BadQuery(str(exc)) from None
        except LookupError as exc:
            self._send(404, str(exc).encode(), "text/plain; charset=utf-8")
            return
        self._send(200, text.encode(), "text/plain; charset=utf-8")

    # ------------------------------------------------------------------ replies

    def _json(self, value: Any) -> None:
        self._send(200, to_json(value).encode(), "application/json")

    def _send(self, status: int, body: bytes, content_type: str, extra: Optional[dict] = None) -> None:
        self.send_response(status, HTTPStatus(status).phrase)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in {**_SECURITY_HEADERS, **(extra or {})}.items():
            self.send_header(name, value)
        if status == 401:
            self.send_header("WWW-Authenticate", 'Bearer realm="minitrain dashboard"')
        self.end_headers()
        self.wfile.write(body)
