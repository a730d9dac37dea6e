"""minitrain.collective's protocol over a real torch.distributed TCPStore, one thread per rank.

Each "rank" gets its own client connection to one TCPStore server, as each worker does; the threads
only stand in for processes. The end-to-end test, tests/e2e/test_collective.py, runs it in workers.
"""

from __future__ import annotations

import pickle
import threading
import time
from datetime import timedelta

import pytest

import minitrain
from minitrain.collective import BroadcastCollectiveTimeoutError, CollectiveTimeoutError, StoreGroup

dist = pytest.importorskip("torch.distributed")

SECRET = b"s" * 32
NAMESPACE = "minitrain/collective/test/0"


@pytest.fixture
def store_server():
    server = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=timedelta(seconds=30), wait_for_workers=False)
    yield server


def _groups(server, world: int, **kwargs) -> list[StoreGroup]:
    return [StoreGroup(dist.TCPStore("127.0.0.1", server.port, is_master=False, timeout=timedelta(seconds=30)),
                       rank, world, NAMESPACE, SECRET, **kwargs) for rank in range(world)]


def _on_every_rank(groups, fn, ranks=None) -> dict[int, object]:
    """Run fn(group) on a thread per rank; return {rank: result or exception}."""
    results: dict[int, object] = {}

    def run(rank):
        try:
            results[rank] = fn(groups[rank])
        except BaseException as exc:  # noqa: BLE001 - handed back to the test
            results[rank] = exc

    threads = [threading.Thread(target=run, args=(rank,)) for rank in (ranks or range(len(groups)))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
        assert not thread.is_alive(), "a collective did not return"
    return results


def test_barrier_and_broadcast_in_sequence(store_server):
    groups = _groups(store_server, 3)

    def steps(group):
        group.barrier(timeout_s=10)
        first = group.broadcast(pickle.dumps(("from", group.rank)), timeout_s=10)
        group.barrier(timeout_s=10)
        second = group.broadcast(pickle.dumps(group.rank * 100), timeout_s=10)
        return pickle.loads(first), pickle.loads(second)

    results = _on_every_rank(groups, steps)
    assert results == {rank: (("from", 0), 0) for rank in range(3)}


def test_barrier_waits_for_the_last_rank(store_server):
    groups = _groups(store_server, 2)
    waiter = threading.Thread(target=groups[0].barrier, kwargs={"timeout_s": 20})
    waiter.start()
    arrival = f"{NAMESPACE}/0/barrier/0"
    deadline = time.monotonic() + 10
    while not store_server.check([arrival]) and time.monotonic() < deadline:
        time.sleep(0.005)
    assert store_server.check([arrival])  # rank 0 has arrived and waits
    assert waiter.is_alive()  # and cannot leave: rank 1 has not arrived
    groups[1].barrier(timeout_s=10)
    waiter.join(10)
    assert not waiter.is_alive()


def test_a_timeout_names_the_missing_ranks(store_server):
    groups = _groups(store_server, 3)
    started = time.monotonic()
    results = _on_every_rank(groups, lambda g: g.barrier(timeout_s=0.3), ranks=[0, 2])
    assert time.monotonic() - started < 5
    for rank in (0, 2):
        error = results[rank]
        assert isinstance(error, CollectiveTimeoutError) and isinstance(error, TimeoutError)
        assert error.missing_ranks == (1,) and error.operation == "barrier"
        assert f"timed out after 0.3 s on rank {rank}: rank(s) [1] did not call it" in str(error)
    # The late rank still finds the others' arrivals: the group is consistent if it makes the call.
    assert groups[1].barrier(timeout_s=5) is None


def test_broadcast_timeout_on_a_waiting_rank_names_rank_zero(store_server):
    groups = _groups(store_server, 2)
    with pytest.raises(BroadcastCollectiveTimeoutError) as caught:
        groups[1].broadcast(b"", timeout_s=0.2)
    assert caught.value.missing_ranks == (0,) and caught.value.operation == "broadcast_from_rank_zero"


def test_waiting_without_a_limit_logs_the_missing_ranks(store_server, caplog):
    groups = _groups(store_server, 2, warn_interval_s=0.1)
    done = threading.Event()
    thread = threading.Thread(target=lambda: (groups[0].barrier(), done.set()))
    with caplog.at_level("WARNING", logger="minitrain"):
        thread.start()
        deadline = time.monotonic() + 10
        while "has waited" not in caplog.text and time.monotonic() < deadline:
            time.sleep(0.02)
        groups[1].barrier(timeout_s=5)
        assert done.wait(10)
    thread.join(5)
    assert "minitrain.collective.barrier(): rank 0 has waited" in caplog.text and "rank(s) [1]" in caplog.text


def test_keys_of_finished_collectives_are_deleted(store_server):
    groups = _groups(store_server, 2)
    _on_every_rank(groups, lambda g: g.broadcast(b"payload", timeout_s=10))
    old = [f"{NAMESPACE}/0/broadcast_from_rank_zero/{rank}" for rank in range(2)] + [f"{NAMESPACE}/0/data"]
    assert all(store_server.check([key]) for key in old)
    _on_every_rank(groups, lambda g: g.barrier(timeout_s=10))
    assert not any(store_server.check([key]) for key in old)


def test_tampered_broadcast_data_is_refused_before_unpickling(store_server):
    groups = _groups(store_server, 2)
    forged = b"\0" * 32 + pickle.dumps("evil")
    store_server.set(f"{NAMESPACE}/0/data", forged)
    store_server.set(f"{NAMESPACE}/0/broadcast_from_rank_zero/0", b"1")  # pose as rank 0's arrival
    with pytest.raises(RuntimeError, match="failed authentication"):
        groups[1].broadcast(b"", timeout_s=5)


def test_timeout_error_survives_pickling():
    error = CollectiveTimeoutError("late", (1, 3), "barrier")
    clone = pickle.loads(pickle.dumps(error))
    assert str(clone) == "late" and clone.missing_ranks == (1, 3) and clone.operation == "barrier"


def test_public_functions_outside_training_and_bad_timeouts():
    import minitrain.collective as collective

    with pytest.raises(RuntimeError, match="collective.barrier"):
        collective.barrier()
    for bad in (0, -1, "1", True):
        with pytest.raises(ValueError, match="timeout_s"):
            collective.barrier(timeout_s=bad)
    assert minitrain.collective is collective  # reachable as an attribute, like minitrain.torch
