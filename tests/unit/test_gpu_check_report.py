"""The GPU check's pieces that need no process (bench/gpu_check.py, bench/gpu_check_support.py): the devices
a worker should see, and the report's table. The script itself (scripts/gpu_check.sh):
tests/process/test_gpu_check.py."""

from __future__ import annotations

from bench.gpu_check import Outcome, table
from bench.gpu_check_support import expected_visible_devices


def test_expected_visible_devices_follows_the_drivers_own_list(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert expected_visible_devices(2) == "0,1"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5,7")
    assert expected_visible_devices(2) == "3,5"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-aaaa,GPU-bbbb")  # minitrain renumbers UUIDs from 0
    assert expected_visible_devices(1) == "0"


def test_the_table_cuts_long_summaries():
    text = table([Outcome("env", "PASS", 1.0, "x" * 400), Outcome("devices", "SKIP", 0.0, "no CUDA")])
    lines = text.splitlines()
    assert lines[0].split() == ["check", "status", "seconds", "summary"]
    assert lines[2].endswith("...") and len(lines[2]) < 200 and lines[3].endswith("no CUDA")
