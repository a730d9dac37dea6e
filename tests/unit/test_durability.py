"""The two commit levels (minitrain.coordinator.facts.durability, and how Commits routes rounds to it).

`Durability` alone, with a recording commit and the recording outbox of tests/controller_support.py:
a round is acknowledged once committed in memory (at once without peers; on several nodes once every
holder's replica is made; after a failed replica only once durable), in round order; rounds become
durable in round order whatever order their holders answer in, only once every part is on storage;
an error answer or a lost node loses exactly the rounds concerned, by name (a lost holder's replica
takes over its persistence), and the rounds behind them still commit; a commit that raises is
reported and wedges nothing; the tiers are told to drop every round but the latest committed one;
restore_view / restore_needs_storage; stale answers change nothing.

`Commits` over a real CheckpointManager in tmp_path: a tier round acknowledges its ranks before any
ShardsPersisted, is listed while only in memory, keeps a plain round behind it in order, and
resume_record is the newest of memory and storage.
"""

from __future__ import annotations

import os

import pytest

from controller_support import RecordingOutbox, run_storage
from minitrain import commands as cmd
from minitrain.commands import CheckpointList, DropShards, Peer, PersistShards, ReportAck, Shard
from minitrain.config import CheckpointConfig
from minitrain.coordinator.facts import events as ev
from minitrain.coordinator.facts.attempt import AttemptTracker
from minitrain.coordinator.facts.commits import Commits
from minitrain.coordinator.facts.durability import Durability
from minitrain.coordinator.facts.metrics_log import MetricsLog
from minitrain.records import ReportRecord, WorkerAssignment
from minitrain.storage.checkpoint_manager import CheckpointManager
from minitrain.storage.filesystem import StorageError
from minitrain.storage.retention import CheckpointRecord

ATTEMPT = 3


def name(i: int) -> str:
    return f"ckpt_{i}"


def record(i: int) -> CheckpointRecord:
    """Round i's checkpoint: run-wide report index 10 + i (so "round 1i" in a message is this one's)."""
    return CheckpointRecord(dir_name=name(i), metrics={"step": i}, report_index=10 + i, attempt=ATTEMPT)


def staged(i: int, *ranks: int) -> tuple[str, ...]:
    return tuple(f".staging/attempt_{ATTEMPT}/rank_{r}/{name(i)}" for r in ranks)


class Rounds:
    """A Durability whose commit records (dir_name, staged) and raises what `refuse` holds for a
    directory; the rounds acknowledged, the errors (dir_name, message) and the durable rounds are kept
    in order. `peers(...)` announces the nodes' replica servers (node nK on host hK, port 7000 + K)."""

    def __init__(self, outbox=None):
        self.outbox = outbox if outbox is not None else RecordingOutbox()
        self.committed: list[tuple[str, tuple[str, ...]]] = []
        self.errors: list[tuple[str, str]] = []
        self.durable: list[str] = []
        self.acks: list[str] = []
        self.refuse: dict[str, Exception] = {}
        self._holders: dict[str, dict] = {}
        self.durability = Durability(self._commit, self.outbox,
                                     lambda held, why: self.errors.append((held.dir_name, why)),
                                     lambda rec: self.durable.append(rec.dir_name))

    def _commit(self, rec: CheckpointRecord, staged_dirs: tuple[str, ...]):
        if rec.dir_name in self.refuse:
            raise self.refuse[rec.dir_name]
        self.committed.append((rec.dir_name, staged_dirs))

    def peers(self, *nodes: str) -> None:
        for node in nodes:
            self.durability.replica_ready(node, f"h{node[1:]}", 7000 + int(node[1:]))

    def hold(self, i: int, holders: dict, staged_ranks=()) -> None:
        self._holders[name(i)] = dict(holders)
        self.durability.hold(record(i), ATTEMPT, holders, staged_ranks, lambda: self.acks.append(name(i)))

    def answer(self, node_id: str, i: int, error: str = "", *, ranks=None, to_peer: str = "") -> None:
        """`node_id` answers the PersistShards it was sent for round i (its own ranks unless `ranks`)."""
        ranks = self._holders[name(i)][node_id] if ranks is None else ranks
        self.durability.on_persisted(ev.ShardsPersisted(node_id, ATTEMPT, name(i), tuple(ranks), error, to_peer))

    @property
    def names(self) -> list[str]:
        return [dir_name for dir_name, _ in self.committed]

    def drops(self) -> list[tuple[str, tuple[tuple[int, str], ...]]]:
        """(node, ((rank, dir_name), ...)) of every DropShards offered, in order."""
        return [(node, tuple((s.rank, s.dir_name) for s in command.shards))
                for kind, node, command in self.outbox.sent if isinstance(command, DropShards)]

    def persists(self) -> list[tuple[str, PersistShards]]:
        return [(node, command) for kind, node, command in self.outbox.sent if isinstance(command, PersistShards)]


