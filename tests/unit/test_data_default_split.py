"""Every dataset passed to a trainer is split across the workers unless `DataConfig(datasets_to_split=...)`
says otherwise, as in Ray Train V2 (`DataConfig.__init__(datasets_to_split="all", ...)`). Workers are
simulated by unpickling the shard specs the driver sends (the trainer is built, not fit)."""

from __future__ import annotations

import inspect

import cloudpickle
import numpy as np

import minitrain.data as mdata
from minitrain import DataConfig
from minitrain.context import TrainContext
from minitrain.data.staging import make_shards, plan_datasets
from minitrain.torch import TorchTrainer


def _rows_per_rank(trainer, world):
    specs = cloudpickle.loads(cloudpickle.dumps(plan_datasets(trainer.datasets, trainer.dataset_config)))
    out = []
    for rank in range(world):
        shards = make_shards(specs, TrainContext(experiment_name="e", world_size=world, world_rank=rank))
        out.append({name: sorted(int(next(iter(row.values()))) for row in shard.iter_rows())
                    for name, shard in shards.items()})
    return out


def test_datasets_to_split_defaults_to_all_as_in_ray():
    assert inspect.signature(DataConfig).parameters["datasets_to_split"].default == "all"
    assert DataConfig().should_split("anything")


def test_every_dataset_is_split_by_default():
    trainer = TorchTrainer(lambda: None, datasets={"train": mdata.range(10), "valid": {"v": np.arange(6)},
                                                   "test": lambda: mdata.from_items(list(range(4)))})
    ranks = _rows_per_rank(trainer, 2)
    for name, n in (("train", 10), ("valid", 6), ("test", 4)):
        assert ranks[0][name] and ranks[1][name] and not set(ranks[0][name]) & set(ranks[1][name])
        assert sorted(ranks[0][name] + ranks[1][name]) == list(range(n))  # disjoint halves, every row once


def test_datasets_to_split_chooses_which_are_split():
    trainer = TorchTrainer(lambda: None, datasets={"train": mdata.range(10), "valid": mdata.range(6)},
                           dataset_config=DataConfig(datasets_to_split=["train"]))
    ranks = _rows_per_rank(trainer, 2)
    assert ranks[0]["train"] == list(range(5)) and ranks[1]["train"] == list(range(5, 10))
    assert ranks[0]["valid"] == ranks[1]["valid"] == list(range(6))  # unsplit: every rank gets all rows
    none = TorchTrainer(lambda: None, datasets={"train": mdata.range(4)}, dataset_config=DataConfig(datasets_to_split=[]))
    assert [r["train"] for r in _rows_per_rank(none, 2)] == [list(range(4))] * 2
