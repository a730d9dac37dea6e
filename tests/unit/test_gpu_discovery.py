"""minitrain.hosts.hostinfo without a process: GPU discovery from CUDA_VISIBLE_DEVICES and from a fake driver
/proc directory, the devices a worker is given, and sanity checks of the host facts. Discovery through a
fake `nvidia-smi` (a python -c script): tests/process/test_hostinfo.py."""

from __future__ import annotations

import os

import pytest

from minitrain.hosts import hostinfo


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("", ()),
        ("-1", ()),
        ("  ", ()),
        ("0", (0,)),
        ("2,0", (2, 0)),
        ("0, 1 ,3", (0, 1, 3)),
        ("1,-1,2", (1,)),  # CUDA stops at the first invalid entry
        ("1,x,2", (1,)),
        ("GPU-5f1c2a3b-aaaa-bbbb-cccc-000000000001,GPU-5f1c2a3b-aaaa-bbbb-cccc-000000000002", (0, 1)),
        ("MIG-3b2d5c1e-0000-1111-2222-333333333333", (0,)),
        ("MIG-GPU-5f1c2a3b/1/0,MIG-GPU-5f1c2a3b/2/0", (0, 1)),  # legacy MIG id form
    ],
)
def test_cuda_visible_devices_decides_when_set(tmp_path, value, expected):
    proc_dir = _fake_proc_gpus(tmp_path, 4)  # ignored: the variable wins
    assert hostinfo.gpu_ids({"CUDA_VISIBLE_DEVICES": value}, proc_gpus_dir=proc_dir) == expected


UUIDS = "GPU-5f1c2a3b-aaaa-bbbb-cccc-000000000001,GPU-5f1c2a3b-aaaa-bbbb-cccc-000000000002"


@pytest.mark.parametrize(
    ("agent_visible", "assigned", "expected"),
    [
        (None, "1", "1"),  # the agent sees every GPU: ids are physical
        ("2,3", "3", "3"),  # integer lists name physical GPUs already
        (UUIDS, "1", "GPU-5f1c2a3b-aaaa-bbbb-cccc-000000000002"),  # positions back to the agent's UUIDs
        (UUIDS, "0,1", UUIDS),
        (UUIDS, "5", "5"),  # not a position of the agent's list: left as given
    ],
)
def test_a_worker_sees_the_gpus_its_agent_was_given(agent_visible, assigned, expected):
    # gpu_ids of an agent restricted by UUID are positions (0, 1); a worker told "1" would see physical
    # GPU 1, not the agent's second GPU, unless the position is mapped back to the UUID.
    environ = {} if agent_visible is None else {"CUDA_VISIBLE_DEVICES": agent_visible}
    assert hostinfo.workers_visible_devices(assigned, environ) == expected


def _fake_proc_gpus(tmp_path, count):
    gpus = tmp_path / "gpus"
    gpus.mkdir()
    for i in range(count):
        (gpus / f"0000:{i:02x}:00.0").mkdir()
    return gpus


def test_driver_proc_entries_are_counted(tmp_path):
    assert hostinfo.gpu_ids({}, proc_gpus_dir=_fake_proc_gpus(tmp_path, 3), nvidia_smi=None) == (0, 1, 2)


def test_host_facts_are_sane():
    assert 1 <= hostinfo.cpu_count() <= (os.cpu_count() or 1)
    assert hostinfo.memory_bytes() > 64 * 2**20
    assert isinstance(hostinfo.hostname(), str) and hostinfo.hostname()