# ---------------------------------------------------------------------------------------------- acknowledging


def test_without_peers_a_round_is_committed_in_memory_at_once_and_each_holder_persists_its_ranks():
    rounds = Rounds()
    rounds.hold(0, {"n0": (0, 1), "n1": (2, 3)})
    assert rounds.persists() == [("n0", PersistShards(ATTEMPT, name(0), (0, 1))),
                                 ("n1", PersistShards(ATTEMPT, name(0), (2, 3)))]
    assert rounds.acks == [name(0)]  # before any ShardsPersisted
    assert rounds.committed == [] and rounds.errors == []
    (held,) = rounds.durability.pending
    assert held.record == record(0) and not held.durable
    assert rounds.durability.latest is held


def test_on_several_nodes_a_round_is_acknowledged_once_every_holder_s_replica_is_made():
    rounds = Rounds()
    rounds.peers("n0", "n1", "n2")
    rounds.hold(0, {"n0": (0,), "n2": (1,)})
    assert rounds.persists() == [
        ("n0", PersistShards(ATTEMPT, name(0), (0,), to_peer=Peer("n1", "h1", 7001))),  # the next node
        ("n0", PersistShards(ATTEMPT, name(0), (0,))),
        ("n2", PersistShards(ATTEMPT, name(0), (1,), to_peer=Peer("n0", "h0", 7000))),  # the first, after the last
        ("n2", PersistShards(ATTEMPT, name(0), (1,)))]
    rounds.answer("n0", 0, to_peer="n1")
    rounds.answer("n0", 0)  # on storage: not what a replica is
    assert rounds.acks == []
    rounds.answer("n2", 0, to_peer="n0")
    assert rounds.acks == [name(0)]
    assert rounds.committed == []  # n2's part is not on storage yet
    rounds.answer("n2", 0)
    assert rounds.names == [name(0)] and rounds.acks == [name(0)]  # acknowledged once


def test_a_failed_replica_leaves_the_round_to_be_acknowledged_once_durable_and_later_rounds_wait_for_it():
    rounds = Rounds()
    rounds.peers("n0", "n1")
    rounds.hold(0, {"n0": (0,), "n1": (1,)})
    rounds.hold(1, {"n0": (0,), "n1": (1,)})
    rounds.answer("n0", 0, "ReplicationError: refused", to_peer="n1")
    rounds.answer("n1", 0, to_peer="n0")
    for node in ("n0", "n1"):
        rounds.answer(node, 1, to_peer="n1" if node == "n0" else "n0")
    assert rounds.acks == []  # round 1 is committed in memory, but round 0 is acknowledged first
    assert rounds.errors == []  # a replica that failed fails nothing
    rounds.answer("n0", 0)
    rounds.answer("n1", 0)
    assert rounds.names == [name(0)] and rounds.acks == [name(0), name(1)]


def test_a_lost_replica_node_leaves_the_holder_s_round_to_be_acknowledged_once_durable():
    rounds = Rounds()
    rounds.peers("n0", "n1", "n2")
    rounds.hold(0, {"n0": (0,)})  # its replica goes to n1
    rounds.durability.node_lost("n1")
    rounds.answer("n0", 0, to_peer="n1")  # a late answer of a copy to the lost node counts for nothing
    assert rounds.acks == [] and rounds.errors == []
    rounds.answer("n0", 0)
    assert rounds.names == [name(0)] and rounds.acks == [name(0)]


