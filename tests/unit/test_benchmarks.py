"""The benchmark commands still run (quick mode); their figures are printed, never asserted."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.e2e
def test_bench_core_quick_mode_runs(tmp_path):
    out = tmp_path / "bench.json"
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_core.py"), "--quick", "--json", str(out)],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    figures = json.loads(out.read_text())
    assert figures, "the benchmark wrote no figures"
    assert "| Measure" in done.stdout
