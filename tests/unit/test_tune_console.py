"""The tune trial table goes through the driver's LiveConsole (minitrain.driver.console), like fit()'s status:
on a real pseudo-terminal it is the one status block, redrawn in place, with a concurrent fit()'s
worker lines and status lines above it and nothing torn; while a fit() holds the block, the sweep's
lines and final table go above that block; status off shows nothing; a closed console breaks nothing.
(A real Tuner.fit() on a pseudo-terminal: tests/process/test_tune_on_a_terminal.py.)"""

from __future__ import annotations

import os
import sys
import threading
import time

import pytest

from minitrain.driver import console as console_module
from minitrain.driver.console import LiveConsole
from minitrain.driver.logs import LogSink
from minitrain.storage import sweep_state as tr
from minitrain.tune.progress import ProgressReporter, render_table
from terminal_support import screen_ending_with, terminal


@pytest.fixture(autouse=True)
def no_block_left_behind():
    yield
    left, console_module._block_owner = console_module._block_owner, None
    assert left is None, "a test left the terminal's status block taken"


def stderr_is(terminal, monkeypatch):
    """Make the pseudo-terminal the process's stderr, as for a driver run in a terminal (in the test's
    body: pytest's capture sets sys.stderr again between a fixture's setup and the test)."""
    monkeypatch.delenv("MINITRAIN_STATUS", raising=False)
    monkeypatch.setattr(sys, "stderr", terminal.out)


def make_trials(n: int, iteration: int = 0) -> list[tr.Trial]:
    trials = []
    for index in range(n):
        trial = tr.new_trial(f"abcde_{index:05d}", f"f_{index:05d}", f"f_{index:05d}", {"lr": 0.1 * (index + 1)}, index)
        trial.status = tr.TrialStatus.RUNNING
        trial.iteration, trial.last_result = iteration, {"loss": 1.0 / (iteration + 1)}
        trials.append(trial)
    return trials


def table(trials: list[tr.Trial]) -> list[str]:
    return render_table(trials, "loss").splitlines()


def test_on_a_terminal_the_table_is_the_status_block_redrawn_in_place(terminal, monkeypatch):
    stderr_is(terminal, monkeypatch)
    reporter = ProgressReporter("loss", interval_s=0)
    try:
        assert reporter.console.mode == "block"
        reporter.update(make_trials(2, iteration=1))
        reporter.trial_changed(make_trials(1)[0])  # no per-trial line: the table shows it
        reporter.update(make_trials(2, iteration=2))
        expected = table(make_trials(2, iteration=2))
        assert screen_ending_with(terminal, expected[-1]) == expected  # the first copy was erased
        done = make_trials(2, iteration=3)
        for trial in done:
            trial.status = tr.TrialStatus.TERMINATED
        reporter.finish(done)
        later = LiveConsole.for_driver()
        later.release()
        assert later.mode == "block"  # the sweep gave the block back...
    finally:
        reporter.release()
    terminal.out.write("after the sweep\n")
    terminal.out.flush()
    assert screen_ending_with(terminal, "after the sweep") == table(done) + ["after the sweep"]  # ...its table stays


