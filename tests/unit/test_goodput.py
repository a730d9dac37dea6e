"""The goodput ledger over synthetic runs: each cause gets exactly the seconds its interval holds (an
attempt that fails and restarts from an older checkpoint, a resize, a run that waited for hosts, a run
without telemetry), the causes sum to wall x ranks, and a monitor rebuilt from the run directory shows
the ledger the live monitor showed."""

from __future__ import annotations

import json

import pytest

from minitrain.coordinator.observers import AttemptEnd, AttemptInfo, RoundInfo, RunInfo, TelemetrySample
from minitrain.monitoring.goodput import CAUSES, Goodput, GoodputLedger, line
from minitrain.monitoring.monitor import RunMonitor
from minitrain.records import ReportRecord, RunOutcome
from minitrain.run_state import RunState as S
from minitrain.storage.filesystem import Storage

# Every sample's step: 1 s, of which 0.2 s on data, 0.1 s in collectives, 0.2 s in report(): compute 0.5.
SHARES = {"compute": 0.5, "data_wait": 0.2, "collective_wait": 0.1, "report_wait": 0.2}


def start_ranks(ledger, attempt, ranks, at):
    """Each rank: STARTUP at `at`, DIST_INIT at +1, TRAINING at +2, first report at +3."""
    for rank in range(ranks):
        ledger.phase(attempt, rank, "STARTUP", at)
        ledger.phase(attempt, rank, "DIST_INIT", at + 1)
        ledger.phase(attempt, rank, "TRAINING", at + 2)
        ledger.report(attempt, rank, at + 3)


def samples(ledger, attempt, ranks, times, step=1.0, data=0.2, collective=0.1, report=0.2):
    for t in times:
        for rank in range(ranks):
            ledger.sample(attempt, rank, t, step, report, collective, data)


def assert_sums(goodput: Goodput, worker_seconds: float):
    """The causes sum to wall x ranks, in total, over the attempts (when there was one) and over the ranks."""
    assert set(goodput.total) == set(CAUSES)
    assert sum(goodput.total.values()) == pytest.approx(worker_seconds, abs=1e-9)
    assert goodput.worker_seconds == pytest.approx(worker_seconds, abs=1e-9)
    if goodput.by_attempt:
        assert sum(sum(a["seconds"].values()) for a in goodput.by_attempt) == pytest.approx(worker_seconds, abs=1e-9)
    assert sum(sum(r.values()) for r in goodput.by_rank.values()) == pytest.approx(worker_seconds, abs=1e-9)
    assert all(v >= -1e-12 for v in goodput.total.values())


def restart_from_an_older_checkpoint(ledger):
    """2 ranks, run 0..28. Attempt 0 starts at 2, reports from 6, fails at 10, exits by 11. Attempt 1
    starts at 13, reports from 17, redoes rounds until 19, finishes at 25, exits by 27."""
    ledger.run_started(0.0, 2)
    ledger.attempt_started(0, 2.0, 2)
    start_ranks(ledger, 0, 2, 3.0)  # DIST_INIT 4, TRAINING 5, first report 6
    samples(ledger, 0, 2, [7.0, 8.0, 9.0])
    ledger.round(0, 7.0, redone=False)
    ledger.round(0, 9.0, redone=False)
    ledger.stopping(0, 10.0)
    samples(ledger, 0, 2, [10.5])  # taken after the stop: left out
    ledger.attempt_ended(0, 11.0)
    ledger.attempt_started(1, 13.0, 2)
    start_ranks(ledger, 1, 2, 14.0)  # DIST_INIT 15, TRAINING 16, first report 17
    ledger.round(1, 18.0, redone=True)
    ledger.round(1, 19.0, redone=True)  # the rounds attempt 0 had completed: lost work until 19
    ledger.round(1, 20.0, redone=False)
    samples(ledger, 1, 2, [18.0 + i for i in range(7)])
    for rank in range(2):
        ledger.phase(1, rank, "FINISHING", 25.0)
    ledger.stopping(1, 26.0)
    ledger.attempt_ended(1, 27.0)
    ledger.run_ended(28.0)


