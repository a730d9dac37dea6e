"""`CallbackRunner`: the run observer that calls `RunConfig.callbacks` on a thread of its own (L3).

The controller tells its observers about the run on its own thread, and each call must be quick.
User callbacks may be slow (a tracker's network I/O), so this observer only turns each event into
calls and queues them; one thread per run makes the calls, one at a time, in the order the events
happened and, for each event, in the order of `RunConfig.callbacks`. When the run ends, `fit()`
waits until the queue is drained, up to `drain_timeout_s`; then it warns, names the call still
running, and returns (the thread is a daemon, so it never keeps the interpreter alive). While a
call hangs, at most `MAX_QUEUED` events wait behind it; later ones are dropped with one warning naming
the call, so a hung callback costs neither the run nor unbounded memory.

A hook that raises is logged with its traceback (the first `LOGGED_FAILURES` of each callback; the
others are counted) and the run goes on; a callback whose `on_run_start` raised is not called again
in this run (a tracker that could not start has nothing to log into). When the run ends, one warning
sums up every callback that failed.
"""

from __future__ import annotations

import logging
import queue
import threading
from typing import Any, Callable, Optional, Sequence

from minitrain.callbacks.base import TrainRunContext
from minitrain.checkpoint import Checkpoint
from minitrain.coordinator.observers import AttemptEnd, AttemptInfo, RoundInfo, RunInfo, RunObserver
from minitrain.errors import rebuild_exception
from minitrain.records import RunOutcome, WorkerFailure
from minitrain.run_state import RunState

logger = logging.getLogger("minitrain")

DRAIN_TIMEOUT_S = 120.0
MAX_QUEUED = 10_000  # events waiting for the callback thread (a round each); beyond: dropped
LOGGED_FAILURES = 3
_STOP = object()


def _name(callback: object) -> str:
    return type(callback).__name__


