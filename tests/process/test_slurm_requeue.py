"""The requeue of a preempted Slurm job (minitrain.hosts.slurm_requeue) with a recording `scontrol` on
PATH. Without any scontrol: tests/unit/test_slurm_launch.py; Slurm's own requeue count
(SLURM_RESTART_COUNT): tests/unit/test_slurm_env.py."""

from __future__ import annotations

import json
import logging
import os
import stat

import pytest

from minitrain.hosts.slurm_requeue import requeue_after_preemption


@pytest.fixture
def scontrol(tmp_path, monkeypatch):
    """A fake `scontrol` first on PATH: records its argv in calls.jsonl and exits with $FAKE_SCONTROL_EXIT."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls.jsonl"
    script = bin_dir / "scontrol"
    script.write_text("#!/usr/bin/env python3\nimport json, os, sys\n"
                      f"open({str(calls)!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n"
                      "print('scontrol says no', file=sys.stderr) if os.environ.get('FAKE_SCONTROL_EXIT', '0') != '0' "
                      "else None\nsys.exit(int(os.environ.get('FAKE_SCONTROL_EXIT', '0')))\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return lambda: [json.loads(line) for line in calls.read_text().splitlines()] if calls.exists() else []


def test_a_preempted_job_is_requeued_with_scontrol(scontrol, caplog):
    with caplog.at_level(logging.WARNING, logger="minitrain"):
        assert requeue_after_preemption("4242") is True
    assert scontrol() == [["requeue", "4242"]]
    # The intent is logged before the call (Slurm may end this process as soon as it accepts), then the result.
    intent = caplog.text.index("Slurm job 4242 is to be requeued now")
    assert intent < caplog.text.index("Slurm job 4242 requeued")


def test_a_refused_requeue_is_logged_with_slurm_s_answer_and_never_raises(scontrol, caplog, monkeypatch):
    monkeypatch.setenv("FAKE_SCONTROL_EXIT", "1")
    with caplog.at_level(logging.ERROR, logger="minitrain"):
        assert requeue_after_preemption("4242") is False
    assert "scontrol says no" in caplog.text and "--requeue" in caplog.text
