"""Which node agents are in the run: connected (on which stream), lost (and why), relaunched.

The controller tells `Membership` of the agents' connections and losses and asks it which nodes an
attempt may use; before an attempt it has lost agents replaced (`relaunch_lost`), and once the wait
for them is over it leaves out those that did not come back (`forget_relaunched`). A lost agent on
this machine is replaced at once; a lost remote host only after its backoff (`HostBackoff`).
"""

from __future__ import annotations

import logging
from typing import Callable, Mapping, Optional, Protocol

from minitrain.coordinator.facts import events as ev
from minitrain.records import NodeInfo

logger = logging.getLogger("minitrain")


class AgentHandles(Protocol):
    """The launcher's view of the agent processes it started."""

    def dead_agents(self) -> dict[str, str]:
        """node_id -> why, for agents whose process ended before they should have."""

    def relaunch(self, node_id: str) -> bool:
        """Start a new agent for a node whose agent died; False when that is not possible."""

    def forget(self, node_id: str) -> None:
        """Stop waiting for the agent of `node_id` (it failed to come back)."""


class HostBackoff:
    """When a lost remote host may be tried again: 30 s after its first loss, doubling each time up to
    600 s; an elastic run passes its resize interval as both (a lost host is probed once per interval)."""

    FIRST_S = 30.0
    LONGEST_S = 600.0

    def __init__(self, first_s: float = FIRST_S, longest_s: float = LONGEST_S) -> None:
        self._first_s = first_s
        self._longest_s = longest_s
        self._until: dict[str, float] = {}
        self._delay: dict[str, float] = {}

    def failed(self, node_id: str, now: float) -> None:
        """The node was lost (again): keep it out longer."""
        delay = min(self._delay.get(node_id, self._first_s / 2) * 2, self._longest_s)
        self._delay[node_id] = delay
        self._until[node_id] = now + delay

    def may_retry(self, node_id: str, now: float) -> bool:
        """True once the node's backoff has run out."""
        return now >= self._until.get(node_id, 0.0)


