"""How datasets reach workers (minitrain.data.staging), TorchTrainer's dataset checks, and local mode.

Workers are simulated by unpickling what the driver would send: the shard specs travel in the run's
payload, so a pickle round trip is exactly what a worker gets.
"""

from __future__ import annotations

import logging
import os

import cloudpickle
import numpy as np
import pytest

import minitrain
import minitrain.data as mdata
from minitrain import DataConfig, RunConfig, ScalingConfig
from minitrain.context import TrainContext
from minitrain.data import staging
from minitrain.data.sources import Files, InMemory, Staged
from minitrain.data.staging import StagingArea, make_shards, plan_datasets, validate_datasets
from minitrain.errors import ConfigError
from minitrain.torch import TorchTrainer


def _area(tmp_path):
    from fsspec.implementations.local import LocalFileSystem

    root = tmp_path / "staging"
    root.mkdir()
    return StagingArea(LocalFileSystem(), str(root))


def _context(rank: int, world: int = 2) -> TrainContext:
    return TrainContext(experiment_name="e", world_size=world, world_rank=rank)


def test_large_numeric_tables_are_staged_as_npy_and_read_back_memory_mapped(tmp_path):
    area = _area(tmp_path)
    ids = np.arange(staging.INLINE_LIMIT_BYTES // 8 + 1)  # just over the limit
    datasets = validate_datasets({"big": mdata.from_numpy(ids).random_shuffle(seed=3),
                                  "small": {"x": np.arange(10)}}, DataConfig())
    specs = plan_datasets(datasets, DataConfig(), num_workers=2, staging=lambda: area)
    assert isinstance(specs["big"].dataset.source, Staged) and specs["small"].dataset.source.__class__ is InMemory
    assert specs["big"].dataset._seed == 3 and specs["big"].split
    assert len(cloudpickle.dumps(specs)) < 10_000  # the payload carries a path, not the rows
    files = os.listdir(specs["big"].dataset.source.root)
    assert files == ["column_0000.npy"]
    received = cloudpickle.loads(cloudpickle.dumps(specs))  # what each worker unpickles
    seen = []
    for rank in range(2):
        shard = make_shards(received, _context(rank))["big"]
        table = shard._load()[0]
        assert isinstance(table.columns["data"], np.memmap)
        seen.extend(row["data"] for row in shard.iter_rows())
    assert sorted(seen) == ids.tolist()
    area.cleanup()
    assert not os.path.exists(area.root)


def test_small_tables_factories_and_files_are_never_staged(tmp_path):
    (tmp_path / "f.csv").write_text("a\n1\n2\n")
    calls = []
    datasets = validate_datasets({"inline": [{"x": 1}], "factory": lambda: calls.append(1) or {"y": [1, 2, 3]},
                                  "files": mdata.read_csv(str(tmp_path / "f.csv"))}, DataConfig())
    specs = plan_datasets(datasets, DataConfig(), staging=lambda: pytest.fail("nothing needs staging"))
    assert isinstance(specs["files"].dataset.source, Files) and not calls  # the factory runs in workers
    shards = make_shards(cloudpickle.loads(cloudpickle.dumps(specs)), _context(0, world=1))
    assert [int(r["y"]) for r in shards["factory"].iter_rows()] == [1, 2, 3]
    assert [int(r["a"]) for r in shards["files"].iter_rows()] == [1, 2]


def test_large_tables_of_objects_travel_inline_with_a_warning(tmp_path, caplog):
    rows = [(np.zeros(1000), {"i": i}) for i in range(600)]  # ~5 MB of rows that are not columns
    datasets = validate_datasets({"objects": rows}, DataConfig())
    with caplog.at_level(logging.WARNING, logger="minitrain"):
        specs = plan_datasets(datasets, DataConfig(), num_workers=4, staging=lambda: _area(tmp_path))
    assert specs["objects"].dataset is datasets["objects"]
    assert "datasets['objects'] is 4.8 MB pickled" in caplog.text and "zero-argument function" in caplog.text


def test_split_and_unsplit_shards():
    datasets = validate_datasets({"train": {"x": np.arange(9)}, "valid": {"x": np.arange(4)}},
                                 DataConfig(datasets_to_split=["train"]))
    specs = plan_datasets(datasets, DataConfig(datasets_to_split=["train"]))
    rows = {rank: {name: [int(r["x"]) for r in shard.iter_rows()]
                   for name, shard in make_shards(specs, _context(rank)).items()} for rank in range(2)}
    assert rows[0]["train"] == [0, 1, 2, 3, 4] and rows[1]["train"] == [5, 6, 7, 8]
    assert rows[0]["valid"] == rows[1]["valid"] == [0, 1, 2, 3]


@pytest.mark.parametrize("datasets, config, fragments", [
    ({"train": [1]}, DataConfig(datasets_to_split=["tain"]), ["datasets_to_split=['tain']", "['tain']",
                                                            "it has ['train']", "Fix the name"]),
    (None, DataConfig(datasets_to_split=["train"]), ["names ['train']", "it has []"]),
    ([1, 2], DataConfig(), ["must be a dict of name -> dataset", "list"]),
    ({"": [1]}, DataConfig(), ["name ''", "non-empty strings"]),
    ({"train": {"x": [1, 2], "y": [1]}}, DataConfig(), ["datasets={'train': ...}", "unequal lengths"]),
    ({"train": 3.5}, DataConfig(), ["datasets={'train': ...}", "builtins.float", "Accepted:"]),
])
def test_trainer_refuses_bad_datasets_before_anything_starts(datasets, config, fragments):
    with pytest.raises(ConfigError) as caught:
        TorchTrainer(lambda: None, datasets=datasets, dataset_config=config)
    for fragment in fragments:
        assert fragment in str(caught.value)


def test_a_dataset_that_cannot_be_pickled_is_named(tmp_path):
    import threading

    lock = threading.Lock()

    class Locked:
        def __init__(self):
            self.lock = lock

        def __len__(self):
            return 1

        def __getitem__(self, index):
            return index

    datasets = validate_datasets({"train": Locked()}, DataConfig())
    with pytest.raises(ConfigError, match=r"datasets=\{'train': \.\.\.\}\) cannot be pickled.*zero-argument"):
        plan_datasets(datasets, DataConfig(), staging=lambda: _area(tmp_path))
    trainer = TorchTrainer(lambda: None, datasets={"valid": lambda: lock}, scaling_config=ScalingConfig(num_workers=2),
                           run_config=RunConfig(name="p", storage_path=str(tmp_path)))
    specs = plan_datasets(trainer.datasets, trainer.dataset_config, staging=lambda: _area(tmp_path))
    with pytest.raises(ConfigError, match=r"datasets=\{'valid': \.\.\.\}\) cannot be pickled"):
        trainer._payload(None, specs)


def _local_train(config):
    shard = minitrain.get_dataset_shard("train")
    assert shard is minitrain.get_dataset_shard("train")  # one iterator per dataset, as in Ray
    rows = [int(r["x"]) for r in shard.iter_rows()]
    try:
        minitrain.get_dataset_shard("nope")
    except KeyError as exc:
        missing = str(exc)
    import minitrain.collective as collective

    collective.barrier(timeout_s=1)
    return {"rows": rows, "missing": missing, "broadcast": collective.broadcast_from_rank_zero("mine")}


def test_local_mode_reads_every_row_and_collectives_are_trivial(tmp_path):
    result = TorchTrainer(_local_train, datasets={"train": {"x": np.arange(5)}},
                          scaling_config=ScalingConfig(num_workers=0),
                          run_config=RunConfig(name="local", storage_path=str(tmp_path))).fit()
    value = result.return_value
    assert value["rows"] == [0, 1, 2, 3, 4] and value["broadcast"] == "mine"
    assert "Dataset shard for 'nope' not found" in value["missing"]


def test_get_dataset_shard_outside_training_raises():
    with pytest.raises(RuntimeError, match="get_dataset_shard"):
        minitrain.get_dataset_shard("train")
