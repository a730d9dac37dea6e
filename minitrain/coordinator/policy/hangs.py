"""Hung ranks (pure): when a rank counts as hung, and reading the stack dumps taken then.

When one rank hangs, its peers soon block in a collective waiting for it. Both stop reporting, but
only the first is the cause: a rank whose main thread sits inside torch.distributed is waiting on
another rank, so its hang is marked a consequence and not chosen as the root cause.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass
from typing import Optional, Union

_THREAD_HEADER = re.compile(r"^(Current thread|Thread) 0x[0-9a-f]+ .*\(most recent call first\):", re.M)
_MAIN_MARKER = "minitrain/worker/bootstrap.py"
# Where a rank waits on its peers: a torch.distributed call, DDP's forward (buffer broadcast),
# minitrain.collective's barrier or broadcast, or autograd's engine, where DDP's gradient
# all-reduce runs in backward hooks (under DDP, loss.backward() blocks there when a peer stops:
# its innermost Python frame is torch/autograd/graph.py).
# Under JAX, a jitted step dispatches asynchronously and the process blocks when it reads a result
# (jax/_src/array.py: `block_until_ready`, `__array__`, `_value`): a rank waiting there for a peer's
# collective has that as its innermost Python frame.
_COLLECTIVE = re.compile(r"torch/distributed/|torch/nn/parallel/distributed\.py|torch/autograd/|"
                         r"minitrain/collective\.py|jax/_src/array\.py")
# A checkpoint report waiting for its round's commit waits on its peers too (the round commits once every
# rank reported it), though its innermost frame is a lock's wait: any frame of the main thread counts.
# Without it, a rank that reported a checkpoint a few ms before a peer hung could be blamed for the hang
# (its last report arrived first: reports travel in batches, a plain one up to 5 ms later).
_WAITS_FOR_COMMIT = re.compile(r'minitrain/worker/session\.py", line \d+ in _wait_for_commit')


def main_thread_stack(dump: str) -> str:
    """The section of a faulthandler dump that belongs to the worker's main thread (runs the user's
    training function under minitrain's bootstrap); "" when it cannot be found."""
    starts = [m.start() for m in _THREAD_HEADER.finditer(dump)] + [len(dump)]
    for begin, end in zip(starts, starts[1:]):
        section = dump[begin:end]
        if _MAIN_MARKER in section:
            return section
    return ""


def waits_in_collective(dump: str) -> bool:
    """True when the main thread waits on a peer: its innermost frame is in torch.distributed (or DDP's
    autograd hooks, minitrain.collective), or it is a checkpoint report waiting for its round's commit."""
    section = main_thread_stack(dump)
    frames = [line for line in section.splitlines() if line.strip().startswith("File ")]
    return bool(frames) and (bool(_COLLECTIVE.search(frames[0])) or any(_WAITS_FOR_COMMIT.search(f) for f in frames))


# ---------------------------------------------------------------------- deadlines

AUTO = "auto"
AUTO_FLOOR_S = 600.0  # FailureConfig.worker_hang_floor_s's default: torch's NCCL collective timeout
AUTO_FACTOR = 10.0  # a rank is hung past this many times its slowest recent report interval
START_ALLOWANCE_S = 1800.0  # "auto": the deadline of a rank's first step in an attempt is at least this
UPLOAD_ALLOWANCE_S = 1800.0  # while a rank uploads a checkpoint, its deadline is at least this
PACE_WINDOW = 100  # report intervals remembered per rank
PACE_MIN_INTERVALS = 2  # "auto" derives a deadline from a rank's pace once it has shown this many intervals