def test_a_lost_holder_s_replica_persists_its_part_and_the_round_is_not_lost():
    rounds = Rounds()
    rounds.peers("n0", "n1")
    rounds.hold(0, {"n0": (0,), "n1": (1,)})
    rounds.answer("n0", 0, to_peer="n1")
    rounds.answer("n1", 0, to_peer="n0")
    assert rounds.acks == [name(0)]
    rounds.outbox.take()
    rounds.durability.node_lost("n0")
    assert rounds.persists() == [("n1", PersistShards(ATTEMPT, name(0), (0,)))]  # from n1's replica of rank 0
    assert rounds.errors == []
    rounds.answer("n0", 0)  # the lost node's late answer is not the one awaited now
    rounds.answer("n1", 0)
    assert rounds.committed == []
    rounds.answer("n1", 0, ranks=(0,))
    assert rounds.names == [name(0)] and rounds.errors == []


def test_a_holder_lost_before_its_replica_is_made_does_not_make_its_round_committed_in_memory():
    """n1's replica is made, n0's is not when n0 is lost: rank 0's files were on n0 only, so the round is
    not committed in memory and its waiting ranks must not be told it is."""
    rounds = Rounds()
    rounds.peers("n0", "n1")
    rounds.hold(0, {"n0": (0,), "n1": (1,)})
    rounds.answer("n1", 0, to_peer="n0")
    rounds.durability.node_lost("n0")
    assert rounds.acks == []


def test_a_holder_whose_stream_is_gone_when_its_round_is_held_loses_the_round_also_with_peers():
    rounds = Rounds(RecordingOutbox(gone={"n0"}))
    rounds.peers("n0", "n1")
    rounds.hold(0, {"n0": (0,), "n1": (1,)})
    rounds.answer("n1", 0, to_peer="n0")
    rounds.answer("n1", 0)
    assert rounds.acks == []
    assert [lost for lost, _ in rounds.errors] == [name(0)]
    assert rounds.durability.pending == ()


def test_a_holder_whose_stream_is_gone_when_its_round_is_held_loses_the_round():
    rounds = Rounds(RecordingOutbox(gone={"n1"}))
    rounds.hold(0, {"n0": (0,), "n1": (1,)})
    ((lost, why),) = rounds.errors
    assert lost == name(0) and "node n1" in why
    assert rounds.durability.pending == ()
    rounds.answer("n0", 0)
    assert rounds.committed == []


# ---------------------------------------------------------------------------------------------- durable


def test_rounds_become_durable_in_round_order_whatever_order_the_holders_answer_in():
    rounds = Rounds()
    rounds.hold(0, {"n0": (0,)})
    rounds.hold(1, {"n1": (1,)})
    rounds.hold(2, {"n0": (0,), "n1": (1,)})
    for node, i in (("n1", 2), ("n1", 1), ("n0", 2)):
        rounds.answer(node, i)
        assert rounds.committed == []  # round 0 is not on storage yet: nothing after it may commit
    rounds.answer("n0", 0)
    assert rounds.committed == [(name(0), staged(0, 0)), (name(1), staged(1, 1)), (name(2), staged(2, 0, 1))]
    assert rounds.durable == [name(0), name(1), name(2)]
    assert rounds.durability.pending == () and rounds.errors == []


def test_a_round_of_several_holders_is_durable_only_once_every_holder_answered():
    rounds = Rounds()
    rounds.hold(0, {"n0": (0, 1), "n1": (2,), "n2": (3,)})
    rounds.answer("n2", 0)
    rounds.answer("n0", 0)
    assert rounds.committed == [] and not rounds.durability.pending[0].durable
    rounds.answer("n1", 0)
    assert rounds.committed == [(name(0), staged(0, 0, 1, 2, 3))]  # every rank's staged shard, in rank order
    assert rounds.durability.latest.durable


def test_a_round_with_staged_ranks_commits_them_with_the_tier_s():
    rounds = Rounds()
    rounds.hold(0, {"n0": (2,)}, staged_ranks=(0, 1))  # ranks 0 and 1 uploaded to staging themselves
    rounds.answer("n0", 0)
    assert rounds.committed == [(name(0), staged(0, 0, 1, 2))]


