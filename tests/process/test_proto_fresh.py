"""The committed generated code in minitrain/rpc/_gen matches proto/minitrain.proto."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_generated_code_is_fresh(tmp_path):
    pytest.importorskip("grpc_tools", reason="grpcio-tools (a dev dependency) regenerates the code")
    # gen_proto.py regenerates into a TemporaryDirectory: keep it under tmp_path.
    env = dict(os.environ, TMPDIR=str(tmp_path), PYTHONDONTWRITEBYTECODE="1")
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_proto.py"), "--check"],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, (
        f"minitrain/rpc/_gen is stale; run `python scripts/gen_proto.py`.\n{result.stdout}{result.stderr}")
