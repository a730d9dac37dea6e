"""A Tune trial's start-up shows: the state file keeps when a trial's process started
and how long it took to its first result; the console's table and the sweep page say "starting for
0:00:07" until then (with what the trial's fit() is doing, which its run observer forwards), and the cost
after. Files written before these fields still read."""

from __future__ import annotations

import json

import pytest

from minitrain.coordinator.observers import AttemptInfo
from minitrain.dashboard.sweep import page_html, trial_rows
from minitrain.run_state import RunState
from minitrain.storage import sweep_state as tr
from minitrain.tune import messages
from minitrain.tune.messages import TrialStarting
from minitrain.tune.progress import render_table
from minitrain.tune.session import ForwardingObserver, TrialSession, TuneContext

HEADER = {"name": "sweep", "trainable": "train", "metric": "loss", "mode": "min", "id_prefix": "abcde",
          "num_samples": 3, "total_trials": 3}


def _trials() -> list[tr.Trial]:
    """A trial starting for 7 s (at now=1007), one whose first result came 12.5 s after its start, and
    one never started."""
    starting = tr.new_trial("abcde_00000", "t0", "t0", {"x": 1}, 0)
    starting.status, starting.started_at = tr.TrialStatus.RUNNING, 1000.0
    running = tr.new_trial("abcde_00001", "t1", "t1", {"x": 2}, 1)
    running.status, running.started_at, running.startup_s, running.iteration = tr.TrialStatus.RUNNING, 990.0, 12.5, 3
    pending = tr.new_trial("abcde_00002", "t2", "t2", {"x": 3}, 2)
    return [starting, running, pending]


def test_the_start_up_cell_says_starting_until_the_first_result_then_the_cost():
    starting, running, pending = _trials()
    assert tr.startup_cell(starting, now=1007.9) == "starting for 0:00:07"
    assert tr.startup_cell(starting, now=1000.0 + 3725) == "starting for 1:02:05"
    assert tr.startup_cell(running, now=5000.0) == "0:00:12"
    assert tr.startup_cell(pending, now=1007.0) == ""
    starting.status = tr.TrialStatus.ERROR  # failed before its first result: no longer starting
    assert tr.startup_cell(starting, now=1007.0) == ""


def test_the_console_table_has_a_start_up_column_once_a_trial_started():
    lines = render_table(_trials(), "loss", now=1007.0).splitlines()
    assert lines[1].split()[-1] == "start-up"
    assert lines[3].endswith("starting for 0:00:07") and lines[4].rstrip().endswith("0:00:12")
    never = [tr.new_trial("abcde_00000", "t0", "t0", {"x": 1}, 0)]
    assert "start-up" not in render_table(never, "loss")  # nothing started: the table as before


def test_the_sweep_page_and_its_json_show_the_start_up():
    rows = trial_rows(HEADER, _trials(), now=1007.0)
    assert [(r["started_at"], r["startup_s"], r["startup"]) for r in rows] == [
        (1000.0, None, "starting for 0:00:07"), (990.0, 12.5, "0:00:12"), (None, None, "")]
    page = page_html(HEADER, _trials(), live=True, now=1007.0)
    assert "<th>Start-up</th>" in page and "<td>starting for 0:00:07</td>" in page and "<td>0:00:12</td>" in page


def test_the_state_file_keeps_the_start_up_and_older_files_still_read(tmp_path):
    tr.write_state(str(tmp_path), HEADER, _trials())
    _, back = tr.read_state(str(tmp_path))
    assert [(t.started_at, t.startup_s) for t in back] == [(1000.0, None), (990.0, 12.5), (None, None)]
    data = json.loads((tmp_path / tr.STATE_FILE).read_text())
    for record in data["trials"]:  # as a file written before the fields existed
        del record["started_at"], record["startup_s"]
    (tmp_path / tr.STATE_FILE).write_text(json.dumps(data))
    _, old = tr.read_state(str(tmp_path))
    assert [(t.started_at, t.startup_s) for t in old] == [(None, None)] * 3


@pytest.mark.parametrize("field, value", [("started_at", "yesterday"), ("startup_s", -1.0), ("startup_s", True),
                                          ("started_at", 1e400)])
def test_a_start_up_field_of_the_wrong_kind_is_refused_naming_it(tmp_path, field, value):
    tr.write_state(str(tmp_path), HEADER, _trials())
    data = json.loads((tmp_path / tr.STATE_FILE).read_text())
    data["trials"][1][field] = value
    (tmp_path / tr.STATE_FILE).write_text(json.dumps(data))
    with pytest.raises(ValueError, match=rf"trials\[1\]\.{field}"):
        tr.read_state(str(tmp_path))


def test_the_start_up_cell_names_what_the_fit_is_doing_while_it_starts():
    starting, running, _ = _trials()
    starting.startup_phase = "rendezvous (process-group init)"
    assert tr.startup_cell(starting, now=1007.0) == "starting for 0:00:07: rendezvous (process-group init)"
    running.startup_phase = "rendezvous (process-group init)"  # its first result came: the cost only
    assert tr.startup_cell(running, now=5000.0) == "0:00:12"


def test_the_state_file_keeps_the_start_up_phase_and_refuses_one_that_is_not_text(tmp_path):
    trials = _trials()
    trials[0].startup_phase = "starting node agents"
    tr.write_state(str(tmp_path), HEADER, trials)
    assert [t.startup_phase for t in tr.read_state(str(tmp_path))[1]] == ["starting node agents", "", ""]
    data = json.loads((tmp_path / tr.STATE_FILE).read_text())
    data["trials"][0]["startup_phase"] = 3
    (tmp_path / tr.STATE_FILE).write_text(json.dumps(data))
    with pytest.raises(ValueError, match=r"trials\[0\]\.startup_phase"):
        tr.read_state(str(tmp_path))


class _Pipe:
    """The trial's report pipe, as lines (the tuner's end)."""

    def __init__(self):
        self.lines = []

    def write(self, line):
        self.lines.append(line)

    def flush(self):
        pass


def test_a_trials_fit_forwards_each_start_up_phase_once_until_its_first_round():
    pipe = _Pipe()
    observer = ForwardingObserver(TrialSession(TuneContext(), pipe, None, None, 0))
    observer.on_state(RunState.PENDING, RunState.LAUNCHING, "", 0)
    observer.on_attempt_start(AttemptInfo(0, ("h0", "h0"), 0.0))
    observer.on_state(RunState.LAUNCHING, RunState.STARTING, "", 0)
    observer.on_worker_phase(0, 0, "STARTUP")  # rank 1 has not connected: still spawning
    observer.on_worker_phase(0, 1, "STARTUP")
    observer.on_worker_phase(0, 0, "DIST_INIT")
    observer.on_worker_phase(0, 1, "DIST_INIT")
    observer.on_worker_phase(7, 1, "TRAINING")  # another attempt's rank: not this one's phase
    observer.on_state(RunState.STARTING, RunState.RUNNING, "", 0)
    observer.on_round(type("Round", (), {"metrics_by_rank": None})())
    observer.on_state(RunState.RUNNING, RunState.RESTARTING, "", 0)  # after the first round: not sent
    sent = [messages.decode(line) for line in pipe.lines]
    assert sent == [TrialStarting("starting node agents"),
                    TrialStarting("spawning workers (starting Python, importing torch and your script)"),
                    TrialStarting("workers connected, loading the training function"),
                    TrialStarting("rendezvous (process-group init)"),
                    TrialStarting("waiting for the first step (report())")]
