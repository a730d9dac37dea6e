"""The run monitor and the straggler rule, fed synthetic observer calls: what it shows, what it writes
to the run directory, how it rebuilds a finished run from those files, and that a storage failure
never reaches the run."""

from __future__ import annotations

import json
import logging

import pytest

from minitrain.config import MonitoringConfig
from minitrain.monitoring.monitor import RunMonitor, step_time_summary
from minitrain.coordinator.observers import (
    AttemptEnd, AttemptInfo, GpuSample, RoundInfo, RunInfo, TelemetrySample,
)
from minitrain.errors import ConfigError
from minitrain.monitoring.stragglers import StragglerDetector, StragglerRule, work_time
from minitrain.records import FailureKind, Phase, ReportRecord, RunOutcome, WorkerFailure
from minitrain.run_state import RunState
from minitrain.storage.filesystem import Storage
from minitrain.storage.layout import EVENTS_NAME, RESERVED_NAMES, TELEMETRY_NAME
from minitrain.storage.retention import CheckpointRecord

RULE = StragglerRule(factor=1.5, window=5, min_samples=3)
S = RunState


def feed(detector, steps, data=None, rounds=1):
    """`rounds` samples of every rank: steps[r] step time, data[r] data wait."""
    for _ in range(rounds):
        for rank, step in enumerate(steps):
            detector.add(rank, f"h{rank}", step, None if data is None else data[rank])
    return detector.evaluate(0.0)


def test_a_rank_persistently_slower_than_the_others_median_is_flagged_then_cleared():
    detector = StragglerDetector(RULE)
    assert feed(detector, [0.1, 0.1, 0.1, 0.3], rounds=2) == ([], [])  # fewer than min_samples: no verdict
    started, cleared = feed(detector, [0.1, 0.1, 0.1, 0.3])
    assert [s.rank for s in started] == [3] and not cleared
    [straggler] = started
    assert straggler.slower_by == pytest.approx(3.0) and straggler.cause == "compute"
    assert straggler.host == "h3" and straggler.median_step_time_s == pytest.approx(0.1)
    # Back to normal: the window's median needs a majority of fast samples before it clears.
    assert feed(detector, [0.1, 0.1, 0.1, 0.1], rounds=2) == ([], [])
    started, cleared = feed(detector, [0.1, 0.1, 0.1, 0.1])
    assert not started and [s.rank for s in cleared] == [3]


def test_one_slow_step_and_a_rank_below_the_factor_are_not_stragglers():
    detector = StragglerDetector(RULE)
    feed(detector, [0.1, 0.1], rounds=4)
    assert feed(detector, [0.1, 0.9]) == ([], [])  # one slow sample out of five
    detector = StragglerDetector(RULE)
    assert feed(detector, [0.1, 0.14], rounds=5) == ([], [])  # 1.4x < 1.5x
    # Two ranks: each is compared with the other (leave-one-out), so 2x is caught.
    assert [s.rank for s in feed(StragglerDetector(RULE), [0.1, 0.2], rounds=3)[0]] == [1]


def test_the_cause_is_data_wait_when_the_extra_data_wait_explains_the_excess():
    started, _ = feed(StragglerDetector(RULE), [0.1, 0.1, 0.4], data=[0.01, 0.01, 0.25], rounds=3)
    assert started[0].cause == "data wait"  # 0.24 s extra data wait of 0.3 s extra step time
    started, _ = feed(StragglerDetector(RULE), [0.1, 0.1, 0.4], data=[0.01, 0.01, 0.05], rounds=3)
    assert started[0].cause == "compute"


