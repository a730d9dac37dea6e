"""minitrain.worker.distributed.wait_for_every_rank over a real TCPStore, one thread per rank.

No rank may start its training function before every rank's process group is up (a rank that fails
at once would otherwise break a peer's gloo mesh still being built: tests/e2e/test_round_completion.py
caught it on CI). The threads only stand in for worker processes; each has its own store client.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest

from minitrain.worker.distributed import wait_for_every_rank

dist = pytest.importorskip("torch.distributed")


def _clients(world: int):
    server = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=timedelta(seconds=30), wait_for_workers=False)
    return server, [dist.TCPStore("127.0.0.1", server.port, is_master=False, timeout=timedelta(seconds=30))
                    for _ in range(world)]


def test_no_rank_returns_before_the_last_rank_arrives():
    world = 4
    server, clients = _clients(world)
    last_arrived = threading.Event()
    saw_last: dict[int, bool] = {}

    def rank(index):
        if index == world - 1:
            time.sleep(0.5)  # a late rank: the others have half a second to return early (they must not)
            last_arrived.set()
        wait_for_every_rank(clients[index], world, "k", timedelta(seconds=20))
        saw_last[index] = last_arrived.is_set()

    threads = [threading.Thread(target=rank, args=(i,)) for i in range(world)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert saw_last == {index: True for index in range(world)}
    del server


def test_a_rank_that_never_arrives_times_the_others_out_with_torchs_error():
    server, clients = _clients(2)
    started = time.monotonic()
    with pytest.raises(Exception, match="(?i)timeout|timed out"):
        wait_for_every_rank(clients[0], 2, "k", timedelta(seconds=1))
    assert time.monotonic() - started < 10
    del server


def test_keys_are_independent():
    """Each key counts its own arrivals: a barrier that every rank passed on one key does not release a
    barrier on another."""
    server, clients = _clients(2)
    passed = []
    threads = [threading.Thread(target=lambda client=client: passed.append(
        wait_for_every_rank(client, 2, "a", timedelta(seconds=20)))) for client in clients]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert passed == [None, None]  # both ranks passed "a"
    with pytest.raises(Exception, match="(?i)timeout|timed out"):  # rank 1 never arrives at "b"
        wait_for_every_rank(clients[0], 2, "b", timedelta(seconds=1))
    assert clients[0].add("a", 0) == 2 and clients[0].add("b", 0) == 1
    del server