class CallbackRunner(RunObserver):
    """Calls `callbacks` (UserCallbacks, trackers, or objects with some of their hooks) for one run.

    Hooks are looked up by name, so a callback may have any subset of them. Per report round every
    callback gets `on_report` (rank 0's metrics), then `on_checkpoint` (when the round committed one),
    then Ray's `after_report`; per failed attempt `after_exception`, then `on_attempt_failure`.
    """

    def __init__(self, callbacks: Sequence[object], context: TrainRunContext,
                 drain_timeout_s: float = DRAIN_TIMEOUT_S):
        self.callbacks = tuple(callbacks)
        self.context = context
        self.drain_timeout_s = drain_timeout_s
        self.failures: dict[int, int] = {}  # index in callbacks -> hook calls that raised
        self._disabled: set[int] = set()
        self._calls: "queue.SimpleQueue[Any]" = queue.SimpleQueue()
        self._thread: Optional[threading.Thread] = None
        self._current = ""  # the call in progress, for the drain warning
        self.dropped = 0  # events not queued because MAX_QUEUED were waiting (a hung callback)

    # ------------------------------------------------------------------ RunObserver (controller thread)

    def on_run_start(self, run: RunInfo) -> None:
        self._thread = threading.Thread(target=self._serve, name=f"minitrain-callbacks-{run.run_id[:8]}",
                                        daemon=True)
        self._thread.start()
        self._queue(lambda cb: ("on_run_start", (self.context,), {}))

    def on_attempt_start(self, attempt: AttemptInfo) -> None:
        self._queue(lambda cb: ("on_attempt_start", (self.context, attempt.attempt, attempt.world_size), {}))

    def on_round(self, round_: RoundInfo) -> None:
        storage = self.context.storage
        checkpoint = None
        if round_.checkpoint is not None:
            checkpoint = Checkpoint(storage.path(round_.checkpoint.dir_name), filesystem=storage.checkpoint_fs)
        by_rank = [dict(m) if m is not None else {} for m in round_.metrics_by_rank]
        rank0 = round_.metrics_by_rank[0] if round_.metrics_by_rank else None
        step = round_.index

        def calls(callback: object) -> list:
            found = []
            if rank0 is not None:
                found.append(("on_report", (self.context, step, dict(rank0)), {}))
            if checkpoint is not None:
                found.append(("on_checkpoint", (self.context, step, checkpoint, dict(rank0 or {})), {}))
            found.append(("after_report", (), {"run_context": self.context, "metrics": [dict(m) for m in by_rank],
                                               "checkpoint": checkpoint}))
            return found

        self._queue_many(calls)

    def on_attempt_end(self, end: AttemptEnd) -> None:
        if not end.failures:
            return
        first: dict[int, WorkerFailure] = {}
        for failure in end.failures:  # the order they were learned: the first of a rank is its own
            first.setdefault(failure.rank, failure)
        pickles = dict(end.exceptions)
        error = end.root_cause or "; ".join(f.cause for f in first.values())

        rebuilt: dict[int, BaseException] = {}  # unpickled on the callback thread, once

        def calls(callback: object) -> list:
            if not rebuilt:
                rebuilt.update({rank: rebuild_exception(f, pickles.get(rank)) for rank, f in sorted(first.items())})
            exceptions = dict(rebuilt)
            return [("after_exception", (), {"run_context": self.context, "worker_exceptions": exceptions}),
                    ("on_attempt_failure", (self.context, end.attempt, error, end.restarting), {})]

        self._queue_many(calls)

    def on_run_end(self, outcome: RunOutcome) -> None:
        error = (outcome.error_message or None) if outcome.state is not RunState.SUCCEEDED else None
        # Callback.on_run_end's `status` is the state's name ("SUCCEEDED", "FAILED", "ABORTED"), as documented.
        self._queue(lambda cb: ("on_run_end", (self.context, outcome.state.value, error), {}))
        self._calls.put(_STOP)
        self.drain()

    # ------------------------------------------------------------------ draining (fit() thread)

    def drain(self) -> bool:
        """Wait until every queued call was made, up to `drain_timeout_s`. True when drained; else a
        warning names the call still running and False."""
        if self._thread is None:
            return True
        self._thread.join(self.drain_timeout_s)
        if self._thread.is_alive():
            logger.warning("RunConfig.callbacks: still busy %.0f s after the run ended (in %s); fit() returns "
                           "without waiting for the rest of their calls", self.drain_timeout_s, self._current)
            return False
        if self.failures:
            summary = ", ".join(f"{_name(self.callbacks[i])} {n} time(s)" for i, n in sorted(self.failures.items()))
            logger.warning("RunConfig.callbacks raised during the run (see the tracebacks above): %s", summary)
        return True

    # ------------------------------------------------------------------ the callback thread

    def _queue(self, call: Callable[[object], tuple]) -> None:
        self._queue_many(lambda callback: [call(callback)])

    def _queue_many(self, calls: Callable[[object], list]) -> None:
        if self._thread is None:
            return
        if self._calls.qsize() >= MAX_QUEUED:
            self.dropped += 1
            if self.dropped == 1:
                logger.warning("RunConfig.callbacks: %d events wait behind %s, which has not returned; later "
                               "events are not passed to the callbacks (the run goes on)", MAX_QUEUED,
                               self._current or "a callback")
            return
        self._calls.put(calls)

    def _serve(self) -> None:
        while True:
            calls = self._calls.get()
            if calls is _STOP:
                return
            for index, callback in enumerate(self.callbacks):
                if index in self._disabled:
                    continue
                for hook, args, kwargs in calls(callback):
                    self._call(index, callback, hook, args, kwargs)

    def _call(self, index: int, callback: object, hook: str, args: tuple, kwargs: dict) -> None:
        method = getattr(callback, hook, None)
        if not callable(method) or index in self._disabled:
            return
        self._current = f"{_name(callback)}.{hook}"
        try:
            method(*args, **kwargs)
        except Exception:  # noqa: BLE001 - a callback never changes the run's outcome
            count = self.failures[index] = self.failures.get(index, 0) + 1
            if count <= LOGGED_FAILURES:
                logger.exception("RunConfig.callbacks[%d] (%s) raised in %s%s", index, _name(callback), hook,
                                 "; its later failures are only counted" if count == LOGGED_FAILURES else "")
            if hook == "on_run_start":
                self._disabled.add(index)
                logger.error("RunConfig.callbacks[%d] (%s) is not called again in this run: its on_run_start "
                             "failed", index, _name(callback))
        finally:
            self._current = ""
