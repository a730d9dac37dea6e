"""What a node has: CPUs, memory, GPUs, name (L1: stdlib + psutil; never imports torch).

The agent reports these at registration. Importing torch to count GPUs would cost seconds and
create a CUDA context in a supervisor that must stay light, so GPUs are counted from the driver's
/proc entries or `nvidia-smi -L` instead.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

import psutil

log = logging.getLogger(__name__)

PROC_NVIDIA_GPUS = "/proc/driver/nvidia/gpus"
NVIDIA_SMI_LIST = ("nvidia-smi", "-L")
_NVIDIA_SMI_TIMEOUT_S = 10.0


def cpu_count() -> int:
    """CPUs this process may run on (its affinity mask, which honours taskset/cpusets), at least 1."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


def memory_bytes() -> int:
    """Total physical memory of the host in bytes (not a cgroup limit)."""
    return psutil.virtual_memory().total


def hostname() -> str:
    """This host's name as the kernel reports it (`socket.gethostname()`)."""
    return socket.gethostname()


def gpu_ids(
    environ: Mapping[str, str] = os.environ,
    *,
    proc_gpus_dir: str | os.PathLike[str] = PROC_NVIDIA_GPUS,
    nvidia_smi: Sequence[str] | None = NVIDIA_SMI_LIST,
) -> tuple[int, ...]:
    """GPU ids visible to processes started with `environ`.

    CUDA_VISIBLE_DEVICES, when set, decides: "" or "-1" -> (); integers -> those integers (physical
    indices); GPU UUIDs or MIG ids -> their positions 0..n-1 (CUDA renumbers visible devices from 0).
    Like CUDA, parsing stops at the first entry that is neither. When unset: one id per entry of the
    NVIDIA driver's `proc_gpus_dir`, else one per "GPU " line of `nvidia_smi` (None skips it), else ().
    """
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return parse_cuda_visible_devices(visible)
    count = _count_proc_gpus(Path(proc_gpus_dir))
    if not count and nvidia_smi:
        count = _count_nvidia_smi(nvidia_smi)
    return tuple(range(count))


def parse_cuda_visible_devices(value: str) -> tuple[int, ...]:
    """Ids named by a CUDA_VISIBLE_DEVICES value; see `gpu_ids` for the rules."""
    entries = []
    for entry in (e.strip() for e in value.split(",")):
        if not (entry.isdigit() or entry.startswith(("GPU-", "MIG-"))):
            break  # CUDA ignores this entry and everything after it ("-1" hides all GPUs)
        entries.append(entry)
    if all(e.isdigit() for e in entries):
        return tuple(int(e) for e in entries)
    return tuple(range(len(entries)))


def workers_visible_devices(assigned: str, environ: Mapping[str, str] = os.environ) -> str:
    """The CUDA_VISIBLE_DEVICES a worker gets for `assigned`, the ids the coordinator chose from this
    node's `gpu_ids` (comma-separated), in the agent's `environ`.

    When the agent's own CUDA_VISIBLE_DEVICES names GPUs by UUID or MIG id, `gpu_ids` are positions in
    that list (CUDA renumbers from 0), and a worker given "1" would see physical GPU 1 instead of the
    agent's second GPU: each position is turned back into the agent's entry. Integer lists (and an
    agent without the variable) name physical GPUs already and pass unchanged, as does anything else."""
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return assigned
    entries = [e.strip() for e in visible.split(",")]
    named = []
    for entry in entries:
        if not (entry.isdigit() or entry.startswith(("GPU-", "MIG-"))):
            break
        named.append(entry)
    if all(e.isdigit() for e in named):
        return assigned
    ids = [a.strip() for a in assigned.split(",")]
    if not all(i.isdigit() and int(i) < len(named) for i in ids):
        return assigned
    return ",".join(named[int(i)] for i in ids)


def _count_proc_gpus(directory: Path) -> int:
    try:
        return sum(1 for _ in directory.iterdir())
    except OSError:
        return 0  # no NVIDIA driver loaded (or not Linux)


def _count_nvidia_smi(command: Sequence[str]) -> int:
    if shutil.which(command[0]) is None:
        return 0
    try:
        done = subprocess.run(
            list(command), capture_output=True, text=True, timeout=_NVIDIA_SMI_TIMEOUT_S, check=True
        )
    except (OSError, subprocess.SubprocessError) as exc:
        # A hung or broken driver must not stop the agent from starting: report no GPUs, say why.
        log.warning("could not count GPUs with %s: %s", " ".join(command), exc)
        return 0
    return sum(1 for line in done.stdout.splitlines() if line.startswith("GPU "))


def route_to(host: str) -> tuple[str, str]:
    """(local address, interface name) this machine uses to reach `host`; ("", "") if unknown.

    Uses the kernel's routing decision (a UDP socket "connected" to the host sends nothing), so the
    answer is the address other machines on that route see, not whatever `hostname -I` lists first.
    """
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect((host, 9))
            address = probe.getsockname()[0]
    except OSError:
        return "", ""
    for name, addresses in psutil.net_if_addrs().items():
        if any(a.address.split("%")[0] == address for a in addresses):
            return address, name
    return address, ""