def test_the_rule_comes_from_the_environment_and_bad_values_name_the_variable(monkeypatch):
    for name in ("MINITRAIN_STRAGGLER_FACTOR", "MINITRAIN_STRAGGLER_WINDOW", "MINITRAIN_STRAGGLER_MIN_SAMPLES"):
        monkeypatch.delenv(name, raising=False)
    assert StragglerRule.from_env() == StragglerRule()
    monkeypatch.setenv("MINITRAIN_STRAGGLER_FACTOR", "1.2")
    monkeypatch.setenv("MINITRAIN_STRAGGLER_WINDOW", "3")
    rule = StragglerRule.from_env()
    assert (rule.factor, rule.window, rule.min_samples) == (1.2, 3, 3)
    monkeypatch.delenv("MINITRAIN_STRAGGLER_WINDOW")
    monkeypatch.setenv("MINITRAIN_STRAGGLER_FACTOR", "fast")
    with pytest.raises(ConfigError, match="MINITRAIN_STRAGGLER_FACTOR='fast'"):
        StragglerRule.from_env()
    monkeypatch.setenv("MINITRAIN_STRAGGLER_FACTOR", "0.9")
    with pytest.raises(ConfigError, match="MINITRAIN_STRAGGLER_FACTOR='0.9'"):
        StragglerRule.from_env()
    monkeypatch.delenv("MINITRAIN_STRAGGLER_FACTOR")
    monkeypatch.setenv("MINITRAIN_STRAGGLER_MIN_SAMPLES", "11")
    with pytest.raises(ConfigError, match="straggler_min_samples.*MINITRAIN_STRAGGLER_MIN_SAMPLES.* got 11"):
        StragglerRule.from_env()


def test_the_rule_comes_from_the_run_monitoring_config():
    rule = StragglerRule.of(MonitoringConfig(straggler_factor=2, straggler_window=4, straggler_min_samples=2))
    assert (rule.factor, rule.window, rule.min_samples) == (2.0, 4, 2)


def sample(rank, t, step, attempt=1, total=None, data=None):
    return TelemetrySample(attempt=attempt, rank=rank, time=t, reports=int(t), step_time_s=step,
                           report_wait_s=0.0, collective_wait_s=0.0, data_wait_s=data, cpu_percent=95.0,
                           rss_bytes=1 << 28, gpus=(GpuSample(0, 80.0, 1, 2),) if rank == 0 else (),
                           total=total, host=f"host{rank}", pid=100 + rank, phase="TRAINING")


def moves(monitor, attempt, *states, reason="why"):
    """The controller's on_state calls for the path `states` (each state to the next)."""
    for previous, next_state in zip(states, states[1:]):
        monitor.on_state(previous, next_state, reason, attempt)


def finish(monitor, outcome: RunState, attempt, ended_at=None):
    """The end of a run as the controller makes it: STOPPING, the outcome, the last attempt's end."""
    moves(monitor, attempt, S.RUNNING, S.STOPPING, outcome)
    if ended_at is not None:
        monitor.on_attempt_end(AttemptEnd(attempt, (), "", False, ended_at))
    monitor.on_run_end(RunOutcome(state=outcome, attempt=attempt, last_metrics=None))


def drive(monitor, slow_rank=1, samples=6):
    """A run: attempt 0 fails, attempt 1 trains with rank `slow_rank` 3x slower and commits a checkpoint."""
    monitor.on_run_start(RunInfo("rid", "exp", "/runs/exp", 2, 10.0))
    moves(monitor, 0, S.PENDING, S.LAUNCHING, S.STARTING)
    monitor.on_attempt_start(AttemptInfo(0, ("host0", "host1"), 11.0))
    moves(monitor, 0, S.STARTING, S.RUNNING, S.RESTARTING)
    failure = WorkerFailure(rank=1, node="host1", pid=7, phase=Phase.TRAINING, time=12.0, exc_type="ValueError",
                            message="boom", kind=FailureKind.EXCEPTION)
    monitor.on_attempt_end(AttemptEnd(0, (failure,), "rank 1 ValueError: boom", True, 12.5))
    moves(monitor, 1, S.RESTARTING, S.STARTING)
    monitor.on_attempt_start(AttemptInfo(1, ("host0", "host1"), 13.0))
    moves(monitor, 1, S.STARTING, S.RUNNING)
    for i in range(samples):
        for rank in (0, 1):
            monitor.on_telemetry(sample(rank, 20.0 + i, 0.3 if rank == slow_rank else 0.1, total=20))
    for index in range(4):
        monitor.on_report(ReportRecord(attempt=1, rank=0, round=index,
                                       metrics_json=json.dumps({"loss": 1.0 / (index + 1)}), reported_at=30.0 + index))
        checkpoint = CheckpointRecord("checkpoint_000003", {"loss": 0.25}, 3, 1, 33.5) if index == 3 else None
        monitor.on_round(RoundInfo(1, index, ({"loss": 1.0 / (index + 1)}, None), checkpoint, 30.0 + index))
        if checkpoint is not None:
            monitor.on_durable(checkpoint, 33.75)  # committed in memory at 33.5, on storage a quarter second on


