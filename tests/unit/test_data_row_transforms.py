"""`Dataset.map`, `flat_map` and `filter` with Ray's row semantics (minitrain.data.transforms). Tests
marked "Ray:" are ported from Ray's python/ray/data/tests/test_map.py by changing the imports."""

from __future__ import annotations

import threading

import cloudpickle
import numpy as np
import pytest

import minitrain.data as ray_data  # what a ported Ray test calls `ray.data`
from minitrain.config import DataConfig
from minitrain.data.staging import plan_datasets
from minitrain.data.tables import ColumnTable, RowTable
from minitrain.errors import ConfigError


def extract_values(column, rows):
    return [row[column] for row in rows]


def column_udf(column, udf):
    def wraps(row):
        return {column: udf(row[column])}

    return wraps


def test_map_basic():  # Ray: test_map.py::test_basic (tasks) and the Dataset.map docstring
    ds = ray_data.range(5)
    assert extract_values("id", ds.map(column_udf("id", lambda x: x + 1)).take()) == [1, 2, 3, 4, 5]

    def parse(row):
        row["double"] = row["id"] * 2  # Ray's docstring example mutates the row and returns it
        return row

    mapped = ds.map(parse)
    assert mapped.columns() == ["id", "double"]
    assert extract_values("double", mapped.take_all()) == [0, 2, 4, 6, 8]
    assert ds.columns() == ["id"] and extract_values("id", ds.take_all()) == [0, 1, 2, 3, 4]  # source untouched


def test_map_with_callable_class_args_and_concurrency():
    instances = []

    class AddN:
        def __init__(self, n):
            self.n = n
            instances.append(threading.get_ident())

        def __call__(self, row, scale, *, offset):
            return {"id": row["id"] * scale + self.n + offset}

    out = ray_data.range(10).map(AddN, fn_constructor_args=(1,), fn_args=(2,), fn_kwargs={"offset": 100},
                                 concurrency=2).take_all()
    assert extract_values("id", out) == [2 * i + 101 for i in range(10)]  # order kept across threads
    assert 1 <= len(instances) == len(set(instances)) <= 2  # one instance per thread (Ray: per actor)
    with pytest.raises(ValueError, match="fn_constructor_args"):
        ray_data.range(3).map(lambda row: row, fn_constructor_args=(1,))


def test_flat_map_generator():  # Ray: test_map.py::test_flat_map_generator
    ds = ray_data.range(3)

    def map_generator(item: dict):
        for _ in range(2):
            yield {"id": item["id"] + 1}

    assert sorted(extract_values("id", ds.flat_map(map_generator).take())) == [1, 1, 2, 2, 3, 3]


def test_flat_map_lists_drop_rows_with_an_empty_list_and_keep_order():
    ds = ray_data.from_items([{"word": "a b"}, {"word": ""}, {"word": "c d e"}])
    out = ds.flat_map(lambda row: [{"w": w} for w in str(row["word"]).split()])
    assert extract_values("w", out.take_all()) == ["a", "b", "c", "d", "e"]
    assert isinstance(out._resolve()[0], ColumnTable)  # rows that stack are stored as columns, as from_items
    assert ray_data.range(3).flat_map(lambda row: []).count() == 0


def test_filter_keeps_rows_and_their_dtypes():  # Ray: Dataset.filter's docstring (fn form)
    ds = ray_data.range(100)
    assert extract_values("id", ds.filter(lambda row: row["id"] <= 4).take_all()) == [0, 1, 2, 3, 4]
    mixed = ray_data.from_items([{"x": float(i), "tag": f"t{i}", "v": [i, i]} for i in range(6)])
    kept = mixed.filter(lambda row: row["x"] % 2 == 0)._resolve()[0]
    assert kept.columns["x"].dtype == np.float64 and kept.columns["v"].shape == (3, 2)
    assert kept.columns["tag"].tolist() == ["t0", "t2", "t4"]
    rows = ray_data.from_torch(_Rows(4)).filter(lambda row: row["item"][1] > 10)
    assert isinstance(rows._resolve()[0], RowTable) and extract_values("item", rows.take_all()) == [(2.0, 20),
                                                                                                  (3.0, 30)]


class _Rows:
    def __len__(self):
        return 4

    def __init__(self, n):
        self.n = n

    def __getitem__(self, index):
        return (float(index), index * 10)


def test_filter_expr_and_missing_fn_raise_with_the_fix():
    with pytest.raises(ConfigError, match=r"filter\(expr='id <= 4'\).*filter\(lambda row"):
        ray_data.range(10).filter(expr="id <= 4")
    with pytest.raises(ValueError, match="exactly one of 'fn' or 'expr'"):
        ray_data.range(10).filter()


def test_outputs_that_are_not_rows_raise_rays_error():
    with pytest.raises(ValueError, match="Standalone Python objects are not allowed"):
        ray_data.range(3).map(lambda row: row["id"]).take_all()
    with pytest.raises(ValueError, match="Standalone Python objects are not allowed"):
        ray_data.range(3).flat_map(lambda row: [row["id"]]).take_all()
    with pytest.raises(ValueError, match="returns a list of rows"):
        ray_data.range(3).flat_map(lambda row: row).take_all()  # a dict, not a list of dicts
    with pytest.raises(TypeError, match="needs a function"):
        ray_data.range(3).map(3)


@pytest.mark.parametrize("method", ["map", "flat_map", "filter"])
@pytest.mark.parametrize("name, value", [("num_cpus", 2), ("num_gpus", 1), ("memory", 10), ("compute", "tasks"),
                                         ("ray_remote_args_fn", lambda: {})])
def test_ray_task_options_are_refused_and_defaults_accepted(method, name, value):
    ds = ray_data.range(3)
    with pytest.raises(ConfigError, match=f"{name}="):
        getattr(ds, method)(lambda row: row, **{name: value})
    getattr(ds, method)(lambda row: row, **{name: None})  # Ray's default is accepted
    with pytest.raises(ConfigError, match=rf"{method}\(concurrency="):
        getattr(ds, method)(lambda row: row, concurrency=0)


def test_transforms_chain_follow_a_shuffle_and_travel_to_workers():
    ds = ray_data.range(20).random_shuffle(seed=3).map(lambda r: {"id": r["id"], "sq": r["id"] ** 2})
    ds = ds.filter(lambda r: r["id"] % 2 == 1).flat_map(lambda r: [r, {"id": -r["id"], "sq": r["sq"]}])
    assert ds._shuffle and ds._seed == 3  # the shuffle carries over to the transformed rows
    spec = cloudpickle.loads(cloudpickle.dumps(plan_datasets({"train": ds}, DataConfig())))["train"]
    rows = list(spec.dataset.iter_rows())
    assert sorted(int(r["id"]) for r in rows) == sorted([i for i in range(1, 20, 2)] + [-i for i in range(1, 20, 2)])
    assert all(int(r["sq"]) == int(r["id"]) ** 2 for r in rows)
