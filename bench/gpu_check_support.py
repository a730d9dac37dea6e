"""What the checks of the GPU check (`bench.gpu_check`) share: their outcome exceptions, a fit() on the
check's storage, per-rank notes, and what a worker sees of its device.

Standard library at module level only: the training functions that use `device_facts` import torch
and minitrain inside.
"""

from __future__ import annotations

import os

from bench.common import read_json, write_json


class CheckFailed(Exception):
    """The check ran and found something wrong; the message says what, `figures` what it measured."""

    def __init__(self, message: str, figures: dict | None = None):
        super().__init__(message)
        self.figures = figures or {}


class CheckSkipped(Exception):
    """The check cannot run here (no GPU, an optional package absent); the message says why."""


# ---------------------------------------------------------------------- helpers shared by the checks


def require(condition: bool, message: str) -> None:
    """CheckFailed(message) unless `condition`."""
    if not condition:
        raise CheckFailed(message)


def fit(train_func, spec: dict, name: str, config: dict, workers: int = 0, scaling: dict | None = None,
        torch_config=None, **run_kwargs):
    """`TorchTrainer(train_func).fit()` of the run `name` under the check's storage, on `workers`
    ranks (default: the spec's) with a GPU each unless the spec says `cpu`."""
    from minitrain import RunConfig, ScalingConfig
    from minitrain.torch import TorchTrainer

    scaling_config = ScalingConfig(num_workers=workers or spec["workers"], use_gpu=not spec["cpu"],
                                   **(scaling or {}))
    return TorchTrainer(train_func, train_loop_config=config, scaling_config=scaling_config,
                        torch_config=torch_config,
                        run_config=RunConfig(name=name, storage_path=os.path.join(spec["tmp"], "storage"),
                                             **run_kwargs)).fit()


def rank_notes(directory: str, count: int) -> list[dict]:
    """The notes `write_rank_note` left in `directory` for ranks 0..count-1; CheckFailed when one is missing."""
    notes = []
    for rank in range(count):
        path = os.path.join(directory, f"rank{rank}.json")
        require(os.path.exists(path), f"rank {rank} left no note in {directory}: its training function did not end")
        notes.append(read_json(path))
    return notes


def write_rank_note(directory: str, note: dict) -> None:
    """Rank `note["rank"]`'s facts, for the driver to check after fit()."""
    os.makedirs(directory, exist_ok=True)
    write_json(os.path.join(directory, f"rank{note['rank']}.json"), note)


def device_facts() -> dict:
    """What this worker sees of its device: minitrain's answer (`get_device`, `get_devices`) beside
    CUDA's (current device, its name and UUID), CUDA_VISIBLE_DEVICES, LOCAL_RANK and the backend."""
    import torch
    import torch.distributed as dist

    import minitrain
    from minitrain.torch import get_device, get_devices

    context = minitrain.get_context()
    device = get_device()
    facts = {"rank": context.get_world_rank(), "local_rank": context.get_local_rank(), "pid": os.getpid(),
             "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
             "local_rank_env": os.environ.get("LOCAL_RANK"), "device": str(device),
             "devices": [str(d) for d in get_devices()], "backend": dist.get_backend()}
    if device.type == "cuda":
        properties = torch.cuda.get_device_properties(device)
        facts.update(current_device=torch.cuda.current_device(), name=properties.name,
                     uuid=str(getattr(properties, "uuid", "")) or None)
    x = torch.ones(512, 512, device=device)
    facts["matmul_ok"] = float((x @ x).sum().item()) == 512.0 ** 3
    return facts


def expected_visible_devices(count: int) -> str:
    """CUDA_VISIBLE_DEVICES that minitrain gives the workers of a 1-node run on `count` GPUs: the first
    `count` of the driver's own list when it names GPUs by number, else 0..count-1."""
    mine = os.environ.get("CUDA_VISIBLE_DEVICES")
    entries = [e.strip() for e in mine.split(",")] if mine else []
    if entries and all(e.isdigit() for e in entries):
        return ",".join(entries[:count])
    return ",".join(str(i) for i in range(count))
