"""The measuring scripts under scripts/ still run (tiny sizes; the figures are printed, never asserted):
bench_controller_costs.py (the controller's Python per message) and bench_grpc_floor.py (gRPC's own cost
per agent message, the floor under a round)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(script: str, *args: str) -> str:
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / script), *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_controller_costs_prints_a_row_per_size():
    out = _run("bench_controller_costs.py", "--ranks", "8,16", "--count", "40")
    rows = [line for line in out.splitlines() if line.startswith("| 8 |") or line.startswith("| 16 |")]
    assert len(rows) == 2 and all(len(row.split("|")) == 7 for row in rows)


def test_grpc_floor_reads_every_message_of_every_round():
    out = _run("bench_grpc_floor.py", "--agents", "4", "--rounds", "5", "--period-s", "0.05")
    [row] = [line for line in out.splitlines() if line.startswith("| 4 |")]
    assert row.split("|")[2].strip() == "20/20"  # 4 agents x 5 rounds, all read
    json.loads(out.splitlines()[-1])
