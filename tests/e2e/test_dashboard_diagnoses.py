"""What the dashboard shows a user, in a real Chromium, on one real 2-worker run that provokes each
diagnosis: rank 1 computes slowly (a straggler), rank 0 keeps bytes across steps (a leak), both read from
a slow data loader, and a checkpoint every 4th report makes rank 0 wait for rank 1's commits.

- start-up: before the first step the page says what start-up is doing (polled from its first second);
- the straggler: the page's ranks table, its step-time plot and /metrics single out rank 1, not rank 0
  whose interval between reports includes its waits;
- the diagnoses: the memory (per rank, and per node against the host's total), idle-share and waits plots
  are drawn, with the leak hint naming rank 0 alone (rank 1's start-up growth is no leak) and the
  data-pipeline hint;
- post hoc: after the run, the post-hoc page (the real CLI on the run directory) shows what the live
  monitor showed at the end: the straggler banner and row, ENDED ranks, every report, the last report.
And the console's start-up line on a real terminal (a pty).
"""

from __future__ import annotations

import html
import json
import logging
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

import pytest

import minitrain
from minitrain import RunConfig, ScalingConfig
from minitrain.hosts import hostinfo
from minitrain.monitoring import diagnoses
from minitrain.monitoring.monitor import RunMonitor
from minitrain.storage.filesystem import Storage
from minitrain.torch import TorchTrainer

from chromium_support import DEADLINE_S
from dashboard_support import stop_dashboard_cli
from terminal_support import run_on_a_terminal

pytestmark = pytest.mark.e2e

ROOT = pathlib.Path(__file__).resolve().parents[2]
# The memory rule's warm-up, shortened so that the run stays short (the rule is otherwise the real one):
# every rank's start-up growth (80 MiB over its first 10 steps, about 5 s) happens within it, and the
# leak is judged against rank 1. Without the warm-up, that growth named rank 1 a leak too.
WARMUP_S = 6.0


def _provoking_run(config: dict) -> None:
    """Rank 1 slow, rank 0 leaking, both on a slow data loader, both growing through their first steps
    (start-up growth, as an optimizer's state and the allocator's caches fill), until the test releases the
    run (all ranks stop at the same step: rank 0's decision is broadcast)."""
    import torch
    from torch.utils.data import DataLoader, Dataset

    import minitrain.torch as mt

    class SlowData(Dataset):
        def __len__(self):
            return 100_000

        def __getitem__(self, index):
            time.sleep(config["data_s"])
            return torch.zeros(1)

    rank = minitrain.get_context().get_world_rank()
    loader = mt.prepare_data_loader(DataLoader(SlowData(), batch_size=1))
    kept = []  # the leak: bytes kept across steps, as a loss tensor appended without .item() would
    warm = []  # start-up growth, on every rank: kept too, but only in the first steps
    deadline = time.monotonic() + config["deadline_s"]
    for step, _ in enumerate(loader):
        if rank == 1:
            time.sleep(config["slow_s"])
        else:
            kept.append(b"\x01" * config["leak_bytes"])
        if step < config["warm_steps"]:
            warm.append(b"\x02" * config["warm_bytes"])
        checkpoint = None
        if step % 4 == 3 and rank == 0:
            directory = tempfile.mkdtemp()
            pathlib.Path(directory, "state.txt").write_text(str(step))
            checkpoint = minitrain.Checkpoint.from_directory(directory)
        minitrain.report({"loss": 1.0 / (step + 1), "step": step}, checkpoint=checkpoint)
        if minitrain.collective.broadcast_from_rank_zero(os.path.exists(config["release"])):
            return
        if time.monotonic() > deadline:
            raise TimeoutError("the test never released the run")


class _UrlCatcher(logging.Handler):
    def __init__(self):
        super().__init__()
        self.url = None
        self.seen = threading.Event()

    def emit(self, record):
        match = re.match(r"dashboard: (http://\S+) ", record.getMessage())
        if match:
            self.url = match.group(1)
            self.seen.set()