def test_an_attempt_that_fails_and_restarts_from_an_older_checkpoint():
    ledger = GoodputLedger()
    restart_from_an_older_checkpoint(ledger)
    goodput = ledger.snapshot(100.0)  # the run ended: now does not matter
    assert_sums(goodput, 28.0 * 2)
    assert goodput.wall_s == 28.0
    first, second = goodput.by_attempt
    # Attempt 0, per rank: 0..2 before it and 2..4 spawn: startup 4; 4..5 dist_init; 5..6 first step;
    # 6..10 training (the samples' shares); 10..11 stopping.
    assert first["seconds"]["startup"] == pytest.approx(4 * 2)
    assert first["seconds"]["dist_init"] == pytest.approx(1 * 2)
    assert first["seconds"]["first_step"] == pytest.approx(1 * 2)
    for cause, share in SHARES.items():
        assert first["seconds"][cause] == pytest.approx(4 * share * 2)
    assert first["seconds"]["stopping"] == pytest.approx(1 * 2)
    assert first["seconds"]["restarting"] == first["seconds"]["lost_work"] == 0
    # Attempt 1: 11..13 restarting; 13..15 startup; 17..19 lost work; 19..25 training; 25..27 stopping
    # and the run's tail 27..28.
    assert second["seconds"]["restarting"] == pytest.approx(2 * 2)
    assert second["seconds"]["startup"] == pytest.approx(2 * 2)
    assert second["seconds"]["lost_work"] == pytest.approx(2 * 2)
    for cause, share in SHARES.items():
        assert second["seconds"][cause] == pytest.approx(6 * share * 2)
    assert second["seconds"]["stopping"] == pytest.approx(3 * 2)
    assert goodput.total["unaccounted"] == pytest.approx(0.0, abs=1e-9)
    assert goodput.share == pytest.approx((2 + 3) * 2 / 56)
    assert goodput.by_rank[0] == pytest.approx(goodput.by_rank[1])
    assert sum(goodput.by_rank[0].values()) == pytest.approx(28.0)
    assert Goodput.from_dict(json.loads(json.dumps(goodput.as_dict()))) == goodput


def test_each_sample_weighs_the_time_it_covers():
    ledger = GoodputLedger()
    ledger.run_started(0.0, 1)
    ledger.attempt_started(0, 0.0, 1)
    ledger.report(0, 0, 0.0)  # no phases told: start-up takes no time, training from the first report
    ledger.sample(0, 0, 1.0, 1.0, 0.0, 0.0, 0.0)  # 0..1: compute only
    ledger.sample(0, 0, 4.0, 1.0, 0.0, 0.0, 1.0)  # 1..4: data wait only
    ledger.attempt_ended(0, 4.0)
    ledger.run_ended(4.0)
    goodput = ledger.snapshot(4.0)
    assert goodput.total["compute"] == pytest.approx(1.0) and goodput.total["data_wait"] == pytest.approx(3.0)
    assert goodput.total["startup"] == 0 and goodput.share == pytest.approx(0.25)


def test_a_resize_counts_each_attempt_at_its_own_size():
    ledger = GoodputLedger()
    ledger.run_started(0.0, 4)
    ledger.attempt_started(0, 0.0, 4)
    start_ranks(ledger, 0, 4, 0.0)  # first report at 3
    samples(ledger, 0, 4, [4.0, 5.0, 6.0, 7.0, 8.0, 9.0])
    ledger.stopping(0, 9.0)  # a host was lost: RESTARTING
    ledger.attempt_ended(0, 10.0)
    ledger.attempt_started(1, 12.0, 2)  # on the 2 ranks left
    start_ranks(ledger, 1, 2, 12.0)
    samples(ledger, 1, 2, [16.0, 17.0, 18.0, 19.0])
    ledger.stopping(1, 19.0)
    ledger.attempt_ended(1, 20.0)
    ledger.run_ended(20.0)
    goodput = ledger.snapshot(20.0)
    assert_sums(goodput, 4 * 10.0 + 2 * 10.0)
    first, second = goodput.by_attempt
    assert (first["world_size"], second["world_size"]) == (4, 2)
    assert second["seconds"]["restarting"] == pytest.approx(2 * 2)  # 10..12, the new size's ranks
    assert first["seconds"]["compute"] == pytest.approx(6 * 0.5 * 4)
    assert second["seconds"]["compute"] == pytest.approx(4 * 0.5 * 2)
    # Ranks 2 and 3 were only in attempt 0.
    assert sum(goodput.by_rank[3].values()) == pytest.approx(10.0)
    assert sum(goodput.by_rank[1].values()) == pytest.approx(20.0)