def test_the_monitor_shows_the_run_its_ranks_and_its_straggler(tmp_path, caplog):
    storage = Storage.for_run(str(tmp_path), "exp")
    storage.makedirs()
    monitor = RunMonitor(storage, kept_dir_names=lambda: {"checkpoint_000003"}, rule=RULE, clock=lambda: 34.0)
    with caplog.at_level(logging.WARNING, logger="minitrain"):
        drive(monitor)
    run = monitor.run()
    assert (run["state"], run["attempt"], run["num_workers"], run["total"]) == ("RUNNING", 1, 2, 20)
    # 3 rounds since the first (at 30.0) over the 4 s to now (34.0); 16 rounds to go.
    assert run["steps_per_s"] == pytest.approx(0.75) and run["progress"] == pytest.approx(4 / 20)
    assert run["eta_s"] == pytest.approx(16 / 0.75)
    [failed, current] = monitor.attempts()
    assert failed["failures"][0]["exc_type"] == "ValueError" and failed["restarting"] is True
    assert current["ended_at"] is None and current["hosts"] == ["host0", "host1"]
    assert monitor.checkpoints() == [{"dir": "checkpoint_000003", "index": 3, "attempt": 1,
                                      "metrics": {"loss": 0.25}, "committed_at": 33.5, "durable_at": 33.75,
                                      "kept": True}]
    assert [r["index"] for r in monitor.reports()] == [0, 1, 2, 3]
    rank0, rank1 = monitor.ranks()
    assert rank0["gpus"] == [{"index": 0, "util_percent": 80.0, "memory_used_bytes": 1, "memory_total_bytes": 2}]
    assert rank1["gpus"] == [] and rank1["pid"] == 101 and rank1["straggler"] and not rank0["straggler"]
    assert rank0["reports"] == 4 and rank0["last_report_age_s"] == pytest.approx(0.0)
    assert rank1["last_report_age_s"] is None and rank1["data_wait_s"] is None
    [straggler] = monitor.stragglers()
    assert (straggler["rank"], straggler["host"], straggler["cause"]) == (1, "host1", "compute")
    assert straggler["slower_by"] == pytest.approx(3.0)
    assert "rank 1 on host1 is a straggler" in caplog.text and caplog.text.count("straggler") == 1
    assert len(monitor.samples()) == 12 and len(monitor.samples(rank=1, since=23.0)) == 2
    assert step_time_summary(monitor.ranks()) == {"min": 0.1, "median": pytest.approx(0.2), "max": 0.3,
                                                  "slowest_rank": 1}
    # Copies: changing what was returned changes nothing inside.
    monitor.ranks()[0]["gpus"].clear()
    assert monitor.ranks()[0]["gpus"]

    finish(monitor, S.SUCCEEDED, 1, ended_at=40.0)
    assert monitor.run()["state"] == "FINISHED"
    [episode] = monitor.straggler_history()
    assert (episode["rank"], episode["attempt"], episode["until"]) == (1, 1, 40.0)

    # The files, and a monitor rebuilt from them (the post-hoc dashboard's view).
    events = [json.loads(line) for line in (tmp_path / "exp" / EVENTS_NAME).read_text().splitlines()]
    assert [e["kind"] for e in events] == ["run_started", "state_changed", "state_changed", "attempt_started",
                                           "state_changed", "state_changed", "attempt_ended", "state_changed",
                                           "attempt_started", "state_changed", "straggler", "checkpoint_committed",
                                           "checkpoint_durable",
                                           "state_changed", "state_changed", "straggler", "attempt_ended",
                                           "run_ended"]
    # The episode still open when its attempt ended is closed with its last figures (post hoc shows them).
    assert events[-3]["cleared"] is True and events[-3]["rank"] == 1
    told = [(e["previous"], e["next"], e["attempt"]) for e in events if e["kind"] == "state_changed"]
    assert told == [("PENDING", "LAUNCHING", 0), ("LAUNCHING", "STARTING", 0), ("STARTING", "RUNNING", 0),
                    ("RUNNING", "RESTARTING", 0), ("RESTARTING", "STARTING", 1), ("STARTING", "RUNNING", 1),
                    ("RUNNING", "STOPPING", 1), ("STOPPING", "FINISHED", 1)]
    assert events[-1]["state"] == "FINISHED"
    lines = (tmp_path / "exp" / TELEMETRY_NAME).read_text().splitlines()
    assert len(lines) == 12 and json.loads(lines[0])["host"] == "host0"
    (tmp_path / "exp" / "metrics.jsonl").write_text("".join(
        json.dumps({"metrics": r["metrics"], "report_index": r["index"], "attempt": 1, "time": r["time"]}) + "\n"
        for r in monitor.reports()))
    with open(tmp_path / "exp" / TELEMETRY_NAME, "a") as torn:
        torn.write('{"rank": 0, "ti')  # a crash in the middle of an append
    rebuilt = RunMonitor.from_run_dir(storage)
    assert rebuilt.attempts() == monitor.attempts()
    assert rebuilt.checkpoints()[0]["dir"] == "checkpoint_000003"
    assert rebuilt.reports() == monitor.reports() and rebuilt.samples() == monitor.samples()
    assert rebuilt.ranks()[1]["step_time_s"] == 0.3
    expected = {k: v for k, v in monitor.run().items()}
    assert rebuilt.run() == expected
    assert rebuilt.straggler_history() == monitor.straggler_history()
    # What the live page showed at the end, post hoc too: the straggler row, the phase, the reports.
    # (Only rank 0 reported in this run; a real round has every rank's report.)
    # (Only rank 0 reported in this run; a real round has every rank's report.) Post hoc, the last
    # report is the last round's time (live, when the driver got it: here its fixed clock, 1 s later).
    live0, rebuilt0 = monitor.ranks()[0], rebuilt.ranks()[0]
    assert rebuilt0.pop("last_report_age_s") == pytest.approx(live0.pop("last_report_age_s") + 1.0)
    assert rebuilt0 == live0
    assert [(r["phase"], r["straggler"]) for r in rebuilt.ranks()] == [(r["phase"], r["straggler"])
                                                                       for r in monitor.ranks()]
    assert [r["phase"] for r in rebuilt.ranks()] == ["ENDED", "ENDED"] and rebuilt.ranks()[1]["straggler"]
    assert {TELEMETRY_NAME, EVENTS_NAME} <= RESERVED_NAMES