def test_a_round_of_staged_ranks_only_behind_a_tier_round_commits_right_after_it():
    rounds = Rounds()
    rounds.hold(0, {"n0": (0,)})
    rounds.hold(1, {}, staged_ranks=(0,))
    assert rounds.committed == [] and rounds.acks == [name(0), name(1)]
    rounds.answer("n0", 0)
    assert rounds.names == [name(0), name(1)]


def test_an_error_answer_loses_its_round_by_name_and_the_rounds_after_it_still_commit():
    rounds = Rounds()
    rounds.hold(0, {"n0": (0,)})
    rounds.hold(1, {"n1": (1,)})
    rounds.answer("n1", 1)
    rounds.answer("n0", 0, "OSError: disk full")
    ((lost, why),) = rounds.errors
    assert lost == name(0)
    assert "ckpt_0" in why and "round 10" in why and "node n0" in why and "disk full" in why
    assert rounds.durability.lost_after(None) == [why]
    assert rounds.names == [name(1)]  # round 1 was complete: it is durable now
    assert ("n0", ((0, name(0)),)) in rounds.drops()  # the lost round's shards are let go
    rounds.answer("n0", 0)  # a late answer for the lost round
    assert rounds.names == [name(1)] and len(rounds.errors) == 1


def test_a_lost_node_without_replicas_loses_exactly_the_rounds_it_still_had_to_persist():
    rounds = Rounds()
    rounds.hold(0, {"n0": (0,), "n1": (1,)})
    rounds.hold(1, {"n0": (0,), "n1": (1,)})
    rounds.hold(2, {"n1": (0, 1)})
    rounds.answer("n0", 0)  # n0's part of round 0 is on storage
    rounds.outbox.take()
    rounds.durability.node_lost("n0")
    ((lost, why),) = rounds.errors
    assert lost == name(1) and "ckpt_1" in why and "round 11" in why and "node n0" in why
    assert [held.dir_name for held in rounds.durability.pending] == [name(0), name(2)]
    assert rounds.drops() == [("n1", ((1, name(1)),))]  # the lost node is told nothing
    for i in (0, 1, 2):
        rounds.answer("n1", i)
    assert rounds.names == [name(0), name(2)]
    assert len(rounds.errors) == 1
    rounds.durability.node_lost("n9")  # a node that held nothing: nothing changes
    rounds.durability.node_lost("n0")  # told twice: once is what counts
    assert len(rounds.errors) == 1


@pytest.mark.parametrize("failure", [StorageError("the index cannot be written"),
                                     ValueError("score 'loss' is not a number")])
def test_a_commit_that_raises_is_reported_by_name_and_the_rounds_behind_it_still_commit(failure):
    rounds = Rounds()
    rounds.refuse[name(0)] = failure
    rounds.hold(0, {"n0": (0,)})
    rounds.hold(1, {"n1": (0,)})
    rounds.answer("n1", 1)
    rounds.answer("n0", 0)
    assert rounds.errors == [(name(0), f"could not commit ckpt_0: {failure}")]
    assert rounds.names == [name(1)] and rounds.durable == [name(1)]
    assert ("n0", ((0, name(0)),)) in rounds.drops()  # a round that cannot be committed is let go
    assert rounds.durability.pending == () and rounds.durability.latest.dir_name == name(1)
    rounds.hold(2, {"n0": (0,)})  # and the rounds after them go on as before
    rounds.answer("n0", 2)
    assert rounds.names == [name(1), name(2)]


