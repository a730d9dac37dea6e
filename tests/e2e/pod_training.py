"""The script every "pod" runs in tests/e2e/test_kubernetes_pods.py (``python -m minitrain.launch
pod_training.py OUT STORAGE STEPS STEP_S [MAX_FAILURES]``): on pod 0 it is the driver, a DDP (gloo) run of one worker a
pod that checkpoints every step and resumes from the latest checkpoint; each rank writes what it saw into
OUT so the test can tell where ranks ran and where a resumed attempt started.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time

import minitrain
from minitrain import Checkpoint, FailureConfig, RunConfig, ScalingConfig
from minitrain.torch import TorchTrainer


def _write(out: str, name: str, record: dict) -> None:
    path = os.path.join(out, name)
    with open(path + ".tmp", "w") as handle:
        json.dump(record, handle)
    os.replace(path + ".tmp", path)  # the test polls the directory: never a half-written file


def train(config):
    import torch
    import torch.distributed as dist

    from minitrain.torch import prepare_model

    context = minitrain.get_context()
    rank, world = context.get_world_rank(), context.get_world_size()
    start = 0
    checkpoint = minitrain.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as directory:
            with open(os.path.join(directory, "step")) as handle:
                start = int(handle.read()) + 1
    _write(config["out"], f"rank_{rank}_start_{start}.json",
           {"rank": rank, "world": world, "start": start, "netns": os.readlink("/proc/self/ns/net"),
            "time": time.time(), "token_variable": "MINITRAIN_JOIN_TOKEN" in os.environ})
    torch.manual_seed(rank)  # different starts: DDP's broadcast must make them equal
    model = prepare_model(torch.nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(start, config["steps"]):
        x = torch.randn(8, 4)
        loss = ((model(x) - x.sum(dim=1, keepdim=True)) ** 2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        flat = torch.cat([p.detach().flatten() for p in model.parameters()])
        gathered = [torch.zeros_like(flat) for _ in range(world)]
        dist.all_gather(gathered, flat)
        time.sleep(config["step_s"])
        _write(config["out"], f"done_{rank}.json", {"step": step})  # the latest step this rank computed
        with tempfile.TemporaryDirectory() as directory:
            if rank == 0:
                with open(os.path.join(directory, "step"), "w") as handle:
                    handle.write(str(step))
            minitrain.report({"step": step, "world": world,
                              "params_equal": all(torch.equal(g, gathered[0]) for g in gathered)},
                             checkpoint=Checkpoint.from_directory(directory) if rank == 0 else None)


if __name__ == "__main__":
    out, storage, steps, step_s = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    max_failures = int(sys.argv[5]) if len(sys.argv) > 5 else 0
    pods = int(os.environ.get("PET_NNODES") or os.environ["WORLD_SIZE"])
    trainer = TorchTrainer(train, train_loop_config={"out": out, "steps": steps, "step_s": step_s},
                           scaling_config=ScalingConfig(num_workers=pods, placement_strategy="STRICT_SPREAD"),
                           run_config=RunConfig(name="pods", storage_path=storage,
                                                failure_config=FailureConfig(max_failures=max_failures)))
    result = trainer.fit()
    _write(out, "result.json", {"metrics": result.metrics})
