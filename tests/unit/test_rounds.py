"""RoundTracker: a round completes when every rank reported it (or finished without it)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from minitrain.coordinator.policy.rounds import RoundConflict, RoundTracker


def test_round_completes_only_when_every_rank_reported():
    rounds = RoundTracker(2)
    assert rounds.add(0, 0, {"a": 1}, "checkpoint_000000") == []
    done = rounds.add(1, 0, {"a": 2}, "")
    assert [(d.round, d.checkpoint_dir_name, d.metrics_by_rank[0]) for d in done] == [(0, "checkpoint_000000", {"a": 1})]
    assert done[0].metrics_by_rank == {0: {"a": 1}, 1: {"a": 2}}


def test_ranks_ahead_wait_for_the_slowest_and_release_in_order():
    rounds = RoundTracker(2)
    for r in range(3):
        assert rounds.add(0, r, {"r": r}, "") == []
    assert [d.round for d in rounds.add(1, 0, {}, "")] == [0]
    assert [d.round for d in rounds.add(1, 1, {}, "")] == [1]
    assert rounds.next_round == 2


def test_disagreeing_directory_names_name_both():
    rounds = RoundTracker(2)
    rounds.add(0, 0, {}, "ckpt_a")
    with pytest.raises(RoundConflict, match=r"rank 0 passed checkpoint_dir_name 'ckpt_a' but rank 1 passed 'ckpt_b'"):
        rounds.add(1, 0, {}, "ckpt_b")


def test_a_finished_rank_no_longer_holds_rounds_back():
    rounds = RoundTracker(2)
    rounds.add(0, 0, {}, "")
    rounds.add(1, 0, {}, "")
    assert rounds.add(0, 1, {"last": True}, "c1") == []
    done = rounds.finish(1, rounds_reported=1)  # rank 1 returned after one report
    assert [(d.round, d.checkpoint_dir_name) for d in done] == [(1, "c1")]
    assert rounds.finish(0, rounds_reported=2) == []


@settings(max_examples=200, deadline=None, database=None)
@given(world=st.integers(1, 4), counts=st.lists(st.integers(0, 6), min_size=4, max_size=4), data=st.data())
def test_every_round_is_released_once_in_order_whatever_the_interleaving(world, counts, data):
    counts = counts[:world]
    reports = [(rank, r) for rank in range(world) for r in range(counts[rank])]
    order = data.draw(st.permutations(reports))
    # Each rank's own reports stay in call order (they travel on one ordered stream).
    order = sorted(order, key=lambda item: (order.index(next(x for x in order if x[0] == item[0])), 0))
    per_rank_next = {rank: 0 for rank in range(world)}
    released = []
    rounds = RoundTracker(world)
    for rank, _ in order:
        r = per_rank_next[rank]
        per_rank_next[rank] += 1
        released += [d.round for d in rounds.add(rank, r, {}, "")]
    for rank in range(world):
        released += [d.round for d in rounds.finish(rank, counts[rank])]
    assert released == list(range(max(counts, default=0)))


def test_the_ranks_whose_files_wait_in_their_memory_tiers_are_handed_back_in_rank_order():
    rounds = RoundTracker(4)
    rounds.add(3, 0, {}, "c", in_tier=True, wants_ack=True)
    rounds.add(1, 0, {}, "c", in_tier=True, wants_ack=True)
    rounds.add(0, 0, {}, "c", staged=True, in_tier=True)  # uploaded to staging: staged, not in a tier
    (done,) = rounds.add(2, 0, {}, "", in_tier=True)  # no checkpoint: no files anywhere
    assert done.tier_ranks == (1, 3)
    assert done.staged_ranks == (0,)
    assert done.ack_ranks == (3, 1)


def test_a_round_without_tier_ranks_hands_back_none():
    rounds = RoundTracker(1)
    (done,) = rounds.add(0, 0, {}, "c", staged=True)
    assert done.tier_ranks == () and done.staged_ranks == (0,)
