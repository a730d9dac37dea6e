"""Smoke tests: each example in examples/ runs as a user would run it (`python examples/X.py
--smoke-test`), a real 2-worker fit on CPU with tiny sizes, and exits 0 (the examples exit 1 when the
loss does not drop). examples/quickstart.py runs in tests/e2e/test_cli.py and tests/e2e/test_console_messages.py.

Examples whose framework is an optional extra are skipped, with the reason, when it is not installed.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE_TIMEOUT_S = 300  # generous: a 2-core CI machine may run other tests beside these


def _needs(module: str, install: str):
    return pytest.mark.skipif(importlib.util.find_spec(module) is None,
                              reason=f"{module} is not installed: {install}")


def _run_example(name: str, tmp_path, *args: str) -> str:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / name), "--smoke-test", "--storage-path", str(tmp_path), *args],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=EXAMPLE_TIMEOUT_S)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-6000:]
    return done.stdout


def test_fsdp_example(tmp_path):
    out = _run_example("fsdp_train.py", tmp_path)
    assert "'epoch': 1" in out and "'__0_0.distcp', '__1_0.distcp'" in out


@_needs("lightning", "pip install 'minitrain[lightning]'")
def test_lightning_example(tmp_path):
    out = _run_example("lightning_train.py", tmp_path)
    assert "'epoch': 1, 'step': 8" in out


@_needs("transformers", "pip install 'minitrain[transformers]'")
def test_huggingface_example(tmp_path):
    out = _run_example("huggingface_train.py", tmp_path)
    assert "'step': 16" in out and "['checkpoint']" in out


@_needs("xgboost", "pip install 'minitrain[xgboost]'")
def test_xgboost_example_trains_and_resumes(tmp_path):
    out = _run_example("xgboost_train.py", tmp_path)
    assert "model: 8 rounds" in out
    resumed = _run_example("xgboost_train.py", tmp_path, "--rounds", "10")  # 2 more rounds from the checkpoint
    assert "model: 10 rounds" in resumed


@_needs("lightgbm", "pip install 'minitrain[lightgbm]'")
def test_lightgbm_example(tmp_path):
    out = _run_example("lightgbm_train.py", tmp_path)
    assert "model: 8 rounds" in out