@dataclass(frozen=True)
class HangRule:
    """How long a rank may go without progress before it counts as hung.

    `timeout_s` a number: a fixed deadline, from the rank's entry into its training function on.
    `timeout_s` "auto": `max(floor_s, factor x the slowest of its last PACE_WINDOW report
    intervals)`, the group's slowest standing in while the rank has shown fewer than PACE_MIN_INTERVALS
    (see `Pace.slowest`), and at least `start_allowance_s` until its first report of the attempt
    (a restore or a recompilation after a restart); never hung while no pace is known at all
    (start-up and the first steps of a run take a time nothing predicts). `timeout_s` None: never hung.
    While a rank uploads a checkpoint its deadline is at least `upload_allowance_s`, whatever the rule.
    """

    timeout_s: Union[float, str, None] = AUTO
    floor_s: float = AUTO_FLOOR_S
    factor: float = AUTO_FACTOR
    start_allowance_s: float = START_ALLOWANCE_S
    upload_allowance_s: float = UPLOAD_ALLOWANCE_S

    def deadline_s(self, slowest: Optional[float], *, starting: bool, uploading: bool) -> Optional[float]:
        """Seconds without progress after which the rank is hung; None when it is never hung.

        `slowest`: the rank's slowest recent report interval, None while its pace is not known
        (`Pace.slowest`); `starting`: it has not reported yet in this attempt; `uploading`: it is
        uploading a checkpoint now."""
        if self.timeout_s is None:
            return None
        if self.timeout_s != AUTO:
            deadline = float(self.timeout_s)
        elif slowest is None:
            # No pace known, the rank's nor the group's: an hour-long first epoch looks exactly like a
            # hang, so nothing is judged (a fixed timeout covers start-up; torch's collective timeout
            # still ends a rank that waits for a peer frozen at start).
            return None
        else:
            deadline = max(self.floor_s, self.factor * slowest)
            if starting:
                deadline = max(deadline, self.start_allowance_s)
        if uploading:
            deadline = max(deadline, self.upload_allowance_s)
        return deadline

    def shortest_deadline_s(self) -> Optional[float]:
        """A bound no `deadline_s` goes below, whatever the rank's pace and state; None when no rank
        is ever hung. (The controller judges the ranks only once the oldest progress is that old.)"""
        if self.timeout_s is None:
            return None
        return self.floor_s if self.timeout_s == AUTO else float(self.timeout_s)

    def explain(self, slowest: Optional[float], *, starting: bool, uploading: bool) -> str:
        """Where `deadline_s` came from, in words, for the hang's message (same arguments)."""
        extra = ""
        if self.timeout_s == AUTO:
            how = f"{self.factor:g} x its slowest recent report interval ({slowest or 0.0:.3g} s)"
            if starting:
                extra += f"; at least {self.start_allowance_s:g} s for its first step"
            head = (f"FailureConfig.worker_hang_timeout_s='auto': {how}, "
                    f"at least worker_hang_floor_s={self.floor_s:g}")
        else:
            head = f"FailureConfig.worker_hang_timeout_s={self.timeout_s:g}"
        if uploading:
            extra += f"; at least {self.upload_allowance_s:g} s while it uploads a checkpoint"
        return head + extra


class Pace:
    """The report intervals of each rank, kept across attempts (pure; the caller passes the time).

    `started(rank)` marks a rank's entry into its training function; the interval up to its first
    report after that spans a start (restore, compilation) and is not counted.
    """

    def __init__(self) -> None:
        self._intervals: dict[int, deque[float]] = {}
        # The window's maximum, kept as it slides (each report O(1) amortized, not a max over the window):
        # (interval number, interval) of the intervals no later one is as slow as, oldest (the max) first.
        self._peaks: dict[int, deque[tuple[int, float]]] = {}
        self._shown: dict[int, int] = {}  # intervals each rank has shown, all attempts together
        self._last: dict[int, Optional[float]] = {}
        self._slowest: dict[int, float] = {}  # kept up to date by reported(): read on every decision
        self._group: Optional[float] = None  # group_slowest(), cached until a report may lower it
        self._group_known = True

    def started(self, rank: int) -> None:
        """The rank (re)entered training: its next report opens a new interval chain."""
        self._last[rank] = None

    def reported(self, rank: int, now: float) -> None:
        """The rank's report arrived at `now`."""
        last = self._last.get(rank)
        self._last[rank] = now
        if last is None:
            return
        interval = max(0.0, now - last)
        window = self._intervals.get(rank)
        if window is None:
            window = self._intervals[rank] = deque(maxlen=PACE_WINDOW)
            self._peaks[rank] = deque()
        window.append(interval)
        number = self._shown.get(rank, 0)
        self._shown[rank] = number + 1
        peaks = self._peaks[rank]
        while peaks and peaks[-1][1] <= interval:
            peaks.pop()  # never the maximum again: this later interval is as slow and leaves the window later
        peaks.append((number, interval))
        if peaks[0][0] <= number - PACE_WINDOW:
            peaks.popleft()  # slid out of the window
        if len(window) < PACE_MIN_INTERVALS:
            return
        slowest = peaks[0][1]
        before = self._slowest.get(rank)
        self._slowest[rank] = slowest
        if self._group_known:
            if self._group is None or slowest >= self._group:
                self._group = slowest
            elif before is not None and before >= self._group:
                self._group_known = False  # the slowest rank got faster: group_slowest() looks again

    def slowest(self, rank: int) -> Optional[float]:
        """The rank's slowest interval of its last PACE_WINDOW; until it has shown PACE_MIN_INTERVALS
        intervals, the group's (`group_slowest`): ranks of one job step in lockstep, and the rank
        that froze first is the one with the least history; None when no rank's pace is known."""
        slowest = self._slowest.get(rank)
        return slowest if slowest is not None else self.group_slowest()

    def knows(self, rank: int) -> bool:
        """The rank has shown PACE_MIN_INTERVALS intervals: `slowest(rank)` is its own and changes only
        with its own reports."""
        return rank in self._slowest

    def group_slowest(self) -> Optional[float]:
        """The slowest recent interval of any rank whose pace is known; None when none is."""
        if not self._group_known:  # O(ranks), only after the group's slowest rank got faster
            self._group, self._group_known = max(self._slowest.values(), default=None), True
        return self._group

    def intervals(self, rank: int) -> tuple[float, ...]:
        """The rank's recent report intervals, oldest first."""
        return tuple(self._intervals.get(rank, ()))
