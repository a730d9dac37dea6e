"""Ctrl-C while the controller's loop runs: noted for the loop, not raised in the middle of an action."""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Callable


@contextlib.contextmanager
def sigint_noted(note: Callable[[], None]):
    """While the loop runs on the main thread with Python's default SIGINT handling, Ctrl-C only calls
    `note` (the loop acts on it at its next turn) instead of raising KeyboardInterrupt wherever the
    thread happens to be, which could cut an action in half. A third press raises at once, for a
    teardown that is itself stuck."""
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
        yield
        return
    presses = 0

    def on_sigint(signum, frame):
        nonlocal presses
        presses += 1
        if presses >= 3:
            raise KeyboardInterrupt
        note()

    signal.signal(signal.SIGINT, on_sigint)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
