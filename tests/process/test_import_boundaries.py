"""What a fresh interpreter imports: the supervisors (driver, agent) start without torch, and a worker
never loads the coordinator."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def _python(code: str, tmp_path: Path) -> str:
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_supervisors_start_without_torch(tmp_path):
    code = ("import minitrain.agent.agent, minitrain.coordinator.run, minitrain.driver.trainer, minitrain; "
            "import sys; print('torch' in sys.modules)")
    assert _python(code, tmp_path) == "False"


def test_worker_never_loads_the_coordinator(tmp_path):
    code = ("import minitrain.worker.bootstrap, minitrain, sys; "
            "minitrain.report, minitrain.get_context, minitrain.get_checkpoint; "
            "print(sorted(m for m in sys.modules if m.startswith(('minitrain.coordinator', "
            "'minitrain.driver.trainer', 'minitrain.agent'))))")
    assert _python(code, tmp_path) == "[]"
