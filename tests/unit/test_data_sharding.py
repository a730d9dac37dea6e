"""Properties of the sharding plan (minitrain.data.sharding) and of passes over real DataIterators.

Every rank of a world is simulated in this process: sharding is pure, so no worker is needed to check
that the ranks of a world together read every row exactly once per epoch.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minitrain.data import from_items
from minitrain.data.iterator import DataIterator
from minitrain.data.sharding import (
    batch_bounds, derive_seed, epoch_order, kept_rows, local_shuffle, shard_bounds, shard_indices,
)

rows = st.integers(min_value=0, max_value=300)
worlds = st.integers(min_value=1, max_value=8)
batch_sizes = st.one_of(st.none(), st.integers(min_value=1, max_value=40))
seeds = st.one_of(st.none(), st.integers(min_value=-(2**63), max_value=2**64 - 1))
epochs = st.integers(min_value=0, max_value=1000)


def _all_shards(n, world, **kwargs) -> list[np.ndarray]:
    return [shard_indices(n, world, rank, **kwargs) for rank in range(world)]


@given(n=rows, world=worlds, seed=seeds, epoch=epochs, batch_size=batch_sizes)
def test_without_drop_last_every_row_is_read_once_per_epoch(n, world, seed, epoch, batch_size):
    shards = _all_shards(n, world, seed=seed, epoch=epoch, batch_size=batch_size, drop_last=False)
    joined = np.concatenate(shards)
    assert sorted(joined.tolist()) == list(range(n))  # every row, none twice
    sizes = [len(s) for s in shards]
    assert max(sizes) - min(sizes) <= 1  # near-equal
    # Batch counts differ by at most one between ranks (the documented cost of reading every row).
    counts = [len(batch_bounds(size, batch_size, False)) for size in sizes]
    assert max(counts) - min(counts) <= 1


@given(n=rows, world=worlds, seed=seeds, epoch=epochs, batch_size=st.integers(min_value=1, max_value=40))
def test_drop_last_gives_every_rank_the_same_full_batches(n, world, seed, epoch, batch_size):
    shards = _all_shards(n, world, seed=seed, epoch=epoch, batch_size=batch_size, drop_last=True)
    joined = np.concatenate(shards).tolist()
    assert len(set(joined)) == len(joined) and set(joined) <= set(range(n))  # each row at most once
    assert n - len(joined) < world * batch_size  # only the tail that cannot fill a batch on every rank
    assert len(joined) == kept_rows(n, world, batch_size, True)
    per_rank = [batch_bounds(len(s), batch_size, True) for s in shards]
    assert len({len(b) for b in per_rank}) == 1  # same number of steps on every rank: DDP cannot hang
    assert all(stop - start == batch_size for batches in per_rank for start, stop in batches)
    assert all(len(s) == len(batches) * batch_size for s, batches in zip(shards, per_rank))


@given(n=rows, world=worlds, seed=st.integers(min_value=0, max_value=2**40), epoch=epochs,
       batch_size=batch_sizes, drop_last=st.booleans())
def test_the_plan_is_a_function_of_its_arguments(n, world, seed, epoch, batch_size, drop_last):
    kwargs = dict(seed=seed, epoch=epoch, batch_size=batch_size, drop_last=drop_last)
    first, again = _all_shards(n, world, **kwargs), _all_shards(n, world, **kwargs)
    assert all(np.array_equal(a, b) for a, b in zip(first, again))


@given(n=st.integers(min_value=12, max_value=300), seed=st.integers(min_value=0, max_value=2**40),
       epoch=st.integers(min_value=0, max_value=1000))
def test_a_seeded_order_changes_every_epoch_and_with_the_seed(n, seed, epoch):
    order = epoch_order(n, seed, epoch)
    assert sorted(order.tolist()) == list(range(n))
    # 12! > 4e8: two equal permutations would be a bug, not bad luck.
    assert not np.array_equal(order, epoch_order(n, seed, epoch + 1))
    assert not np.array_equal(order, epoch_order(n, seed + 1, epoch))


@given(n=rows, epoch=epochs)
def test_without_a_seed_the_order_is_storage_order_in_every_epoch(n, epoch):
    assert epoch_order(n, None, epoch).tolist() == list(range(n))


@given(n=rows, world=worlds)
def test_blocks_are_contiguous_and_cover_the_rows(n, world):
    bounds = [shard_bounds(n, world, rank) for rank in range(world)]
    assert bounds[0][0] == 0 and bounds[-1][1] == n
    assert all(bounds[i][1] == bounds[i + 1][0] for i in range(world - 1))


@given(n=rows, batch_size=batch_sizes, drop_last=st.booleans())
def test_batches_cover_the_rows_in_order(n, batch_size, drop_last):
    bounds = batch_bounds(n, batch_size, drop_last)
    covered = [i for start, stop in bounds for i in range(start, stop)]
    if batch_size is None:
        assert covered == list(range(n))
        return
    assert covered == list(range(len(covered)))
    assert all(0 < stop - start <= batch_size for start, stop in bounds)
    assert len(covered) == (n - n % batch_size if drop_last else n)


@given(values=st.lists(st.integers(-(2**63), 2**63 - 1), max_size=200, unique=True), buffer_size=st.integers(1, 300),
       seed=st.integers(min_value=0, max_value=2**40))
def test_local_shuffle_is_a_seeded_permutation(values, buffer_size, seed):
    indices = np.asarray(values, dtype=np.int64)
    shuffled = local_shuffle(indices, buffer_size, seed)
    assert sorted(shuffled.tolist()) == sorted(values)
    assert np.array_equal(shuffled, local_shuffle(indices, buffer_size, seed))


def test_local_shuffle_edges():
    indices = np.arange(100)
    assert np.array_equal(local_shuffle(indices, 1, 3), indices)  # a buffer of one keeps the order
    assert not np.array_equal(local_shuffle(indices, 100, 3), indices)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="local_shuffle_buffer_size"):
            local_shuffle(indices, bad, 0)


def test_derived_seeds_depend_on_every_part():
    assert derive_seed(1, 2, 3) == derive_seed(1, 2, 3)
    assert len({derive_seed(1, 2, 3), derive_seed(1, 2, 4), derive_seed(1, 3, 3), derive_seed(2, 2, 3)}) == 4
    assert 0 <= derive_seed(-5, 2**70) < 2**63


# ---------------------------------------------------------------------------------- through DataIterator


def _world(dataset, world: int) -> list[DataIterator]:
    return [DataIterator(dataset, world_size=world, rank=rank, run_seed=11) for rank in range(world)]


@settings(max_examples=60, deadline=None)
@given(n=st.integers(0, 120), world=worlds, batch_size=batch_sizes, shuffled=st.booleans(),
       buffer=st.one_of(st.none(), st.integers(1, 50)), columnar=st.booleans())
def test_iterators_of_a_world_read_every_row_once_per_epoch(n, world, batch_size, shuffled, buffer, columnar):
    items = [{"id": i} for i in range(n)] if columnar else [("row", i) for i in range(n)]
    dataset = from_items(items)
    if shuffled:
        dataset = dataset.random_shuffle(seed=5)
    shards = _world(dataset, world)
    if batch_size is None:
        buffer = None  # a local shuffle needs a batch size (as Ray: test_data_iter_batches)
    orders = []
    for _epoch in range(2):
        seen = []
        for shard in shards:
            for batch in shard.iter_batches(batch_size=batch_size, local_shuffle_buffer_size=buffer,
                                            local_shuffle_seed=9):
                seen.extend((batch["id"] if columnar else batch["item"][1]).tolist())
        assert sorted(seen) == list(range(n))
        orders.append(seen)
    if shuffled and n >= 12:
        assert orders[0] != orders[1]  # every epoch has its own order


def test_each_iter_of_one_iterable_is_a_new_epoch_and_set_epoch_rewinds():
    dataset = from_items([{"id": i} for i in range(50)]).random_shuffle(seed=1)
    shard = DataIterator(dataset, world_size=2, rank=1)
    batches = shard.iter_batches(batch_size=None)  # Ray style: make the iterable once, loop per epoch
    first = next(iter(batches))["id"].tolist()
    second = next(iter(batches))["id"].tolist()
    assert shard.epoch == 2 and first != second
    assert first == shard_indices(50, 2, 1, seed=1, epoch=0).tolist()
    shard.set_epoch(0)
    assert [row["id"] for row in shard.iter_rows()] == first
    with pytest.raises(ValueError, match="set_epoch"):
        shard.set_epoch(-1)


def test_unseeded_shuffle_uses_the_run_seed_so_ranks_agree():
    dataset = from_items([{"id": i} for i in range(40)]).random_shuffle()
    rows = [[r["id"] for r in shard.iter_rows()] for shard in _world(dataset, 2)]
    assert sorted(rows[0] + rows[1]) == list(range(40))
    assert rows[0] + rows[1] == epoch_order(40, 11, 0).tolist()


def test_local_shuffle_differs_per_epoch_and_rank_but_repeats_for_a_seed():
    dataset = from_items([{"id": i} for i in range(64)])

    def passes(rank):
        shard = DataIterator(dataset, world_size=2, rank=rank)
        batches = shard.iter_batches(batch_size=64, local_shuffle_buffer_size=16, local_shuffle_seed=4)
        return [next(iter(batches))["id"].tolist() for _ in range(2)]

    rank0, rank1 = passes(0), passes(1)
    assert rank0 == passes(0)  # same seed, same sequence of orders
    assert rank0[0] != rank0[1] and sorted(rank0[0]) == sorted(rank0[1]) == list(range(32))
    assert sorted(rank1[0]) == list(range(32, 64))


def test_bad_iteration_arguments_are_refused_before_a_pass():
    shard = DataIterator(from_items([1, 2, 3]))
    for kwargs, match in [({"batch_size": 0}, "batch_size"), ({"batch_size": 2.0}, "batch_size"),
                          ({"local_shuffle_buffer_size": 0}, "local_shuffle_buffer_size"),
                          ({"prefetch_batches": -1}, "prefetch_batches"), ({"batch_format": "arrow"}, "batch_format")]:
        with pytest.raises(ValueError, match=match):
            shard.iter_batches(**kwargs)
    assert shard.epoch == 0  # nothing was started