def test_stale_or_unknown_answers_change_nothing():
    rounds = Rounds()
    rounds.peers("n0", "n1")
    d = rounds.durability
    rounds.hold(0, {"n0": (0,), "n1": (1,)})
    rounds.hold(1, {"n0": (0,)})
    rounds.answer("n0", 0, to_peer="n1")  # (an agent answers in the order it was told: replica, then storage)
    rounds.answer("n0", 0)

    def state():
        return (list(rounds.outbox.sent), list(rounds.acks),
                [(h.dir_name, set(h.persisting), set(h.replicating), h.replication_failed) for h in d.pending])

    before = state()
    for node, i, error, ranks, to_peer, attempt in (
            ("n0", 0, "", None, "", ATTEMPT),  # said already
            ("n0", 0, "late failure", None, "", ATTEMPT),  # a failure after its success
            ("n0", 0, "late failure", None, "n1", ATTEMPT),  # a replica failure after its success
            ("n1", 0, "", (0, 1), "", ATTEMPT),  # not the ranks it was sent
            ("n2", 0, "", (1,), "", ATTEMPT), ("n2", 0, "x", (1,), "n0", ATTEMPT),  # not a holder
            ("n1", 7, "", (1,), "", ATTEMPT), ("n1", 7, "x", (1,), "", ATTEMPT),  # no such round
            ("n1", 0, "", None, "", ATTEMPT + 1),  # another attempt's round of that name
            ("n1", 0, "x", None, "n0", ATTEMPT - 1)):
        ranks = (1,) if ranks is None and node == "n1" else ranks
        d.on_persisted(ev.ShardsPersisted(node, attempt, name(i), tuple(ranks or (0,)), error, to_peer))
    assert state() == before
    assert rounds.committed == [] and rounds.errors == [] and d.lost_after(None) == []
    rounds.answer("n1", 0, to_peer="n0")
    rounds.answer("n1", 0)
    rounds.answer("n0", 1, to_peer="n1")
    rounds.answer("n0", 1)
    assert rounds.names == [name(0), name(1)] and rounds.acks == [name(0), name(1)]
    rounds.answer("n0", 1, "after it was durable")
    assert rounds.errors == [] and rounds.names == [name(0), name(1)]


# ---------------------------------------------------------------------------------------------- the tiers


def test_superseded_rounds_are_dropped_and_the_latest_is_kept_until_a_newer_one_is_held():
    rounds = Rounds()
    d = rounds.durability
    rounds.hold(0, {"n0": (0,), "n1": (1,)})
    rounds.answer("n0", 0)
    rounds.answer("n1", 0)
    assert rounds.names == [name(0)] and rounds.drops() == []  # durable, and kept: a restart reads it from memory
    assert d.latest.dir_name == name(0) and d.latest.durable
    rounds.hold(1, {"n0": (0,), "n1": (1,)})  # a newer round committed in memory: round 0 is not needed
    assert rounds.drops() == [("n0", ((0, name(0)),)), ("n1", ((1, name(0)),))]
    rounds.outbox.take()
    rounds.hold(2, {"n0": (0, 1)})
    rounds.answer("n0", 1)
    rounds.answer("n1", 1)  # round 1 durable while round 2 is not: round 2 is what a restart needs
    assert rounds.drops() == [("n0", ((0, name(1)),)), ("n1", ((1, name(1)),))]
    rounds.outbox.take()
    rounds.answer("n0", 2)
    assert rounds.names == [name(0), name(1), name(2)]
    assert rounds.drops() == []  # round 2 is the latest: kept
    assert d.latest.dir_name == name(2)


def test_a_dropped_round_s_replicas_are_dropped_too():
    rounds = Rounds()
    rounds.peers("n0", "n1")
    rounds.hold(0, {"n0": (0,), "n1": (1,)})
    rounds.answer("n0", 0, to_peer="n1")
    rounds.answer("n1", 0, to_peer="n0")
    rounds.answer("n0", 0)
    rounds.answer("n1", 0)
    rounds.outbox.take()
    rounds.hold(1, {"n0": (0,)})
    assert sorted(rounds.drops()) == [("n0", ((0, name(0)),)), ("n0", ((1, name(0)),)),
                                      ("n1", ((0, name(0)),)), ("n1", ((1, name(0)),))]


def test_restore_view_names_the_latest_round_s_shards_in_rank_order():
    rounds = Rounds()
    d = rounds.durability
    assert d.restore_view() is None
    rounds.hold(0, {"n1": (3, 1), "n0": (2, 0)})
    assert d.restore_view() == cmd.RestoreView(name(0), tuple(Shard(ATTEMPT, r, name(0)) for r in range(4)))
    rounds.answer("n0", 0)
    rounds.answer("n1", 0)
    assert d.restore_view().dir_name == name(0)  # durable and kept
    rounds.hold(1, {"n0": (0, 1, 2, 3)})
    assert d.restore_view() == cmd.RestoreView(name(1), tuple(Shard(ATTEMPT, r, name(1)) for r in range(4)))
    rounds.answer("n0", 1, "boom")  # round 1 lost; round 0 was dropped when round 1 was held
    assert d.restore_view() is None


