"""List columns stack as in Ray Data, `minitrain.data.range`, `Dataset.map_batches`, and
Ray's execution arguments (each works or raises). Tests marked "Ray:" are ported from Ray's own data
tests (python/ray/data/tests/test_map.py) by changing the imports."""

from __future__ import annotations

import os
import threading

import cloudpickle
import numpy as np
import pytest
from fsspec.implementations.local import LocalFileSystem

import minitrain.data as mdata
import minitrain.data as ray_data  # what a ported Ray test calls `ray.data`
from minitrain.config import DataConfig
from minitrain.data.sources import Staged
from minitrain.data.staging import StagingArea, plan_datasets
from minitrain.errors import ConfigError


def extract_values(column, rows):
    return [row[column] for row in rows]


# ---------------------------------------------------------------------------------- list columns stack


def test_the_torchtrainer_docstring_example_gives_B_by_1_tensors():
    torch = pytest.importorskip("torch")
    train_dataset = mdata.from_items([{"input": [x], "label": [2 * x + 1]} for x in range(200)])
    batch = next(iter(train_dataset.iter_torch_batches(batch_size=32, dtypes=torch.float)))
    assert batch["input"].shape == (32, 1) and batch["input"].dtype == torch.float32
    assert batch["label"][:3, 0].tolist() == [1.0, 3.0, 5.0]


def test_list_and_array_cells_stack_to_B_by_shape_numpy_arrays():
    ds = mdata.from_items([{"v": [i, i + 1, i + 2], "m": np.full((2, 2), i), "t": (i, -i)} for i in range(5)])
    for batch_format in ("default", "numpy"):
        batch = next(iter(ds.iter_batches(batch_size=4, batch_format=batch_format)))
        assert batch["v"].shape == (4, 3) and batch["v"][1].tolist() == [1, 2, 3]
        assert batch["m"].shape == (4, 2, 2) and batch["t"].shape == (4, 2)


def test_ragged_lists_are_object_arrays_and_refuse_to_become_one_tensor():
    torch = pytest.importorskip("torch")
    ds = mdata.from_items([{"tokens": list(range(n))} for n in (2, 2, 1, 3)])
    batch = next(iter(ds.iter_batches(batch_size=4)))
    assert batch["tokens"].dtype == object and batch["tokens"][3].tolist() == [0, 1, 2]
    with pytest.raises(RuntimeError, match="column 'tokens'.*collate_fn.*Numpy array of object dtype"):
        next(iter(ds.iter_torch_batches(batch_size=4)))
    # A batch whose cells happen to share a shape stacks, as Ray does.
    even = next(iter(ds.iter_torch_batches(batch_size=2, dtypes=torch.float32)))
    assert even["tokens"].shape == (2, 2)
    padded = next(iter(ds.iter_torch_batches(
        batch_size=4, collate_fn=lambda b: torch.nn.utils.rnn.pad_sequence(
            [torch.as_tensor(t) for t in b["tokens"]], batch_first=True))))
    assert padded.shape == (4, 3)


# ---------------------------------------------------------------------------------- range


def test_range_has_an_int64_id_column_and_blocks():
    ds = mdata.range(10)
    assert ds.columns() == ["id"] and ds.count() == 10 and ds.num_blocks() == 1
    assert ds.take(3) == [{"id": 0}, {"id": 1}, {"id": 2}]
    assert next(iter(ds.iter_batches(batch_size=None)))["id"].dtype == np.int64
    assert mdata.range(10, override_num_blocks=4).num_blocks() == 4
    assert mdata.range(10, parallelism=3).num_blocks() == 3
    assert mdata.range(10, parallelism=-1, concurrency=2).num_blocks() == 1
    assert mdata.range(0).count() == 0
    with pytest.raises(ConfigError, match="override_num_blocks=0 must be an int >= 1"):
        mdata.range(10, override_num_blocks=0)
    with pytest.raises(ValueError, match="non-negative"):
        mdata.range(-1)


# ---------------------------------------------------------------------------------- map_batches (Ray's tests)


@pytest.fixture
def parquet_dir(tmp_path):
    pd = pytest.importorskip("pandas")
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    df = pd.DataFrame({"one": [1, 2, 3], "two": [2, 3, 4]})
    pq.write_table(pa.Table.from_pandas(df), os.path.join(tmp_path, "test1.parquet"))
    return str(tmp_path)


