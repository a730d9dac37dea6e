"""A real sweep (its trial a real process) on a pseudo-terminal that is the driver's stderr: the trial
table goes through the driver's LiveConsole, above the status block of a fit() running meanwhile, and
the sweep leaves the terminal's status block free when it ends."""

from __future__ import annotations

import os
import pty
import re
import sys
import time

import minitrain
from minitrain import tune
from minitrain.driver import console as console_module
from minitrain.driver.console import LiveConsole

ERASE = "\x1b[1A\x1b[2K"


def screen_of(master: int, last: str, timeout_s: float = 30.0) -> list[str]:
    """What the terminal shows (an erase removes the line above) once its last line is `last`."""
    received, deadline = b"", time.monotonic() + timeout_s
    os.set_blocking(master, False)
    while True:
        try:
            received += os.read(master, 65536)
        except BlockingIOError:
            pass
        lines: list[str] = []
        for token in re.split(r"(\x1b\[1A\x1b\[2K|\n)", received.decode().replace("\r\n", "\n")):
            if token == ERASE:
                lines.pop()
            elif token and token != "\n":
                lines.append(token)
        if (lines and lines[-1] == last) or time.monotonic() > deadline:
            return lines
        time.sleep(0.01)


def one_report(config):
    tune.report({"loss": config["x"]})


def test_a_sweep_writes_its_table_through_the_console_and_frees_the_block(tmp_path, monkeypatch):
    master, slave = pty.openpty()
    out = open(slave, "w", buffering=1, encoding="utf-8")
    monkeypatch.delenv("MINITRAIN_STATUS", raising=False)
    monkeypatch.setenv("MINITRAIN_DASHBOARD", "0")
    monkeypatch.setattr(sys, "stderr", out)
    fit_console = LiveConsole.for_driver()  # a fit() on another thread draws the block
    try:
        fit_console.show(["minitrain: run A | step 1"])
        results = tune.Tuner(one_report, param_space={"x": 0.5},
                             tune_config=tune.TuneConfig(metric="loss", mode="min"),
                             run_config=minitrain.RunConfig(name="sweep", storage_path=str(tmp_path))).fit()
        assert results.num_terminated == 1
        fit_console.show(["minitrain: run A | step 2"])
        screen = screen_of(master, "minitrain: run A | step 2")
        # The sweep's lines and last table went above the fit's block, which was drawn again below them.
        assert screen[-1] == "minitrain: run A | step 2" and "minitrain: run A | step 1" not in screen
        started = [line for line in screen if re.fullmatch(r"Trial \S+ RUNNING with config \{'x': 0\.5\}", line)]
        ended = [line for line in screen if re.fullmatch(r"Trial \S+ TERMINATED after 1 iterations, loss=0\.5", line)]
        assert len(started) == 1 and len(ended) == 1, screen
        assert screen.index(started[0]) < screen.index(ended[0]) < screen.index("Trial status: 1 TERMINATED")
        # The last table gives the trial's start-up cost (process start to first result).
        header = screen[screen.index("Trial status: 1 TERMINATED") + 1]
        assert header.split()[-1] == "start-up" and re.search(r"\b0:00:\d\d\s*$", screen[-2]), screen
    finally:
        fit_console.release()
        out.close()
        os.close(master)
    assert console_module._block_owner is None  # the sweep holds no block after its end
