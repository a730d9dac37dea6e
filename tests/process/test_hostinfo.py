"""minitrain.hosts.hostinfo with processes: GPU discovery through a fake `nvidia-smi` (a python -c script),
and an import that leaves torch out. Discovery without a process: tests/unit/test_gpu_discovery.py."""

from __future__ import annotations

import os
import subprocess
import sys

from minitrain.hosts import hostinfo

NO_PROC = "/nonexistent/proc/driver/nvidia/gpus"


def _fake_smi(text: str) -> tuple[str, ...]:
    return (sys.executable, "-c", f"print({text!r}, end='')")


def test_nvidia_smi_lines_are_counted_when_proc_is_missing():
    listing = (
        "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-aaaa)\n"
        "  MIG 1g.10gb     Device  0: (UUID: MIG-bbbb)\n"
        "GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-cccc)\n"
    )
    assert hostinfo.gpu_ids({}, proc_gpus_dir=NO_PROC, nvidia_smi=_fake_smi(listing)) == (0, 1)


def test_failing_or_missing_nvidia_smi_means_no_gpus(tmp_path):
    failing = (sys.executable, "-c", "import sys; print('GPU 0: x'); sys.exit(9)")
    assert hostinfo.gpu_ids({}, proc_gpus_dir=NO_PROC, nvidia_smi=failing) == ()
    missing = (str(tmp_path / "no-such-nvidia-smi"), "-L")
    assert hostinfo.gpu_ids({}, proc_gpus_dir=NO_PROC, nvidia_smi=missing) == ()
    assert hostinfo.gpu_ids({}, proc_gpus_dir=NO_PROC, nvidia_smi=None) == ()


def test_empty_proc_dir_falls_back_to_nvidia_smi(tmp_path):
    smi = _fake_smi("GPU 0: NVIDIA A100 (UUID: GPU-x)\n")
    empty = tmp_path / "gpus"  # the driver's /proc directory, with no GPU in it
    empty.mkdir()
    assert hostinfo.gpu_ids({}, proc_gpus_dir=empty, nvidia_smi=smi) == (0,)


def test_hostinfo_does_not_import_torch():
    # The agent imports this module; torch would cost seconds and a CUDA context in a supervisor.
    code = "import sys, minitrain.hosts.hostinfo, minitrain.procs; sys.exit('torch' in sys.modules)"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    assert subprocess.run([sys.executable, "-c", code], env=env, timeout=30).returncode == 0
