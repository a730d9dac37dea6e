"""minitrain.agent.cgroups without a process: why an agent's cgroup is not used, read from fake /proc files
(a cgroup v1-only machine, a systemd unit that did not delegate its subtree). Cgroups that end real daemons:
tests/process/test_descendants.py."""

from __future__ import annotations

from minitrain.agent import cgroups


def test_the_reason_cgroups_are_not_used_is_given(tmp_path):
    """A cgroup v1-only machine (no "0::" line) and a systemd unit that did not delegate its subtree."""
    (tmp_path / "cgroup").write_text("4:memory:/x\n1:cpu:/\n")
    (tmp_path / "mountinfo").write_text("")
    assert cgroups.open_agent_cgroup("run", str(tmp_path)) == (None, "no cgroup v2 hierarchy (cgroup v1 only)")
    unit = tmp_path / "fs" / "system.slice" / "train.service"
    unit.mkdir(parents=True)
    (tmp_path / "cgroup").write_text("0::/system.slice/train.service\n")
    (tmp_path / "mountinfo").write_text(f"41 23 0:38 / {tmp_path / 'fs'} rw,relatime - cgroup2 cgroup2 rw\n")
    agent_cgroup, reason = cgroups.open_agent_cgroup("run", str(tmp_path))
    assert agent_cgroup is None and "train.service" in reason and "Delegate=yes" in reason
    assert list(unit.iterdir()) == []  # nothing created