class Membership:
    """The agents of the run's nodes `node_ids`; `local_node_ids` are on this machine."""

    def __init__(self, node_ids: tuple[str, ...], local_node_ids: frozenset, agents: AgentHandles,
                 clock: Callable[[], float], backoff: Optional[HostBackoff] = None):
        self._node_ids = node_ids
        self._local_node_ids = local_node_ids
        self._agents = agents
        self._clock = clock
        self.nodes: dict[str, NodeInfo] = {}  # node_id -> its connected agent's node (read only outside)
        self._streams: dict[str, int] = {}  # node_id -> its agent's current stream
        self._lost: dict[str, str] = {}  # node_id -> why it was lost
        self._relaunched: list[str] = []  # lost nodes given a new agent, not yet back
        # Nodes readied for a start they are not in yet (an elastic run's returning host), whose agent has
        # not answered that its warm worker is ready (or will not be): growth does not count them yet.
        self._warming: set[str] = set()
        self._backoff = backoff if backoff is not None else HostBackoff()
        self.version = 0  # changes whenever the usable nodes may have: what depends on them is recomputed
        self._missing: tuple[int, tuple[str, ...]] = (-1, ())  # (version, missing()) asked at every loop turn

    @property
    def lost(self) -> Mapping[str, str]:
        """node_id -> why, for the nodes that are out of the run."""
        return self._lost

    # ------------------------------------------------------------------ facts in

    def connected(self, event: ev.AgentConnected) -> None:
        """A node's agent connected (again) on stream `event.stream`."""
        self.nodes[event.node.node_id] = event.node
        self._streams[event.node.node_id] = event.stream
        self._warming.discard(event.node.node_id)  # a new agent: it is readied again if need be
        self.version += 1

    def is_current(self, event: ev.AgentLost) -> bool:
        """Whether `event` ends the node's current agent's stream (not an older one's)."""
        return event.stream == self._streams.get(event.node_id, event.stream)

    def lose(self, event: ev.AgentLost) -> bool:
        """Take a node out of the run and back its host off; False (nothing changes) when the event
        ends an older stream than the agent's current one, or the node is already out."""
        if event.stream != self._streams.get(event.node_id, event.stream) or event.node_id in self._lost:
            return False
        self._lost[event.node_id] = event.reason
        self._warming.discard(event.node_id)
        self._backoff.failed(event.node_id, self._clock())
        self.version += 1
        return True

    def warming(self, node_id: str) -> None:
        """`node_id` was sent a warm-up for a start it is not in yet: `ready()` leaves it out until its
        agent answers (`warmed`), it is lost or connects again, or an attempt starts (`attempt_started`)."""
        self._warming.add(node_id)
        self.version += 1

    def warmed(self, event: ev.NodeWarmed) -> bool:
        """The agent answered its warm-up; False (nothing changes) for an older stream's answer or a
        node that was not warming."""
        if event.stream != self._streams.get(event.node_id) or event.node_id not in self._warming:
            return False
        self._warming.discard(event.node_id)
        self.version += 1
        return True

    def attempt_started(self) -> None:
        """An attempt started: it took every node as it was, so none is waited for any more."""
        if self._warming:
            self._warming.clear()
            self.version += 1

    # ------------------------------------------------------------------ questions

    def missing(self) -> tuple[str, ...]:
        """The run's nodes, not lost, whose agent has not connected. Recomputed only when `version`
        changed: it is asked at every loop turn, and a walk of every node then cost 8% of the
        coordinator's samples at 2048 hosts."""
        if self._missing[0] != self.version:
            missing = tuple(n for n in self._node_ids if n not in self._lost and n not in self.nodes)
            self._missing = (self.version, missing)
        return self._missing[1]

    def failed_to_start(self, missing: tuple[str, ...]) -> str:
        """Why agents of `missing` nodes will not connect (their process ended); "" when none did."""
        if not missing:
            return ""
        dead = {n: why for n, why in self._agents.dead_agents().items() if n in missing}
        if not dead:
            return ""
        return "node agent(s) failed to start: " + "; ".join(f"{n}: {why}" for n, why in sorted(dead.items()))

    def usable(self) -> list[NodeInfo]:
        """The nodes an attempt may run on: connected and not lost, in the run's order."""
        return [self.nodes[n] for n in self._node_ids if n not in self._lost and n in self.nodes]

    def ready(self) -> list[NodeInfo]:
        """The usable nodes a running attempt may grow onto now: those not still warming up (see
        `warming`), in the run's order."""
        return [node for node in self.usable() if node.node_id not in self._warming]

    def probe_due(self) -> bool:
        """Some lost node's retry interval has run out (`relaunch_lost` would start a new agent there)."""
        now = self._clock()
        return any(self._backoff.may_retry(node_id, now) for node_id in self._lost)

    def lost_text(self) -> str:
        """The lost nodes and why, for a message."""
        return "; ".join(f"{n} ({why})" for n, why in sorted(self._lost.items()))

    # ------------------------------------------------------------------ actions

    def relaunch_lost(self) -> None:
        """Before a new attempt: replace lost agents on this machine at once; re-admit a lost remote
        host only after its backoff (it may be gone for good)."""
        now = self._clock()
        self._relaunched = []
        for node_id in list(self._lost):
            if node_id not in self._local_node_ids and not self._backoff.may_retry(node_id, now):
                continue
            if self._agents.relaunch(node_id):
                logger.warning("node %s: starting a new agent (the old one was lost: %s)", node_id,
                               self._lost[node_id])
                self.nodes.pop(node_id, None)
                del self._lost[node_id]
                self._relaunched.append(node_id)
                self.version += 1
            else:  # this launcher cannot start agents again: not retried before its backoff
                self._backoff.failed(node_id, now)

    def forget_relaunched(self, reason: str) -> None:
        """Relaunched agents that did not connect stay out, and their hosts back off longer."""
        for node_id in self._relaunched:
            if node_id not in self.nodes:
                self._agents.forget(node_id)
                self._lost[node_id] = f"it did not come back ({reason})"
                self._backoff.failed(node_id, self._clock())
                self.version += 1
        self._relaunched = []

    def drop_dead(self) -> None:
        """Elastic runs: each node whose agent ended before it connected (a host that does not answer)
        is out of the run again, its host retried after its backoff; agents still connecting are left."""
        missing = self.missing()
        dead = {n: why for n, why in self._agents.dead_agents().items() if n in missing} if missing else {}
        for node_id, why in dead.items():
            self._agents.forget(node_id)
            self._lost[node_id] = f"its agent ended before it connected: {why.splitlines()[0]}"
            self._backoff.failed(node_id, self._clock())
            logger.info("node %s is out of the run until it is tried again: %s", node_id, self._lost[node_id])
        if dead:
            self.version += 1
