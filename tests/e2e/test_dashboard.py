"""The dashboard of a real 2-worker run, in a real headless Chromium (Debian `chromium`): live while
fit() runs, then post hoc with `python -m minitrain.dashboard RUN_PATH` on the finished run.

Chromium renders the page and runs its script (uPlot draws into the DOM); the test reads the rendered
DOM (`--dump-dom`) and finds the rank table's rows and a metric plot. The training function reports
until the test, done with the live page, releases it through a file (no timing guesswork).
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import threading
import time
import urllib.request

import pytest

import minitrain
from minitrain import RunConfig, ScalingConfig
from minitrain.torch import TorchTrainer

from chromium_support import Chromium  # the `chromium` fixture is in tests/e2e/conftest.py
from dashboard_support import stop_dashboard_cli

pytestmark = pytest.mark.e2e

DEADLINE_S = 120.0  # generous: the machine is shared; every wait below ends as soon as its condition holds


def _train_until_released(config: dict) -> None:
    """Reports a falling loss every ~50 ms until the test writes the release file (bounded)."""
    deadline = time.monotonic() + config["deadline_s"]
    step = 0
    while time.monotonic() < deadline:
        step += 1
        minitrain.report({"loss": 1.0 / step, "step": step})
        if os.path.exists(config["release"]) and step >= 5:
            return
        time.sleep(0.05)
    raise TimeoutError("the test never released the run")


class _UrlCatcher(logging.Handler):
    """Catches the dashboard's one log line."""

    def __init__(self):
        super().__init__()
        self.url: str | None = None
        self.lines: list[str] = []
        self.seen = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        match = re.match(r"dashboard: (http://\S+) ", message)
        if match:
            self.url = match.group(1)
            self.lines.append(message)
            self.seen.set()


def _get_json(url: str):
    with urllib.request.urlopen(url, timeout=30) as response:
        return json.loads(response.read())


def _wait_for(condition, what: str):
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def _check_rendered(dom: str) -> None:
    """The rank table with both ranks and a drawn metric plot are in the rendered DOM."""
    assert '<table id="ranks">' in dom
    assert '<tr data-rank="0"' in dom and '<tr data-rank="1"' in dom
    plot = re.search(r'<div class="metric-plot" data-metric="loss">(.*?)</canvas>', dom, re.S)
    assert plot is not None and 'class="uplot' in plot.group(1), "uPlot drew no loss plot"
    assert re.search(r'id="timeline"[^>]*>\s*<div class="uplot', dom), "no step-time timeline"


def _live_checks(catcher: _UrlCatcher, chromium: Chromium, config: dict, found: dict) -> None:
    try:
        assert catcher.seen.wait(DEADLINE_S), "the dashboard never logged its address"
        url = catcher.url
        # Both ranks measured (telemetry at <= 1 Hz) and a few metrics reported: the page has data.
        _wait_for(lambda: all(r.get("step_time_s") for r in _get_json(url + "api/ranks")) and
                  len(_get_json(url + "api/ranks")) == 2 and len(_get_json(url + "api/metrics")) >= 3,
                  "both ranks' telemetry and three reports")
        found["dom"] = chromium.dom(url)
        found["screenshot"] = os.path.join(config["out"], "dashboard.png")
        chromium.screenshot(url, found["screenshot"])
        found["metrics_text"] = urllib.request.urlopen(url + "metrics", timeout=30).read().decode()
        request = urllib.request.Request(url + "api/ranks/1/stacks", method="POST",
                                         headers={"X-Minitrain-Dashboard": "1"})
        found["stacks"] = urllib.request.urlopen(request, timeout=60).read().decode()
        found["port"] = int(url.rsplit(":", 1)[1].strip("/"))
    except BaseException as exc:  # noqa: BLE001 - reported by the main thread
        found["error"] = exc
    finally:
        open(config["release"], "w").close()


def test_live_and_post_hoc_dashboard_in_chromium(tmp_path, chromium, monkeypatch):
    monkeypatch.delenv("MINITRAIN_DASHBOARD", raising=False)
    out = tmp_path / "out"
    out.mkdir()
    config = {"release": str(out / "release"), "out": str(out), "deadline_s": DEADLINE_S}
    catcher = _UrlCatcher()
    logger = logging.getLogger("minitrain")
    logger.addHandler(catcher)
    found: dict = {}
    checker = threading.Thread(target=_live_checks, args=(catcher, chromium, config, found), daemon=True)
    checker.start()
    try:
        result = TorchTrainer(_train_until_released, train_loop_config=config,
                              scaling_config=ScalingConfig(num_workers=2),
                              run_config=RunConfig(name="dash", storage_path=str(tmp_path / "runs"))).fit()
    finally:
        logger.removeHandler(catcher)
        open(config["release"], "w").close()
        checker.join(timeout=DEADLINE_S)
    if "error" in found:
        raise found["error"]
    assert result.error is None and len(catcher.lines) == 1
    _check_rendered(found["dom"])
    assert os.path.getsize(found["screenshot"]) > 10_000
    assert "_train_until_released" in found["stacks"]  # rank 1's own frames, from its faulthandler
    assert 'ray_train_controller_state{' in found["metrics_text"]
    assert re.search(r'minitrain_train_step_time_seconds\{[^}]*ray_train_worker_world_rank="1"', found["metrics_text"])
    # The server went away with fit(): nothing listens on its port any more.
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{found['port']}/api/run", timeout=5)

    # Post hoc: the real CLI on the finished run directory.
    run_path = str(tmp_path / "runs" / "dash")
    cli = subprocess.Popen([sys.executable, "-m", "minitrain.dashboard", run_path], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        line = cli.stdout.readline()
        match = re.search(r"(http://127\.0\.0\.1:\d+/)", line)
        assert match, (line, cli.stderr.read() if cli.poll() is not None else "")
        url = match.group(1)
        assert _get_json(url + "api/run")["state"] == "FINISHED"
        dom = chromium.dom(url)
        _check_rendered(dom)
        assert "from storage" in dom and '<button class="stacks"' not in dom
    finally:
        assert stop_dashboard_cli(cli, DEADLINE_S) == 0
        cli.stdout.close()
        cli.stderr.close()