def test_the_state_shown_is_the_one_the_controller_told_from_pending_on(tmp_path):
    """The monitor derives no state of its own: before any move it shows PENDING (never a STARTING of
    its own), an attempt's start or end changes nothing, and a run directory replays the moves."""
    storage = Storage.for_run(str(tmp_path), "exp")
    storage.makedirs()
    monitor = RunMonitor(storage, rule=RULE, clock=lambda: 5.0)
    monitor.on_run_start(RunInfo("rid", "exp", "/runs/exp", 2, 1.0))
    assert monitor.run()["state"] == "PENDING"
    monitor.on_state(S.PENDING, S.LAUNCHING, "starting node agents", 0)
    assert monitor.run()["state"] == "LAUNCHING"
    monitor.on_state(S.LAUNCHING, S.STARTING, "starting attempt 0", 0)
    monitor.on_attempt_start(AttemptInfo(0, ("h0", "h1"), 2.0))
    assert monitor.run()["state"] == "STARTING"  # the ranks are not all training yet
    monitor.on_state(S.STARTING, S.RUNNING, "every rank is training", 0)
    monitor.on_state(S.RUNNING, S.RESTARTING, "rank 1 died", 0)
    monitor.on_attempt_end(AttemptEnd(0, (), "rank 1 died", True, 3.0))
    assert monitor.run()["state"] == "RESTARTING"
    finish(monitor, S.ABORTED, 0)
    assert monitor.run()["state"] == "ABORTED"
    lines = (tmp_path / "exp" / EVENTS_NAME).read_text().splitlines()
    reasons = [json.loads(line)["reason"] for line in lines if json.loads(line)["kind"] == "state_changed"]
    assert reasons[:4] == ["starting node agents", "starting attempt 0", "every rank is training", "rank 1 died"]
    assert RunMonitor.from_run_dir(storage).run()["state"] == "ABORTED"
    # A directory read while the run goes on (its events so far): the last move told.
    live = Storage.for_run(str(tmp_path), "live")
    live.makedirs()
    (tmp_path / "live" / EVENTS_NAME).write_text("\n".join(lines[:5]) + "\n")
    assert json.loads(lines[4])["kind"] == "state_changed"
    assert RunMonitor.from_run_dir(live).run()["state"] == "RUNNING"