def test_restore_view_names_where_each_shard_can_be_fetched_from_live_nodes_only():
    rounds = Rounds()
    rounds.peers("n0", "n1", "n2")
    rounds.hold(0, {"n0": (0,), "n1": (1,), "n2": (2,)})  # replicas: n0 -> n1, n1 -> n2, n2 -> n0
    for node, peer in (("n0", "n1"), ("n1", "n2"), ("n2", "n0")):
        rounds.answer(node, 0, to_peer=peer)
        rounds.answer(node, 0)
    rounds.durability.node_lost("n1")
    view = rounds.durability.restore_view()
    assert [(s.rank, s.sources) for s in view.shards] == [(0, ("h0:7000",)), (1, ("h2:7002",)),
                                                           (2, ("h2:7002", "h0:7000"))]


def test_a_lost_node_s_ranks_stay_in_the_kept_round_s_view():
    """The latest durable round is spread over n0 (rank 0) and n1 (rank 1), without replicas; n0 is lost.
    The view still names rank 0's shard, with nowhere to fetch it: no agent builds a view of rank 1's
    shard alone (half a checkpoint); the restart reads the round from storage."""
    rounds = Rounds()
    rounds.hold(0, {"n0": (0,), "n1": (1,)})
    rounds.answer("n0", 0)
    rounds.answer("n1", 0)
    rounds.durability.node_lost("n0")
    view = rounds.durability.restore_view()
    assert [(s.rank, s.sources) for s in view.shards] == [(0, ()), (1, ())]


def test_a_restore_view_never_leaves_out_the_ranks_that_uploaded_to_staging():
    """Rank 0's node had room in its tier, rank 1's did not (it uploaded to staging). The restart waits
    until the round is durable (restore_needs_storage), then must read it whole: a view of rank 0's
    shard alone is a checkpoint without rank 1's files."""
    rounds = Rounds()
    rounds.hold(0, {"n0": (0,)}, staged_ranks=(1,))
    assert rounds.durability.restore_needs_storage()
    rounds.answer("n0", 0)
    view = rounds.durability.restore_view()
    assert view is None or sorted(s.rank for s in view.shards) == [0, 1]


def test_restore_needs_storage_only_for_a_round_that_cannot_be_read_whole_from_memory():
    def needs(holders, staged_ranks=(), durable=False, peers=(), lost=()) -> bool:
        rounds = Rounds()
        rounds.peers(*peers)
        rounds.hold(0, holders, staged_ranks)
        for node in peers:  # every replica is made
            if node in holders:
                rounds.answer(node, 0, to_peer=rounds.durability.pending[0].replicas[node])
        if durable:
            for node_id in holders:
                rounds.answer(node_id, 0)
        for node in lost:
            rounds.durability.node_lost(node)
        return rounds.durability.restore_needs_storage()

    assert not Rounds().durability.restore_needs_storage()  # nothing in memory
    assert not needs({"n0": (0, 1)})
    assert needs({"n0": (0,), "n1": (1,)})  # no agent can fetch the other's shard
    assert needs({"n0": (0,)}, staged_ranks=(1,))
    assert needs({"n0": (0,)}, staged_ranks=(1,), peers=("n0", "n1"))
    assert not needs({"n0": (0,), "n1": (1,)}, durable=True)
    assert not needs({"n0": (0,)}, staged_ranks=(1,), durable=True)
    assert not needs({"n0": (0,), "n1": (1,)}, peers=("n0", "n1"))  # each shard can be fetched from a live node
    assert not needs({"n0": (0,), "n1": (1,)}, peers=("n0", "n1", "n2"), lost=("n0",))  # from n0's replica on n1
    assert not needs({"n0": (0,)}, peers=("n0", "n1"), lost=("n0",))  # one holder, lost: its replica is on n1


# ---------------------------------------------------------------------------------------------- Commits


