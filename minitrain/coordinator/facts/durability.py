"""The two commit levels of a checkpoint: committed in memory, then durable on storage.

A round whose ranks put their files into their nodes' memory tiers (`minitrain.storage.memory_tier`) is
*committed in memory* once every rank reported it (`hold`): the ranks waiting in `report()` are
acknowledged then (by `Commits`), and each node holding a part of it is told to write its shards to the
run's staging area (`PersistShards`; the agent does it, `minitrain.agent.tier_keeper`). The round is
*durable* once every holder said its shards are there (`on_persisted`): the checkpoint manager then
commits it exactly as it commits an upload (staged files moved into `<run>/<dir>/`, the index written,
top-K evictions), in round order, so a later round never becomes durable before an earlier one.

What the memory tiers hold is decided here: every round not durable yet, plus the latest committed
round (what a restart resumes from, served from memory); everything else is dropped (`DropShards`).
A node that is lost takes the shards only it held with it: a round that needed them is lost (logged by
name), and the run resumes from the latest round still whole in memory or on storage. A persistence
that failed after the agent's retries fails the round by name (`on_error`), never silently.
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
    """A checkpoint round committed in memory: its record, the attempt that reported it, which node holds
    which ranks' shards, the ranks that uploaded to staging themselves, and the nodes still persisting."""

    record: CheckpointRecord
    attempt: int
    holders: dict[str, tuple[int, ...]]  # node id -> ranks whose shards it holds
    staged: tuple[int, ...] = ()
    persisting: set[str] = field(default_factory=set)  # nodes that have not said their shards are on storage
    durable: bool = False

    @property
    def dir_name(self) -> str:
        """The checkpoint's directory name."""
        return self.record.dir_name

    def shards(self) -> tuple[cmd.Shard, ...]:
        """Every rank's shard in the tiers, in rank order (the order a commit merges them in)."""
        ranks = sorted(rank for ranks in self.holders.values() for rank in ranks)
        return tuple(cmd.Shard(self.attempt, rank, self.dir_name) for rank in ranks)


class Durability:
    """The rounds committed in memory and their way to storage; see the module docstring.

    `commit(record, staged)` is the checkpoint manager's commit (`CheckpointBook.commit`); `on_error(round,
    message)` is told when a round cannot become durable (its persistence or its commit failed);
    `on_durable(record)` when one did.
    """

    def __init__(self, commit: Callable[[CheckpointRecord, tuple[str, ...]], object], outbox: Outbox,
                 on_error: Callable[[HeldRound, str], None],
                 on_durable: Callable[[CheckpointRecord], None] = lambda record: None):
        self._commit = commit
        self._outbox = outbox
        self._on_error = on_error
        self._on_durable = on_durable
        self._held: list[HeldRound] = []  # committed in memory, not durable yet, in round order
        self._kept: Optional[HeldRound] = None  # the latest round, durable and still in the tiers
        self.lost: list[str] = []  # why rounds committed in memory never became durable, in order

    # ------------------------------------------------------------------ what is known

    @property
    def pending(self) -> tuple[HeldRound, ...]:
        """The rounds committed in memory that are not durable yet, oldest first."""
        return tuple(self._held)

    @property
    def latest(self) -> Optional[HeldRound]:
        """The latest round committed in memory whose shards the tiers still hold (durable or not)."""
        return self._held[-1] if self._held else self._kept

    def restore_view(self) -> Optional[cmd.RestoreView]:
        """What a new attempt resumes from, when its shards are in the tiers (`latest`)."""
        latest = self.latest
        return None if latest is None else cmd.RestoreView(latest.dir_name, latest.shards())

    def restore_needs_storage(self) -> bool:
        """Whether the round a restart resumes from is not durable yet and no one node holds all of it
        (its shards are on several nodes, or some ranks uploaded to staging): the restart then waits
        until it is durable and reads it from storage."""
        latest = self.latest
        return latest is not None and not latest.durable and (len(latest.holders) != 1 or bool(latest.staged))

    # ------------------------------------------------------------------ the levels

    def hold(self, record: CheckpointRecord, attempt: int, holders: dict[str, tuple[int, ...]],
             staged: tuple[int, ...] = ()) -> None:
        """Round `record` is committed in memory (every rank's files are in a tier, or staged): tell its
        holders to persist their shards, and drop what no restart needs any more."""
        held = HeldRound(record, attempt, dict(holders), tuple(staged), set(holders))
        self._held.append(held)
        for node_id, ranks in holders.items():
            if not self._outbox.to_agent(node_id, cmd.PersistShards(attempt, record.dir_name, tuple(ranks))):
                self.node_lost(node_id)  # its stream is gone: so are its shards
        self._drop_superseded()

    def on_persisted(self, event: ev.ShardsPersisted) -> None:
        """A holder wrote its shards to storage (or failed to): commit every round now complete, in order."""
        held = next((h for h in self._held if h.attempt == event.attempt and h.dir_name == event.dir_name), None)
        if held is None or event.node_id not in held.persisting:
            return  # a round already lost, or a stale answer
        if event.error:
            self._lose(held, f"{held.dir_name} (round {held.record.report_index}) could not be written to storage "
                             f"from the memory tier of node {event.node_id}: {event.error}")
            return
        held.persisting.discard(event.node_id)
        self._commit_complete()

    def node_lost(self, node_id: str) -> None:
        """`node_id` is out of the run: the rounds it held a part of and had not persisted are lost."""
        for held in list(self._held):
            if node_id in held.persisting:
                self._lose(held, f"{held.dir_name} (round {held.record.report_index}) was committed in memory "
                                 f"only, and node {node_id}, which held part of it, is lost")
        if self._kept is not None and node_id in self._kept.holders:
            self._kept.holders.pop(node_id)
            if not self._kept.holders:
                self._kept = None

    def _commit_complete(self) -> None:
        while self._held and not self._held[0].persisting:
            held = self._held.pop(0)
            ranks = sorted({*held.staged, *(rank for ranks in held.holders.values() for rank in ranks)})
            staged = tuple(staged_dir(held.attempt, rank, held.dir_name) for rank in ranks)
            try:
                self._commit(held.record, staged)
            except (ValueError, StorageError) as exc:
                self._fail(held, f"could not commit {held.dir_name}: {exc}")
                continue
            held.durable = True
            logger.debug("%s is durable (round %d)", held.dir_name, held.record.report_index)
            self._on_durable(held.record)
            if not self._held:
                self._keep(held)
            else:
                self._drop(held)

    def _lose(self, held: HeldRound, why: str) -> None:
        self._held.remove(held)
        self._drop(held)
        self._fail(held, why)
        self._commit_complete()  # the rounds after it may be complete

    def _fail(self, held: HeldRound, why: str) -> None:
        logger.error("%s", why)
        self.lost.append(why)
        self._on_error(held, why)

    def _keep(self, held: HeldRound) -> None:
        previous, self._kept = self._kept, held
        if previous is not None and previous is not held:
            self._drop(previous)

    def _drop_superseded(self) -> None:
        """A newer round is committed in memory: the durable one kept for restarts is no longer needed."""
        if self._kept is not None and self._held:
            self._drop(self._kept)
            self._kept = None

    def _drop(self, held: HeldRound) -> None:
        shards = held.shards()
        for node_id, ranks in held.holders.items():
            mine = tuple(s for s in shards if s.rank in ranks)
            self._outbox.to_agent(node_id, cmd.DropShards(mine))