class FailingStorage:
    def __init__(self):
        self.calls = 0

    def append_text(self, name, text):
        self.calls += 1
        raise OSError(28, "No space left on device")

    def url(self, name=""):
        return f"/full/{name}"


def test_a_storage_failure_is_logged_once_and_the_monitor_goes_on(caplog):
    storage = FailingStorage()
    monitor = RunMonitor(storage, rule=RULE)
    with caplog.at_level(logging.WARNING, logger="minitrain"):
        drive(monitor)
        finish(monitor, S.FAILED, 1)
    assert caplog.text.count("could not write") == 1 and "No space left" in caplog.text
    assert monitor.run()["state"] == "ERRORED" and len(monitor.samples()) == 12


def checkpoint_round_samples(rank, t, attempt=0):
    """The reviewer's 3-rank run (a checkpoint every 20 steps, rank 2 slow): a fast rank works 0.05 s a
    step and then blocks in the checkpoint report() until rank 2 (0.251 s a step) reaches the round, so
    most of its samples show a long step that is nearly all report wait; rank 2 never waits."""
    if rank == 2:
        step, report_wait = 0.251, 0.001
    else:
        step = (0.05, 1.8, 2.8, 3.8)[int(t) % 4]
        report_wait = step - 0.05
    return TelemetrySample(attempt=attempt, rank=rank, time=t, reports=int(t), step_time_s=step,
                           report_wait_s=report_wait, collective_wait_s=0.0, data_wait_s=None,
                           host=f"host{rank}", pid=100 + rank, phase="TRAINING")


def test_ranks_blocked_at_checkpoint_rounds_by_a_slow_peer_are_not_stragglers_the_peer_is(caplog):
    monitor = RunMonitor(None, rule=StragglerRule())  # the defaults: window 10, at least 5 samples
    monitor.on_run_start(RunInfo("rid", "exp", "/runs/exp", 3, 0.0))
    monitor.on_attempt_start(AttemptInfo(0, ("host0", "host1", "host2"), 0.0))
    with caplog.at_level(logging.WARNING, logger="minitrain"):
        for t in range(12):
            for rank in range(3):
                monitor.on_telemetry(checkpoint_round_samples(rank, float(t)))
    [straggler] = monitor.stragglers()
    assert (straggler["rank"], straggler["host"], straggler["cause"]) == (2, "host2", "compute")
    assert straggler["step_time_s"] == pytest.approx(0.25) and straggler["median_step_time_s"] == pytest.approx(0.05)
    assert straggler["slower_by"] == pytest.approx(5.0)
    rows = monitor.ranks()
    assert [r["straggler"] for r in rows] == [False, False, True]
    assert rows[0]["work_time_s"] == pytest.approx(0.05) and rows[2]["work_time_s"] == pytest.approx(0.25)
    assert step_time_summary(rows)["slowest_rank"] == 2
    assert "rank 2 on host2 is a straggler" in caplog.text and "rank 0" not in caplog.text
    # Judged on step time alone (the rule before), the waiting ranks were named and rank 2 was not.
    blind = StragglerDetector(StragglerRule())
    for t in range(12):
        for rank in range(3):
            s = checkpoint_round_samples(rank, float(t))
            blind.add(rank, s.host, s.step_time_s, None)
    started, _ = blind.evaluate(12.0)
    assert [s.rank for s in started] == [0, 1]


def test_work_time_and_the_rule_s_edge_cases():
    assert work_time(None, 1.0, 1.0) is None
    assert work_time(1.0, None, None) == 1.0 and work_time(1.0, 0.7, 0.2) == pytest.approx(0.1)
    assert work_time(1.0, 0.9, 0.3) == 0.0  # never negative
    # Peers whose work measured 0 (they only waited): the slow rank is still named, no division by 0.
    started, _ = feed(StragglerDetector(RULE), [0.0, 0.0, 0.3], rounds=3)
    assert [s.rank for s in started] == [2] and started[0].slower_by == pytest.approx(300.0)
    assert feed(StragglerDetector(RULE), [0.0, 0.0], rounds=3) == ([], [])
    # A single rank has nobody to be compared with.
    assert feed(StragglerDetector(RULE), [5.0], rounds=5) == ([], [])


