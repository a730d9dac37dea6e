"""The per-process training session registry (L0).

Exactly one session is current inside a training function: a `minitrain.worker.session.WorkerSession`
in a worker process, or the trainer's local session when `ScalingConfig(num_workers=0)` runs the
function in the driver. The public functions in `minitrain.train_api` find it here, so they never
import the runtime that created it.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Optional, Protocol

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
_current: Optional[Session] = None


def set_current(session: Optional[Session]) -> None:
    """Make `session` the current one (None clears it)."""
    global _current
    with _lock:
        _current = session


def current(function_name: str) -> Session:
    """The current session; RuntimeError naming `function_name` when called outside training."""
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


def remove_run_observer_maker(maker: Callable[[], Any]) -> None:
    """Undo `add_run_observer_maker(maker)` (nothing when it is not registered)."""
    with _lock:
        if maker in _run_observer_makers:
            _run_observer_makers.remove(maker)


def new_run_observers() -> list:
    """One new observer from each registered maker, for one `fit()`."""
    with _lock:
        makers = list(_run_observer_makers)
    return [maker() for maker in makers]
