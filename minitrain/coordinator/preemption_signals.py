"""Preemption signals to the driver: noted, never acted on in the handler.

Two scopes, both on the main thread only, both leaving a handler of the user's own alone:
- `preemption_deferred`, for the whole `fit()`: a signal before the controller's loop runs (storage
  checks, agents starting) is kept for the loop; one after it ended is dropped (the run is over). Without
  it, SIGUSR2's default action would kill the driver in those windows.
- `preemption_noted`, while the controller's loop and its teardown run: each signal calls `note(name)`,
  which queues an event for the loop (the controller's `preempt`: a SimpleQueue put, which Python
  allows in a signal handler). The loop decides at its next turn (coordinator/policy/decide.py).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Callable, Iterator, Sequence

_pending: list[str] = []  # signals `preemption_deferred` kept for the loop (appended by a handler only)


def _keep(signum: int, frame: object) -> None:
    _pending.append(signal.Signals(signum).name)


_keep.yields_to_preemption = True  # type: ignore[attr-defined]


def _replaceable(number: signal.Signals) -> bool:
    current = signal.getsignal(number)
    return current is signal.SIG_DFL or getattr(current, "yields_to_preemption", False)


@contextlib.contextmanager
def _installed(names: Sequence[str], handler: Callable) -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous: dict[signal.Signals, object] = {}
    for name in names:
        number = signal.Signals[name]
        if _replaceable(number):
            previous[number] = signal.signal(number, handler)
    try:
        yield
    finally:
        for number, old in previous.items():
            signal.signal(number, old)


@contextlib.contextmanager
def preemption_deferred(names: Sequence[str]) -> Iterator[None]:
    """For a whole `fit()`: the signals `names` (FailureConfig's preemption_signals) whose handler is
    the default are kept for the controller's loop instead of killing the driver (see the module doc).
    SIGTERM normally has `fit()`'s SIGTERM-as-Ctrl-C handler here, which stays."""
    del _pending[:]
    try:
        with _installed([n for n in names if signal.getsignal(signal.Signals[n]) is signal.SIG_DFL], _keep):
            yield
    finally:
        del _pending[:]


@contextlib.contextmanager
def preemption_noted(names: Sequence[str], note: Callable[[str], None]) -> Iterator[None]:
    """While the controller's loop runs: each of the signals `names` only calls `note(name)`, and the
    signals kept since `fit()` began are noted first. A signal whose handler is neither the default nor
    one that yields to preemption (`fit()`'s SIGTERM-as-Ctrl-C and `preemption_deferred`'s, marked
    `yields_to_preemption`) is left alone: a handler of the user's own wins. The previous handlers come
    back on the way out."""
    def on_signal(signum: int, frame: object) -> None:
        note(signal.Signals(signum).name)

    with _installed(names, on_signal):
        while _pending:
            note(_pending.pop(0))
        yield