def test_a_run_that_waited_for_hosts_counts_the_wait_before_its_first_attempt():
    ledger = GoodputLedger()
    ledger.waited(100.0, 130.0)  # before the run started, as fit() does it
    ledger.run_started(131.0, 2)
    ledger.attempt_started(0, 133.0, 2)
    start_ranks(ledger, 0, 2, 133.0)  # first report at 136
    samples(ledger, 0, 2, [137.0, 138.0, 139.0, 140.0])
    ledger.phase(0, 0, "FINISHING", 140.0)
    ledger.phase(0, 1, "FINISHING", 140.0)
    ledger.attempt_ended(0, 141.0)
    ledger.run_ended(141.0)
    goodput = ledger.snapshot(141.0)
    assert goodput.wall_s == pytest.approx(41.0)
    assert_sums(goodput, 41.0 * 2)
    assert goodput.total["resource_wait"] == pytest.approx(30.0 * 2)
    assert goodput.total["startup"] == pytest.approx((3.0 + 1.0) * 2)  # 130..133 placing, 133..134 spawn
    assert goodput.total["restarting"] == 0 and goodput.total["stopping"] == pytest.approx(1.0 * 2)


def test_a_run_that_never_got_its_hosts_is_all_resource_wait_and_start_up():
    ledger = GoodputLedger()
    ledger.waited(0.0, 10.0)
    ledger.run_started(10.0, 3)
    ledger.run_ended(12.0)
    goodput = ledger.snapshot(12.0)
    assert_sums(goodput, 12.0 * 3)
    assert goodput.total["resource_wait"] == pytest.approx(30.0) and goodput.total["startup"] == pytest.approx(6.0)
    assert goodput.by_attempt == () and goodput.share == 0.0


def test_training_without_telemetry_is_unaccounted_never_dropped():
    ledger = GoodputLedger()
    ledger.run_started(0.0, 2)
    ledger.attempt_started(0, 0.0, 2)
    start_ranks(ledger, 0, 2, 0.0)  # first report at 3, and no sample (MINITRAIN_TELEMETRY=0)
    ledger.attempt_ended(0, 10.0)
    ledger.run_ended(10.0)
    goodput = ledger.snapshot(10.0)
    assert_sums(goodput, 20.0)
    assert goodput.total["unaccounted"] == pytest.approx(7.0 * 2) and goodput.total["compute"] == 0


def test_a_running_attempt_counts_up_to_now():
    ledger = GoodputLedger()
    ledger.run_started(0.0, 1)
    ledger.attempt_started(0, 1.0, 1)
    ledger.report(0, 0, 2.0)
    ledger.sample(0, 0, 3.0, 1.0, 0.0, 0.0, 0.0)
    goodput = ledger.snapshot(5.0)
    assert_sums(goodput, 5.0)
    assert goodput.total["compute"] == pytest.approx(3.0) and goodput.by_attempt[0]["ended_at"] is None
    ledger.attempt_ended(0, 6.0)
    assert ledger.snapshot(8.0).total["restarting"] == pytest.approx(2.0)  # waiting for the next attempt


def test_the_line_names_the_causes_above_a_tenth_of_a_percent_largest_first():
    total = dict.fromkeys(CAUSES, 0.0)
    total.update(compute=931.0, restarting=42.0, report_wait=15.0, data_wait=11.5, stopping=0.5)
    text = line(total, 1000.0, 0.931)
    assert text == "goodput 93.1%: compute 93.1%, restarting 4.2%, report_wait 1.5%, data_wait 1.1%"


def test_the_monitor_keeps_the_ledger_and_rebuilds_it_from_the_run_directory(tmp_path):
    storage = Storage.for_run(str(tmp_path), "exp")
    storage.makedirs()
    now = [0.0]
    monitor = RunMonitor(storage, clock=lambda: now[0])

    def at(t):
        now[0] = t

    at(0.0)
    monitor.note_waiting("waiting for 2 CPUs on h0")
    at(5.0)
    monitor.note_waiting(None)
    monitor.on_run_start(RunInfo("rid", "exp", "/runs/exp", 2, 6.0))
    for attempt, start in ((0, 8.0), (1, 20.0)):
        at(start)
        monitor.on_state(S.PENDING if attempt == 0 else S.RESTARTING, S.STARTING, "start", attempt)
        monitor.on_attempt_start(AttemptInfo(attempt, ("h0", "h0"), start))
        for rank in (0, 1):
            for offset, phase in ((1, "STARTUP"), (2, "DIST_INIT"), (3, "TRAINING")):
                at(start + offset)
                monitor.on_worker_phase(attempt, rank, phase)
        at(start + 4)
        for rank in (0, 1):
            monitor.on_report(ReportRecord(attempt, rank, 0, "{}", start + 4))
        for i in range(1, 5):
            for rank in (0, 1):
                monitor.on_telemetry(TelemetrySample(attempt, rank, start + 4 + i, i, 1.0, 0.25, 0.0, 0.25))
            monitor.on_round(RoundInfo(attempt, 10 * attempt + i, ({}, {}), None, start + 4 + i,
                                       redone=attempt == 1 and i <= 2))
        at(start + 9)
        monitor.on_state(S.RUNNING, S.RESTARTING if attempt == 0 else S.STOPPING, "stop", attempt)
        monitor.on_attempt_end(AttemptEnd(attempt, (), "", attempt == 0, start + 10))
    at(31.0)
    monitor.on_run_end(RunOutcome(state=S.SUCCEEDED, attempt=1, last_metrics=None))

    live = monitor.goodput()
    assert live["wall_s"] == pytest.approx(31.0)
    assert sum(live["total"].values()) == pytest.approx(31.0 * 2)
    assert live["total"]["resource_wait"] == pytest.approx(5.0 * 2)
    assert live["total"]["lost_work"] == pytest.approx(2.0 * 2)  # attempt 1's first report 24 .. round at 26
    assert live["total"]["restarting"] == pytest.approx(2.0 * 2)  # 18 .. 20
    assert live["total"]["dist_init"] == pytest.approx(1.0 * 2 * 2)
    assert live["total"]["compute"] == pytest.approx((5 + 3) * 0.5 * 2)
    assert [a["attempt"] for a in live["by_attempt"]] == [0, 1]
    rebuilt = RunMonitor.from_run_dir(storage)
    assert rebuilt.goodput() == live
    assert all("timing" not in a for a in rebuilt.attempts())  # the ledger's facts are no attempts() field


