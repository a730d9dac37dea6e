"""minitrain.procs without a process: what an exit status means (`decode_returncode`), and the host's
out-of-memory kill count read from fake cgroup v1 and v2 files (`oom_kill_count`). Against real processes:
tests/process/test_procs.py."""

from __future__ import annotations

from pathlib import Path

from minitrain import procs


def test_decode_returncode_plain_values():
    assert procs.decode_returncode(0) == (0, None)
    assert procs.decode_returncode(-15) == (None, 15)


def test_oom_kill_count_of_this_host_is_int_or_none():
    count = procs.oom_kill_count()
    assert count is None or (isinstance(count, int) and count >= 0)


def _fake_proc_self(tmp_path: Path, cgroup: str, mountinfo: str) -> Path:
    proc_self = tmp_path / "proc_self"
    proc_self.mkdir()
    (proc_self / "cgroup").write_text(cgroup)
    (proc_self / "mountinfo").write_text(mountinfo)
    return proc_self


def test_oom_kill_count_reads_cgroup_v2_memory_events(tmp_path):
    cg = tmp_path / "cg2" / "job" / "agent"
    cg.mkdir(parents=True)
    (cg / "memory.events").write_text("low 0\nhigh 0\nmax 2\noom 2\noom_kill 7\noom_group_kill 0\n")
    proc_self = _fake_proc_self(
        tmp_path,
        "0::/job/agent\n",
        f"30 23 0:26 / {tmp_path / 'cg2'} rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n",
    )
    assert procs.oom_kill_count(proc_self) == 7


def test_oom_kill_count_reads_cgroup_v1_oom_control_under_a_subtree_mount(tmp_path):
    cg = tmp_path / "mem" / "agent"
    cg.mkdir(parents=True)
    (cg / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n")
    proc_self = _fake_proc_self(
        tmp_path,
        "4:memory:/docker/abc/agent\n3:cpu,cpuacct:/docker/abc\n0::/\n",
        f"34 31 0:31 /docker/abc {tmp_path / 'mem'} rw - cgroup cgroup rw,memory\n",
    )
    assert procs.oom_kill_count(proc_self) == 3


def test_oom_kill_count_is_none_without_a_memory_cgroup(tmp_path):
    proc_self = _fake_proc_self(tmp_path, "0::/\n", "")
    assert procs.oom_kill_count(proc_self) is None
    assert procs.oom_kill_count(tmp_path / "missing") is None
