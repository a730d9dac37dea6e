"""minitrain.data constructors, the values TorchTrainer(datasets=...) accepts, and the file readers."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest

import minitrain.data as mdata
from minitrain.data import readers
from minitrain.data.dataset import as_dataset
from minitrain.data.sources import Factory, Files, InMemory
from minitrain.data.tables import ColumnTable, RowTable
from minitrain.errors import ConfigError

WHERE = "TorchTrainer(datasets={'train': ...})"


class MapStyle:
    """A map-style dataset (what torch.utils.data.Dataset subclasses look like), rows as tuples."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, index):
        if not 0 <= index < self.n:
            raise IndexError(index)
        return (float(index), index * 10)


class IterableDataset:
    """Named like torch's: rows only by iteration."""

    def __iter__(self):
        return iter(range(3))


def _table(value):
    return as_dataset(value, WHERE)._resolve()[0]


# ---------------------------------------------------------------------------------- constructors


def test_from_items_follows_rays_row_layout():
    dicts = mdata.from_items([{"x": i, "name": f"n{i}"} for i in range(4)])
    assert dicts.count() == 4 and dicts.columns() == ["x", "name"]
    assert isinstance(dicts.source.table, ColumnTable)  # stacked into columns
    assert [int(r["x"]) for r in dicts.take_all()] == [0, 1, 2, 3]
    plain = mdata.from_items([1, 2, 3])
    assert plain.columns() == ["item"] and [int(r["item"]) for r in plain.take()] == [1, 2, 3]
    ragged = mdata.from_items([{"tokens": [1, 2]}, {"tokens": [3]}])  # Ray: one array per row (object column)
    assert isinstance(ragged.source.table, ColumnTable) and ragged.take(1)[0]["tokens"].tolist() == [1, 2]
    assert ragged.source.table.columns["tokens"].dtype == object
    words = mdata.from_items([{"w": ["a", "b"]}, {"w": ["c"]}])  # lists of strings stay rows
    assert isinstance(words.source.table, RowTable)
    mixed = mdata.from_items([("a", 1), ("b", 2)])
    assert mixed.take(1) == [{"item": ("a", 1)}]  # tuples are kept, never coerced to strings
    with pytest.raises(TypeError, match="list of rows"):
        mdata.from_items("abc")


def test_from_numpy_pandas_and_torch():
    assert mdata.from_numpy(np.arange(6).reshape(3, 2)).take(1)[0]["data"].tolist() == [0, 1]
    assert mdata.from_numpy([np.arange(2), np.arange(3)]).count() == 5
    pd = pytest.importorskip("pandas")
    frame = pd.DataFrame({"a": [1, 2, 3], "s": ["x", "y", "z"]}, index=[7, 8, 9])
    ds = mdata.from_pandas(frame)
    assert ds.columns() == ["a", "s"] and ds.take(1)[0]["s"] == "x"
    assert mdata.from_pandas([frame, frame]).count() == 6
    with pytest.raises(ConfigError, match="same columns"):
        mdata.from_pandas([frame, frame[["a"]]])
    torch_rows = mdata.from_torch(MapStyle(3))
    assert torch_rows.take(2) == [{"item": (0.0, 0)}, {"item": (1.0, 10)}]
    with pytest.raises(TypeError, match="map-style"):
        mdata.from_torch(IterableDataset())


def test_random_shuffle_keeps_rows_and_validates_the_seed():
    ds = mdata.from_items(list(range(30))).random_shuffle(seed=3)
    first = [int(r["item"]) for r in ds.iter_rows()]
    second = [int(r["item"]) for r in ds.iter_rows()]
    assert sorted(first) == sorted(second) == list(range(30)) and first != second
    assert ds.take(3) == mdata.from_items(list(range(30))).take(3)  # take() is storage order
    with pytest.raises(TypeError, match="seed"):
        mdata.from_items([1]).random_shuffle(seed="1")


def test_a_dataset_pickles_without_its_caches():
    ds = mdata.from_items([{"x": i} for i in range(5)]).random_shuffle(seed=2)
    list(ds.iter_rows())
    clone = pickle.loads(pickle.dumps(ds))
    assert clone._cache is None and clone._iterator is None
    assert [int(r["x"]) for r in clone.iter_rows()] == [int(r["x"]) for r in
                                                        mdata.from_items([{"x": i} for i in range(5)])
                                                        .random_shuffle(seed=2).iter_rows()]


# ---------------------------------------------------------------------------------- accepted values


def test_accepted_values():
    assert _table({"x": np.arange(3), "y": [1.0, 2.0, 3.0]}).num_rows == 3
    assert isinstance(_table([(1, 2), (3, 4)]), RowTable)  # rows as they are
    assert isinstance(_table([{"a": 1}, {"a": 2}]), ColumnTable)
    assert isinstance(_table(MapStyle(4)), RowTable) and _table(MapStyle(4)).row(2) == (2.0, 20)
    assert _table(np.zeros((5, 2))).columns["data"].shape == (5, 2)
    factory = as_dataset(lambda: {"x": [1, 2]}, WHERE)
    assert isinstance(factory.source, Factory) and factory.count() == 2
    assert isinstance(as_dataset(MapStyle, WHERE).source, Factory)  # a class: its constructor is the factory
    with pytest.raises(TypeError, match="called with no arguments"):
        as_dataset(MapStyle, WHERE).count()
    pd = pytest.importorskip("pandas")
    assert _table(pd.DataFrame({"a": [1, 2]})).columns["a"].tolist() == [1, 2]


