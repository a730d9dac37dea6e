"""The report window: the backpressure of `report()`, a part of the wire protocol (L1).

A rank keeps at most REPORT_WINDOW reports in flight that the coordinator has not recorded. Every
RECEIPT_EVERY-th report (rounds 63, 127, ...) sets `Report.wants_receipt`, and the coordinator answers it
with a `ReportReceipt` as soon as it recorded that report (not when its round commits, so a rank never
waits on another); a commit's `ReportAck` says as much for its round. Past the window, report() waits for
a receipt: a saturated coordinator slows the training loops down instead of the reports queueing without
bound in the workers, their agents and the coordinator (memory, and a latency that only grows).

256 reports are 25 s of a 10 Hz loop, within the lease's allowance for late heartbeats (60 s), so a
coordinator that keeps up, or that pauses for a few seconds, never makes report() wait; one receipt per
64 reports costs the coordinator a few bytes a rank every several seconds at 10 Hz.
"""

from __future__ import annotations

REPORT_WINDOW = 256
RECEIPT_EVERY = 64


def wants_receipt(round_: int) -> bool:
    """Whether report `round_` (from 0) asks for a receipt."""
    return round_ % RECEIPT_EVERY == RECEIPT_EVERY - 1


def oldest_allowed(round_: int) -> int:
    """The round the coordinator must have recorded before report `round_` may go."""
    return round_ - REPORT_WINDOW


def must_wait(round_: int, recorded_round: int) -> bool:
    """Whether report `round_` must wait, the coordinator having recorded rounds up to `recorded_round`
    (-1: none); it may go once `recorded_round` reaches `oldest_allowed(round_)`."""
    return oldest_allowed(round_) > recorded_round
