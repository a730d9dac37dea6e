"""What keeps the coordinator responsive with thousands of workers (see README, "Control-plane scale"):
round bookkeeping that does not rescan the ranks at every report, commands handed to the server loop
in batches (in order), and the GC threshold raised only while a server runs."""

from __future__ import annotations

import asyncio
import gc
import threading

from minitrain.coordinator import server as server_module
from minitrain.coordinator.rounds import RoundTracker
from minitrain.coordinator.service import Hub


def test_a_late_rank_does_not_make_every_report_rescan_the_ranks(monkeypatch):
    world = 256
    rounds = RoundTracker(world)
    scans = []
    original = RoundTracker._has_answered
    monkeypatch.setattr(RoundTracker, "_has_answered",
                        lambda self, *args: scans.append(args) or original(self, *args))
    for rank in range(world - 1):  # every rank but the last reports rounds 0 and 1: round 0 waits
        assert rounds.add(rank, 0, {}, "") == []
    for rank in range(world - 1):
        assert rounds.add(rank, 1, {}, "") == []
    assert [d.round for d in rounds.add(world - 1, 0, {}, "")] == [0]
    assert [d.round for d in rounds.add(world - 1, 1, {}, "")] == [1]
    assert scans == []  # no rank finished: completion is a count, not a scan


def test_hub_delivers_every_command_in_order_across_threads():
    loop = asyncio.new_event_loop()
    hub, outboxes, senders = Hub(), {}, 4
    ready = threading.Event()

    def serve():
        asyncio.set_event_loop(loop)
        hub.bind_loop(loop)
        for rank in range(senders):
            outboxes[rank] = asyncio.Queue()
            hub.register_worker(0, rank, outboxes[rank])
        loop.call_soon(ready.set)
        loop.run_forever()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    ready.wait(10)

    def send(rank):
        for i in range(2000):
            assert hub.send_to_worker(0, rank, (rank, i))

    threads = [threading.Thread(target=send, args=(rank,)) for rank in range(senders)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    drained = asyncio.run_coroutine_threadsafe(_drain(outboxes, 2000), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)
    loop.close()
    assert drained == {rank: [(rank, i) for i in range(2000)] for rank in range(senders)}
    assert not hub.send_to_worker(0, 0, "late")  # the loop is closed: nothing is queued


async def _drain(outboxes, count):
    return {rank: [await queue.get() for _ in range(count)] for rank, queue in outboxes.items()}


def test_gc_threshold_is_raised_while_serving_and_restored_after():
    before = gc.get_threshold()
    try:
        gc.set_threshold(700, 10, 10)
        guard = server_module._GcThreshold()
        guard.raise_()
        assert gc.get_threshold() == (server_module.GC_YOUNG_THRESHOLD, 10, 10)
        guard.restore()
        guard.restore()  # idempotent
        assert gc.get_threshold() == (700, 10, 10)
        gc.set_threshold(50_000, 10, 10)  # an application that raised it further is left alone
        guard.raise_()
        assert gc.get_threshold() == (50_000, 10, 10)
        guard.restore()
        assert gc.get_threshold() == (50_000, 10, 10)
    finally:
        gc.set_threshold(*before)