def test_tensor_columns_become_arrays():
    torch = pytest.importorskip("torch")
    table = _table({"x": torch.arange(4, dtype=torch.float16), "y": torch.ones(4, 2)})
    assert table.columns["x"].dtype == np.float16 and table.columns["y"].shape == (4, 2)
    with pytest.raises(ConfigError, match=r"\['x'\] is a tensor of dtype torch.bfloat16"):
        _table({"x": torch.zeros(2, dtype=torch.bfloat16)})


@pytest.mark.parametrize("value, fragments", [
    ({"x": np.arange(3), "y": np.arange(2)}, ["unequal lengths", "'x' has 3", "'y' has 2", WHERE]),
    ({"x": 5}, ["['x'] is a scalar", "one value per row"]),
    ({1: [1, 2]}, ["column name 1", "must be str"]),
    ({}, ["no columns"]),
    (42, [WHERE, "builtins.int", "Accepted:", "read_parquet", "zero-argument function"]),
    ("data/train.csv", ["the string 'data/train.csv'", "read_csv"]),
    (IterableDataset(), ["IterableDataset", "map-style", "prepare_data_loader"]),
])
def test_bad_values_name_the_field_the_value_and_the_fix(value, fragments):
    with pytest.raises(ConfigError) as caught:
        as_dataset(value, WHERE)
    for fragment in fragments:
        assert fragment in str(caught.value)


def test_a_factory_must_return_a_dataset():
    with pytest.raises(ConfigError, match="returned another function"):
        as_dataset(lambda: (lambda: [1]), WHERE).count()
    with pytest.raises(ConfigError, match="what TorchTrainer.* returned is a builtins.object"):
        as_dataset(lambda: object(), WHERE).count()


# ---------------------------------------------------------------------------------- files


def _write_csv(path, rows):
    path.write_text("a,b\n" + "".join(f"{a},{b}\n" for a, b in rows))


def test_read_csv_files_directories_and_globs(tmp_path):
    (tmp_path / "d").mkdir()
    _write_csv(tmp_path / "d" / "1.csv", [(1, "x"), (2, "y")])
    _write_csv(tmp_path / "d" / "2.csv", [(3, "z")])
    (tmp_path / "d" / "notes.txt").write_text("not data")
    ds = mdata.read_csv(str(tmp_path / "d"), include_paths=True)
    assert isinstance(ds.source, Files) and len(ds.source.paths) == 2
    assert ds.count() == 3 and ds.columns() == ["a", "b", "path"]
    assert [int(r["a"]) for r in ds.take_all()] == [1, 2, 3]
    assert ds.take(1)[0]["path"].endswith("1.csv")
    assert mdata.read_csv(str(tmp_path / "d" / "*.csv"), parallelism=4).count() == 3  # Ray knobs ignored
    assert mdata.read_csv([str(tmp_path / "d" / "2.csv")]).count() == 1
    with pytest.raises(FileNotFoundError, match="does not exist"):
        mdata.read_csv(str(tmp_path / "missing.csv"))
    with pytest.raises(FileNotFoundError, match="file_extensions"):
        mdata.read_csv(str(tmp_path), file_extensions=["tsv"])


def test_read_csv_on_an_fsspec_url():
    import fsspec

    fs = fsspec.filesystem("memory")
    fs.pipe("/minitrain-test-data/x.csv", b"a,b\n1,2\n3,4\n")
    try:
        ds = mdata.read_csv("memory://minitrain-test-data/x.csv")
        assert [int(r["b"]) for r in ds.take_all()] == [2, 4]
    finally:
        fs.rm("/minitrain-test-data", recursive=True)


def test_read_json_lines_and_arrays(tmp_path):
    (tmp_path / "a.jsonl").write_text("\n".join(json.dumps({"x": i, "s": str(i)}) for i in range(3)))
    (tmp_path / "b.json").write_text(json.dumps([{"x": 9, "s": "9"}]))
    ds = mdata.read_json([str(tmp_path / "a.jsonl"), str(tmp_path / "b.json")])
    assert [int(r["x"]) for r in ds.take_all()] == [0, 1, 2, 9]
    assert mdata.read_json(str(tmp_path / "a.jsonl"), lines=True).count() == 3


def test_read_parquet(tmp_path):
    pytest.importorskip("pyarrow")
    pd = pytest.importorskip("pandas")
    pd.DataFrame({"x": [1, 2, 3], "y": [0.5, 1.5, 2.5]}).to_parquet(tmp_path / "p.parquet")
    ds = mdata.read_parquet(str(tmp_path), columns=["y"])
    assert ds.columns() == ["y"] and [float(r["y"]) for r in ds.take_all()] == [0.5, 1.5, 2.5]


def test_stdlib_readers_infer_numbers():
    records = [{"a": "1", "b": "2.5", "c": "x"}, {"a": "2", "b": "3", "c": "y"}]
    columns = readers._columns_from_records(records, "f.csv", infer_numbers=True)
    assert columns["a"].dtype.kind == "i" and columns["b"].dtype.kind == "f" and columns["c"].tolist() == ["x", "y"]


def test_materialize_reads_once(tmp_path):
    _write_csv(tmp_path / "m.csv", [(1, "x")])
    ds = mdata.read_csv(str(tmp_path / "m.csv")).random_shuffle(seed=1).materialize()
    (tmp_path / "m.csv").unlink()
    assert isinstance(ds.source, InMemory) and ds.count() == 1 and ds._shuffle and ds._seed == 1
