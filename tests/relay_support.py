"""The agent relay's upward side as its tests see it: what `minitrain.agent.transport.relay.RelayServer`
hands to `send_up`, for the in-process relay tests (tests/unit/test_agent_relay.py) and those with real
worker processes (tests/process/test_relay_processes.py)."""

from __future__ import annotations

import threading

from minitrain.rpc._gen import minitrain_pb2 as pb


class Upward:
    """Stands in for the agent's stream to the coordinator as the relay's `send_up`
    (`CoordinatorStream._queue_relayed`): keeps every `RelayedMessage` handed up, in order, in `items`.
    `wait_for` waits until a predicate of the items holds, up to `deadline_s`, or fails naming what did not
    happen."""

    def __init__(self, deadline_s: float) -> None:
        self.items: list[pb.RelayedMessage] = []
        self.deadline_s = deadline_s
        self._cond = threading.Condition()

    def send_up(self, items: list) -> None:
        with self._cond:
            self.items.extend(items)
            self._cond.notify_all()

    def wait_for(self, predicate, what: str) -> None:
        with self._cond:
            assert self._cond.wait_for(lambda: predicate(self.items), timeout=self.deadline_s), \
                f"{what} within {self.deadline_s} s; got {self.items}"

    def of_stream(self, number: int) -> list[pb.RelayedMessage]:
        """The items of relayed stream `number`, in order."""
        with self._cond:
            return [item for item in self.items if item.stream == number]

    def closed(self, number: int) -> int:
        """How many times stream `number` was said to be closed (once at most, if the relay is right)."""
        return sum(1 for item in self.of_stream(number) if item.closed)

    def stream_of_rank(self, rank: int) -> int:
        """The number of the first stream that carried a message of `rank`."""
        with self._cond:
            return next(item.stream for item in self.items if not item.closed and item.message.rank == rank)
