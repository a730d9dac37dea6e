"""Batch formats: numpy dicts, pandas frames, and torch tensors (dtypes, device, collate_fn)."""

from __future__ import annotations

from collections import namedtuple

import numpy as np
import pytest

import minitrain.data as mdata
from minitrain.context import TrainContext
from minitrain.data.batches import numpy_collate
from minitrain.data.iterator import DataIterator

torch = pytest.importorskip("torch")


class Pairs:
    """A map-style dataset of (features tensor, label) rows, as a torch Dataset returns them."""

    def __len__(self):
        return 10

    def __getitem__(self, index):
        return torch.full((3,), float(index)), index


def test_numpy_batches_of_columns_and_of_rows():
    columns = mdata.from_items([{"x": i, "v": np.ones(2) * i} for i in range(5)])
    batches = list(columns.iter_batches(batch_size=2))
    assert [b["x"].tolist() for b in batches] == [[0, 1], [2, 3], [4]]
    assert batches[0]["v"].shape == (2, 2)
    whole = list(mdata.from_items([1, 2]).iter_batches(batch_size=None))
    assert len(whole) == 1 and whole[0]["item"].tolist() == [1, 2]
    pairs = next(iter(DataIterator(mdata.dataset.as_dataset(Pairs(), "d")).iter_batches(batch_size=4)))
    assert isinstance(pairs, tuple) and pairs[0].shape == (4, 3) and pairs[1].tolist() == [0, 1, 2, 3]


def test_numpy_collate_keeps_structure_and_tolerates_ragged_leaves():
    Point = namedtuple("Point", "x y")
    collated = numpy_collate([Point(1, 2), Point(3, 4)])
    assert isinstance(collated, Point) and collated.x.tolist() == [1, 3]
    ragged = numpy_collate([{"t": [1, 2]}, {"t": [3]}])["t"]
    assert ragged.dtype == object and ragged[1].tolist() == [3]


def test_pandas_batches():
    pytest.importorskip("pandas")
    frame = next(iter(mdata.from_items([{"x": i} for i in range(3)]).iter_batches(batch_format="pandas")))
    assert frame["x"].tolist() == [0, 1, 2]
    assert mdata.from_items([{"x": 1}]).to_pandas().shape == (1, 1)


def test_torch_batches_of_columns_with_dtypes_and_device():
    ds = mdata.from_items([{"x": i, "y": float(i)} for i in range(6)])
    batches = list(ds.iter_torch_batches(batch_size=4, dtypes={"x": torch.float32}, device="cpu"))
    assert batches[0]["x"].dtype == torch.float32 and batches[0]["y"].dtype == torch.float64
    assert batches[1]["x"].tolist() == [4.0, 5.0]
    one_dtype = next(iter(ds.iter_torch_batches(dtypes=torch.float16, device=None)))
    assert {t.dtype for t in one_dtype.values()} == {torch.float16}
    auto = next(iter(ds.iter_torch_batches()))  # "auto" outside a GPU worker: cpu
    assert auto["x"].device.type == "cpu"


def test_torch_batches_of_rows_collate_like_a_dataloader():
    shard = DataIterator(mdata.dataset.as_dataset(Pairs(), "d"), world_size=2, rank=1,
                         context=TrainContext(experiment_name="e", world_size=2, world_rank=1))
    features, labels = next(iter(shard.iter_torch_batches(batch_size=3, dtypes=torch.float64)))
    assert features.shape == (3, 3) and features.dtype == torch.float64
    assert labels.tolist() == [5.0, 6.0, 7.0]  # rank 1 of 2 reads rows 5..9


def test_collate_fn_gets_the_raw_batch_and_excludes_dtypes_and_device():
    ds = mdata.from_items([{"x": i} for i in range(4)])
    seen = []
    batches = list(ds.iter_torch_batches(batch_size=2, collate_fn=lambda b: seen.append(b) or len(b["x"])))
    assert batches == [2, 2] and isinstance(seen[0]["x"], np.ndarray)
    with pytest.raises(ValueError, match="collate_fn cannot be used with dtypes and device"):
        ds.iter_torch_batches(collate_fn=lambda b: b, dtypes=torch.float32)
    with pytest.raises(ValueError, match="collate_fn cannot be used with dtypes and device"):
        ds.iter_torch_batches(collate_fn=lambda b: b, device="cpu")


def test_string_columns_cannot_become_tensors():
    ds = mdata.from_items([{"name": "a"}, {"name": "b"}])
    with pytest.raises(TypeError, match="column 'name' holds <U1 values.*collate_fn"):
        next(iter(ds.iter_torch_batches()))
