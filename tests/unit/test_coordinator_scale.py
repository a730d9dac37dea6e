"""What keeps the coordinator responsive with thousands of workers (see docs/benchmarks/scale.md):
round bookkeeping that does not rescan the ranks at every report, commands handed to the server loop
in batches (in order), the GC threshold raised only while a server runs, a straggler rule
that does not compare every rank with every other at every telemetry sample, and per-event costs that
do not grow with the ranks (Pace's sliding maximum, the monitor's straggler episodes, the hang watch
built only when a deadline can be due; scripts/bench_controller_costs.py measures them)."""

from __future__ import annotations

import asyncio
import gc
import random
import statistics
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controller_support import training_controller

from minitrain.config import FailureConfig
from minitrain.coordinator.facts import events as ev
from minitrain.coordinator.facts.attempt import AttemptTracker
from minitrain.coordinator.policy.decide import _silent_ranks
from minitrain.coordinator.policy.loop import Seen, Watch
from minitrain.coordinator.policy.rounds import RoundTracker
from minitrain.coordinator.transport import server as server_module
from minitrain.monitoring.monitor import (
    MAX_SAMPLES, MIN_SAMPLES_PER_RANK, SAMPLES_PER_RANK, RunMonitor, samples_per_rank,
)
from minitrain.commands import ReportAck
from minitrain.coordinator.facts.hang_watch import HangWatch
from minitrain.coordinator.facts.metrics_log import read_metrics_history
from minitrain.coordinator.observers import AttemptEnd, AttemptInfo, RunInfo, TelemetrySample
from minitrain.coordinator.policy.hangs import AUTO_FLOOR_S, PACE_MIN_INTERVALS, PACE_WINDOW, HangRule, Pace
from minitrain.coordinator.transport.service import Hub
from minitrain.monitoring.stragglers import (
    MIN_WORK_S, StragglerDetector, StragglerRule, _median_known,
)
from minitrain.records import Phase, ReportRecord, WorkerAssignment
from minitrain.storage.filesystem import Storage


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
            assert hub.to_worker(0, rank, ReportAck(rank * 10_000 + i))

    threads = [threading.Thread(target=send, args=(rank,)) for rank in range(senders)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    drained = asyncio.run_coroutine_threadsafe(_drain(outboxes, 2000), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)
    loop.close()
    rounds = {rank: [message.report_ack.round for message in messages] for rank, messages in drained.items()}
    assert rounds == {rank: [rank * 10_000 + i for i in range(2000)] for rank in range(senders)}
    assert not hub.to_worker(0, 0, ReportAck(0))  # the loop is closed: nothing is queued


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


# ---------------------------------------------------------------- per-event costs (scripts/bench_controller_costs.py)

@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.sampled_from(["report", "report", "report", "start"]),
                          st.sampled_from([0.0, 0.1, 0.1, 0.5, 3.0])), max_size=400))
def test_pace_keeps_the_same_slowest_intervals_as_a_max_over_each_window(ops):
    """Pace keeps each window's maximum as it slides (O(1) per report) and the group's slowest cached:
    the same figures as taking the max of the last PACE_WINDOW intervals at every report."""
    pace, now, last, intervals = Pace(), 0.0, {}, {}
    for rank, op, step in ops:
        now += step
        if op == "start":
            pace.started(rank)
            last[rank] = None
            continue
        pace.reported(rank, now)
        if last.get(rank) is not None:
            intervals.setdefault(rank, []).append(now - last[rank])
        last[rank] = now
        own = {r: max(v[-PACE_WINDOW:]) for r, v in intervals.items() if len(v) >= PACE_MIN_INTERVALS}
        group = max(own.values(), default=None)
        for r in range(3):
            assert pace.slowest(r) == own.get(r, group)
            assert pace.knows(r) == (r in own)
            assert pace.intervals(r) == tuple(intervals.get(r, [])[-PACE_WINDOW:])
        assert pace.group_slowest() == group


class _EventLog(RunMonitor):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.events = []

    def _event(self, kind, when, fields):
        self.events.append(dict(fields, kind=kind, time=when))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.sampled_from([0.1, 0.1, 0.1, 0.3, 0.5, None])), max_size=150),
       st.integers(10, 140))
