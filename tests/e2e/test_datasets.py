"""TorchTrainer(datasets=...) end to end: one fit on 2 gloo workers checks sharding, epochs, staging,
an unsplit dataset built by a factory in each worker, and get_dataset_shard's KeyError.

Each rank writes what it read to files under tmp_path; the test checks the union across ranks.
"""

from __future__ import annotations

import json
import os
import tempfile

import numpy as np
import pytest

import minitrain
import minitrain.data as mdata
from minitrain import DataConfig, RunConfig, ScalingConfig
from minitrain.data.sharding import shard_indices
from minitrain.data.staging import INLINE_LIMIT_BYTES
from minitrain.torch import TorchTrainer

pytestmark = pytest.mark.e2e

TRAIN_ROWS = INLINE_LIMIT_BYTES // 8 + 1000  # int64 ids just over the inline limit: staged as .npy
VALID_ROWS = 37
SEED = 7
EPOCHS = 2
BATCH = 4096


def make_valid():
    """Built in each worker (a factory): the unsplit validation set."""
    return mdata.from_items([{"v": i, "name": f"row{i}"} for i in range(VALID_ROWS)])


def train_with_datasets(config: dict):
    context = minitrain.get_context()
    rank = context.get_world_rank()
    train = minitrain.get_dataset_shard("train")
    info = {"same_object": train is minitrain.get_dataset_shard("train"),
            "source": type(train._dataset.source).__name__,
            "staged_root": getattr(train._dataset.source, "root", None)}
    batches = train.iter_torch_batches(batch_size=1000)  # made once, iterated once per epoch (Ray style)
    for epoch in range(EPOCHS):
        ids = np.concatenate([batch["data"].numpy() for batch in batches])
        np.save(os.path.join(config["out"], f"train_rank{rank}_epoch{epoch}.npy"), ids)
    info["valid"] = [int(row["v"]) for row in minitrain.get_dataset_shard("valid").iter_rows()]
    info["drop_last_batches"] = [len(b["data"]) for b in train.iter_batches(batch_size=BATCH, drop_last=True)]
    try:
        minitrain.get_dataset_shard("nope")
    except KeyError as exc:
        info["missing"] = str(exc)
    with open(os.path.join(config["out"], f"rank{rank}.json"), "w") as handle:
        json.dump(info, handle)


def _staging_dirs() -> set[str]:
    return {name for name in os.listdir(tempfile.gettempdir()) if name.startswith("minitrain_datasets_")}


def test_split_and_unsplit_datasets_on_two_workers(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    before = _staging_dirs()
    train = mdata.from_numpy(np.arange(TRAIN_ROWS)).random_shuffle(seed=SEED)
    TorchTrainer(train_with_datasets, train_loop_config={"out": str(out)},
                 datasets={"train": train, "valid": make_valid},
                 dataset_config=DataConfig(datasets_to_split=["train"]),
                 scaling_config=ScalingConfig(num_workers=2),
                 run_config=RunConfig(name="datasets", storage_path=str(tmp_path / "results"))).fit()

    info = {rank: json.loads((out / f"rank{rank}.json").read_text()) for rank in (0, 1)}
    orders = []
    for epoch in range(EPOCHS):
        shards = [np.load(out / f"train_rank{rank}_epoch{epoch}.npy") for rank in (0, 1)]
        joined = np.concatenate(shards)
        assert np.array_equal(np.sort(joined), np.arange(TRAIN_ROWS))  # every row exactly once this epoch
        assert abs(len(shards[0]) - len(shards[1])) <= 1
        for rank in (0, 1):  # the workers followed the documented plan for this seed and epoch
            assert np.array_equal(shards[rank], shard_indices(TRAIN_ROWS, 2, rank, seed=SEED, epoch=epoch))
        orders.append(joined)
    assert not np.array_equal(orders[0], orders[1])  # reshuffled between epochs
    for rank in (0, 1):
        assert info[rank]["same_object"] and info[rank]["source"] == "Staged"
        assert info[rank]["valid"] == list(range(VALID_ROWS))  # unsplit: every rank reads all rows
        steps = (TRAIN_ROWS // (2 * BATCH))
        assert info[rank]["drop_last_batches"] == [BATCH] * steps  # same full batches on both ranks
        assert "Dataset shard for 'nope' not found" in info[rank]["missing"]
    assert info[0]["staged_root"] == info[1]["staged_root"]
    assert not os.path.exists(info[0]["staged_root"])  # the staged copy is deleted when fit() returns
    assert _staging_dirs() <= before


# ---------------------------------------------------------------------------------- Ray's docstring example


def train_docstring_example(config: dict):
    import torch

    shard = minitrain.get_dataset_shard("train")
    seen = []
    for batch in shard.iter_torch_batches(batch_size=32, dtypes=torch.float):
        assert batch["input"].shape[1:] == (1,) and batch["input"].dtype == torch.float32
        assert torch.equal(batch["label"], 2 * batch["input"] + 1)
        assert torch.equal(batch["scaled"], batch["input"] * 10)
        seen.extend(int(v) for v in batch["input"][:, 0])
    minitrain.report({"rows": len(seen), "first": seen[:1]})


def test_torchtrainer_docstring_example_with_map_batches(tmp_path):
    # TorchTrainer's docstring: list-valued items become [B, 1] tensors; map_batches runs in the workers.
    items = mdata.from_items([{"input": [x], "label": [2 * x + 1]} for x in range(200)])
    train = items.map_batches(lambda b: {**b, "scaled": b["input"] * 10}, batch_size=64)
    result = TorchTrainer(train_docstring_example, datasets={"train": train},
                          scaling_config=ScalingConfig(num_workers=2),
                          run_config=RunConfig(name="docstring", storage_path=str(tmp_path))).fit()
    assert result.metrics == {"rows": 100, "first": [0]}  # rank 0 reads the first half
