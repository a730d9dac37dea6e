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

Beside the session, the process may run a tuning trial: `link_trial`/`current_trial` (the seam
between minitrain.tune and `TorchTrainer.fit()`, see `TrialLink`).
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
from typing import Any, Iterator, Optional, Protocol

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


def current_or_none() -> Optional[Session]:
    """The current session (as `current` finds it), or None outside a training function."""
    session = _bound.get()
    return session if session is not None else _current


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


class TrialLink(Protocol):
    """A tuning trial's link to its sweep, as `fit()` sees it (the seam between minitrain.tune and
    TorchTrainer.fit()): a fit() run inside a trial reports each of its report rounds to the trial
    (Ray's TuneReportCallback, implicit)."""

    def run_observer(self, callbacks: Any = ()) -> Any:
        """A new driver-side observer (minitrain.coordinator.observers.RunObserver) for one fit();
        `callbacks` are that fit()'s RunConfig.callbacks (a Tune callback among them may change what is
        forwarded)."""


_trial: Optional[TrialLink] = None  # the trial this process runs, if it runs one


def link_trial(link: Optional[TrialLink]) -> None:
    """Make `link` the trial of this process (None unlinks it).

    Who sets it: minitrain.tune's trial process (tune/trial_process.py), once, before it runs the
    trainable. Who reads it: `TorchTrainer.fit()`, through `current_trial()`, so that fit() forwards
    its rounds without importing minitrain.tune. Why process-wide: a trial owns its whole process, so
    every fit() in it, on whatever thread the trainable starts it, belongs to that trial."""
    global _trial
    with _lock:
        _trial = link


def current_trial() -> Optional[TrialLink]:
    """The tuning trial this process runs, or None outside a trial (see `link_trial`)."""
    with _lock:
        return _trial
