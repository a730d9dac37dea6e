"""What one process of the scale simulation's clients saw (`bench.scale.clients`), written as JSON at the end."""

from __future__ import annotations

import array
import sys
import time
from typing import Optional


class Stats:
    """What this process saw, written as JSON (and latencies as raw doubles) at the end."""

    def __init__(self, warmup_rounds: int):
        self.warmup_rounds = warmup_rounds
        self.latencies = array.array("d")  # seconds, rounds >= warmup_rounds
        self.sent = 0
        self.acked = 0
        self.reordered = 0
        self.reopened = 0  # streams opened again after breaking during start-up
        self.held_back = 0  # ticks a rank skipped because its report window was full
        self.silenced_at: list[float] = []  # wall clock of each agent's "silent" fault
        self.lost_at: list[float] = []  # wall clock of each agent's "host_lost" fault
        self.relaunched_at: list[float] = []  # wall clock of each new agent started for a lost node
        self.rejoined_at: list[float] = []  # ... and of its hello to the coordinator
        self.messages_up = 0  # gRPC messages written towards the coordinator (agents' and workers')
        self.items_up = 0  # worker and agent messages in them (a RelayedUp counts its items)
        self.acks_per_second: dict[int, int] = {}
        self.messages_per_second: dict[int, int] = {}  # gRPC messages written, per wall-clock second
        self.lag: list[float] = []  # how late the ticker was, per tick
        self.errors: list[str] = []
        self.first_report_at: Optional[float] = None
        self.last_report_at: Optional[float] = None

    def error(self, text: str) -> None:
        """Record an error; it also goes to stderr (the client's log) at once, so a run that stalls says why."""
        self.errors.append(text)
        print(text, file=sys.stderr, flush=True)

    def sent_message(self, items: int) -> None:
        """One gRPC message towards the coordinator, carrying `items` agent or worker messages."""
        self.messages_up += 1
        self.items_up += items
        second = int(time.time())
        self.messages_per_second[second] = self.messages_per_second.get(second, 0) + 1
