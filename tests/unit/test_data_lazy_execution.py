"""Lazy execution as in Ray Data: a dataset's transforms run again on every pass (epoch) of a worker's
DataIterator, a `materialize()`d one's run once. Counted with a counter the transform increments.

Workers are simulated by unpickling what the driver sends (the shard specs travel in the run's payload),
then iterating each rank's DataIterator as `get_dataset_shard` returns it.
"""

from __future__ import annotations

import itertools

import cloudpickle
import numpy as np
import pytest

import minitrain.data as mdata
from minitrain.config import DataConfig
from minitrain.context import TrainContext
from minitrain.data.staging import make_shards, plan_datasets

CALLS = itertools.count()  # module-level: the transforms below are pickled by reference


def _counted(row):
    next(CALLS)
    return {"id": row["id"], "noise": np.random.random()}


def _counted_batch(batch):
    next(CALLS)
    return batch


def _calls() -> int:
    return next(CALLS)  # itertools.count has no peek: reading advances it, so compare differences


def _shard(dataset, rank=0, world=1):
    specs = cloudpickle.loads(cloudpickle.dumps(plan_datasets({"train": dataset}, DataConfig())))
    return make_shards(specs, TrainContext(experiment_name="e", world_size=world, world_rank=rank))["train"]


@pytest.mark.parametrize("build", [lambda ds: ds.map(_counted),
                                   lambda ds: ds.map_batches(_counted_batch, batch_size=1)])
def test_a_lazy_datasets_transforms_run_again_every_epoch(build):
    shard = _shard(build(mdata.range(10)))
    before = _calls()
    for _epoch in range(3):
        assert len(list(shard.iter_batches(batch_size=4))) == 3
    assert _calls() - before - 1 == 30  # 10 rows (or 10 one-row batches) x 3 epochs


def test_a_materialized_datasets_transforms_run_once():
    before = _calls()
    materialized = mdata.range(10).map(_counted).materialize()  # runs here, once
    assert _calls() - before - 1 == 10
    shard = _shard(materialized)
    before = _calls()
    epochs = [np.concatenate([b["noise"] for b in shard.iter_batches(batch_size=3)]) for _ in range(3)]
    assert _calls() - before - 1 == 0  # never again
    assert all(np.array_equal(epochs[0], e) for e in epochs)  # the same values every epoch


def test_random_augmentation_is_drawn_anew_each_epoch_and_shards_stay_disjoint():
    base = mdata.range(40).map(_counted)
    shards = [_shard(base, rank, 2) for rank in range(2)]
    per_epoch = []
    for _epoch in range(2):
        rows = [row for shard in shards for row in shard.iter_rows()]
        assert sorted(int(r["id"]) for r in rows) == list(range(40))  # every row once per epoch
        per_epoch.append(np.array([r["noise"] for r in rows]))
    assert not np.array_equal(per_epoch[0], per_epoch[1])  # fresh noise in epoch 2


def test_driver_side_iteration_is_lazy_too():
    ds = mdata.range(5).map(_counted)
    before = _calls()
    for _ in range(2):
        assert sum(len(b["id"]) for b in ds.iter_batches(batch_size=2)) == 5
    assert ds.take_all()[0]["id"] == 0
    assert _calls() - before - 1 == 15  # two passes and one take_all
