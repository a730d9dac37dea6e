"""The GPUs of this host as the resource ledger counts them (L1: nvidia-ml-py, imported lazily).

On a host with an NVIDIA driver the GPUs come from NVML (`pynvml`, the nvidia-ml-py package): each
one's NVML index, its UUID, and the processes computing on it now, so a GPU busy with a program that
is not a minitrain run can be reported (and, with ``MINITRAIN_LEDGER_FOREIGN_GPUS=taken``, kept out
of placement). Without NVML (no driver, no library, or it fails) the GPUs are `hostinfo.gpu_ids`,
without UUIDs or processes.

Only the GPUs this process may use count: CUDA_VISIBLE_DEVICES, when set, names them by index or by
UUID (``GPU-...``). `Gpu.visible_entry` names a GPU for a run's agent the way this host names them:
its index (with ``CUDA_DEVICE_ORDER=PCI_BUS_ID``, so that CUDA numbers GPUs as NVML does: see
`PCI_ORDER`), or its UUID when CUDA_VISIBLE_DEVICES names GPUs by UUID or CUDA_DEVICE_ORDER is set to
another order.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass

from minitrain.hosts import hostinfo

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Gpu:
    """One GPU of this host: `index` (NVML's, i.e. the physical index; ledger claims name GPUs by it),
    `uuid` ("" when not known), `name` (the model) and `busy_pids` (processes computing on it when it
    was looked at)."""

    index: int
    uuid: str = ""
    name: str = ""
    busy_pids: tuple[int, ...] = ()
    entry: str = ""

    @property
    def visible_entry(self) -> str:
        """This GPU as a CUDA_VISIBLE_DEVICES entry for a run's agent on its host (see the module doc)."""
        return self.entry or str(self.index)


# An agent given NVML indices also gets this, so CUDA resolves them as NVML counts (by PCI bus), not
# fastest first: the two orders differ on hosts with mixed GPUs.
PCI_ORDER = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


def host_gpus(environ: Mapping[str, str] = os.environ) -> tuple[Gpu, ...]:
    """The GPUs processes started with `environ` may use, from NVML when it answers, else from
    `hostinfo.gpu_ids(environ)`. Never raises: a broken driver means no GPUs, and says why in the log."""
    found = _nvml_gpus()
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if found is None:
        ids = hostinfo.gpu_ids(environ)
        entries = [e.strip() for e in visible.split(",")] if visible is not None else []
        # UUID lists count by position: the agent must be given the entries themselves
        return tuple(Gpu(i, entry=entries[i] if not all(e.isdigit() for e in entries[:len(ids)]) else "")
                     for i in ids)
    by_uuid_order = environ.get("CUDA_DEVICE_ORDER", "PCI_BUS_ID") != "PCI_BUS_ID"
    if visible is not None and any(e.strip().startswith(("GPU-", "MIG-")) for e in visible.split(",")):
        by_uuid_order = True
    found = tuple(Gpu(g.index, g.uuid, g.name, g.busy_pids, g.uuid if by_uuid_order and g.uuid else "")
                  for g in found)
    if visible is None:
        return found
    by_index = {gpu.index: gpu for gpu in found}
    by_uuid = {gpu.uuid: gpu for gpu in found if gpu.uuid}
    chosen = []
    for entry in (e.strip() for e in visible.split(",")):
        gpu = by_index.get(int(entry)) if entry.isdigit() else by_uuid.get(entry)
        if gpu is None:
            break  # as CUDA: an entry it cannot resolve ends the list
        chosen.append(gpu)
    return tuple(chosen)


def _nvml_gpus():
    """Every GPU NVML sees, or None when NVML is not there or fails."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - NVMLError_LibraryNotFound / DriverNotLoaded: a host without GPUs
        return None
    try:
        gpus = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            gpus.append(Gpu(index, _text(pynvml.nvmlDeviceGetUUID(handle)),
                            _text(pynvml.nvmlDeviceGetName(handle)), _busy_pids(pynvml, handle)))
        return tuple(gpus)
    except Exception as exc:  # noqa: BLE001 - a GPU NVML cannot describe: fall back to counting
        log.warning("NVML could not list the GPUs (%s); counting them without it", exc)
        return None
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass


def _busy_pids(pynvml, handle) -> tuple[int, ...]:
    pids: set[int] = set()
    for query in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
        try:
            pids.update(int(p.pid) for p in getattr(pynvml, query)(handle))
        except Exception:  # noqa: BLE001 - not supported on this GPU/driver: nothing known
            continue
    return tuple(sorted(pids))


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
