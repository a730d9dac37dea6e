"""Policies over lost hosts (pure): when a lost remote host may come back into the run."""

from __future__ import annotations


class HostBackoff:
    """When a lost remote host may be tried again: 30 s after its first loss, doubling each time."""

    FIRST_S = 30.0
    LONGEST_S = 600.0

    def __init__(self) -> None:
        self._until: dict[str, float] = {}
        self._delay: dict[str, float] = {}

    def failed(self, node_id: str, now: float) -> None:
        """The node was lost (again): keep it out longer."""
        delay = min(self._delay.get(node_id, self.FIRST_S / 2) * 2, self.LONGEST_S)
        self._delay[node_id] = delay
        self._until[node_id] = now + delay

    def may_retry(self, node_id: str, now: float) -> bool:
        """True once the node's backoff has run out."""
        return now >= self._until.get(node_id, 0.0)