def _get(url: str):
    with urllib.request.urlopen(url, timeout=30) as response:
        body = response.read()
    return json.loads(body) if "/api/" in url or url.endswith("parts") else body.decode()


def _wait_for(condition, what: str):
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def _watch_live(catcher, chromium, config, found):
    try:
        assert catcher.seen.wait(DEADLINE_S), "the dashboard never logged its address"
        url = catcher.url
        # Start-up says what it does, from the first poll until the first step.
        startup = set()

        def started_stepping():
            section = _get(url + "parts")["startup"]
            text = re.sub(r"<[^>]+>", "", section)
            if text:
                startup.add(re.sub(r", for .*", "", text))
            return _get(url + "api/run")["rounds"] > 0
        _wait_for(started_stepping, "the first step")
        found["startup"] = startup

        def diagnosed():
            hints = _get(url + "api/hints")
            named = found.setdefault("memory_ranks", set())
            named.update(rank for h in hints if h["kind"] == "memory" for rank in h["ranks"])
            stragglers = [s["rank"] for s in _get(url + "api/stragglers")]
            return {h["kind"] for h in hints} >= {"memory", "data"} and 1 in stragglers
        _wait_for(diagnosed, "the leak and data hints and rank 1 named a straggler")
        found["dom"] = chromium.dom(url)
        found["metrics"] = _get(url + "metrics")
        found["nodes"] = _get(url + "api/nodes")
        chromium.screenshot(url, os.path.join(config["out"], "diagnoses.png"))
    except BaseException as exc:  # noqa: BLE001 - reported by the main thread
        found["error"] = exc
    finally:
        open(config["release"], "w").close()


def _row(dom: str, rank: int) -> str:
    match = re.search(rf'<tr data-rank="{rank}"[^>]*>.*?</tr>', dom, re.S)
    assert match, f"no row for rank {rank}"
    return match.group(0)


def _ticks(dom: str, plot: str, axis: str = "y") -> list[str]:
    """The tick labels drawn on one axis of a plot (the page keeps them on the plot's element: a canvas is
    opaque to the DOM)."""
    match = re.search(rf'id="{plot}"[^>]*>\s*<div class="uplot[^"]*"[^>]*?data-{axis}-ticks="([^"]*)"', dom)
    assert match, f"no {axis} ticks on the {plot} plot"
    return html.unescape(match.group(1)).split("|")


def _readable(ticks: list[str], unit: str) -> None:
    """Ticks that read apart: distinct, not all "0", each in `unit`."""
    assert len(ticks) >= 2 and len(set(ticks)) == len(ticks), ticks
    assert not all(re.fullmatch(r"[-0.]*\D*", t) for t in ticks), ticks
    assert all(t.endswith(unit) for t in ticks), (unit, ticks)


def _step_time_cell(row: str) -> float:
    cells = re.findall(r"<td>(.*?)</td>", row, re.S)
    value = cells[4]  # Rank, Host, PID, Phase, Step time (excl. waits)
    number = float(value.split()[0])
    return number / 1000 if value.endswith(" ms") else number / 1e6 if value.endswith(" µs") else number


