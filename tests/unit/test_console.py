"""The live console: a status block redrawn in place on a real pseudo-terminal,
worker and log lines never torn by it, one summary line at a time on a pipe, and a console that
cannot be written never breaking anything."""

from __future__ import annotations

import logging
import os
import re
import threading
from types import SimpleNamespace

import pytest

import minitrain
from minitrain.coordinator.observers import RoundInfo
from minitrain.driver.console import LiveConsole, status_mode
from minitrain.driver.logs import LogSink
from minitrain.errors import ConfigError
from minitrain.monitoring.console_status import ConsoleStatus, line_interval_s, status_parts
from minitrain.monitoring.monitor import RunMonitor
from minitrain.monitoring.stragglers import StragglerRule
from minitrain.records import RunOutcome
from minitrain.run_state import RunState

from terminal_support import terminal
from test_monitor import drive, moves  # noqa: E402 - a run fed to a monitor: 2 ranks, rank 1 3x slower


def test_the_mode_follows_the_terminal_and_the_environment(terminal):
    read_end, write_end = os.pipe()
    with open(read_end) as r, open(write_end, "w") as w:
        assert status_mode({}, terminal.out) == "block" and status_mode({}, w) == "lines"
        assert status_mode({"MINITRAIN_STATUS": "lines"}, terminal.out) == "lines"
        assert status_mode({"MINITRAIN_STATUS": "0"}, terminal.out) is None
    assert line_interval_s({}) == 30.0 and line_interval_s({"MINITRAIN_STATUS_INTERVAL_S": "5"}) == 5.0
    with pytest.raises(ConfigError, match="MINITRAIN_STATUS_INTERVAL_S='soon'"):
        line_interval_s({"MINITRAIN_STATUS_INTERVAL_S": "soon"})


def test_worker_lines_go_above_the_block_which_is_redrawn_in_place(terminal):
    console = LiveConsole("block", stdout=terminal.out, stderr=terminal.out)
    sink = LogSink("/nonexistent-logs", stdout=terminal.out, stderr=terminal.out, live=console)
    sink._files[(0, 0)] = None  # no log file in this test: the console is what is tested
    console.show(["status 1", "steps 1"])
    sink.write(0, 0, "host", False, ["hello", "world"])
    console.show(["status 2", "steps 2"])
    sink.write(0, 0, "host", True, ["warn"])
    assert terminal.screen() == ["(rank 0, host) hello", "(rank 0, host) world", "(rank 0, host) warn",
                                 "status 2", "steps 2"]
    console.finish(["final"])
    sink.write(0, 0, "host", False, ["after"])  # the final status stays; later output goes below it
    assert terminal.screen()[-2:] == ["final", "(rank 0, host) after"]


def test_concurrent_output_is_never_torn_by_the_status(terminal):
    console = LiveConsole("block", stdout=terminal.out, stderr=terminal.out)
    sink = LogSink("/nonexistent-logs", stdout=terminal.out, stderr=terminal.out, live=console)
    for rank in range(3):
        sink._files[(0, rank)] = None
    stop = threading.Event()

    def status():
        n = 0
        while not stop.is_set():
            n += 1
            console.show([f"status {n}", f"ranks {n}"])

    def worker(rank):
        for i in range(200):
            sink.write(0, rank, "h", False, [f"line {i} of rank {rank}"])

    drawer = threading.Thread(target=status)
    drawer.start()
    workers = [threading.Thread(target=worker, args=(r,)) for r in range(3)]
    for w in workers:
        w.start()
    chunks = []
    while any(w.is_alive() for w in workers):
        chunks.append(terminal.read())  # keep the pty's buffer from filling up
        for w in workers:
            w.join(0.01)
    stop.set()
    while drawer.is_alive():  # still read: on a full pty buffer its write would block and it would never stop
        chunks.append(terminal.read())
        drawer.join(0.01)
    screen = terminal.screen()
    worker_lines = [line for line in screen if not line.startswith(("status", "ranks"))]
    for rank in range(3):
        mine = [line for line in worker_lines if line.endswith(f"of rank {rank}")]
        assert mine == [f"(rank {rank}, h) line {i} of rank {rank}" for i in range(200)]
    assert len(worker_lines) == 600  # nothing else: no torn or merged line
    assert [line.split()[0] for line in screen[-2:]] == ["status", "ranks"]


def test_log_lines_go_through_the_console_while_it_owns_the_handlers(terminal):
    console = LiveConsole("block", stdout=terminal.out, stderr=terminal.out)
    logger = logging.getLogger("minitrain.test_console")
    logger.propagate = False
    handler = logging.StreamHandler(terminal.out)
    logger.addHandler(handler)
    try:
        console.show(["status"])
        with console.owning_log_handlers(logger):
            logger.warning("a warning")
        assert handler.stream is terminal.out
        assert terminal.screen() == ["a warning", "status"]
    finally:
        logger.removeHandler(handler)


def test_a_closed_console_breaks_nothing(tmp_path, caplog):
    read_end, write_end = os.pipe()
    stream = open(write_end, "w")
    console = LiveConsole("block", stdout=stream, stderr=stream)
    sink = LogSink(str(tmp_path), stdout=stream, stderr=stream, live=console)
    console.show(["status"])
    os.close(read_end)
    stream.close()
    with caplog.at_level(logging.WARNING, logger="minitrain"):
        sink.write(0, 0, "h", False, ["still logged"])
    assert sink.console_detached and "cannot be written" in caplog.text
    console.show(["more"])  # the status turns itself off instead of raising
    console.finish(["done"])
    assert console.mode is None
    assert (tmp_path / "attempt_0" / "rank_0.log").read_text() == "still logged\n"
    sink.close()


