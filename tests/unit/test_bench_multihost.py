"""The multi-host benchmark still runs (quick mode) on a fake cluster; its figures are checked for
presence, never speed. Skipped where no cluster can be built (not root, no netns, no sshd)."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.e2e
@pytest.mark.cluster
def test_bench_multihost_quick_mode_runs(tmp_path):
    from cluster import skip_reason  # tests/cluster.py

    if reason := skip_reason():
        pytest.skip(reason)
    out = tmp_path / "bench.json"
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_multihost.py"), "--quick",
                           "--json", str(out), "--tmp-dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    figures = json.loads(out.read_text())
    assert "skipped" not in figures, figures.get("skipped")
    start = figures["startup"]
    for kind in ("ssh", "local"):  # 2 hosts x 2 workers over ssh, and the same job on one host
        assert len(start[kind]["fit"]["values_s"]) == 1 and start[kind]["fit"]["median_s"] > 0
        assert start[kind]["process"]["median_s"] >= start[kind]["fit"]["median_s"]
    assert start["preflight"]["median_s"] > 0 and start["ratio"] > 0
    for name in ("cut", "agent_kill"):
        loss = figures[name]
        assert len(loss["runs"]) == 1, loss
        run = loss["runs"][0]
        assert run["detect_s"] >= 0 and run["raised_s"] >= run["detect_s"], run
        assert "lost" in run["message"] or "stopping every rank" in run["message"], run
        assert "WorkerGroupError" in run["error_head"], run
    assert figures["leftover_processes"] == 0
    assert "| Measure" in done.stdout and "| Measure" in figures["markdown"]
    assert not any(tmp_path.glob("minitrain-bench-multihost-*")), "the temporary directory was left behind"
