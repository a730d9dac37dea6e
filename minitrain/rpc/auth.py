"""Per-run token authentication for every RPC (L1).

The coordinator mints a token of 256 random bits per run. Agents get it on stdin and workers from
their agent over a pipe; it never appears on a command line or in an environment. Clients send it as
the `x-minitrain-token` metadata entry; the server interceptor compares it in constant time *before*
the handler is chosen, so an unauthenticated request is never deserialised and never reaches a
handler: it is refused with UNAUTHENTICATED.
"""

from __future__ import annotations

import hmac
import secrets
from typing import Callable, Optional

import grpc
from grpc import aio

TOKEN_METADATA_KEY = "x-minitrain-token"
TOKEN_BYTES = 32  # 256 bits


def new_token() -> str:
    """A fresh URL-safe token carrying TOKEN_BYTES random bytes."""
    return secrets.token_urlsafe(TOKEN_BYTES)


def call_metadata(token: str) -> tuple[tuple[str, str], ...]:
    """The metadata a client attaches to every call."""
    return ((TOKEN_METADATA_KEY, token),)


def _presented_token(handler_call_details) -> Optional[str]:
    for key, value in handler_call_details.invocation_metadata or ():
        if key == TOKEN_METADATA_KEY:
            return value if isinstance(value, str) else value.decode("ascii", "replace")
    return None


def token_matches(expected: str, handler_call_details) -> bool:
    """True when the call's metadata carries exactly `expected` (constant-time comparison)."""
    presented = _presented_token(handler_call_details)
    if presented is None:
        return False
    return hmac.compare_digest(presented.encode(), expected.encode())


def _refusal(details: str) -> grpc.RpcMethodHandler:
    # No request_deserializer: the refused request's bytes are never parsed.
    def stream_refused(request_iterator, context):
        context.abort(grpc.StatusCode.UNAUTHENTICATED, details)

    return grpc.stream_stream_rpc_method_handler(stream_refused)


def _aio_refusal(details: str) -> grpc.RpcMethodHandler:
    async def stream_refused(request_iterator, context):
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, details)

    return grpc.stream_stream_rpc_method_handler(stream_refused)


_REFUSED = "missing or wrong minitrain run token"


class TokenAuthInterceptor(grpc.ServerInterceptor):
    """Synchronous-server interceptor: refuse any call whose token does not match.

    `on_refused` (optional) is called with the method name of each refused call, for logs and tests.
    """

    def __init__(self, token: str, on_refused: Optional[Callable[[str], None]] = None):
        self._token = token
        self._on_refused = on_refused

    def intercept_service(self, continuation, handler_call_details):
        if token_matches(self._token, handler_call_details):
            return continuation(handler_call_details)
        if self._on_refused is not None:
            self._on_refused(handler_call_details.method)
        return _refusal(_REFUSED)


class AioTokenAuthInterceptor(aio.ServerInterceptor):
    """asyncio-server interceptor with the same contract as `TokenAuthInterceptor`."""

    def __init__(self, token: str, on_refused: Optional[Callable[[str], None]] = None):
        self._token = token
        self._on_refused = on_refused

    async def intercept_service(self, continuation, handler_call_details):
        if token_matches(self._token, handler_call_details):
            return await continuation(handler_call_details)
        if self._on_refused is not None:
            self._on_refused(handler_call_details.method)
        return _aio_refusal(_REFUSED)