def test_steps_per_s_is_taken_over_time_never_over_a_burst_and_over_the_whole_run_at_the_end():
    now = [0.0]
    monitor = RunMonitor(None, rule=RULE, clock=lambda: now[0])
    monitor.on_run_start(RunInfo("rid", "exp", "/runs/exp", 2, 100.0))
    monitor.on_attempt_start(AttemptInfo(0, ("h0", "h1"), 101.0))

    def rounds(first, count, at, spacing=0.0):
        for i in range(count):
            monitor.on_round(RoundInfo(0, first + i, ({"i": first + i}, None), None, at + i * spacing))

    # The driver commits 20 rounds in one burst (a late rank's reports caught up): 40 us apart.
    rounds(0, 20, 110.0, spacing=2e-6)
    now[0] = 110.00004
    assert monitor.run()["steps_per_s"] is None  # not from a near-zero interval
    now[0] = 115.0
    assert monitor.run()["steps_per_s"] == pytest.approx(19 / 5.0)
    # Steady: 2 rounds a second for a minute; the rate is over about the last 30 s only.
    rounds(20, 120, 115.5, spacing=0.5)
    now[0] = 175.0
    assert monitor.run()["steps_per_s"] == pytest.approx(2.0, rel=0.05)
    # A stall: no round for a minute shows 0, not the old rate.
    now[0] = 240.0
    assert monitor.run()["steps_per_s"] == 0.0 and monitor.run()["eta_s"] is None
    # A restart: the rate starts again with the attempt (the gap was no step).
    monitor.on_attempt_end(AttemptEnd(0, (), "", True, 240.0))
    monitor.on_attempt_start(AttemptInfo(1, ("h0", "h1"), 241.0))
    assert monitor.run()["steps_per_s"] is None
    rounds(140, 10, 250.0, spacing=1.0)
    now[0] = 259.0
    assert monitor.run()["steps_per_s"] == pytest.approx(1.0)
    # The end: this run's 150 rounds over its 160 s, whatever the last rounds' spacing was.
    rounds(150, 20, 260.0, spacing=2e-6)
    now[0] = 260.0
    finish(monitor, S.SUCCEEDED, 1, ended_at=260.0)
    now[0] = 999.0  # read long after: the final figure does not move
    assert monitor.run()["steps_per_s"] == pytest.approx(170 / 160.0)
    assert monitor.run()["rounds"] == 170


def test_a_resumed_run_counts_its_own_rounds_and_its_own_samples(tmp_path):
    storage = Storage.for_run(str(tmp_path), "exp")
    storage.makedirs()
    clock = [0.0]
    for started, first_round, ranks in ((10.0, 0, 3), (100.0, 50, 2)):  # resumed with 2 workers
        clock[0] = started
        monitor = RunMonitor(storage, rule=RULE, clock=lambda: clock[0])
        monitor.on_run_start(RunInfo("rid", "exp", str(tmp_path / "exp"), ranks, started))
        monitor.on_attempt_start(AttemptInfo(0, tuple(f"h{r}" for r in range(ranks)), started + 1))
        for i in range(50):
            for rank in range(ranks):
                monitor.on_telemetry(sample(rank, started + 2 + i * 0.2, 0.2, attempt=0))
            monitor.on_round(RoundInfo(0, first_round + i, ({"i": i},) + (None,) * (ranks - 1), None,
                                       started + 2 + i * 0.2))
        clock[0] = started + 20.0
        finish(monitor, S.SUCCEEDED, 0, ended_at=clock[0])
        run = monitor.run()
        assert run["rounds"] == first_round + 50 and run["steps_per_s"] == pytest.approx(50 / 20.0)
    (tmp_path / "exp" / "metrics.jsonl").write_text("".join(
        json.dumps({"metrics": {"i": i}, "report_index": i, "attempt": 0,
                    "time": (12.0 + i * 0.2 if i < 50 else 102.0 + (i - 50) * 0.2)}) + "\n" for i in range(100)))
    rebuilt = RunMonitor.from_run_dir(storage)
    assert [r["rank"] for r in rebuilt.ranks()] == [0, 1]  # not the first run's rank 2
    assert rebuilt.run()["rounds"] == 100 and rebuilt.run()["steps_per_s"] == pytest.approx(50 / 20.0)


