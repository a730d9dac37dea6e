"""The node agent's memory tier: made at the run's first start, written to storage in the background,
read back by restarts, emptied on the coordinator's word, removed when the agent ends (L2).

The workers put their checkpoint files into the tier (`minitrain.storage.memory_tier`) and report them;
once every rank's files of a round are in, the coordinator counts the round committed in memory and
tells each agent holding a part of it to persist (`PersistShards`). This agent writes those shards to
the run's staging area on one thread, in the order the commands came (round order), retrying a failing
storage with backoff for up to MINITRAIN_PERSIST_RETRY_S, and says when they are there
(`ShardsPersisted`), or that it gave up (with the error, which fails the run's commit by name). The
coordinator then commits the round on storage (durable). Because the agent, not the worker, does the
writing, a worker killed at any moment after its report never loses an upload.

On several nodes, the tier also takes the run's other agents' replicas (`minitrain.agent.replication`:
a `ReplicaServer` on the node's address, announced with `ReplicaReady`), and a PersistShards with
`to_peer` copies shards into that peer's tier instead of to storage, on the same thread and in the same
order; the coordinator counts a round committed in memory once it is replicated.

A restart's workers read the checkpoint they resume from through the tier's merged view of it
(`RestoreView`), built by hard links before they start once every shard is here (a shard this tier
lacks is fetched from a peer that holds it); the coordinator says which shards no restart needs any
more (`DropShards`). The agent decides none of this.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from typing import Any, Optional

import cloudpickle

from minitrain import commands as cmd
from minitrain import knobs
from minitrain.agent.replication import ReplicaServer, ReplicationError, fetch_dir, push_dir
from minitrain.hosts import hostinfo
from minitrain.storage.layout import shard_dir, staged_dir
from minitrain.storage.memory_tier import MemoryTier, default_capacity, tree_bytes

logger = logging.getLogger("minitrain.agent")

FIRST_RETRY_S = 0.5
MAX_RETRY_INTERVAL_S = 10.0
_STOP = object()


class TierKeeper:
    """One agent's memory tier (none until a start asks for one). `report(attempt, dir_name, ranks,
    error, to_peer)` is how persistence results go to the coordinator (the agent's stream's `persisted`),
    `replica_ready(port)` how its replica server is announced; `token` authenticates replicas, and
    `node_address` (set once known) is the address the replica server binds."""

    def __init__(self, report, replica_ready=None, token: str = "", base: Optional[str] = None):
        self._report = report
        self._replica_ready = replica_ready
        self._token = token
        self.node_address = ""
        self._replicas: Optional[ReplicaServer] = None
        self._base = base if base is not None else knobs.MEMORY_TIER_DIR.get()
        self._retry_s = knobs.PERSIST_RETRY_S.get()
        self.tier: Optional[MemoryTier] = None
        self._refused = False  # a start asked for a tier and none could be made: asked once
        self._storage_spec = b""
        self._storage: Any = None
        self._jobs: "queue.Queue" = queue.Queue()
        self._thread: Optional[threading.Thread] = None
        self._local_ranks: dict[int, set[int]] = {}  # attempt -> the ranks started on this node
        self._pending: set[tuple[int, int, str]] = set()  # shards queued to be written to storage
        self._pending_lock = threading.Lock()

    def configure(self, start: cmd.StartWorkers, live: frozenset[int] = frozenset()) -> Optional[MemoryTier]:
        """The tier the workers of `start` use: made at the first start that asks for one (its
        capacity then holds for the agent's life), None when the run has none or it cannot be made
        here (a warning says why; the workers then upload straight to storage). `live`: the attempts
        whose workers on this node have not all exited (what they write is theirs, not leftovers)."""
        if start.storage:
            self._storage_spec = start.storage
        self._local_ranks.setdefault(start.attempt, set()).update(launch.rank for launch in start.workers)
        if self.tier is not None:
            self._remove_leftovers(start, live)
        if start.memory_tier_bytes == 0 or self._refused:
            return self.tier
        if self.tier is None:
            capacity = start.memory_tier_bytes
            if capacity < 0:
                capacity = default_capacity(self._base, hostinfo.memory_bytes())
            try:
                if capacity <= 0:
                    raise OSError(f"{self._base} has no room for it")
                self.tier = MemoryTier.create(capacity, self._base)
            except OSError as exc:
                self._refused = True
                logger.warning("no memory tier on this host (%s): checkpoints go straight to storage", exc)
                return None
            self._thread = threading.Thread(target=self._persist_loop, name="agent-persist", daemon=True)
            self._thread.start()
        if start.replicas and self._replicas is None and self.node_address:
            self._serve_replicas()
        return self.tier

    def _remove_leftovers(self, start: cmd.StartWorkers, live: frozenset[int]) -> None:
        """Before a new attempt's workers start (the earlier ones are gone: the coordinator starts an
        attempt once the last one's processes exited), remove what the earlier ones left in the tier that
        nothing will read: half-written shards, and rounds of this node's ranks that never completed."""
        keep = {(s.attempt, s.rank, s.dir_name) for s in (start.restore.shards if start.restore else ())}
        with self._pending_lock:
            keep |= self._pending
        removed = self.tier.remove_leftovers(start.attempt, self._local_ranks, keep, live)
        if removed:
            logger.info("removed from the memory tier what earlier attempts left uncommitted: %s", ", ".join(removed))

    def _serve_replicas(self) -> None:
        tier = self.tier
        server = ReplicaServer(tier.root, self._token, self.node_address, reserve=tier.reserve, release=tier.release)
        try:
            port = server.start()
        except OSError as exc:
            logger.warning("this node's memory tier takes no replicas (%s): its checkpoints become committed "
                           "only once on storage", exc)
            return
        self._replicas = server
        if self._replica_ready is not None:
            self._replica_ready(port)

    def restore(self, attempt: int, view: Optional[cmd.RestoreView]) -> Optional[tuple[str, str]]:
        """(dir_name, path) of the merged view of the checkpoint `attempt` resumes from, when every one
        of its shards is in this tier; None otherwise (the workers read it from storage)."""
        if view is None or self.tier is None:
            return None
        for shard in view.shards:
            self._fetch_missing(shard)
        try:
            path = self.tier.build_view(view.dir_name, [(s.attempt, s.rank) for s in view.shards])
        except OSError as exc:
            logger.warning("could not build the view of %s from the memory tier (%s); it is read from "
                           "storage", view.dir_name, exc)
            return None
        if path is None:
            return None
        return view.dir_name, path

    def _fetch_missing(self, shard: cmd.Shard) -> None:
        """Fetch a shard this tier lacks from the first of its sources that has it (best effort: a view
        without it is not built, and the workers read the checkpoint from storage)."""
        tier = self.tier
        if tier.has_shard(shard.attempt, shard.rank, shard.dir_name):
            return
        target = tier.shard_path(shard.attempt, shard.rank, shard.dir_name)
        key = shard_dir(shard.attempt, shard.rank, shard.dir_name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        for source in shard.sources:
            host, _, port = source.rpartition(":")
            try:
                fetch_dir((host.strip("[]"), int(port)), self._token, key, target)
            except (ReplicationError, OSError, ValueError) as exc:
                logger.warning("could not fetch %s from %s: %s", key, source, exc)
                continue
            if not tier.reserve(key, tree_bytes(target)):
                tier.drop([(shard.attempt, shard.rank, shard.dir_name)])
                logger.warning("%s does not fit in this node's memory tier; it is read from storage", key)
            return

    def persist(self, command: cmd.PersistShards) -> None:
        """Queue the shards for writing to storage, after every earlier command."""
        if self.tier is None:
            self._report(command.attempt, command.dir_name, command.ranks, "this host has no memory tier")
            return
        if command.to_peer is None:
            with self._pending_lock:
                self._pending.update((command.attempt, rank, command.dir_name) for rank in command.ranks)
        self._jobs.put(command)

    def drop(self, command: cmd.DropShards) -> None:
        """Remove shards no restart needs (they are on storage, or lost for good)."""
        if self.tier is not None:
            self.tier.drop((s.attempt, s.rank, s.dir_name) for s in command.shards)

    def close(self) -> None:
        """Stop persisting (what is queued is dropped: the coordinator waited for what it needed) and
        remove the tier with everything in it."""
        if self._thread is not None:
            self._jobs.put(_STOP)
            self._thread.join(timeout=5.0)
        if self._replicas is not None:
            self._replicas.close()
        if self.tier is not None:
            self.tier.destroy()

    # ------------------------------------------------------------------ the persisting thread

    def _persist_loop(self) -> None:
        while True:
            job = self._jobs.get()
            if job is _STOP:
                return
            error = ""
            try:
                if job.to_peer is not None:
                    self._replicate(job)
                else:
                    self._persist(job)
            except Exception as exc:  # noqa: BLE001 - any storage or peer error, reported by name
                error = f"{type(exc).__name__}: {exc}"
            if job.to_peer is None:
                with self._pending_lock:
                    self._pending.difference_update((job.attempt, rank, job.dir_name) for rank in job.ranks)
            self._report(job.attempt, job.dir_name, job.ranks, error,
                         job.to_peer.node_id if job.to_peer is not None else "")

    def _replicate(self, job: cmd.PersistShards) -> None:
        tier, peer = self.tier, job.to_peer
        for rank in job.ranks:
            if not tier.has_shard(job.attempt, rank, job.dir_name):
                raise FileNotFoundError(f"rank {rank}'s shard of {job.dir_name} is not in the memory tier")
            push_dir((peer.host, peer.port), self._token, tier.shard_path(job.attempt, rank, job.dir_name),
                     shard_dir(job.attempt, rank, job.dir_name))

    def _persist(self, job: cmd.PersistShards) -> None:
        tier = self.tier
        for rank in job.ranks:
            source = tier.shard_path(job.attempt, rank, job.dir_name)
            if not tier.has_shard(job.attempt, rank, job.dir_name):
                raise FileNotFoundError(f"rank {rank}'s shard of {job.dir_name} is not in the memory tier {source}")
            self._with_retries(lambda: self._storage_of().upload_dir(source, staged_dir(job.attempt, rank,
                                                                                        job.dir_name)),
                               f"rank {rank}'s shard of {job.dir_name}")

    def _with_retries(self, action, what: str) -> None:
        """Run `action` until it succeeds, retrying with doubling pauses for up to the retry budget."""
        deadline = time.monotonic() + self._retry_s
        pause = FIRST_RETRY_S
        while True:
            try:
                action()
                return
            except Exception as exc:  # noqa: BLE001 - retried, then raised
                if time.monotonic() + pause > deadline:
                    raise
                logger.warning("writing %s to storage failed (%s); retrying in %.1f s", what, exc, pause)
                time.sleep(pause)
                pause = min(pause * 2, MAX_RETRY_INTERVAL_S)

    def _storage_of(self) -> Any:
        if self._storage is None:
            if not self._storage_spec:
                raise RuntimeError("the coordinator sent no storage to persist to")
            # The run's Storage, pickled by the driver and sent on this authenticated stream.
            self._storage = cloudpickle.loads(self._storage_spec)
        return self._storage