class Run:
    """Commits over a real checkpoint manager in tmp_path; one attempt of two ranks, rank r on node n<r>."""

    def __init__(self, tmp_path):
        self.storage = run_storage(tmp_path)
        self.root = tmp_path / "run"
        self.outbox = RecordingOutbox()
        self.commits = Commits(CheckpointManager.load(self.storage, CheckpointConfig()), MetricsLog(self.storage),
                               self.outbox)
        self.commits.start_attempt(2)
        self.tracker = AttemptTracker.create(ATTEMPT, [WorkerAssignment(r, 0, 2, 1, r, f"n{r}") for r in range(2)],
                                             {"n0": "h0", "n1": "h1"})
        self.commits.attach(self.tracker)

    def report(self, round_: int, dir_name: str = "", *, in_tier=False, staged=False) -> None:
        """Both ranks report `round_` (waiting for its commit), with checkpoint `dir_name` if given."""
        self.commits.on_reports(self.tracker, tuple(
            ReportRecord(ATTEMPT, rank, round_, '{"step": %d}' % round_, 1.0, checkpoint_dir_name=dir_name,
                         wants_ack=True, staged=staged, in_tier=in_tier) for rank in range(2)))

    def stage(self, dir_name: str, rank: int) -> None:
        """Rank `rank`'s shard of `dir_name` is in the staging area (an agent, or the rank, wrote it)."""
        path = self.root / ".staging" / f"attempt_{ATTEMPT}" / f"rank_{rank}" / dir_name
        path.mkdir(parents=True)
        (path / f"from_rank_{rank}").write_text(dir_name)

    def persisted(self, dir_name: str) -> None:
        """Both nodes' agents wrote their shards of `dir_name` to staging, and said so."""
        for rank in range(2):
            self.stage(dir_name, rank)
            self.commits.durability.on_persisted(ev.ShardsPersisted(f"n{rank}", ATTEMPT, dir_name, (rank,)))

    def listed(self, request_id: int) -> list[str]:
        self.commits.request_checkpoint_list(ev.CheckpointsRequested(ATTEMPT, 0, request_id, rounds=0))
        answers = [c for _, c in self.outbox.delivered("worker", CheckpointList) if c.request_id == request_id]
        return [entry.dir_name for entry in answers[-1].checkpoints]


def test_a_tier_round_acknowledges_its_ranks_at_once_and_is_durable_once_its_holders_answer(tmp_path):
    run = Run(tmp_path)
    run.report(0, "ckpt_a", in_tier=True)
    assert run.outbox.worker_kinds(ReportAck) == [(ATTEMPT, 0), (ATTEMPT, 1)]  # before any ShardsPersisted
    assert run.outbox.delivered("agent", PersistShards) == [("n0", PersistShards(ATTEMPT, "ckpt_a", (0,))),
                                                            ("n1", PersistShards(ATTEMPT, "ckpt_a", (1,)))]
    assert run.commits.checkpoints.latest is None and not (run.root / "ckpt_a").exists()
    assert run.commits.checkpoints_committed == 1
    run.persisted("ckpt_a")
    assert run.commits.checkpoints.latest.dir_name == "ckpt_a"
    assert sorted(os.listdir(run.root / "ckpt_a")) == ["from_rank_0", "from_rank_1"]
    assert run.tracker.failures() == []


def test_a_tier_round_on_two_nodes_with_replicas_is_acknowledged_once_replicated_before_it_is_on_storage(tmp_path):
    run = Run(tmp_path)
    for rank in range(2):
        run.commits.durability.replica_ready(f"n{rank}", f"h{rank}", 7000 + rank)
    run.report(0, "ckpt_a", in_tier=True)
    assert run.outbox.worker_kinds(ReportAck) == []  # rank 0's files are on n0 alone so far
    run.commits.durability.on_persisted(ev.ShardsPersisted("n0", ATTEMPT, "ckpt_a", (0,), to_peer="n1"))
    assert run.outbox.worker_kinds(ReportAck) == []
    run.commits.durability.on_persisted(ev.ShardsPersisted("n1", ATTEMPT, "ckpt_a", (1,), to_peer="n0"))
    assert run.outbox.worker_kinds(ReportAck) == [(ATTEMPT, 0), (ATTEMPT, 1)]
    assert run.commits.checkpoints.latest is None
    run.persisted("ckpt_a")
    assert run.commits.checkpoints.latest.dir_name == "ckpt_a"
    assert run.outbox.worker_kinds(ReportAck) == [(ATTEMPT, 0), (ATTEMPT, 1)]  # once