def test_a_concurrent_fit_never_tears_the_table(terminal, monkeypatch):
    stderr_is(terminal, monkeypatch)
    reporter = ProgressReporter("loss", interval_s=0)  # the sweep started first: it draws the block
    fit_console = LiveConsole.for_driver()  # a fit() on another thread: lines, through the sweep's block
    sink = LogSink("/nonexistent-logs", stdout=terminal.out, stderr=terminal.out, live=fit_console)
    for rank in range(2):
        sink._files[(0, rank)] = None  # no log file in this test: the console is what is tested
    assert reporter.console.mode == "block" and fit_console.mode == "lines"

    def worker(rank):
        for i in range(150):
            sink.write(0, rank, "h", rank == 1, [f"line {i} of rank {rank}"])

    def fit_status():
        for i in range(100):
            fit_console.line(f"minitrain: run B | step {i}")

    # The pty's buffer is drained on a thread of its own: a writer holding the console's lock blocks
    # while the buffer is full, and a reader that needs that lock first (the table's update) would never
    # come back to drain it.
    writers_done = threading.Event()

    def drain():
        while not writers_done.is_set():
            terminal.read()
            time.sleep(0.002)

    drainer = threading.Thread(target=drain)
    drainer.start()
    threads = [threading.Thread(target=worker, args=(r,)) for r in range(2)] + [threading.Thread(target=fit_status)]
    for thread in threads:
        thread.start()
    iteration = 0
    try:
        while any(thread.is_alive() for thread in threads):
            iteration += 1
            reporter.update(make_trials(3, iteration))
        for thread in threads:
            thread.join()
    finally:
        writers_done.set()
        drainer.join()
    reporter.update(make_trials(3, iteration + 1))
    try:
        screen = screen_ending_with(terminal, table(make_trials(3, iteration + 1))[-1])
        # The table is whole, once, at the bottom; everything above it is the fit's, each line whole.
        assert screen[-len(table(make_trials(3))):] == table(make_trials(3, iteration + 1))
        above = screen[:-len(table(make_trials(3)))]
        for rank in range(2):
            assert [line for line in above if line.endswith(f"of rank {rank}")] == \
                [f"(rank {rank}, h) line {i} of rank {rank}" for i in range(150)]
        assert [line for line in above if line.startswith("minitrain:")] == \
            [f"minitrain: run B | step {i}" for i in range(100)]
        assert len(above) == 400  # nothing else: no torn, merged or left-over table line
    finally:
        fit_console.release()
        reporter.finish(make_trials(3, iteration + 1))


def test_while_a_fit_draws_the_block_the_sweep_writes_lines_above_it(terminal, monkeypatch):
    stderr_is(terminal, monkeypatch)
    fit_console = LiveConsole.for_driver()
    try:
        fit_console.show(["minitrain: run A | step 1"])
        reporter = ProgressReporter("loss")
        assert reporter.console.mode == "lines"
        trial = make_trials(1)[0]
        reporter.trial_changed(trial)
        reporter.update([trial])  # no table until the end
        fit_console.show(["minitrain: run A | step 2"])
        trial.status, trial.iteration, trial.last_result = tr.TrialStatus.TERMINATED, 3, {"loss": 0.25}
        reporter.trial_changed(trial)
        reporter.finish([trial])
        assert screen_ending_with(terminal, "minitrain: run A | step 2") == [
            f"Trial f_00000 RUNNING with config {trial.config}", "Trial f_00000 TERMINATED after 3 iterations, loss=0.25",
            *table([trial]), "minitrain: run A | step 2"]
        after = LiveConsole.for_driver()
        assert after.mode == "lines"  # the sweep's end did not free the fit's block
    finally:
        fit_console.release()


def test_status_off_or_verbose_0_shows_nothing_and_a_closed_console_breaks_nothing(terminal, monkeypatch):
    stderr_is(terminal, monkeypatch)
    trials = make_trials(2, iteration=1)
    quiet = ProgressReporter("loss", interval_s=0, verbose=0)
    quiet.update(trials)
    quiet.finish(trials)
    monkeypatch.setenv("MINITRAIN_STATUS", "0")
    off = ProgressReporter("loss", interval_s=0)
    off.trial_changed(trials[0])
    off.update(trials)
    off.finish(trials)
    terminal.out.write("end\n")
    terminal.out.flush()
    assert screen_ending_with(terminal, "end") == ["end"]
    read_end, write_end = os.pipe()
    stream = open(write_end, "w")
    closed = ProgressReporter("loss", console=LiveConsole("lines", stdout=stream, stderr=stream))
    os.close(read_end)
    stream.close()
    closed.trial_changed(trials[0])
    closed.finish(trials)  # the sweep goes on: the table turned itself off
    assert closed.console.mode is None
