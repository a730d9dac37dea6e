"""`prefetch_batches` of `DataIterator.iter_batches` / `iter_torch_batches` / `iter_rows` builds batches
ahead on a background thread, and the other iterator arguments either work or raise (none is accepted
then ignored). The prefetched batches are exactly the unprefetched ones, producer
errors reach the consumer where they would have, no thread outlives its pass, and the data wait
counted for telemetry is the time the consumer is blocked."""

from __future__ import annotations

import gc
import threading
import time
import warnings
from types import SimpleNamespace

import numpy as np
import pytest

import minitrain.data as mdata
from minitrain import waits
from minitrain.data.iterator import DataIterator
from minitrain.data.prefetch import Prefetcher, prefetched
from minitrain.data.tables import RowTable

torch = pytest.importorskip("torch")

DEADLINE_S = 30.0


def _prefetch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("minitrain-prefetch")]


def _wait_until(condition, what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


@pytest.fixture(autouse=True)
def _no_thread_left_behind(monkeypatch):
    monkeypatch.setattr(waits, "ENABLED", True)
    waits.reset()
    yield
    gc.collect()
    assert _prefetch_threads() == []
    waits.reset()


def _as_lists(batch):
    if isinstance(batch, dict):
        return {k: (v.tolist() if hasattr(v, "tolist") else v) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return [_as_lists(v) for v in batch]
    return batch.tolist() if hasattr(batch, "tolist") else batch


def _world(dataset, world: int) -> list[DataIterator]:
    return [DataIterator(dataset, world_size=world, rank=rank, run_seed=3) for rank in range(world)]


# ------------------------------------------------------------------ same batches, same order


@pytest.mark.parametrize("columnar", [True, False])
def test_prefetched_batches_equal_unprefetched_ones_across_shards_epochs_and_local_shuffle(columnar):
    items = [{"x": i, "y": [i, -i]} for i in range(203)] if columnar else [(i, float(i) / 2) for i in range(203)]
    dataset = mdata.from_items(items).random_shuffle(seed=7)
    kwargs = dict(batch_size=16, drop_last=True, local_shuffle_buffer_size=40, local_shuffle_seed=11)
    seen = {}
    for prefetch in (0, 1, 3, 50):
        passes = []
        for shard in _world(dataset, 2):
            numpy_batches = shard.iter_batches(prefetch_batches=prefetch, **kwargs)
            torch_batches = shard.iter_torch_batches(prefetch_batches=prefetch, device=None, **kwargs)
            for _epoch in range(2):  # one iterable, a pass per iter(): each a new epoch
                passes.append([_as_lists(b) for b in numpy_batches])
                passes.append([_as_lists(b) for b in torch_batches])
            passes.append([_as_lists(row) for row in shard.iter_rows(prefetch_batches=prefetch)])
        seen[prefetch] = passes
    assert all(passes for passes in seen[0])
    assert seen[1] == seen[0] and seen[3] == seen[0] and seen[50] == seen[0]
    first_epoch, second_epoch = seen[0][0], seen[0][2]
    assert first_epoch != second_epoch  # the comparison covers real shuffles, not one fixed order


def test_iter_rows_prefetches_in_chunks_and_keeps_every_row_in_order():
    dataset = mdata.range(1000)
    shard = DataIterator(dataset)
    assert [row["id"] for row in shard.iter_rows(prefetch_batches=2)] == list(range(1000))
    assert [row["id"] for row in shard.iter_rows(prefetch_batches=0)] == list(range(1000))


def test_batches_are_built_on_the_prefetch_thread_and_on_the_caller_without_prefetch():
    built_on = []

    def collate(batch):
        built_on.append(threading.current_thread())
        return batch["id"]

    dataset = mdata.range(40)
    list(dataset.iter_torch_batches(batch_size=10, collate_fn=collate, prefetch_batches=2))
    assert len(built_on) == 4 and all(t.name.startswith("minitrain-prefetch") for t in built_on)
    built_on.clear()
    list(dataset.iter_torch_batches(batch_size=10, collate_fn=collate, prefetch_batches=0))
    assert built_on == [threading.current_thread()] * 4


@pytest.mark.parametrize("depth", [1, 3])
def test_the_producer_stays_at_most_depth_items_ahead(depth):
    produced = []

    def source():
        for i in range(20):
            produced.append(i)
            yield i

    items = Prefetcher(source(), depth)
    assert next(items) == 0
    _wait_until(lambda: items.ready() == depth, f"{depth} items ready")
    time.sleep(0.2)  # a producer ignoring the bound would build more meanwhile
    assert len(produced) == 1 + depth and items.ready() == depth
    assert next(items) == 1
    _wait_until(lambda: items.ready() == depth, "the freed slot refilled")
    assert len(produced) == 2 + depth
    assert list(items) == list(range(2, 20))


# ------------------------------------------------------------------ errors reach the consumer in place


@pytest.mark.parametrize("prefetch", [0, 1, 4])
def test_a_producer_error_is_raised_after_the_batches_before_it(prefetch):
    def collate(batch):
        if batch["id"][0] == 30:
            raise KeyError("bad row 30")
        return batch["id"].tolist()

    got = []
    with pytest.raises(KeyError, match="bad row 30"):
        for batch in mdata.range(100).iter_torch_batches(batch_size=10, collate_fn=collate,
                                                          prefetch_batches=prefetch):
            got.append(batch[0])
    assert got == [0, 10, 20]
    assert _prefetch_threads() == []


def test_errors_of_the_conversion_itself_come_through_the_prefetch_thread():
    dataset = mdata.from_items([{"name": f"n{i}"} for i in range(5)])
    with pytest.raises(TypeError, match="column 'name'"):
        list(dataset.iter_torch_batches(batch_size=2, prefetch_batches=2, device=None))


# ------------------------------------------------------------------ no thread left behind


def test_break_stops_and_joins_the_prefetch_thread():
    for batch in mdata.range(10_000).iter_batches(batch_size=10, prefetch_batches=4):
        assert _prefetch_threads()  # running while the pass is open
        break
    assert _prefetch_threads() == []  # joined at the break, not eventually


def test_a_garbage_collected_pass_stops_its_thread_started_or_not():
    batches = mdata.range(10_000).iter_batches(batch_size=10, prefetch_batches=2)
    started = iter(batches)
    next(started)
    never_started = iter(batches)
    assert len(_prefetch_threads()) == 2
    del started, never_started
    gc.collect()
    assert _prefetch_threads() == []


def test_an_exception_in_the_loop_body_stops_the_thread():
    with pytest.raises(RuntimeError, match="training step failed"):
        for _batch in mdata.range(10_000).iter_torch_batches(batch_size=10, prefetch_batches=3, device=None):
            raise RuntimeError("training step failed")
    gc.collect()
    assert _prefetch_threads() == []


def test_closing_stops_a_producer_blocked_for_room_and_closes_the_source_on_its_thread():
    closed_on = []

    def source():
        try:
            yield from range(1000)
        finally:
            closed_on.append(threading.current_thread().name)

    items = prefetched(source(), 2, name="t")
    assert next(items) == 0
    _wait_until(lambda: items.ready() == 2, "the buffer to fill")
    items.close()
    assert closed_on == ["minitrain-prefetch-t"] and _prefetch_threads() == []
    assert list(items) == []  # a closed iterator is exhausted
    assert prefetched(iter([1]), 0).__class__ is not Prefetcher  # 0: the source itself, no thread


# ------------------------------------------------------------------ data wait = time blocked on the queue


def test_the_data_wait_is_the_time_blocked_on_the_queue():
    gate, entered = threading.Event(), threading.Event()
    released_at = []

    def collate(batch):
        if batch["id"][0] == 10:  # the second batch waits for the gate (a slow reader)
            entered.set()
            assert gate.wait(DEADLINE_S)
        return batch["id"]

    def release_later():
        entered.wait(DEADLINE_S)
        time.sleep(0.3)
        released_at.append(time.perf_counter())
        gate.set()

    batches = iter(mdata.range(30).iter_torch_batches(batch_size=10, collate_fn=collate, prefetch_batches=1))
    assert next(batches)[0] == 0
    before = waits.totals().data_s
    helper = threading.Thread(target=release_later)
    helper.start()
    called_at = time.perf_counter()
    assert next(batches)[0] == 10
    helper.join()
    blocked = waits.totals().data_s - before
    assert blocked >= released_at[0] - called_at - 0.01  # blocked until the producer delivered
    assert [b[0] for b in batches] == [20]


def test_time_spent_building_ahead_is_not_data_wait():
    def slow_source():
        yield 0
        time.sleep(0.5)  # building the next batch while the consumer trains
        yield 1

    items = Prefetcher(slow_source(), 1)
    timed = waits.timed_iterator(items)
    assert next(timed) == 0
    _wait_until(lambda: items.ready() == 1, "the slow batch to be built")
    before = waits.totals().data_s
    assert next(timed) == 1
    assert waits.totals().data_s - before < 0.5  # the batch was ready: no wait for its 0.5 s build
    assert list(timed) == []


# ------------------------------------------------------------------ arguments: work or raise


@pytest.mark.parametrize("value", [-1, True, 1.5, "2", None])
def test_prefetch_batches_must_be_a_non_negative_int(value):
    shard = DataIterator(mdata.range(4))
    for call in (shard.iter_batches, shard.iter_torch_batches, shard.iter_rows):
        with pytest.raises(ValueError, match="prefetch_batches="):
            call(prefetch_batches=value)


def test_prefetch_blocks_is_refused_as_ray_does():
    shard = DataIterator(mdata.range(4))
    with pytest.raises(ValueError, match="prefetch_blocks=2 is deprecated.*use prefetch_batches"):
        shard.iter_rows(prefetch_blocks=2)
    assert [r["id"] for r in shard.iter_rows(prefetch_blocks=0)] == [0, 1, 2, 3]  # the default: no block prefetch
    for call in (shard.iter_batches, shard.iter_torch_batches):  # removed from Ray's batch APIs in 2.10
        with pytest.raises(TypeError, match="prefetch_blocks"):
            call(prefetch_blocks=1)


def test_pin_memory_with_collate_fn_is_refused_as_in_ray():
    with pytest.raises(ValueError, match="pin_memory is only supported when using `DefaultCollateFn`"):
        mdata.range(4).iter_torch_batches(collate_fn=lambda b: b, pin_memory=True)


def test_pin_memory_pins_or_says_why_it_cannot():
    dataset = mdata.range(8)
    if torch.cuda.is_available():
        batch = next(iter(dataset.iter_torch_batches(batch_size=4, device="cpu", pin_memory=True)))
        assert batch["id"].is_pinned()
        return
    with pytest.warns(UserWarning, match="pin_memory=True.*no CUDA device"):
        batches = dataset.iter_torch_batches(batch_size=4, pin_memory=True)
    assert [b["id"].tolist() for b in batches] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dataset.iter_torch_batches(batch_size=4)  # no warning without pin_memory


def test_dtypes_must_be_torch_dtypes_naming_existing_columns():
    dataset = mdata.from_items([{"a": i, "b": float(i)} for i in range(6)])
    with pytest.raises(ValueError, match="dtypes='float32' must be a torch.dtype"):
        dataset.iter_torch_batches(dtypes="float32")
    with pytest.raises(ValueError, match=r"values for \['b'\] are not torch dtypes"):
        dataset.iter_torch_batches(dtypes={"a": torch.float64, "b": np.float32})
    with pytest.raises(ValueError, match=r"dtypes names \['c'\].*their columns: \['a', 'b'\]"):
        list(dataset.iter_torch_batches(batch_size=3, dtypes={"a": torch.float64, "c": torch.int8}))
    batch = next(iter(dataset.iter_torch_batches(batch_size=3, dtypes={"a": torch.float64})))
    assert batch["a"].dtype == torch.float64 and batch["b"].dtype == torch.float64  # b: numpy float64 as is
    tuples = RowTable([(float(i), i) for i in range(4)])  # a row table without a wrap key: tuple batches
    rows = DataIterator(SimpleNamespace(_resolve=lambda: (tuples, False, None)))
    with pytest.raises(ValueError, match="batches are not dicts"):
        list(rows.iter_torch_batches(batch_size=2, dtypes={"x": torch.float32}))


def test_collate_fn_must_be_callable_and_device_is_checked_when_called():
    dataset = mdata.range(4)
    with pytest.raises(ValueError, match="collate_fn=3 is not callable"):
        dataset.iter_torch_batches(collate_fn=3)
    with pytest.raises(RuntimeError):
        dataset.iter_torch_batches(device="not-a-device")


def test_drop_last_needs_a_batch_size_and_the_shuffle_seed_must_be_an_int():
    shard = DataIterator(mdata.range(10))
    with pytest.raises(ValueError, match="drop_last=True needs a batch_size"):
        shard.iter_batches(batch_size=None, drop_last=True)
    with pytest.raises(ValueError, match="local_shuffle_seed='7' must be an int"):
        shard.iter_batches(local_shuffle_buffer_size=4, local_shuffle_seed="7")
    # A seed without a buffer: Ray accepts it and the order is deterministic anyway.
    assert next(iter(shard.iter_batches(batch_size=None, local_shuffle_seed=7)))["id"].tolist() == list(range(10))
