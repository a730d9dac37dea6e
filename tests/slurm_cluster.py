"""A real Slurm cluster for tests: scripts/slurm_cluster.py (munged, slurmctld, a slurmd per network
namespace), imported by path, plus skip logic and the session fixture's body.

    def test_x(slurm_cluster): ...                      # conftest fixture, 2 nodes, one per session
"""

from __future__ import annotations

import functools
import importlib.util
import sys
from pathlib import Path

import pytest

import cluster as netns  # tests/cluster.py: loads scripts/netns_cluster.py under the name both share

_SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "slurm_cluster.py"


def module():
    """scripts/slurm_cluster.py as the module `slurm_cluster_script` (SlurmCluster, SlurmError...)."""
    if (mod := sys.modules.get("slurm_cluster_script")) is None:
        netns.module()  # registers netns_cluster first, so both modules use the same one
        spec = importlib.util.spec_from_file_location("slurm_cluster_script", _SCRIPT)
        mod = importlib.util.module_from_spec(spec)
        sys.modules["slurm_cluster_script"] = mod
        spec.loader.exec_module(mod)
    return mod


@functools.lru_cache(maxsize=None)
def skip_reason() -> str | None:
    """Why a Slurm cluster cannot be made here (probed once per process; Debian's Slurm and munge are
    installed first when missing and root can), or None."""
    if reason := netns.skip_reason():
        return reason
    reason = module().unavailable_reason(install=True, probe=False)
    return f"Slurm cluster unavailable: {reason}" if reason else None


def session_cluster(tmp_path_factory):
    """Generator behind conftest's session-scoped `slurm_cluster` fixture: a running 2-node cluster
    (always torn down), or a skip with the reason."""
    if reason := skip_reason():
        pytest.skip(reason)
    with module().SlurmCluster(tmp_path_factory.mktemp("slurm")) as slurm:
        yield slurm