def test_a_late_sample_of_an_ended_attempt_is_history_only():
    monitor = RunMonitor(None, rule=RULE)
    monitor.on_run_start(RunInfo("rid", "exp", "/runs/exp", 2, 0.0))
    monitor.on_attempt_start(AttemptInfo(0, ("h0", "h1"), 1.0))
    for t in range(4):
        for rank in (0, 1):
            monitor.on_telemetry(sample(rank, 2.0 + t, 0.1, attempt=0))
    monitor.on_attempt_end(AttemptEnd(0, (), "rank 1 died", True, 6.0))
    for t in range(4):  # samples still in flight when the attempt ended, rank 1's slow
        for rank in (0, 1):
            monitor.on_telemetry(sample(rank, 6.5 + t, 0.9 if rank else 0.1, attempt=0))
    assert monitor.stragglers() == [] and monitor.straggler_history() == []
    assert len(monitor.samples(rank=1)) == 8
    monitor.on_attempt_start(AttemptInfo(1, ("h0", "h1"), 11.0))
    assert [r["step_time_s"] for r in monitor.ranks()] == [None, None]  # the new attempt's rows start empty


def test_the_status_parts_of_a_checkpoint_without_a_commit_time():
    from minitrain.monitoring.console_status import status_parts

    run = {"name": "r", "attempt": 0, "state": "RUNNING", "started_at": 0.0, "ended_at": None, "rounds": 3,
           "total": 3, "progress": 1.0, "steps_per_s": 0.0, "eta_s": None}
    parts = status_parts(run, [{"rank": 0, "step_time_s": 0.2, "report_wait_s": None}], [],
                         [{"dir": "checkpoint_000002", "committed_at": None}], 10.0)
    assert parts[1] == "3/3 steps (100.0%) | - steps/s"
    assert parts[2].startswith("step time excl. waits min 0.200 s") and parts[-1] == "last checkpoint checkpoint_000002"


def test_worker_phases_show_before_any_telemetry_and_ranks_end_ended(tmp_path):
    """Start-up shows each rank's phase (no telemetry before training); an ended attempt's
    ranks show ENDED (FAILED for the one that failed), not the TRAINING of their last sample."""
    monitor = RunMonitor(None, rule=RULE, clock=lambda: 5.0)
    monitor.on_run_start(RunInfo("rid", "exp", "/runs/exp", 2, 1.0))
    monitor.on_state(S.LAUNCHING, S.STARTING, "starting attempt 0", 0)
    monitor.on_attempt_start(AttemptInfo(0, ("h0", "h1"), 2.0))
    monitor.on_worker_phase(0, 1, "DIST_INIT")
    monitor.on_worker_phase(7, 0, "TRAINING")  # another attempt's: ignored
    assert [r["phase"] for r in monitor.ranks()] == [None, "DIST_INIT"]
    assert (monitor.run()["state_since"], monitor.run()["state_reason"]) == (5.0, "starting attempt 0")
    monitor.on_telemetry(sample(0, 3.0, 0.1))
    failure = WorkerFailure(rank=1, node="h1", pid=7, phase=Phase.TRAINING, time=4.0, exc_type="ValueError",
                            message="boom", kind=FailureKind.EXCEPTION)
    monitor.on_attempt_end(AttemptEnd(0, (failure,), "rank 1 ValueError: boom", False, 4.5))
    assert [r["phase"] for r in monitor.ranks()] == ["ENDED", "FAILED"]


