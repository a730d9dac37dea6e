"""`iter_batches` formats, `batch_size`/`drop_last` and the local shuffle buffer as Ray's, on a Dataset and
on the DataIterator a worker gets from `get_dataset_shard` (simulated: the shard specs a worker unpickles).
Tests marked "Ray:" are ported from Ray's python/ray/data/tests/test_consumption.py by changing the
imports; each notes what it leaves out."""

from __future__ import annotations

import math

import cloudpickle
import numpy as np
import pytest

import minitrain.data as ray_data  # what a ported Ray test calls `ray.data`
from minitrain.config import DataConfig
from minitrain.context import TrainContext
from minitrain.data.staging import make_shards, plan_datasets

pd = pytest.importorskip("pandas")


def _shards(dataset, world):
    specs = cloudpickle.loads(cloudpickle.dumps(plan_datasets({"train": dataset}, DataConfig())))
    return [make_shards(specs, TrainContext(experiment_name="e", world_size=world, world_rank=rank))["train"]
            for rank in range(world)]


def _dfs():
    return [pd.DataFrame({"one": [1, 2, 3], "two": [2, 3, 4]}), pd.DataFrame({"one": [4, 5, 6], "two": [5, 6, 7]}),
            pd.DataFrame({"one": [7, 8, 9], "two": [8, 9, 10]}),
            pd.DataFrame({"one": [10, 11, 12], "two": [11, 12, 13]})]


@pytest.mark.parametrize("where", ["dataset", "shard"])
def test_iter_batches_basic(where):
    # Ray: test_consumption.py::test_iter_batches_basic. Left out: batch_format="pyarrow" (not built here:
    # ValueError naming the formats), and batch_size=None giving one batch per input block (here: one
    # batch of the whole shard).
    dfs = _dfs()
    ds = ray_data.from_pandas(dfs)
    ds = ds if where == "dataset" else _shards(ds, 1)[0]
    whole = pd.concat(dfs, ignore_index=True)

    (batch,) = list(ds.iter_batches(batch_size=None, batch_format="pandas"))
    assert isinstance(batch, pd.DataFrame) and batch.equals(whole)
    for batch_format in ("numpy", "default"):
        (batch,) = list(ds.iter_batches(batch_size=None, batch_format=batch_format))
        assert isinstance(batch, dict) and list(batch) == ["one", "two"]
        assert all(isinstance(col, np.ndarray) for col in batch.values())
        pd.testing.assert_frame_equal(pd.DataFrame(batch), whole)

    for batch_size in (2, 4):  # smaller and larger than a block
        batches = list(ds.iter_batches(batch_size=batch_size, batch_format="pandas"))
        assert all(len(batch) == batch_size for batch in batches)
        assert len(batches) == math.ceil(12 / batch_size)
        assert pd.concat(batches, ignore_index=True).equals(whole)

    batches = list(ds.iter_batches(batch_size=15, batch_format="pandas"))  # larger than the dataset
    assert len(batches) == 1 and len(batches[0]) == 12

    batches = list(ds.iter_batches(batch_size=5, drop_last=True, batch_format="pandas"))
    assert [len(b) for b in batches] == [5, 5]
    assert pd.concat(batches, ignore_index=True).equals(whole[:10])

    batches = list(ds.iter_batches(batch_size=5, drop_last=False, batch_format="pandas"))
    assert [len(b) for b in batches] == [5, 5, 2]
    assert pd.concat(batches, ignore_index=True).equals(whole)

    for prefetch_batches in (1, 2, 4):
        batches = list(ds.iter_batches(prefetch_batches=prefetch_batches, batch_size=2, batch_format="pandas"))
        assert pd.concat(batches, ignore_index=True).equals(whole)


