"""The two commit levels of a checkpoint: committed in memory, then durable on storage.

A round whose ranks put their files into their nodes' memory tiers (`minitrain.storage.memory_tier`)
is handed here once every rank reported it (`hold`). On one node it is *committed in memory* at once;
on several, once each holder copied its shards into one other node's tier (a replica:
`PersistShards(to_peer=...)`, `minitrain.agent.replication`), so one lost node loses nothing committed.
Then, and only then, the ranks waiting in `report()` are acknowledged (`ack`), in round order. A holder
whose replication fails leaves its round to be acknowledged once it is durable.

Each holder is also told to write its shards to the run's staging area (`PersistShards`; the agent
does it, `minitrain.agent.tier_keeper`). The round is *durable* once every part of it is there
(`on_persisted`): the checkpoint manager then commits it exactly as it commits an upload (staged files
moved into `<run>/<dir>/`, the index written, top-K evictions), in round order, so a later round never
becomes durable before an earlier one.

What the tiers hold is decided here: every round not durable yet, plus the latest committed round (what
a restart resumes from, served from memory); everything else is dropped (`DropShards`). A node that is
lost before its shards were on storage hands their persistence to the node holding their replica; a
round with a part nobody holds any more is lost (logged and told by name: `on_error`), and the run
resumes from the latest round still whole in memory or on storage. A persistence that failed after
the agent's retries loses its round the same way, never silently.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable, Optional

from minitrain import commands as cmd
from minitrain.coordinator.facts import events as ev
from minitrain.coordinator.facts.outbox import Outbox
from minitrain.storage.filesystem import StorageError
from minitrain.storage.layout import staged_dir
from minitrain.storage.retention import CheckpointRecord

logger = logging.getLogger("minitrain")


@dataclass
class HeldRound:
    """A checkpoint round on its way through the two levels: its record, the attempt that reported it,
    which node holds which ranks' shards (`holders`) and which node holds each holder's replica
    (`replicas`), the ranks that uploaded to staging themselves, the copies still under way
    (`replicating`: holders whose replica is not made; `persisting`: (node, ranks) not on storage yet),
    and `ack`, which acknowledges the ranks waiting for its commit."""

    record: CheckpointRecord
    attempt: int
    holders: dict[str, tuple[int, ...]]
    staged: tuple[int, ...] = ()
    ack: Callable[[], None] = lambda: None
    replicas: dict[str, str] = field(default_factory=dict)  # holder node -> the node holding its replica
    replicating: set[str] = field(default_factory=set)
    persisting: set[tuple[str, tuple[int, ...]]] = field(default_factory=set)
    replication_failed: bool = False
    acked: bool = False
    durable: bool = False

    @property
    def dir_name(self) -> str:
        """The checkpoint's directory name."""
        return self.record.dir_name

    @property
    def in_memory(self) -> bool:
        """Committed in memory: every shard is in a tier and, on several nodes, replicated."""
        return not self.replicating and not self.replication_failed

    def ranks(self) -> list[int]:
        """Every rank with a shard in a tier, in rank order (the order a commit merges them in)."""
        return sorted(rank for ranks in self.holders.values() for rank in ranks)

    def nodes_holding(self, holder: str) -> list[str]:
        """The nodes whose tiers hold `holder`'s shards: the holder, then its replica's node."""
        replica = self.replicas.get(holder)
        return [holder] + ([replica] if replica is not None else [])


