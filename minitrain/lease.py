"""A lease on a peer whose heartbeats share an ordered stream with its data (L0, stdlib only).

Both ends of an agent's stream hold one: the coordinator on each agent, each agent on the coordinator.
Each relayed worker holds one on its agent with the same interval and timeout: the agent's relay sends a
heartbeat to a worker it sent nothing else for HEARTBEAT_INTERVAL_S (minitrain.agent.transport.relay), and
a worker that read nothing for LEASE_TIMEOUT_S ends itself (minitrain.worker.transport.local_client). That
stream is a local socket: no backlog to allow for, so the worker's lease is the plain timeout.
The peer is silent when nothing of it was read for `timeout_s` plus its backlog: how long its latest
stamped message took from being stamped (`sent_at`, the peer's wall clock when it queued the message)
to being read here. An agent stamps every message and sends a heartbeat only when it queued nothing
else for HEARTBEAT_INTERVAL_S; the coordinator stamps its heartbeats. Messages travel in one ordered
stream, behind whatever the peer queued before them, so when the reader falls behind (a coordinator
saturated by reports) they arrive late. Judged by read times alone, a peer that is alive and sending
looked silent, and the coordinator declared healthy nodes lost
(docs/benchmarks/scale.md, "Past saturation"). A dead or frozen peer is still found by gRPC's keepalive
pings, which the transport answers outside this queue; a peer that stops while backlogged is declared
silent that much later.
Clocks of different hosts may differ: a peer whose clock is ahead reads as no backlog (the plain
timeout), one whose clock is behind as more (a later verdict, never an earlier one). The allowance is
capped at MAX_BACKLOG_S, so a badly skewed clock cannot switch the lease off.

One peer's latest delay is not enough when the reader keeps falling behind: at 4096 fake workers x 10
reports/s on a 2-core VM the coordinator read every agent seconds late and later each second, and a live
agent whose latest message had come 4.2 s late went unread for 9.7 s while its next messages waited
behind the others': declared lost, the run failed. So the reader's own lag counts too (`reader_lag_s`):
the delay, among the peers read in the last moment, beyond each peer's own smallest delay ever
(`Lease.lag_s`: that smallest delay is its clock's offset plus the network's latency, so a skewed clock
adds nothing), at its 90th percentile so that one peer on a slow path does not lengthen every lease. A
silent peer is found `timeout_s` plus the longer of its own backlog and the reader's lag after its last
message: 4.0-4.25 s while the reader keeps up.
"""

from __future__ import annotations

import math
import time
from typing import Callable, Iterable, Optional

MAX_BACKLOG_S = 60.0  # the most a message's delay extends the lease
# Both ends of an agent's stream send a heartbeat this often (the agent: when it sent nothing else
# meanwhile) and hold a lease of LEASE_TIMEOUT_S on the other, which they look at every
# LEASE_CHECK_INTERVAL_S: a silent peer is found 4.0-4.25 s after its last message while the reader keeps
# up (the control plane's target: a silent host among 2,048 found within 5 s). Four heartbeat intervals: a peer
# is lost after missing three heartbeats in a row and most of the fourth, and a reader that falls behind
# extends the lease by its own delay (below), so a live peer behind a busy coordinator is not lost.
HEARTBEAT_INTERVAL_S = 1.0
LEASE_TIMEOUT_S = 4.0
LEASE_CHECK_INTERVAL_S = 0.25

def until_heartbeat_s(quiet_s: float, interval_s: float = HEARTBEAT_INTERVAL_S) -> float:
    """How long an agent that queued nothing for `quiet_s` waits before its next heartbeat; 0 when one
    is due now (a whole interval of quiet). Any message renews its lease at the coordinator, so
    heartbeats only fill the silences."""
    return max(0.0, interval_s - quiet_s)


class Lease:
    """Silence of one peer: `heard()` at every message read from it, with its `sent_at` stamp."""

    __slots__ = ("timeout_s", "_clock", "_wall", "last_heard", "backlog_s", "lag_s", "_least_delay_s")

    def __init__(self, timeout_s: float, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time):
        self.timeout_s = timeout_s
        self._clock = clock
        self._wall = wall
        self.last_heard = clock()
        self.backlog_s = 0.0  # how late the latest stamped message was read (never negative)
        self.lag_s = 0.0  # how much later than this peer's quickest message the latest one was read
        self._least_delay_s: Optional[float] = None  # the smallest (read - stamp) of any of its messages

    def heard(self, sent_at: Optional[float] = None) -> None:
        """A message of the peer was read now; `sent_at`: the peer's wall-clock stamp on it (None or 0:
        not stamped, the backlog and lag stay as they were)."""
        self.last_heard = self._clock()
        if sent_at:
            delay = self._wall() - sent_at
            self.backlog_s = min(max(0.0, delay), MAX_BACKLOG_S)
            if self._least_delay_s is None or delay < self._least_delay_s:
                self._least_delay_s = delay
            self.lag_s = min(delay - self._least_delay_s, MAX_BACKLOG_S)

    def silent_s(self) -> float:
        """Seconds since anything of the peer was read."""
        return self._clock() - self.last_heard

    def expired(self, reader_lag_s: float = 0.0) -> bool:
        """Nothing read for longer than the timeout plus the longer of the peer's backlog and
        `reader_lag_s` (how far behind the reader is: `reader_lag_s()` over every peer)."""
        return self.silent_s() > self.timeout_s + max(self.backlog_s, reader_lag_s)

    def describe(self, reader_lag_s: float = 0.0) -> str:
        """Why it expired (with the `reader_lag_s` it was judged with), for logs and failure messages."""
        text = (f"nothing for {self.silent_s():.1f} s (lease {self.timeout_s:g} s, plus {self.backlog_s:.1f} s "
                "for its latest message's delay")
        if reader_lag_s > self.backlog_s:
            text += f"; the coordinator read its agents {reader_lag_s:.1f} s late"
        return text + ")"


READER_LAG_QUANTILE = 0.9  # of the peers' lags: one slow link (or a few) does not lengthen every lease


def reader_lag_s(leases: Iterable[Lease], since: float) -> Optional[float]:
    """How far behind the reader of `leases` is: the READER_LAG_QUANTILE quantile (nearest rank) of
    `lag_s` among the peers read at or after `since` (the leases' monotonic clock); None when none of them
    was (the reader's lag is unknown then: keep the last one). A reader that falls behind delays every
    peer's messages; a slow network path delays one peer's only, and is left out up to 10% of the peers."""
    lags = sorted(lease.lag_s for lease in leases if lease.last_heard >= since)
    if not lags:
        return None
    return lags[max(0, math.ceil(READER_LAG_QUANTILE * len(lags)) - 1)]
