"""Who may read the dashboard and press its buttons.

- On a loopback address, only this machine can connect, and no token is asked. The Host header must
  still name a loopback address: otherwise a web page whose DNS name is re-pointed at 127.0.0.1 (DNS
  rebinding) could read the API from the user's own browser.
- On any other address, every request needs the viewer token: a fresh random 256-bit string made for
  this server (never the run's RPC token, which stays inside the coordinator). It is accepted as
  `Authorization: Bearer <token>`, as the `token` query parameter (the URL printed at start), or as the
  `minitrain_dashboard` cookie that a page opened with the query parameter sets (HttpOnly,
  SameSite=Strict), and compared in constant time.
- Every POST (the "dump stacks" action) also needs the header `X-Minitrain-Dashboard: 1`, and an
  Origin header, when sent, must be this server: a cross-site form or script cannot add such a header
  without a CORS preflight, which this server never answers, so no other site can make a browser press
  the button (CSRF).
"""

from __future__ import annotations

import hmac
import secrets
from dataclasses import dataclass
from http.cookies import CookieError, SimpleCookie
from typing import Mapping, Optional
from urllib.parse import urlsplit

from minitrain.dashboard.settings import is_loopback_host

COOKIE = "minitrain_dashboard"
ACTION_HEADER = "X-Minitrain-Dashboard"


def new_viewer_token() -> str:
    """A fresh 256-bit URL-safe token."""
    return secrets.token_urlsafe(32)


@dataclass(frozen=True)
class Verdict:
    """The answer to one request: `status` 200 lets it through; otherwise `reason` says why not.
    `set_cookie` is True when the request carried a valid token in its URL (the page then keeps it as a
    cookie for the requests its script makes)."""

    status: int
    reason: str = ""
    set_cookie: bool = False


class Access:
    """The rules above for one server. `token` is None exactly when the server is on loopback."""

    def __init__(self, token: Optional[str]):
        self.token = token

    def check(self, method: str, query: Mapping[str, list[str]], headers: Mapping[str, str]) -> Verdict:
        """The verdict for a request (`headers` looked up case-insensitively, as http.server gives them)."""
        host = _host_name(headers.get("Host", ""))
        from_url = False
        if self.token is None:
            if host is None or not is_loopback_host(host):
                return Verdict(403, "this dashboard answers only to a loopback Host (127.0.0.1, localhost, [::1])")
        else:
            given, from_url = _token_in(query, headers)
            if given is None or not hmac.compare_digest(given.encode(), self.token.encode()):
                return Verdict(401, "a valid viewer token is required (the URL printed when the dashboard "
                                    "started, or Authorization: Bearer <token>)")
        if method == "POST":
            if headers.get(ACTION_HEADER) != "1":
                return Verdict(403, f"an action needs the header {ACTION_HEADER}: 1 (sent by the page's script)")
            origin = headers.get("Origin")
            if origin is not None and urlsplit(origin).netloc != headers.get("Host", ""):
                return Verdict(403, "cross-origin actions are refused")
        return Verdict(200, set_cookie=from_url)

    def cookie_header(self) -> str:
        """The Set-Cookie value that keeps the viewer token for the page's own requests."""
        return f"{COOKIE}={self.token}; HttpOnly; SameSite=Strict; Path=/"


def _token_in(query: Mapping[str, list[str]], headers: Mapping[str, str]) -> tuple[Optional[str], bool]:
    """The token a request carries and whether it came in the URL."""
    authorization = headers.get("Authorization", "")
    if authorization.startswith("Bearer "):
        return authorization[len("Bearer "):].strip(), False
    if query.get("token"):
        return query["token"][0], True
    raw = headers.get("Cookie")
    if raw:
        try:
            morsel = SimpleCookie(raw).get(COOKIE)
        except CookieError:
            morsel = None
        if morsel is not None:
            return morsel.value, False
    return None, False


def _host_name(netloc: str) -> Optional[str]:
    """The host part of a Host header or an origin's netloc ('[::1]:80' -> '::1'), or None if absent."""
    if not netloc:
        return None
    if netloc.startswith("["):
        end = netloc.find("]")
        return netloc[1:end] if end > 0 else None
    return netloc.rsplit(":", 1)[0] if ":" in netloc else netloc
