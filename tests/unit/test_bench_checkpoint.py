"""The checkpoint benchmark still runs (quick mode); its figures are checked for presence, never speed."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.e2e
def test_bench_checkpoint_quick_mode_runs(tmp_path):
    out = tmp_path / "bench.json"
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_checkpoint.py"), "--quick",
                           "--json", str(out), "--tmp-dir", str(tmp_path),
                           "--no-drop-caches"],  # dropping the page cache would slow the tests beside it
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    figures = json.loads(out.read_text())
    persist, steps = figures["persist"], figures["steps"]
    assert persist["size_bytes"] == 64 << 20
    for key in ("minitrain_mib_s", "copy_mib_s", "ratio"):
        assert persist[key] > 0, key
    assert len(persist["minitrain"]) == len(persist["copy"]) == 1
    for variant in ("plain", "metrics", "async", "sync"):
        assert steps["summary"][variant]["median_ms"] > 0, variant
        assert len(steps["runs"][variant][0]["step_s"]) == steps["steps"]
    for key in ("async_overhead_pct", "async_overhead_vs_plain_pct", "sync_overhead_pct"):
        assert isinstance(steps[key], float), key
    assert "| Measure" in done.stdout and "| Measure" in figures["markdown"]
    assert not any(tmp_path.glob("minitrain-bench-ckpt-*")), "the temporary directory was left behind"