class Durability:
    """The rounds committed in memory and their way to storage; see the module docstring.

    `commit(record, staged)` is the checkpoint manager's commit (`CheckpointBook.commit`); `on_error(round,
    message)` is told when a round cannot become durable (its persistence or its commit failed, or a
    node took the only copy of a part with it); `on_durable(record)` when one did.
    """

    def __init__(self, commit: Callable[[CheckpointRecord, tuple[str, ...]], object], outbox: Outbox,
                 on_error: Callable[[HeldRound, str], None],
                 on_durable: Callable[[CheckpointRecord], None] = lambda record: None):
        self._commit = commit
        self._outbox = outbox
        self._on_error = on_error
        self._on_durable = on_durable
        self._held: list[HeldRound] = []  # not durable yet, in round order
        self._kept: Optional[HeldRound] = None  # the latest round, durable and still in the tiers
        self._replica_ports: dict[str, tuple[str, int]] = {}  # node -> (host, port) its tier takes replicas on
        self._lost_nodes: set[str] = set()
        self._lost: list[tuple[int, str]] = []  # (report index, why) of rounds that never became durable

    # ------------------------------------------------------------------ what is known

    def lost_after(self, report_index: Optional[int]) -> list[str]:
        """Why the rounds lost after the run's latest durable checkpoint (`report_index`, None: none)
        never became durable, in the order they were lost: what the run's result would miss (None: every
        lost round). A lost round that a later durable one superseded (the restart trained past it) is not
        among them."""
        return [why for index, why in self._lost if report_index is None or index > report_index]

    @property
    def pending(self) -> tuple[HeldRound, ...]:
        """The rounds handed here that are not durable yet, oldest first."""
        return tuple(self._held)

    @property
    def latest(self) -> Optional[HeldRound]:
        """The latest round committed in memory whose shards the tiers still hold (durable or not)."""
        return self._held[-1] if self._held else self._kept

    def replica_ready(self, node_id: str, host: str, port: int) -> None:
        """The agent of `node_id` takes replicas on `host`:`port` (a new agent of a node that returned
        comes with a new, empty tier)."""
        self._lost_nodes.discard(node_id)
        self._replica_ports[node_id] = (host, port)

    def node_returned(self, node_id: str) -> None:
        """A new agent of `node_id` connected (after its earlier one was lost): it holds a new, empty tier
        (what the lost agent held was accounted for by `node_lost`), so its shards count again."""
        self._lost_nodes.discard(node_id)

    def restore_view(self) -> Optional[cmd.RestoreView]:
        """What a new attempt resumes from when its shards are in the tiers (`latest`): every shard with
        the replica addresses of the live nodes holding it (an agent lacking one fetches it there)."""
        latest = self.latest
        if latest is None or latest.staged:  # some ranks' files are on storage only: read it there
            return None
        shards = []
        for holder, ranks in sorted(latest.holders.items()):
            sources = tuple(f"{host}:{port}" for host, port in (
                self._replica_ports[node] for node in latest.nodes_holding(holder)
                if node in self._replica_ports and node not in self._lost_nodes))
            shards.extend(cmd.Shard(latest.attempt, rank, latest.dir_name, sources) for rank in ranks)
        return cmd.RestoreView(latest.dir_name, tuple(sorted(shards, key=lambda shard: shard.rank)))

    def restore_needs_storage(self) -> bool:
        """Whether the round a restart resumes from is not durable yet and cannot be read from memory on
        every node: some ranks uploaded to staging, or it is spread over several nodes and some part
        cannot be fetched from a live node's tier. The restart then waits until it is durable."""
        latest = self.latest
        if latest is None or latest.durable:
            return False
        if latest.staged:
            return True
        if len(latest.holders) == 1 and not self._lost_nodes & set(latest.holders):
            return False
        return not all(any(node in self._replica_ports and node not in self._lost_nodes
                           for node in latest.nodes_holding(holder)) for holder in latest.holders)

    # ------------------------------------------------------------------ the levels

    def hold(self, record: CheckpointRecord, attempt: int, holders: dict[str, tuple[int, ...]],
             staged: tuple[int, ...] = (), ack: Callable[[], None] = lambda: None) -> None:
        """Every rank reported round `record`, its files in the tiers of `holders` (node -> ranks) or,
        for `staged`, uploaded: replicate and persist them, and acknowledge the round (`ack`) once it is
        committed in memory."""
        held = HeldRound(record, attempt, dict(holders), tuple(staged), ack)
        self._held.append(held)
        commands = []
        for node_id, ranks in holders.items():  # every part recorded before anything is sent
            peer = self._peer_of(node_id)
            if peer is not None:
                held.replicas[node_id] = peer.node_id
                held.replicating.add(node_id)
                commands.append((node_id, cmd.PersistShards(attempt, record.dir_name, tuple(ranks), to_peer=peer)))
            held.persisting.add((node_id, tuple(ranks)))
            commands.append((node_id, cmd.PersistShards(attempt, record.dir_name, tuple(ranks))))
        for node_id, command in commands:
            if held not in self._held:
                break  # lost meanwhile (a holder's stream was gone)
            self._send(node_id, command)
        self._drop_superseded()
        self._acknowledge()
        self._commit_complete()  # a round of staged ranks only, say

    def on_persisted(self, event: ev.ShardsPersisted) -> None:
        """A node copied its shards to a peer or to storage (or failed to): acknowledge what is committed
        in memory and commit what is durable, in round order."""
        held = next((h for h in self._held if h.attempt == event.attempt and h.dir_name == event.dir_name), None)
        if held is None:
            return  # a round already lost or durable
        if event.to_peer:
            if event.node_id not in held.replicating:
                return
            held.replicating.discard(event.node_id)
            if event.error:
                held.replication_failed = True
                held.replicas.pop(event.node_id, None)
                logger.warning("%s could not be replicated from node %s to node %s (%s); it counts as committed "
                               "once it is on storage", held.dir_name, event.node_id, event.to_peer, event.error)
            self._commit_complete()
            return
        key = (event.node_id, tuple(event.ranks))
        if key not in held.persisting:
            return
        if event.error:
            self._lose(held, f"{held.dir_name} (round {held.record.report_index}) could not be written to storage "
                             f"from the memory tier of node {event.node_id}: {event.error}")
            return
        held.persisting.discard(key)
        self._commit_complete()

    def node_lost(self, node_id: str) -> None:
        """`node_id` is out of the run, and its tier with it: the shards it had not put on storage are
        persisted from their replicas; a round with a part that has no copy left is lost."""
        if node_id in self._lost_nodes:
            return
        self._lost_nodes.add(node_id)
        self._replica_ports.pop(node_id, None)
        for held in list(self._held):
            if node_id in held.replicating:  # its replica was never made: the copy cannot be counted on
                held.replicating.discard(node_id)
                held.replicas.pop(node_id, None)
                held.replication_failed = True
            for holder, replica in list(held.replicas.items()):
                if replica == node_id:  # the replica is gone; the holder still has the shards
                    held.replicas.pop(holder)
                    if holder in held.replicating:
                        held.replicating.discard(holder)
                        held.replication_failed = True
            held.replicating.discard(node_id)
            for key in [key for key in held.persisting if key[0] == node_id]:
                replica = held.replicas.get(node_id)
                if replica is None or replica in self._lost_nodes:
                    self._lose(held, f"{held.dir_name} (round {held.record.report_index}) was not on storage yet, "
                                     f"and node {node_id}, which held part of it, is lost with no replica left")
                    break
                held.persisting.discard(key)
                held.persisting.add((replica, key[1]))
                self._send(replica, cmd.PersistShards(held.attempt, held.dir_name, key[1]))
                logger.warning("node %s is lost before its part of %s was on storage; node %s persists it from "
                               "its replica", node_id, held.dir_name, replica)
        self._acknowledge()
        kept = self._kept
        if kept is not None and all(node in self._lost_nodes for holder in kept.holders
                                    for node in kept.nodes_holding(holder)):
            self._kept = None

    # ------------------------------------------------------------------ inside

    def _peer_of(self, node_id: str) -> Optional[cmd.Peer]:
        """The node whose tier takes `node_id`'s replicas: the next live one after it in node order."""
        others = sorted(node for node in self._replica_ports if node != node_id and node not in self._lost_nodes)
        if not others:
            return None
        peer = next((node for node in others if node > node_id), others[0])
        host, port = self._replica_ports[peer]
        return cmd.Peer(peer, host, port)

    def _send(self, node_id: str, command: cmd.AgentCommand) -> None:
        if not self._outbox.to_agent(node_id, command):
            self.node_lost(node_id)  # its stream is gone: so is its tier

    def _acknowledge(self) -> None:
        """Acknowledge, in round order, every round committed in memory (or durable) not acknowledged."""
        for held in self._held:
            if not held.acked:
                if not (held.in_memory or held.durable):
                    return
                held.acked = True
                held.ack()

    def _commit_complete(self) -> None:
        while self._held and not self._held[0].persisting and not self._held[0].replicating:
            held = self._held.pop(0)
            staged = tuple(staged_dir(held.attempt, rank, held.dir_name)
                           for rank in sorted({*held.staged, *held.ranks()}))
            try:
                self._commit(held.record, staged)
            except (ValueError, StorageError) as exc:
                self._drop(held)
                self._fail(held, f"could not commit {held.dir_name}: {exc}")
                continue
            held.durable = True
            if not held.acked:
                held.acked = True
                held.ack()
            logger.debug("%s is durable (round %d)", held.dir_name, held.record.report_index)
            self._on_durable(held.record)
            if not self._held:
                self._keep(held)
            else:
                self._drop(held)
        self._acknowledge()

    def _lose(self, held: HeldRound, why: str) -> None:
        self._held.remove(held)
        self._drop(held)
        self._fail(held, why)
        self._commit_complete()  # the rounds after it may be complete

    def _fail(self, held: HeldRound, why: str) -> None:
        logger.error("%s", why)
        self._lost.append((held.record.report_index, why))
        self._on_error(held, why)

    def _keep(self, held: HeldRound) -> None:
        previous, self._kept = self._kept, held
        if previous is not None and previous is not held:
            self._drop(previous)

    def superseded(self) -> None:
        """A newer checkpoint was committed on storage directly (its ranks uploaded it): the round kept in
        the tiers for restarts is no longer the latest."""
        if self._kept is not None:
            self._drop(self._kept)
            self._kept = None

    def _drop_superseded(self) -> None:
        """A newer round is on its way: the durable one kept for restarts is no longer needed."""
        if self._kept is not None and self._held:
            self._drop(self._kept)
            self._kept = None

    def _drop(self, held: HeldRound) -> None:
        for holder, ranks in held.holders.items():
            shards = tuple(cmd.Shard(held.attempt, rank, held.dir_name) for rank in ranks)
            for node in held.nodes_holding(holder):
                if node not in self._lost_nodes:
                    self._outbox.to_agent(node, cmd.DropShards(shards))