def test_straggler_episodes_hold_their_latest_figures_as_when_they_were_copied_at_every_sample(samples, restart):
    """The monitor gives open episodes their figures when read, not at every sample: an open episode
    still shows the figures `stragglers()` shows, and a closed one those of its straggler's last
    sample (as in its "cleared" event)."""
    monitor = _EventLog(storage=None, rule=StragglerRule(window=4, min_samples=2))
    monitor.on_run_start(RunInfo("run", "exp", "/tmp/x", 4, 0.0, request_stacks=lambda rank: None))
    monitor.on_attempt_start(AttemptInfo(0, ("h",) * 4, 0.0))
    attempt = 0
    for t, (rank, step) in enumerate(samples):
        if t == restart:  # an attempt ends with stragglers open: their episodes end with it
            monitor.on_attempt_end(AttemptEnd(attempt, (), "", True, float(t)))
            attempt += 1
            monitor.on_attempt_start(AttemptInfo(attempt, ("h",) * 4, float(t)))
        monitor.on_telemetry(TelemetrySample(attempt=attempt, rank=rank, time=float(t), reports=t, step_time_s=step,
                                             host=f"h{rank}", pid=1, phase="TRAINING"))
        history = monitor.straggler_history()
        current = {s["rank"]: s for s in monitor.stragglers()}
        open_ = {e["rank"]: e for e in history if e["until"] is None and e["attempt"] == attempt}
        assert {r: {k: v for k, v in e.items() if k not in ("attempt", "until")} for r, e in open_.items()} == current
    cleared = [e for e in monitor.events if e["kind"] == "straggler" and e["cleared"]]
    closed = [e for e in monitor.straggler_history() if e["until"] is not None]
    for event in cleared:
        [episode] = [e for e in closed if e["rank"] == event["rank"] and e["until"] == event["time"]]
        figures = {k: v for k, v in event.items() if k not in ("kind", "time", "cleared")}
        assert {k: episode[k] for k in figures} == figures


def _training_attempt(ranks):
    """An attempt of `ranks` ranks on one node, every one connected and starting up."""
    tracker = AttemptTracker.create(0, [WorkerAssignment(r, r, ranks, ranks, 0, "n0") for r in range(ranks)],
                                    {"n0": "n0"})
    for rank in range(ranks):
        tracker.on_connected(ev.WorkerConnected(0, rank, 1000 + rank, "n0"))
    return tracker


def _phase(watch, tracker, rank, phase, now):
    """A rank's phase change, told to the hang watch and the tracker as the controller does."""
    event = ev.WorkerPhaseChanged(0, rank, phase)
    watch.phase_changed(tracker, event)
    tracker.on_phase(event)
    tracker.progressed(rank, now)


def _report(watch, tracker, rank, round_, now):
    """A rank's report, recorded (Commits) and then told to the hang watch, as the controller does."""
    tracker.reported(rank, round_, now)
    watch.reported((ReportRecord(0, rank, round_, "{}", now),), now)


def _full_watch(watch, tracker):
    """The hang watch built from every rank, as at every turn before (the reference)."""
    watched = {}
    for rank, state in tracker.ranks.items():
        if state.phase >= Phase.TRAINING and not state.done and not state.exited:
            deadline_s = watch.deadline_s(rank, state)
            if deadline_s is not None:
                watched[rank] = Watch(state.last_progress, deadline_s)
    return watched


@pytest.mark.parametrize("timeout_s,floor_s", [("auto", 2.0), (3.0, None), (None, None)])
def test_the_hang_watch_built_only_when_due_finds_every_silent_rank_at_once(timeout_s, floor_s):
    """The hang watch scans the ranks only when the earliest possible deadline has come (an O(ranks)
    scan at every turn of the loop was the controller's largest cost per event at 4096 ranks): at every
    turn it finds the same silent ranks as the full scan would, whatever the reports, phases
    (uploads, which lengthen a deadline) and pauses."""
    now = 100.0
    ranks = 5
    rng = random.Random(f"{timeout_s}")
    for trial in range(8):
        watch = HangWatch(HangRule(timeout_s=timeout_s, floor_s=floor_s or AUTO_FLOOR_S))
        tracker = _training_attempt(ranks)
        rounds = dict.fromkeys(range(ranks), 0)
        scans = 0
        for _ in range(400):
            now += rng.choice([0.0, 0.01, 0.1, 0.1, 0.5, 1.5]) if rng.random() > 0.02 else 25.0  # a pause
            rank = rng.randrange(ranks)
            state = tracker.ranks[rank]
            kind = rng.choice(["report"] * 6 + ["phase", "done", "none", "none"])
            if kind == "phase" and not state.exited:
                phase = Phase.TRAINING if state.phase is not Phase.TRAINING else Phase.CHECKPOINT_UPLOAD
                _phase(watch, tracker, rank, phase, now)
            elif kind == "report" and state.phase >= Phase.TRAINING and not state.exited:
                _report(watch, tracker, rank, rounds[rank], now)
                rounds[rank] += 1
            elif kind == "done" and rng.random() < 0.05:
                state.done = state.exited = True
            expected = _silent_ranks(Seen(watched=_full_watch(watch, tracker)), now)
            watched = watch.watched(tracker, now)
            scans += bool(watched)
            assert _silent_ranks(Seen(watched=watched), now) == expected
        if timeout_s is None:
            assert scans == 0