def test_map_batches_basic(parquet_dir):  # Ray: test_map.py::test_map_batches_basic (pyarrow format aside)
    ds = ray_data.range(5)
    with pytest.raises(ValueError):
        ds.map_batches(lambda x: x, batch_size=-1).take()

    ds = ray_data.read_parquet(parquet_dir)
    ds_list = ds.map_batches(lambda df: df + 1, batch_size=1, batch_format="pandas").take()
    assert [s["one"] for s in ds_list] == [2, 3, 4]
    assert [s["two"] for s in ds_list] == [3, 4, 5]

    size = 300
    ds = ray_data.range(size)
    ds_list = ds.map_batches(lambda df: df + 1, batch_size=17, batch_format="pandas").take_all()
    for i in range(size):
        assert ds_list[i]["id"] == i + 1
    assert ds.count() == 300

    ds = ray_data.read_parquet(parquet_dir)
    assert extract_values("id", ds.map_batches(lambda df: {"id": np.array([1])}, batch_size=1).take()) == [1, 1, 1]

    with pytest.raises(ValueError):
        ds.map_batches(lambda df: 1, batch_size=2).take()


def test_map_batches_extra_args(parquet_dir):  # Ray: test_map.py::test_map_batches_extra_args
    ds = ray_data.range(5)
    with pytest.raises(ValueError):
        ds.map_batches(lambda x: x, fn_constructor_args=(1,), fn_constructor_kwargs={"a": 1})

    def udf(batch, a, b=None):
        assert a == 1 and b == 2
        return b * batch + a

    ds2 = ray_data.read_parquet(parquet_dir).map_batches(udf, batch_size=1, batch_format="pandas",
                                                          fn_args=(1,), fn_kwargs={"b": 2})
    assert sorted(s["one"] for s in ds2.take()) == [3, 5, 7]

    class CallableFn:
        def __init__(self, a, b=None):
            assert a == 1 and b == 2
            self.a, self.b = a, b

        def __call__(self, x):
            return self.b * x + self.a

    chained = ray_data.read_parquet(parquet_dir).map_batches(
        lambda df, a, b=None: b * df + a, batch_size=1, batch_format="pandas", fn_args=(1,), fn_kwargs={"b": 2},
    ).map_batches(CallableFn, concurrency=1, batch_size=1, batch_format="pandas", fn_constructor_args=(1,),
                  fn_constructor_kwargs={"b": 2})
    assert sorted(s["one"] for s in chained.take()) == [7, 11, 15]
    assert sorted(s["two"] for s in chained.take()) == [11, 15, 19]


def test_map_batches_generator(parquet_dir):  # Ray: test_map.py::test_map_batches_generator
    def pandas_generator(batch):
        for i in range(len(batch)):
            yield batch.iloc[[i]] + 1

    ds2 = ray_data.read_parquet(parquet_dir).map_batches(pandas_generator, batch_size=1, batch_format="pandas")
    assert sorted(s["one"] for s in ds2.take()) == [2, 3, 4]

    def fail_generator(batch):
        for i in range(len(batch)):
            yield i

    with pytest.raises(ValueError):
        ray_data.read_parquet(parquet_dir).map_batches(fail_generator, batch_size=2).take()


def test_map_batches_actors_preserves_order():  # Ray: test_map.py::test_map_batches_actors_preserves_order
    class UDFClass:
        def __call__(self, x):
            return x

    ds = ray_data.range(10, override_num_blocks=5)
    assert extract_values("id", ds.map_batches(UDFClass, concurrency=1).take()) == list(range(10))


@pytest.mark.parametrize("num_rows,num_blocks,batch_size", [(10, 5, 2), (10, 1, 10), (12, 3, 2)])
def test_map_batches_batch_mutation_and_zero_copy(num_rows, num_blocks, batch_size):
    # Ray: test_map.py::test_map_batches_batch_mutation / _zero_copy (without repartition)
    def mutate(batch):
        batch["id"] += 1
        return batch

    ds = ray_data.range(num_rows, override_num_blocks=num_blocks)
    mutated = ds.map_batches(mutate, batch_size=batch_size, zero_copy_batch=False)
    assert [row["id"] for row in mutated.iter_rows()] == list(range(1, num_rows + 1))
    with pytest.raises(ValueError, match="read-only"):
        ds.map_batches(mutate, batch_size=batch_size, zero_copy_batch=True).materialize()


# ---------------------------------------------------------------------------------- map_batches semantics


def test_batches_never_span_blocks_and_none_means_whole_blocks():
    seen = []

    def record(batch):
        seen.append(batch["id"].tolist())
        return batch

    mdata.range(10, override_num_blocks=3).map_batches(record).count()
    assert seen == [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9]]
    seen.clear()
    mdata.range(10, override_num_blocks=2).map_batches(record, batch_size=3).count()
    assert seen == [[0, 1, 2], [3, 4], [5, 6, 7], [8, 9]]


