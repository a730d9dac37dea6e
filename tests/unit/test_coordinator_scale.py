"""What keeps the coordinator responsive with thousands of workers (see README, "Control-plane scale"):
round bookkeeping that does not rescan the ranks at every report, commands handed to the server loop
in batches (in order), the GC threshold raised only while a server runs, and a straggler rule
that does not compare every rank with every other at every telemetry sample."""

from __future__ import annotations

import asyncio
import gc
import statistics
import threading

from hypothesis import given, settings
from hypothesis import strategies as st

from minitrain.coordinator import server as server_module
from minitrain.coordinator.rounds import RoundTracker
from minitrain.coordinator.monitor import (
    MAX_SAMPLES, MIN_SAMPLES_PER_RANK, SAMPLES_PER_RANK, RunMonitor, samples_per_rank,
)
from minitrain.coordinator.observers import AttemptInfo, RunInfo, TelemetrySample
from minitrain.coordinator.service import Hub
from minitrain.coordinator.stragglers import (
    MIN_WORK_S, StragglerDetector, StragglerRule, _median_known,
)


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


# ---------------------------------------------------------------- stragglers at scale

def _reference_evaluate(detector, flagged_before, now):
    """The rule as the module doc states it, computed the slow way (every rank against the median of
    every other rank's median): what StragglerDetector.evaluate must agree with."""
    rule = detector.rule
    ready = {r: statistics.median(s) for r, s in detector._steps.items() if len(s) >= rule.min_samples}
    current = {}
    if len(ready) >= 2:
        for rank, median in ready.items():
            others = max(statistics.median(m for r, m in ready.items() if r != rank), MIN_WORK_S)
            if median < rule.factor * others:
                continue
            own = _median_known(detector._data[rank])
            cause = "compute"
            if own is not None:
                known = [w for w in (_median_known(detector._data[r]) for r in ready if r != rank) if w is not None]
                baseline = statistics.median(known) if known else 0.0
                cause = "data wait" if own - baseline >= rule.data_share * (median - others) else "compute"
            previous = flagged_before.get(rank)
            current[rank] = (median / others, median, others, cause, previous.since if previous else now)
    return current


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 9), st.sampled_from([0.05, 0.1, 0.1, 0.1, 0.2, 0.5, 0.0]),
                          st.sampled_from([None, 0.0, 0.01, 0.3]), st.sampled_from([None, 0.0, 0.05])),
                min_size=1, max_size=120),
       st.integers(1, 6))
def test_the_fast_straggler_rule_agrees_with_the_rule_computed_rank_by_rank(samples, min_samples):
    detector = StragglerDetector(StragglerRule(window=6, min_samples=min_samples))
    for t, (rank, step, data, report_wait) in enumerate(samples):
        detector.add(rank, f"host{rank}", step, data, report_wait)
        flagged_before = detector.flagged
        expected = _reference_evaluate(detector, flagged_before, float(t))
        started, cleared = detector.evaluate(float(t))
        got = {r: (s.slower_by, s.step_time_s, s.median_step_time_s, s.cause, s.since)
               for r, s in detector.flagged.items()}
        assert got == expected
        assert [s.rank for s in started] == sorted(set(expected) - set(flagged_before))
        assert [s.rank for s in cleared] == sorted(set(flagged_before) - set(expected))


def test_judging_thousands_of_ranks_takes_no_median_over_all_of_them(monkeypatch):
    """The rule is applied at every telemetry sample (one a second per rank). Computed rank by rank
    it cost O(ranks^2 log ranks) per sample: seconds of the controller's thread per sample at 4096 ranks."""
    ranks = 4096
    detector = StragglerDetector(StragglerRule(window=5, min_samples=5))
    for i in range(5):
        for rank in range(ranks):
            detector.add(rank, "h", 0.1 + rank * 1e-6 + (0.3 if rank == 7 else 0.0), 0.01)
    sizes = []
    original = statistics.median
    monkeypatch.setattr(statistics, "median", lambda data: sizes.append(len(list(data))) or 0.0)
    started, _ = detector.evaluate(1.0)
    monkeypatch.setattr(statistics, "median", original)
    assert [s.rank for s in started] == [7]
    assert sizes == []  # the medians come from the sorted order, not from rescanning the ranks


def test_the_monitor_keeps_a_bounded_history_in_all_however_many_ranks():
    """2000 samples a rank (0.7 KiB each) would hold 5.6 GiB at 4096 ranks after half an hour."""
    assert samples_per_rank(8) == SAMPLES_PER_RANK
    assert samples_per_rank(4096) * 4096 <= MAX_SAMPLES
    assert samples_per_rank(1_000_000) == MIN_SAMPLES_PER_RANK
    monitor = RunMonitor(storage=None)
    monitor.on_run_start(RunInfo("run", "exp", "/tmp/x", 4096, 0.0, request_stacks=lambda rank: None))
    monitor.on_attempt_start(AttemptInfo(0, ("h",) * 4096, 0.0))
    for i in range(300):
        monitor.on_telemetry(TelemetrySample(attempt=0, rank=5, time=float(i), reports=i, step_time_s=0.1,
                                             host="h", pid=1, phase="TRAINING"))
    kept = monitor.samples(5, 0.0)
    assert len(kept) == samples_per_rank(4096) < 300
    assert kept[-1]["time"] == 299.0  # the latest ones
