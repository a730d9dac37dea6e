"""A real sweep whose trial takes a while before its first result: while it starts,
the sweep's state file, its page's rows and the console's table say "starting for H:MM:SS"; after its
first result they give how long that took."""

from __future__ import annotations

import os
import re
import threading
import time

import minitrain
from minitrain import tune
from minitrain.dashboard.sweep import read_sweep, trial_rows
from minitrain.tune.progress import render_table

DEADLINE_S = 120.0


def slow_to_start(config):
    """Start-up that lasts until the test has seen it (a slow import, a dataset download)."""
    deadline = time.monotonic() + config["deadline_s"]
    while not os.path.exists(config["release"]) and time.monotonic() < deadline:
        time.sleep(0.05)
    tune.report({"loss": 1.0})


def test_a_trial_shows_starting_until_its_first_result_then_its_start_up_cost(tmp_path, monkeypatch):
    monkeypatch.setenv("MINITRAIN_DASHBOARD", "0")
    monkeypatch.setenv("MINITRAIN_STATUS", "0")
    path, release = tmp_path / "sweep", tmp_path / "release"
    seen: dict = {}

    def watch():
        try:
            deadline = time.monotonic() + DEADLINE_S
            while time.monotonic() < deadline:
                if path.is_dir():
                    header, trials = read_sweep(str(path))
                    rows = trial_rows(header, trials)
                    if rows and rows[0]["startup"].startswith("starting for ") and time.time() - rows[0]["started_at"] > 1.5:
                        seen["row"], seen["table"] = rows[0], render_table(trials, "loss")
                        return
                time.sleep(0.1)
        finally:
            release.touch()

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    results = tune.Tuner(slow_to_start, param_space={"release": str(release), "deadline_s": DEADLINE_S},
                         tune_config=tune.TuneConfig(metric="loss", mode="min"),
                         run_config=minitrain.RunConfig(name="sweep", storage_path=str(tmp_path))).fit()
    watcher.join(DEADLINE_S)
    assert results.num_terminated == 1
    assert re.fullmatch(r"starting for 0:00:0\d", seen["row"]["startup"]), seen
    assert seen["row"]["startup_s"] is None and "starting for 0:00:0" in seen["table"]
    _, [trial] = read_sweep(str(path))
    assert trial.startup_s is not None and trial.startup_s >= 1.5  # the cost, kept after the first result
    assert re.fullmatch(r"0:00:\d\d", trial_rows({}, [trial])[0]["startup"])