def test_a_tier_round_is_listed_while_only_in_memory_and_once_when_durable(tmp_path):
    run = Run(tmp_path)
    run.report(0, "ckpt_a", in_tier=True)
    assert run.listed(1) == ["ckpt_a"]
    assert run.commits.committed_names() == {"ckpt_a"}
    run.persisted("ckpt_a")
    assert run.listed(2) == ["ckpt_a"]
    assert run.commits.committed_names() == {"ckpt_a"}


def test_a_plain_round_behind_a_tier_round_is_committed_after_it(tmp_path):
    run = Run(tmp_path)
    run.report(0, "ckpt_a", in_tier=True)
    for rank in range(2):
        run.stage("ckpt_b", rank)  # the ranks uploaded round 1 themselves (no room in their tiers)
    run.report(1, "ckpt_b", staged=True)
    assert run.commits.checkpoints.latest is None  # round 1 waits for round 0
    assert not (run.root / "ckpt_b").exists()
    assert run.outbox.worker_kinds(ReportAck) == [(ATTEMPT, 0), (ATTEMPT, 1)] * 2
    assert run.listed(1) == ["ckpt_a", "ckpt_b"]
    run.persisted("ckpt_a")
    book = run.commits.checkpoints
    assert [r.dir_name for r in book.records] == ["ckpt_a", "ckpt_b"] and book.latest.dir_name == "ckpt_b"
    assert (run.root / "ckpt_b" / "from_rank_1").exists()
    assert run.tracker.failures() == [] and run.commits.durability.lost_after(None) == []


def test_resume_record_is_the_newest_of_memory_and_storage(tmp_path):
    run = Run(tmp_path)
    assert run.commits.resume_record() is None
    run.report(0, "ckpt_a", in_tier=True)
    assert run.commits.resume_record().dir_name == "ckpt_a"  # committed in memory only
    run.persisted("ckpt_a")
    assert run.commits.checkpoints.latest.dir_name == "ckpt_a"
    assert run.commits.resume_record().dir_name == "ckpt_a"
    run.report(1, "ckpt_b", in_tier=True)
    assert run.commits.resume_record().dir_name == "ckpt_b"  # memory is newer than storage
    run.persisted("ckpt_b")
    for rank in range(2):
        run.stage("ckpt_c", rank)
    run.report(2, "ckpt_c", staged=True)  # committed on storage at once: nothing is pending
    assert run.commits.checkpoints.latest.dir_name == "ckpt_c"
    assert run.commits.durability.latest is None  # superseded: no longer kept in the tiers
    assert run.commits.resume_record().dir_name == "ckpt_c"  # storage is newer than memory


def test_a_tier_round_that_cannot_become_durable_fails_rank_0_by_name(tmp_path):
    run = Run(tmp_path)
    run.report(0, "ckpt_a", in_tier=True)
    run.commits.durability.on_persisted(ev.ShardsPersisted("n1", ATTEMPT, "ckpt_a", (1,), "OSError: no space"))
    ((failure),) = run.tracker.failures()
    assert failure.rank == 0 and failure.exc_type == "CheckpointNotDurable"
    assert "ckpt_a" in failure.message and "no space" in failure.message
    assert run.commits.resume_record() is None


def test_a_node_whose_agent_returned_loses_its_next_round_by_name_when_that_agent_dies_too():
    """One host: its agent dies while it persists round 0 (lost by name), a new agent connects (its tier
    is new and empty), holds round 1, and dies while persisting it too: round 1 is lost by name as well,
    never left pending (which would make the run wait for it forever)."""
    rounds = Rounds()
    rounds.hold(0, {"n0": (0, 1)})
    rounds.durability.node_lost("n0")
    assert [dir_name for dir_name, _ in rounds.errors] == [name(0)]
    rounds.durability.node_returned("n0")
    rounds.hold(1, {"n0": (0, 1)})
    assert not rounds.durability.restore_needs_storage()  # the one node holds all of round 1 again
    rounds.durability.node_lost("n0")
    assert [dir_name for dir_name, _ in rounds.errors] == [name(0), name(1)]
    assert rounds.durability.pending == ()