def test_the_dashboard_points_at_the_slow_rank_diagnoses_and_remembers(tmp_path, chromium, monkeypatch):
    monkeypatch.delenv("MINITRAIN_DASHBOARD", raising=False)
    monkeypatch.setattr(diagnoses, "MEMORY_WARMUP_S", WARMUP_S)
    out = tmp_path / "out"
    out.mkdir()
    config = {"release": str(out / "release"), "out": str(out), "deadline_s": DEADLINE_S, "data_s": 0.1,
              "slow_s": 0.4, "leak_bytes": 3 << 20, "warm_steps": 10, "warm_bytes": 8 << 20}
    catcher, found = _UrlCatcher(), {}
    logger = logging.getLogger("minitrain")
    logger.addHandler(catcher)
    watcher = threading.Thread(target=_watch_live, args=(catcher, chromium, config, found), daemon=True)
    watcher.start()
    trainer = TorchTrainer(_provoking_run, train_loop_config=config, scaling_config=ScalingConfig(num_workers=2),
                           run_config=RunConfig(name="diag", storage_path=str(tmp_path / "runs")))
    try:
        result = trainer.fit()
    finally:
        logger.removeHandler(catcher)
        open(config["release"], "w").close()
        watcher.join(timeout=DEADLINE_S)
    if "error" in found:
        raise found["error"]
    assert result.error is None

    # Start-up: the page said what start-up was doing before the first step.
    assert any(text.startswith("starting: ") for text in found["startup"]), found["startup"]

    # The straggler: the table, the plot's straggler series and /metrics all single out rank 1.
    dom = found["dom"]
    assert 'class="straggler"' in _row(dom, 1) and 'class="straggler"' not in _row(dom, 0)
    assert _step_time_cell(_row(dom, 1)) > 2 * _step_time_cell(_row(dom, 0))
    assert re.search(r'id="timeline"[^>]*>\s*<div class="uplot', dom), "no step-time plot"
    assert "rank 1 (straggler)" in dom
    steps = dict(re.findall(r'minitrain_train_step_time_seconds\{[^}]*ray_train_worker_world_rank="(\d)"[^}]*\} (\S+)',
                            found["metrics"]))
    assert float(steps["1"]) > 2 * float(steps["0"]), steps

    # The diagnoses over time, drawn, and their hints.
    for plot in ("waits", "idle", "memory", "node-memory"):
        assert re.search(rf'id="{plot}"[^>]*>\s*<div class="uplot', dom), f"no {plot} plot"
    _readable(_ticks(dom, "waits"), "s")  # seconds, in the unit their range calls for
    _readable(_ticks(dom, "memory"), "iB")
    # The node memory plot has the host's total as a line: its agent's figure, named in the legend.
    [node] = found["nodes"]
    assert node["memory_bytes"] == hostinfo.memory_bytes() > 0, node
    total_line = f'node {node["host"]} total ({node["memory_bytes"] / 2**30:.1f} GiB)'
    assert total_line in dom
    # The leak is rank 0's alone: no poll ever named another rank, and the page says rank 0 only.
    assert found["memory_ranks"] == {0}, found["memory_ranks"]
    assert "memory climbs steadily across epochs on rank(s) 0 (rank 0: " in dom and "likely a leak" in dom
    assert "the data pipeline is not keeping up" in dom
    assert "no GPU measured" in dom  # no NVML here: said, not an empty box

    # Post hoc: what the live monitor showed at the end, rebuilt from the run directory ...
    live = trainer._monitor
    rebuilt = RunMonitor.from_run_dir(Storage.for_run(str(tmp_path / "runs"), "diag"))
    assert rebuilt.straggler_history() == live.straggler_history() and live.straggler_history()
    assert rebuilt.hints() == live.hints()

    def comparable(rows):
        return [{k: v for k, v in r.items() if k != "last_report_age_s"} for r in rows]
    assert comparable(rebuilt.ranks()) == comparable(live.ranks())
    assert all(r["phase"] == "ENDED" and r["last_report_age_s"] is not None for r in rebuilt.ranks())
    assert {r["reports"] for r in rebuilt.ranks()} == {rebuilt.run()["rounds"]}

    # ... and served by the real CLI, in Chromium.
    serve = ("import sys; from minitrain.monitoring import diagnoses; diagnoses.MEMORY_WARMUP_S = float(sys.argv[1]); "
             "from minitrain.dashboard.__main__ import main; sys.exit(main(sys.argv[2:]))")  # the same warm-up
    cli = subprocess.Popen([sys.executable, "-c", serve, str(WARMUP_S), str(tmp_path / "runs" / "diag")],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        match = re.search(r"(http://127\.0\.0\.1:\d+/)", cli.stdout.readline())
        assert match, cli.stderr.read() if cli.poll() is not None else "no address"
        url = match.group(1)
        assert [s["rank"] for s in _get(url + "api/stragglers")] == [1]
        after = chromium.dom(url)
        assert "rank 1 on" in after and "was a straggler" in after
        assert 'class="straggler"' in _row(after, 1)
        for rank in (0, 1):
            row = _row(after, rank)
            assert "<td>ENDED</td>" in row and " ago</td>" in row and f"<td>{rebuilt.run()['rounds']}</td>" in row
        assert "memory climbs steadily across epochs on rank(s) 0 (" in after
        assert "the data pipeline is not keeping up" in after
        assert _get(url + "api/nodes") == found["nodes"] and total_line in after
    finally:
        stop_dashboard_cli(cli, DEADLINE_S)
        cli.stdout.close()
        cli.stderr.close()


def test_the_console_shows_start_up_on_a_terminal(tmp_path):
    """Start-up on a real terminal (a pty): until the first step, the status block says what start-up
    does ("starting: ...") instead of "0 steps | - steps/s"."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MINITRAIN_DASHBOARD": "0"}
    argv = [sys.executable, str(ROOT / "examples" / "quickstart.py"), "--epochs", "1", "--storage-path", str(tmp_path)]
    code, screen = run_on_a_terminal(argv, env, 240.0)
    assert code == 0, screen[-3000:]
    assert "0 steps | - steps/s" not in screen
    assert re.search(r"starting: (starting node agents|spawning workers|workers connected|rendezvous|waiting for "
                     r"the first step)", screen), screen[-3000:]


def test_every_plot_has_readable_axes_and_the_gpus_are_plotted_over_time(chromium):
    """Every plot's value axis, and the GPU plots of the diagnoses, in a real Chromium, from samples given as the
    monitor keeps them (as a fake NVML would give the GPU figures: no GPU here): waits of a fraction of a
    millisecond read in µs (uPlot's own labels read "0" on every tick), memory in MiB or GiB, shares in %."""
    from dashboard_support import FixedRun
    from minitrain.dashboard import DashboardServer
    from minitrain.dashboard.settings import DashboardAddress

    run = FixedRun()
    for i, s in enumerate(run._samples):
        s["gpus"] = [{"index": 0, "util_percent": 50.0 + i, "memory_used_bytes": (1 + i) << 30,
                      "memory_total_bytes": 80 << 30}]
        s["report_wait_s"], s["collective_wait_s"] = 1e-4 * (1 + i % 4), 5e-5 * (1 + i % 3)
    with DashboardServer(run, DashboardAddress(), live=False) as server:
        dom = chromium.dom(f"http://127.0.0.1:{server.port}/")
    for plot in ("gpu-util", "gpu-memory"):
        assert re.search(rf'id="{plot}"[^>]*>\s*<div class="uplot', dom), f"no {plot} plot"
    assert "rank 1 GPU 0" in dom and "GPU utilisation" in dom
    waits = _ticks(dom, "waits")
    _readable(waits, " µs")
    for plot, unit in (("timeline", " ms"), ("idle", "%"), ("memory", " MiB"), ("node-memory", " GiB"),
                       ("gpu-util", "%"), ("gpu-memory", " GiB")):
        _readable(_ticks(dom, plot), unit)
    loss = re.search(r'data-metric="loss"[^>]*>\s*<div class="uplot[^"]*"[^>]*?data-y-ticks="([^"]*)"', dom)
    assert loss and len(set(loss.group(1).split("|"))) > 1, "the loss plot's ticks"
    # the node memory plot, against the host's total (FixedRun: h0 has 16 GiB)
    assert re.search(r'id="node-memory"[^>]*>\s*<div class="uplot', dom), "no node memory plot"
    assert "node h0 total (16.0 GiB)" in dom and "node h0 (its ranks)" in dom
