"""tests/unit holds in-process tests only: a test here that starts a process fails and says where the
test belongs (tests/process for real processes, tests/e2e for real fits)."""

from __future__ import annotations

import os
import subprocess

import pytest


@pytest.fixture(autouse=True)
def _no_processes(monkeypatch, request):
    def refuse(*args, **kwargs):
        raise AssertionError(f"{request.node.nodeid} starts a process: move it to tests/process (real "
                             "processes) or tests/e2e (real fits), and keep tests/unit in-process")

    monkeypatch.setattr(subprocess.Popen, "__init__", refuse)
    monkeypatch.setattr(os, "fork", refuse)
    monkeypatch.setattr(os, "posix_spawn", refuse)
