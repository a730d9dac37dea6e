"""The worker's side of a preemption (coordinator/facts/preemption.py has the protocol).

The stream thread marks the rank noticed and answers with its report count (`WorkerClient`); this
module is what the training thread does about it:
- `after_report(rounds)`, called at the end of each report() once the rank is noticed: wait until the
  agreed round R is known (milliseconds: every rank's stream thread answers at once), and after the
  report with index R (rounds > R) hold until minitrain stops this worker, so that nothing is computed
  past the agreed checkpoint;
- `info(rounds)`, `get_preemption_info()`: None before the notice; once noticed, wait for R, then the
  `PreemptionInfo` from the R-th report on, None before it.
Nothing here runs in a signal handler: signals reach the driver or the agents, never this code.
"""

from __future__ import annotations

from typing import Optional

from minitrain.records import PreemptionInfo
from minitrain.worker.transport.client import WorkerClient

WAIT_S = 7 * 24 * 3600.0  # the coordinator always answers or ends the stream; the stop bounds the hold


class PreemptionGate:
    """One rank's view of the agreed round, through its `client`."""

    def __init__(self, client: WorkerClient):
        self._client = client
        self._info: Optional[PreemptionInfo] = None

    def _round(self) -> PreemptionInfo:
        if self._info is None:
            command = self._client.wait_preemption_round(WAIT_S)
            self._info = PreemptionInfo(deadline_ms=command.deadline_ms or None,
                                        preempted_node_to_ranks={node: list(ranks) for node, ranks in command.node_ranks},
                                        round=command.round, signal=command.signal)
        return self._info

    def after_report(self, rounds: int) -> None:
        """The rank, noticed, has made `rounds` reports: wait for the round; past it, hold until
        stopped (StreamClosed when the coordinator ends the stream instead)."""
        if rounds > self._round().round:
            self._client.wait_closed(WAIT_S)

    def info(self, rounds: int) -> Optional[PreemptionInfo]:
        """What `get_preemption_info()` returns after `rounds` reports."""
        if not self._client.preemption_noticed:
            return None
        info = self._round()
        return info if rounds >= info.round else None
