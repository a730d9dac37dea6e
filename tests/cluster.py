"""Fake multi-host clusters for tests: scripts/netns_cluster.py (network namespaces on a bridge, each
with its own IP and sshd), imported by path, plus skip logic.

    def test_x(netns_cluster):                          # conftest fixture, 2 hosts
    @pytest.mark.parametrize("netns_cluster", [3], indirect=True)
    def test_y(netns_cluster): ...                      # 3 hosts

    with cluster.netns_cluster(2, tmp_path / "c") as c:  # or by hand; skips when not possible here
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
_SCRIPT = REPO_ROOT / "scripts" / "netns_cluster.py"


def module():
    """scripts/netns_cluster.py as the module `netns_cluster` (NetnsCluster, ClusterHost, ClusterError...)."""
    if (mod := sys.modules.get("netns_cluster")) is None:
        spec = importlib.util.spec_from_file_location("netns_cluster", _SCRIPT)
        mod = importlib.util.module_from_spec(spec)
        sys.modules["netns_cluster"] = mod  # before exec: dataclasses look their module up
        spec.loader.exec_module(mod)
    return mod


@functools.lru_cache(maxsize=None)
def skip_reason() -> str | None:
    """Why clusters cannot be made on this machine (probed once per process), or None."""
    reason = module().unavailable_reason(probe=True)
    return f"netns cluster unavailable: {reason}" if reason else None


def skip_unless_available() -> None:
    """pytest.skip with the reason when this machine cannot make clusters (not root, no netns, no sshd)."""
    if reason := skip_reason():
        pytest.skip(reason)


@contextlib.contextmanager
def netns_cluster(num_hosts: int, workdir, **kwargs):
    """A running NetnsCluster for the `with` block (skips the test when unavailable); always torn down."""
    skip_unless_available()
    with module().NetnsCluster(num_hosts, workdir, **kwargs) as cluster:
        yield cluster


def fixture_body(request, tmp_path):
    """Generator behind conftest's `netns_cluster` fixture: host count from request.param (default 2)."""
    with netns_cluster(getattr(request, "param", 2), tmp_path / "netns_cluster") as cluster:
        yield cluster