def test_a_deadline_taken_from_the_group_s_pace_is_watched_as_it_shrinks():
    """A rank with too few intervals of its own is judged by the group's slowest interval, which can
    fall without any event of that rank: the watch must not wait for the deadline it had."""
    watch = HangWatch(HangRule(timeout_s="auto", floor_s=2.0))
    tracker = _training_attempt(2)
    rounds = [0, 0]

    def at(t, rank, kind="report"):
        if kind == "training":
            _phase(watch, tracker, rank, Phase.TRAINING, t)
        else:
            _report(watch, tracker, rank, rounds[rank], t)
            rounds[rank] += 1
        expected = _silent_ranks(Seen(watched=_full_watch(watch, tracker)), t)
        assert _silent_ranks(Seen(watched=watch.watched(tracker, t)), t) == expected
        return expected

    at(100.0, 0, "training")
    at(100.0, 1, "training")
    at(100.1, 0)
    at(105.0, 1)  # rank 1's only report: its deadline is the group's, 10 x 10 s
    at(110.1, 0)
    at(110.2, 0)  # rank 0: intervals 10 s and 0.1 s
    found = [at(110.2 + 0.01 * (k + 1), 0) for k in range(99)]  # the 10 s interval leaves rank 0's window
    assert watch.pace.slowest(1) == pytest.approx(0.1)
    assert found[-1] == (1,) and found[0] == ()  # rank 1, silent since 105, is past 2 s as soon as it shrank


class _BatchWatcher:
    """A run observer that keeps what it is told of reports and rounds."""

    def __init__(self):
        self.reports, self.rounds = [], []

    def on_report(self, report):
        self.reports.append((report.attempt, report.rank, report.round))

    def on_round(self, round_):
        self.rounds.append(round_)


def test_a_batch_of_reports_is_recorded_report_by_report(tmp_path):
    """One ReportsReceived (a relayed batch) has each report's effects in order, as separate events
    had: observers see each report of the current attempt (a stale one is dropped), a round completed
    mid-batch reaches on_round with every rank's metrics, rank 0's metrics reach the history, and a
    refused report (a checkpoint directory conflict) fails its rank without dropping the reports after it."""
    watcher = _BatchWatcher()
    controller, tracker = training_controller(tmp_path, 3, FailureConfig(max_failures=0), lambda: 50.0,
                                               observers=[watcher])
    for rank in range(3):
        controller._handle(ev.WorkerPhaseChanged(0, rank, Phase.TRAINING))

    def report(rank, round_, attempt=0, checkpoint=""):
        return ReportRecord(attempt, rank, round_, f'{{"rank": {rank}, "round": {round_}}}', 49.0, checkpoint)

    controller._handle(ev.ReportsReceived((report(1, 0), report(2, 0, attempt=7), report(0, 0), report(2, 0),
                                           report(0, 1, checkpoint="a"), report(1, 1, checkpoint="b"),
                                           report(0, 2))))
    assert watcher.reports == [(0, 1, 0), (0, 0, 0), (0, 2, 0), (0, 0, 1), (0, 1, 1), (0, 0, 2)]
    [round0] = watcher.rounds
    assert round0.index == 0 and round0.checkpoint is None
    assert list(round0.metrics_by_rank) == [{"rank": r, "round": 0} for r in range(3)]
    controller._commits.persist()  # rank 0's metrics reach metrics.jsonl, the run's one record of them
    metrics_jsonl = read_metrics_history(Storage.for_run(str(tmp_path), "run"))
    assert [entry["metrics"] for entry in metrics_jsonl] == [{"rank": 0, "round": r} for r in range(3)]
    assert controller._commits.history.last_metrics == {"rank": 0, "round": 2}
    assert [tracker.ranks[r].last_round for r in range(3)] == [2, 1, 0]
    assert tracker.failures()[0].rank == 1 and tracker.failures()[0].exc_type == "CheckpointDirConflict"
    assert all(tracker.ranks[r].last_progress == 50.0 for r in range(3))
