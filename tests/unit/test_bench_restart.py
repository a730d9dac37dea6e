"""The restart benchmark still runs (quick mode); its figures are checked for presence, never speed."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.e2e
def test_bench_restart_quick_mode_runs(tmp_path):
    out = tmp_path / "bench.json"
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_restart.py"), "--quick",
                           "--json", str(out), "--tmp-dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    figures = json.loads(out.read_text())
    restart, agent = figures["minitrain_restart"], figures["agent_loss"]
    # minitrain: every kill was followed by an attempt that reached its first step, and the job finished.
    assert restart["kills"] == 3 and restart["succeeded_after_kill"] == 3, restart["per_restart"]
    assert len(restart["latencies_s"]) == 3 and restart["median_s"] > 0
    assert restart["resumed_every_attempt"] and restart["run"]["leftover_processes"] == 0
    assert "kill_to_detected_log" in restart["phases"]
    assert agent["kills"] == 3 and agent["succeeded_after_kill"] == 3, agent["per_restart"]
    assert agent["phases"]["kill_to_lost_log"]["median_s"] >= 0
    assert agent["run"]["leftover_processes"] == 0
    # torchrun: whatever it did is recorded (its restarts may fail or hang: that is a finding, not an error).
    torchrun = figures["torchrun_restart"]
    assert torchrun is not None and torchrun["runs"] == 1 and torchrun["leftover_processes"] == 0
    assert {"kills", "succeeded_after_kill", "failed", "latencies_s", "endings"} <= set(torchrun)
    assert len(torchrun["jobs"]) == 1 and "per_restart" in torchrun["jobs"][0]
    assert "| Measure" in done.stdout and "| Measure" in figures["markdown"]
    assert not any(tmp_path.glob("minitrain-bench-restart-*")), "the temporary directory was left behind"