def test_concurrency_runs_batches_on_threads_with_one_instance_each():
    instances, threads = [], set()
    lock = threading.Lock()
    started = threading.Barrier(2, timeout=60)

    class Tag:
        def __init__(self):
            with lock:
                instances.append(self)

        def __call__(self, batch):
            threads.add(threading.get_ident())
            if len(batch["id"]) and batch["id"][0] < 2:
                started.wait()  # the first two batches can only pass when they run at the same time
            return {"id": batch["id"], "tag": np.full(len(batch["id"]), id(self))}

    rows = mdata.range(8).map_batches(Tag, batch_size=1, concurrency=(1, 2)).take_all()
    assert [int(r["id"]) for r in rows] == list(range(8))  # order kept
    assert len(instances) == 2 and len(threads) == 2


def test_map_batches_follows_a_shuffle_and_reaches_workers_staged(tmp_path):
    big = mdata.from_numpy(np.arange(600_000, dtype=np.int64))  # 4.8 MB: staged, not inlined
    mapped = big.random_shuffle(seed=3).map_batches(lambda b: {"double": b["data"] * 2}, batch_size=100_000)
    specs = plan_datasets({"train": mapped}, DataConfig(), num_workers=2,
                          staging=lambda: StagingArea(LocalFileSystem(), str(tmp_path / "stage")))
    shipped = cloudpickle.loads(cloudpickle.dumps(specs["train"].dataset))
    assert isinstance(shipped.source.parent.source, Staged)
    rows = [int(r["double"]) for r in shipped.iter_rows()]
    assert sorted(rows) == list(range(0, 1_200_000, 2)) and rows[:5] != [0, 2, 4, 6, 8]  # shuffled


@pytest.mark.parametrize("name,value", [("num_cpus", 1), ("num_gpus", 1), ("memory", 10), ("compute", "actors"),
                                        ("ray_remote_args_fn", lambda: {}), ("scheduling_strategy", "SPREAD")])
def test_map_batches_refuses_ray_task_options(name, value):
    expected = TypeError if name == "scheduling_strategy" else ConfigError
    with pytest.raises(expected, match=name):
        mdata.range(3).map_batches(lambda b: b, **{name: value})
    if expected is ConfigError:  # the default is accepted
        assert mdata.range(3).map_batches(lambda b: b, **{name: None}).count() == 3


# ---------------------------------------------------------------------------------- execution arguments


def _csvs(tmp_path):
    for i in range(3):
        (tmp_path / f"part{i}.csv").write_text(f"x\n{i}\n")
    return str(tmp_path)


@pytest.mark.parametrize("name,value", [("ray_remote_args", {"num_cpus": 2}), ("num_cpus", 2), ("num_gpus", 1),
                                        ("memory", 1), ("meta_provider", object()), ("partitioning", object()),
                                        ("arrow_open_stream_args", {"buffer_size": 1}), ("local_read", True)])
def test_readers_refuse_ray_arguments_they_cannot_honour(tmp_path, name, value):
    path = _csvs(tmp_path)
    with pytest.raises(ConfigError, match=f"read_csv.*{name}=.*cannot be honoured.*Remove {name}="):
        mdata.read_csv(path, **{name: value})
    default = {"local_read": False}.get(name)
    assert mdata.read_csv(path, **{name: default}).count() == 3


def test_readers_honour_blocks_concurrency_filters_and_missing_paths(tmp_path):
    path = _csvs(tmp_path)
    assert mdata.read_csv(path, parallelism=-1).num_blocks() == 1
    assert mdata.read_csv(path, override_num_blocks=2).num_blocks() == 2
    assert sorted(int(r["x"]) for r in mdata.read_csv(path, concurrency=3).iter_rows()) == [0, 1, 2]
    only_first = mdata.read_csv(path, partition_filter=lambda paths: [p for p in paths if "part0" in p])
    assert [int(r["x"]) for r in only_first.iter_rows()] == [0]
    with pytest.raises(FileNotFoundError):
        mdata.read_csv([path, str(tmp_path / "missing.csv")])
    assert mdata.read_csv([path, str(tmp_path / "missing.csv")], ignore_missing_paths=True).count() == 3
    shuffled = mdata.read_csv(path, shuffle="files")
    assert sorted(shuffled.source.paths) == sorted(mdata.read_csv(path).source.paths)
    with pytest.raises(ConfigError, match="shuffle='rows' must be None or 'files'"):
        mdata.read_csv(path, shuffle="rows")


def test_constructors_take_only_ray_arguments_they_honour():
    assert mdata.from_items([1, 2, 3], override_num_blocks=2).num_blocks() == 2
    assert mdata.from_items([1, 2, 3], parallelism=-1).num_blocks() == 1
    with pytest.raises(TypeError):
        mdata.from_items([1], ray_remote_args={})
    with pytest.raises(ConfigError, match="local_read=True cannot be honoured"):
        mdata.from_torch([1, 2], local_read=True)
    assert mdata.range(6).random_shuffle(seed=1, num_blocks=3).num_blocks() == 3
    with pytest.raises(ConfigError, match="num_cpus=2 cannot be honoured"):
        mdata.range(6).random_shuffle(num_cpus=2)