@pytest.mark.parametrize("block_sizes,batch_size,drop_last", [
    ([10], 3, False), ([10], 3, True), ([10], 5, False), ([5, 5, 5], 7, False), ([5, 5, 5], 7, True),
    ([1, 5, 10], 4, False), ([1, 5, 10], 4, True), ([5, 3, 7], 1, False), ([2, 3, 4], 100, False),
    ([6, 12, 18], 6, False),
])
def test_iter_batches_grid(block_sizes, batch_size, drop_last):
    # Ray: test_consumption.py::test_iter_batches_grid (from_blocks -> from_pandas of the same frames).
    dfs, running = [], 0
    for size in block_sizes:
        dfs.append(pd.DataFrame({"value": list(range(running, running + size))}))
        running += size
    num_rows = running
    ds = ray_data.from_pandas(dfs)
    batches = list(ds.iter_batches(batch_size=batch_size, drop_last=drop_last, batch_format="pandas"))
    if num_rows % batch_size == 0 or not drop_last:
        assert len(batches) == math.ceil(num_rows / batch_size)
        assert pd.concat(batches, ignore_index=True).equals(ds.to_pandas())
    else:
        assert len(batches) == num_rows // batch_size
        assert pd.concat(batches, ignore_index=True).equals(ds.to_pandas()[: batch_size * (num_rows // batch_size)])
    if num_rows % batch_size == 0 or drop_last:
        assert all(len(batch) == batch_size for batch in batches)
    else:
        assert all(len(batch) == batch_size for batch in batches[:-1])
        assert len(batches[-1]) == num_rows % batch_size


@pytest.mark.parametrize("ds_format", ["arrow", "pandas"])
def test_iter_batches_local_shuffle(ds_format):
    # Ray: test_consumption.py::test_iter_batches_local_shuffle ("arrow" is ray.data.range here).
    with pytest.raises(ValueError):  # a batch size must be given for a local shuffle
        list(ray_data.range(100).iter_batches(batch_size=None, local_shuffle_buffer_size=10))

    def range(n, parallelism=200):  # noqa: A001 - Ray's helper's name
        ds = ray_data.range(n, override_num_blocks=parallelism)
        if ds_format == "pandas":
            ds = ds.map_batches(lambda df: df, batch_size=None, batch_format="pandas")
        return ds

    def unbatch(batches):
        return [int(v) for batch in batches for v in batch["id"]]

    base = list(builtins_range(100))
    for parallelism, batch_size, buffer in [(10, 3, 25), (1, 3, 25), (100, 3, 25), (10, 3, 200), (20, 12, 25),
                                            (10, 200, 400)]:
        r1 = unbatch(range(100, parallelism).iter_batches(batch_size=batch_size, local_shuffle_buffer_size=buffer))
        r2 = unbatch(range(100, parallelism).iter_batches(batch_size=batch_size, local_shuffle_buffer_size=buffer))
        assert r1 != r2 and r1 != base and r2 != base  # random
        assert sorted(r1) == sorted(r2) == base  # no row lost or repeated
    seeded = [unbatch(range(100, 10).iter_batches(batch_size=3, local_shuffle_buffer_size=25, local_shuffle_seed=0))
              for _ in builtins_range(2)]
    assert seeded[0] == seeded[1] != base and sorted(seeded[0]) == base
    r1 = unbatch(range(100, 10).iter_batches(batch_size=7, local_shuffle_buffer_size=21, drop_last=True))
    assert len(r1) % 7 == 0 and len(set(r1)) == len(r1) and set(r1) <= set(base)  # partial batch dropped
    empty = ray_data.from_items([])
    assert unbatch(empty.iter_batches(batch_size=2, local_shuffle_buffer_size=10)) == []


builtins_range = range


@pytest.mark.parametrize("method", ["iter_batches", "iter_torch_batches"])
def test_local_shuffle_on_worker_shards_loses_and_repeats_nothing(method):
    if method == "iter_torch_batches":
        pytest.importorskip("torch")
    shards = _shards(ray_data.range(200), 2)
    kwargs = {"device": None} if method == "iter_torch_batches" else {}
    orders = []
    for _epoch in range(2):
        seen = []
        for shard in shards:
            mine = [int(v) for b in getattr(shard, method)(batch_size=8, local_shuffle_buffer_size=32,
                                                           local_shuffle_seed=1, **kwargs) for v in b["id"]]
            assert len(mine) == 100 and sorted(mine) != mine  # this rank's rows, reordered
            seen.extend(mine)
        assert sorted(seen) == list(builtins_range(200))  # every row exactly once across the ranks
        orders.append(seen)
    assert orders[0] != orders[1]  # the seed mixes in the epoch
    with pytest.raises(ValueError, match="batch size must be provided"):
        iter(getattr(shards[0], method)(batch_size=None, local_shuffle_buffer_size=4, **kwargs))


def test_unknown_batch_formats_name_the_supported_ones():
    with pytest.raises(ValueError, match=r"batch_format='pyarrow'.*'default', 'numpy', 'pandas'"):
        ray_data.range(3).iter_batches(batch_format="pyarrow")