def test_each_host_s_total_memory_is_kept_with_its_attempt_live_and_post_hoc(tmp_path):
    """The node memory plot is drawn against each host's total memory, which the
    attempt's start gives (from the agents' hellos); the run directory keeps it for the post-hoc page."""
    storage = Storage.for_run(str(tmp_path), "exp")
    storage.makedirs()
    monitor = RunMonitor(storage, rule=RULE, clock=lambda: 5.0)
    assert monitor.nodes() == []  # before the first attempt
    monitor.on_run_start(RunInfo("rid", "exp", "/runs/exp", 3, 1.0))
    monitor.on_attempt_start(AttemptInfo(0, ("hb", "ha", "hb"), 2.0, {"hb": 8 << 30, "ha": 16 << 30}))
    assert monitor.nodes() == [{"host": "ha", "memory_bytes": 16 << 30}, {"host": "hb", "memory_bytes": 8 << 30}]
    assert monitor.attempts()[0]["host_memory_bytes"] == {"hb": 8 << 30, "ha": 16 << 30}
    monitor.on_attempt_end(AttemptEnd(0, (), "", True, 3.0))
    monitor.on_attempt_start(AttemptInfo(1, ("hc",), 4.0, {"hc": 4 << 30}))  # the current attempt's hosts only
    assert monitor.nodes() == [{"host": "hc", "memory_bytes": 4 << 30}]
    monitor.on_run_end(RunOutcome(state="FINISHED", attempt=1, last_metrics=None))
    assert RunMonitor.from_run_dir(storage).nodes() == monitor.nodes()
    # A run directory written before the field existed: no totals, nothing breaks.
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / EVENTS_NAME).write_text(json.dumps(
        {"time": 2.0, "kind": "attempt_started", "attempt": 0, "started_at": 2.0, "ended_at": None, "hosts": ["h"],
         "failures": [], "root_cause": "", "restarting": False}) + "\n")
    assert RunMonitor.from_run_dir(Storage.for_run(str(tmp_path), "old")).nodes() == []


def test_the_memory_hint_counts_the_warm_up_from_each_rank_s_first_step_past_the_kept_history(tmp_path):
    """A big run keeps a short history per rank (60 samples at 10,000 ranks): the memory warm-up still
    counts from when each rank's steps began, live and post hoc, so a leak is named once the history
    no longer reaches back to the first step."""
    storage = Storage.for_run(str(tmp_path), "exp")
    storage.makedirs()
    monitor = RunMonitor(storage, rule=RULE, clock=lambda: 300.0)
    monitor.on_run_start(RunInfo("rid", "exp", "/runs/exp", 10_000, 1.0))
    monitor.on_attempt_start(AttemptInfo(0, ("h", "h"), 2.0, {"h": 64 << 30}))
    mib = 2 ** 20
    for i in range(200):  # rank 0 keeps 2 MiB a second after start-up; rank 1 stays flat
        for rank in (0, 1):
            rss = 300 * mib + (40 * mib if i else 0) + (2 * mib * i if rank == 0 else 0)
            monitor.on_telemetry(TelemetrySample(attempt=0, rank=rank, time=10.0 + i, reports=i, step_time_s=0.5,
                                                 rss_bytes=rss, host="h", pid=100 + rank, phase="TRAINING"))
    assert len(monitor.samples(rank=0)) == 60 and monitor.samples(rank=0)[0]["reports"] == 140
    [hint] = monitor.hints()
    assert hint["ranks"] == [0] and "rank(s) 0 (" in hint["message"]
    monitor.on_run_end(RunOutcome(state="FINISHED", attempt=0, last_metrics=None))
    assert RunMonitor.from_run_dir(storage).hints() == monitor.hints()


def test_the_dashboard_groups_failed_attempts_by_their_root_cause_s_host(tmp_path):
    """The attempts the monitor records carry their root cause, which the dashboard groups by host as the
    end-of-run summary does (the same function says both); one that has not failed adds nothing."""
    from minitrain.dashboard.pages import attempts_html, failed_by_host

    storage = Storage.for_run(str(tmp_path), "exp")
    storage.makedirs()
    monitor = RunMonitor(storage, kept_dir_names=lambda: {"checkpoint_000003"}, rule=RULE, clock=lambda: 34.0)
    drive(monitor)
    failed, current = monitor.attempts()
    assert failed["root"] == {"host": "host1", "rank": 1, "phase": "TRAINING", "cause": "ValueError: boom"}
    assert current.get("root") is None
    summary = failed_by_host(monitor.attempts())
    assert summary == "1 attempt failed on host host1: 1x rank 1 during training: ValueError: boom"
    assert summary in attempts_html(monitor.attempts())
    assert failed_by_host([current]) == ""