def test_the_dashboard_and_prometheus_show_the_ledger():
    from minitrain.dashboard.api import api_view
    from minitrain.dashboard.pages import goodput_html, parts
    from minitrain.dashboard.prometheus import exposition, registry_for

    monitor = RunMonitor(clock=lambda: 28.0)
    ledger = GoodputLedger()
    restart_from_an_older_checkpoint(ledger)
    monitor._ledger = ledger  # the monitor's own feeding is checked above; here: what the views show
    assert api_view(monitor, "goodput", {}) == ledger.snapshot(28.0).as_dict()
    section = parts(monitor, live=False)["goodput"]
    assert section.startswith('<div id="goodput">') and "goodput 17.9%: " in section
    assert "<td>0</td><td>2</td>" in section and '<tr class="total"><td>total</td>' in section
    assert "<th>lost_work</th>" in section and "<th>resource_wait</th>" not in section  # causes that had time
    assert "nothing measured yet" in goodput_html(None)
    text = exposition(registry_for(monitor)).decode()
    assert 'minitrain_train_goodput_seconds{cause="lost_work",ray_train_run_id="",ray_train_run_name=""} 4.0' in text
    assert 'minitrain_train_goodput_ratio{ray_train_run_id="",ray_train_run_name=""} 0.178' in text


def test_the_commits_mark_the_rounds_an_attempt_redoes_after_resuming_from_an_older_checkpoint(tmp_path):
    """What the ledger's lost_work rests on: `RoundInfo.redone`, as the coordinator's commits tell it."""
    from minitrain.config import CheckpointConfig
    from minitrain.coordinator.facts.attempt import AttemptTracker
    from minitrain.coordinator.facts.commits import Commits
    from minitrain.coordinator.facts.metrics_log import MetricsLog
    from minitrain.coordinator.observers import Observers
    from minitrain.records import WorkerAssignment
    from minitrain.storage.checkpoint_manager import CheckpointManager

    storage = Storage.for_run(str(tmp_path), "run")
    storage.makedirs()
    rounds: list = []

    class Tap:
        def on_round(self, round_):
            rounds.append((round_.attempt, round_.redone))

    commits = Commits(CheckpointManager.load(storage, CheckpointConfig()), MetricsLog(storage), outbox=None,
                      observers=Observers([Tap()]))

    def attempt(number: int, count: int, checkpoint_at: int = -1) -> None:
        commits.start_attempt(world_size=1)
        tracker = AttemptTracker.create(number, [WorkerAssignment(0, 0, 1, 1, 0, "n0")], {"n0": "h0"})
        for r in range(count):
            name = ""
            if r == checkpoint_at:
                name = f"checkpoint_a{number}_r{r}"
                (tmp_path / "run" / name).mkdir()
                (tmp_path / "run" / name / "state").write_text(str(r))
            commits.on_reports(tracker, (ReportRecord(number, 0, r, "{}", 1.0, checkpoint_dir_name=name),))

    attempt(0, 5, checkpoint_at=1)  # steps 0-4, a checkpoint after step 1
    attempt(1, 4)  # resumed after step 1: steps 2-4 redone, step 5 new
    assert rounds == [(0, False)] * 5 + [(1, True)] * 3 + [(1, False)]
