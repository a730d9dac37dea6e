"""Where the coordinator's core sends its commands: the `Outbox` protocol.

`WorkerGroup`, `Commits` and the controller say what they want done with the records of
`minitrain.commands` and never see the wire format: the gRPC `minitrain.coordinator.transport.service.Hub`
implements this protocol and converts each record in `minitrain.rpc.convert`; unit tests pass a fake
that records what was sent.
"""

from __future__ import annotations

from typing import Protocol

from minitrain.commands import AgentCommand, WorkerCommand


class Outbox(Protocol):
    """Commands to the open agent and worker streams; callable from any thread. Commands to one stream
    arrive in the order they were sent."""

    def to_agent(self, node_id: str, command: AgentCommand) -> bool:
        """Queue `command` for the agent of `node_id`; False when its stream is gone."""

    def to_worker(self, attempt: int, rank: int, command: WorkerCommand) -> bool:
        """Queue `command` for the worker (attempt, rank); False when its stream is gone."""

    def close_worker(self, attempt: int, rank: int) -> None:
        """End the stream of worker (attempt, rank) after what was queued (it sees the stream finish);
        nothing it sends later is read."""
