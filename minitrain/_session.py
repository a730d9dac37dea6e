"""The per-process training session registry (L0).

Exactly one session is current inside a training function: a `minitrain.worker.session.WorkerSession`
in a worker process, or the trainer's local session when `ScalingConfig(num_workers=0)` runs the
function in the driver. The public functions in `minitrain.train_api` find it here, so they never
import the runtime that created it.

Two scopes, because a worker owns its process but a driver may run several fit()s at once:
- `set_current` (a worker process): the session of the whole process, so threads the training
  function starts (a data loader's, the user's) see it too.
- `bound(session)` (local mode in the driver): the session of the calling thread's context only
  (a contextvars.ContextVar), so two local fit()s on two threads never see each other's session.
  Threads started inside such a function do not inherit it (threading.Thread starts a new context);
  they can be run with `contextvars.copy_context().run(...)` to see it.
A bound session is found before the process-wide one.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
from typing import Any, Callable, Iterator, Optional, Protocol

from minitrain.context import TrainContext


class Session(Protocol):
    """What a training session offers the public per-worker functions."""

    context: TrainContext

    def report(self, metrics: dict, checkpoint: Any = None, checkpoint_dir_name: Optional[str] = None,
               **options: Any) -> None:
        """Record one report (see `minitrain.report`)."""

    def get_checkpoint(self) -> Any:
        """The checkpoint to resume from, or None (see `minitrain.get_checkpoint`)."""


_lock = threading.Lock()
_current: Optional[Session] = None  # the process's session (a worker process)
_bound: contextvars.ContextVar[Optional[Session]] = contextvars.ContextVar("minitrain_session", default=None)


def set_current(session: Optional[Session]) -> None:
    """Make `session` the current one of the whole process (None clears it). For a process that runs
    one training function only (a worker); a driver's local mode uses `bound`."""
    global _current
    with _lock:
        _current = session


@contextlib.contextmanager
def bound(session: Session) -> Iterator[Session]:
    """While inside: `session` is current for the calling thread's context only, before any
    process-wide session (see the module doc). Restores what was bound before, however it ends."""
    token = _bound.set(session)
    try:
        yield session
    finally:
        _bound.reset(token)


def current(function_name: str) -> Session:
    """The current session; RuntimeError naming `function_name` when called outside training."""
    session = _bound.get()
    if session is None:
        session = _current
    if session is None:
        raise RuntimeError(
            f"minitrain.{function_name}() cannot be used outside of a minitrain training function. "
            "Call it inside the function you pass to TorchTrainer (it runs on every worker)."
        )
    return session


# Process-wide makers of extra driver-side run observers (minitrain.coordinator.observers.RunObserver):
# every TorchTrainer.fit() in this process asks each for one observer. minitrain.tune's trial process
# registers one so that each report round of any fit() it runs reaches the tuner (Ray's
# TuneReportCallback, implicit). A tuning trial owns its whole process, so process-wide is its scope.
_run_observer_makers: list = []


def add_run_observer_maker(maker: Callable[[], Any]) -> None:
    """Give every later `fit()` in this process an observer made by `maker()`."""
    with _lock:
        _run_observer_makers.append(maker)


def new_run_observers() -> list:
    """One new observer from each registered maker, for one `fit()`."""
    with _lock:
        makers = list(_run_observer_makers)
    return [maker() for maker in makers]
