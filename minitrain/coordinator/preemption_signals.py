"""Preemption signals to the driver while the controller's loop runs: noted for the loop, nothing else."""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Callable, Iterator, Sequence


@contextlib.contextmanager
def preemption_noted(names: Sequence[str], note: Callable[[str], None]) -> Iterator[None]:
    """While the loop runs on the main thread, each of the signals `names` (FailureConfig's
    preemption_signals) only calls `note(name)`, which queues an event for the loop (the controller's
    `preempt`: a SimpleQueue put, which Python allows in a signal handler). Nothing is saved or
    stopped inside the handler: the loop decides at its next turn (coordinator/decide.py).

    A signal whose handler is neither the default nor one that yields to preemption (`fit()`'s
    SIGTERM-as-Ctrl-C, marked `yields_to_preemption`) is left alone: a handler of the user's own
    wins. So is every signal off the main thread. The previous handlers come back on the way out."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous: dict[signal.Signals, object] = {}

    def on_signal(signum: int, frame: object) -> None:
        note(signal.Signals(signum).name)

    for name in names:
        number = signal.Signals[name]
        current = signal.getsignal(number)
        if current is signal.SIG_DFL or getattr(current, "yields_to_preemption", False):
            previous[number] = signal.signal(number, on_signal)
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