def test_off_a_terminal_the_status_is_a_summary_line_at_a_time(tmp_path):
    read_end, write_end = os.pipe()
    reader = open(read_end)
    writer = open(write_end, "w")
    monitor = RunMonitor(None, rule=StragglerRule(factor=1.5, window=5, min_samples=3), clock=lambda: 40.0)
    console = LiveConsole(status_mode({}, writer), stdout=writer, stderr=writer)
    status = ConsoleStatus(monitor, console, line_every_s=0.05, clock=lambda: 40.0)
    drive(monitor)  # attempt 1 of a 20-step run, 4 steps done at 1 step/s, rank 1 3x slower
    status.on_run_start(None)
    first = reader.readline()
    # The driver commits the last 16 rounds at once (a late rank's reports caught up), 2 us apart.
    for index in range(4, 20):
        monitor.on_round(RoundInfo(1, index, ({"loss": 0.1}, None), None, 39.9 + index * 2e-6))
    moves(monitor, 1, RunState.RUNNING, RunState.STOPPING, RunState.SUCCEEDED)
    monitor.on_run_end(RunOutcome(state=RunState.SUCCEEDED, attempt=1, last_metrics=None))
    status.on_run_end(RunOutcome(state=RunState.SUCCEEDED, attempt=1, last_metrics=None))
    writer.close()
    rest = reader.read().splitlines()
    reader.close()
    # 3 rounds since the first (at 30 s) in the 10 s to now (40 s): 0.30 steps/s, 16 to go.
    assert first.startswith("minitrain: exp | attempt 1 RUNNING | 0:00:30 elapsed | 4/20 steps (20.0%) | "
                            "0.30 steps/s | ETA 0:00:53 | step time excl. waits min 0.100 s")
    assert "(slowest: rank 1)" in first and "straggler: rank 1 on host1 3.0x slower (compute)" in first
    assert "last checkpoint checkpoint_000003 (0:00:06 ago)" in first
    assert rest and all(line.startswith("minitrain: exp") for line in rest)
    # The last line: the whole run's rate, 20 steps in its 30 s (not 15 rounds over 30 us).
    assert rest[-1].startswith("minitrain: exp | attempt 1 FINISHED | 0:00:30 elapsed | 20/20 steps (100.0%) | "
                               "0.67 steps/s | step time excl. waits")


def test_the_status_parts_without_a_total_or_a_rate():
    run = {"name": "r", "attempt": 0, "state": "STARTING", "started_at": 0.0, "ended_at": None, "rounds": 0,
           "total": None, "steps_per_s": None, "eta_s": None, "progress": None}
    # Until the first step, the steps part is what start-up is doing (not "0 steps | - steps/s").
    assert status_parts(run, [], [], [], 3725.0) == [
        "minitrain: r | attempt 0 STARTING | 1:02:05 elapsed",
        "starting: spawning workers (starting Python, importing torch and your script)"]
    stepping = dict(run, state="RUNNING", rounds=3, state_since=3700.0)
    assert status_parts(stepping, [], [], [], 3725.0) == [
        "minitrain: r | attempt 0 RUNNING | 1:02:05 elapsed", "3 steps | - steps/s"]
    resized = [{"attempt": 1, "from_workers": 2, "to_workers": 1, "reason": "host h1 lost (x)", "time": 1.0}]
    assert status_parts(stepping, [], [], [], 3725.0, resizes=resized)[-1] == \
        "1 worker since attempt 1 (resized from 2: host h1 lost (x))"  # an elastic run's latest resize


def test_the_start_up_line_names_the_least_advanced_ranks_phase_and_its_time():
    run = {"name": "r", "attempt": 0, "state": "STARTING", "started_at": 0.0, "ended_at": None, "rounds": 0,
           "state_since": 2.0}
    ranks = [{"rank": 0, "phase": "TRAINING"}, {"rank": 1, "phase": "DIST_INIT"}, {"rank": 2, "phase": "DIST_INIT"}]
    assert status_parts(run, ranks, [], [], 9.0)[1] == "starting: rendezvous (process-group init), 2/3 ranks, for 0:00:07"
    launching = dict(run, state="LAUNCHING")
    assert status_parts(launching, [], [], [], 9.0)[1] == "starting: starting node agents, for 0:00:07"
    running = dict(run, state="RUNNING")
    assert status_parts(running, ranks, [], [], 9.0)[1] == "starting: waiting for the first step (report()), for 0:00:07"


def test_set_progress_total_takes_a_positive_int_inside_a_training_function():
    from minitrain import _session, waits
    from minitrain.context import TrainContext

    with pytest.raises(RuntimeError, match="set_progress_total"):
        minitrain.set_progress_total(10)
    _session.set_current(SimpleNamespace(context=TrainContext(experiment_name="t", local_mode=True)))
    try:
        for bad in (0, -3, 2.5, True, "10"):
            with pytest.raises(ValueError, match=f"set_progress_total\\(total={re.escape(repr(bad))}\\)"):
                minitrain.set_progress_total(bad)
        minitrain.set_progress_total(120)
        assert waits.declared_total() == 120
    finally:
        _session.set_current(None)
        waits.reset()
