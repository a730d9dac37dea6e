"""scripts/gpu_check.sh keeps working where CI runs, on machines without a GPU: it finds its Python,
reports every GPU check SKIP with the reason, prints its table and writes $OUT/gpu_check.json; without
--allow-no-gpu the missing CUDA is a failure; and --cpu runs a check's own code on CPU workers (the
restart check: the planted crashes, the attempt count, the restart times).
The real run needs a GPU machine (docs/benchmarks/index.md, "GPU check"). The check's pieces that need no
process: tests/unit/test_gpu_check_report.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bench.gpu_check import CHECKS

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"

needs_no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="with a GPU the script runs the real checks")


def _run(tmp_path: Path, *args: str) -> tuple[int, str, dict]:
    env = dict(os.environ, GPU_CHECK_PYTHON=sys.executable, OUT=str(tmp_path))
    work = str(tmp_path / "work")  # a failed run keeps its logs: under tmp_path, not /tmp
    done = subprocess.run(["bash", str(SCRIPT), "--work", work, *args], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    output = done.stdout + done.stderr
    path = tmp_path / "gpu_check.json"
    assert path.exists(), output[-4000:]
    return done.returncode, output, json.loads(path.read_text())


@needs_no_gpu
def test_without_a_gpu_every_check_is_skipped_with_its_reason(tmp_path):
    code, output, report = _run(tmp_path, "--allow-no-gpu")
    assert code == 0, output[-4000:]
    statuses = {c["name"]: (c["status"], c["summary"]) for c in report["checks"]}
    assert list(statuses) == [c.name for c in CHECKS]
    assert statuses["env"][0] == "PASS" and "no CUDA" in statuses["env"][1]
    for name, (status, summary) in statuses.items():
        if name != "env":
            assert status == "SKIP" and summary.startswith("no CUDA"), (name, status, summary)
    assert f"using {sys.executable}" in output
    assert "check " in output and "1 passed, 0 failed, 9 skipped" in output
    assert report["failed"] == [] and report["machine"]["gpus"] == 0


@needs_no_gpu
def test_without_a_gpu_and_not_allowed_the_env_check_fails(tmp_path):
    code, output, report = _run(tmp_path, "--only", "devices")
    assert code == 1, output[-4000:]
    env, devices = report["checks"]
    assert env["status"] == "FAIL" and "no usable CUDA" in env["summary"] and "--allow-no-gpu" in env["summary"]
    assert devices["status"] == "SKIP" and report["failed"] == ["env"]


@pytest.mark.soak  # a benchmark's smoke run (real fits, 10 s): with tests/e2e/test_bench_quick.py
def test_the_cpu_mode_runs_the_restart_check_on_cpu_workers(tmp_path):
    code, output, report = _run(tmp_path, "--cpu", "--only", "cuda_restart")
    assert code == 0, output[-4000:]
    restart = report["checks"][1]
    assert restart["status"] == "PASS", restart
    assert restart["figures"]["restart_after_exit_s"] > 0
    assert [len(lines) for lines in restart["figures"]["entries"].values()] == [3, 3]  # 2 ranks x 3 attempts


def test_an_unknown_check_is_refused(tmp_path):
    done = subprocess.run(["bash", str(SCRIPT), "--only", "nonsense"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120, env=dict(os.environ, GPU_CHECK_PYTHON=sys.executable))
    assert done.returncode == 2 and "unknown check(s) ['nonsense']" in done.stderr
