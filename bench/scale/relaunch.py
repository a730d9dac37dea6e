"""Relaunching a lost fake agent: the coordinator's fake launcher asks, the client process serving the node
answers by starting a new agent for it (so that the simulation regains the hosts it lost).

The request is one JSON line on the client process's stdin, after its configuration line (which carries
the run token, as a real agent's stdin does): {"relaunch": NODE_ID}. This module owns that format: both
sides use it.
"""

from __future__ import annotations

import json
import threading
from typing import IO, Callable

RELAUNCH = "relaunch"


def request(node_id: str) -> bytes:
    """The line that asks a client process to start a new agent for `node_id`."""
    return json.dumps({RELAUNCH: node_id}).encode() + b"\n"


def read_requests(stream: IO[str], post: Callable[[str], None]) -> threading.Thread:
    """Read relaunch requests from `stream` until it ends, calling `post(node_id)` for each
    (from a daemon thread: `post` must hand the request to the event loop, e.g. call_soon_threadsafe)."""

    def read() -> None:
        for line in stream:
            if line.strip():
                ask = json.loads(line)
                post(ask[RELAUNCH])

    thread = threading.Thread(target=read, name="relaunch-requests", daemon=True)
    thread.start()
    return thread

