"""The "dump stacks" button's way into a live run: a run observer that asks the controller for a
rank's stacks (`RunInfo.request_stacks`) and hands the answer (`on_stacks`) to the HTTP thread that
waits for it."""

from __future__ import annotations

import threading
from typing import Callable, Optional

from minitrain.coordinator.observers import AttemptInfo, RunInfo, RunObserver, StackDump

WAIT_S = 15.0  # the agent waits up to a few seconds for a worker's faulthandler; then it answers ""


class StackDesk(RunObserver):
    """`dump(rank)` from any thread: every thread's stack of `rank` in the current attempt."""

    def __init__(self, wait_s: float = WAIT_S):
        self._wait_s = wait_s
        self._request: Optional[Callable[[int], None]] = None
        self._lock = threading.Lock()
        self._answers: dict[int, StackDump] = {}
        self._arrived = threading.Condition(self._lock)
        self._ended = False
        self._world_size: Optional[int] = None  # of the latest attempt: the ranks there are to ask

    def on_run_start(self, run: RunInfo) -> None:
        self._request = run.request_stacks

    def on_attempt_start(self, attempt: AttemptInfo) -> None:
        with self._lock:
            self._world_size = attempt.world_size

    def on_stacks(self, dump: StackDump) -> None:
        with self._arrived:
            self._answers[dump.rank] = dump
            self._arrived.notify_all()

    def on_run_end(self, outcome) -> None:
        with self._arrived:
            self._ended = True
            self._arrived.notify_all()

    def dump(self, rank: int) -> str:
        """The stacks of `rank`, waiting up to the desk's wait; ValueError for a rank outside the latest
        attempt (0 to its world size - 1), asked of no one; LookupError when the run cannot give them
        (no attempt started yet, ended, or the rank did not answer in time)."""
        request = self._request
        with self._arrived:
            world_size = self._world_size
            if request is None or world_size is None:
                raise LookupError("the run has not started its workers yet")
            if not 0 <= rank < world_size:
                raise ValueError(f"rank {rank} is not in the run: the current attempt has ranks 0 to "
                                 f"{world_size - 1}")
            before = self._answers.get(rank)
        request(rank)
        with self._arrived:
            fresh = self._arrived.wait_for(
                lambda: self._ended or self._answers.get(rank) is not before, timeout=self._wait_s)
            answer = self._answers.get(rank)
            if not fresh or answer is before:
                raise LookupError(f"rank {rank} sent no stacks within {self._wait_s:.0f} s "
                                  f"(it is not running, or the run ended)")
        return answer.text or "(no answer: the process is stopped or blocked in the kernel)"
