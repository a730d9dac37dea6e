"""pandas dtypes survive from `from_pandas` to a worker's batches, as in Ray: categorical columns stay
categorical in pandas batches (and so reach LightGBM as categorical features), ints stay ints and
datetimes stay datetimes. Workers are simulated by unpickling the shard specs the driver sends."""

from __future__ import annotations

import logging

import cloudpickle
import numpy as np
import pytest

import minitrain.data as mdata
from minitrain.config import DataConfig
from minitrain.context import TrainContext
from minitrain.data import staging
from minitrain.data.staging import make_shards, plan_datasets

pd = pytest.importorskip("pandas")


def _frame(n: int = 8) -> "pd.DataFrame":
    return pd.DataFrame({
        "cat": pd.Categorical(["a", "b", "c", "a"] * (n // 4), categories=["a", "b", "c"]),
        "i32": np.arange(n, dtype=np.int32),
        "i64": np.arange(n, dtype=np.int64) * 10,
        "nullable": pd.array([1, None] * (n // 2), dtype="Int64"),
        "when": pd.date_range("2024-01-01", periods=n, freq="D"),
        "when_utc": pd.date_range("2024-01-01", periods=n, freq="h", tz="UTC"),
        "x": np.linspace(0, 1, n),
    })


def _shards(dataset, world, staging_area=None):
    specs = plan_datasets({"train": dataset}, DataConfig(), num_workers=world, staging=staging_area)
    specs = cloudpickle.loads(cloudpickle.dumps(specs))
    return [make_shards(specs, TrainContext(experiment_name="e", world_size=world, world_rank=rank))["train"]
            for rank in range(world)]


def test_pandas_batches_on_the_worker_keep_every_dtype():
    df = _frame()
    (shard,) = _shards(mdata.from_pandas(df), 1)
    (batch,) = list(shard.iter_batches(batch_size=None, batch_format="pandas"))
    assert batch.dtypes.to_dict() == df.dtypes.to_dict()
    pd.testing.assert_frame_equal(batch, df)
    assert shard.materialize().to_pandas().dtypes.to_dict() == df.dtypes.to_dict()  # what GBDT loops use


def test_split_shards_keep_the_categories_of_the_whole_column():
    df = _frame(16)
    parts = [next(iter(shard.iter_batches(batch_size=None, batch_format="pandas"))) for shard in _shards(
        mdata.from_pandas(df).random_shuffle(seed=2), 2)]
    for part in parts:
        assert isinstance(part["cat"].dtype, pd.CategoricalDtype)
        assert list(part["cat"].cat.categories) == ["a", "b", "c"]  # not only the values this rank saw
    joined = pd.concat(parts).sort_values("i64", ignore_index=True)
    pd.testing.assert_frame_equal(joined, df)


def test_numpy_and_torch_batches_get_the_values():
    (shard,) = _shards(mdata.from_pandas(_frame()), 1)
    (batch,) = list(shard.iter_batches(batch_size=None))
    assert batch["cat"].tolist() == ["a", "b", "c", "a"] * 2  # a categorical's values, as str
    assert batch["i32"].dtype == np.int32 and batch["i64"].dtype == np.int64
    assert batch["when"].dtype.kind == "M"  # numpy datetime64
    torch = pytest.importorskip("torch")
    (tensors,) = list(shard.iter_torch_batches(batch_size=None, collate_fn=lambda b: {
        "i32": torch.as_tensor(b["i32"]), "cat": b["cat"]}))  # collate_fn gets numpy values, as in Ray
    assert tensors["i32"].dtype == torch.int32 and tensors["cat"].tolist()[:2] == ["a", "b"]
    with pytest.raises(TypeError, match="column 'cat'"):  # strings cannot be tensors: named, not silently kept
        list(shard.iter_torch_batches(batch_size=None, device=None))


def test_map_batches_and_filter_keep_pandas_dtypes():
    df = _frame()
    ds = mdata.from_pandas(df).map_batches(lambda b: b.assign(y=b["i64"] * 2), batch_format="pandas")
    ds = ds.filter(lambda row: row["i32"] % 2 == 0)
    out = ds.to_pandas()
    assert isinstance(out["cat"].dtype, pd.CategoricalDtype) and out["y"].dtype == np.int64
    assert out["when_utc"].dtype == df["when_utc"].dtype and out["i32"].tolist() == [0, 2, 4, 6]


def test_a_large_frame_with_a_categorical_travels_pickled_keeping_it(tmp_path, monkeypatch, caplog):
    from fsspec.implementations.local import LocalFileSystem

    monkeypatch.setattr(staging, "INLINE_LIMIT_BYTES", 64)  # make this small frame "large"
    area = staging.StagingArea(LocalFileSystem(), str(tmp_path))
    with caplog.at_level(logging.WARNING, logger="minitrain"):
        (shard,) = _shards(mdata.from_pandas(_frame()), 1, staging_area=lambda: area)
    assert "travels inside the run's payload" in caplog.text  # .npy files cannot hold a categorical
    (batch,) = list(shard.iter_batches(batch_size=None, batch_format="pandas"))
    assert isinstance(batch["cat"].dtype, pd.CategoricalDtype)


def test_lightgbm_sees_a_categorical_feature():
    lgb = pytest.importorskip("lightgbm")
    df = _frame(40).drop(columns=["when", "when_utc", "nullable"])
    (shard,) = _shards(mdata.from_pandas(df), 1)
    train_df = shard.materialize().to_pandas()  # minitrain.lightgbm's documented training loop
    data = lgb.Dataset(train_df.drop(columns=["x"]), label=train_df["x"], params={"verbose": -1}).construct()
    assert data.pandas_categorical == [["a", "b", "c"]]  # LightGBM took "cat" as categorical
