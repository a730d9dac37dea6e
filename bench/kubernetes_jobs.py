"""The script every "pod" of the `kubernetes` workload runs (``python -m minitrain.launch
bench/kubernetes_jobs.py OUT STORAGE STEPS STEP_S``): on pod 0 the driver of a DDP (gloo) run of one worker
a pod, a checkpoint every step, resuming from the latest. Each rank writes ``first_step_RANK_START.json``
with the time its first step of an attempt (starting at step START) was reported."""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time

import minitrain
from minitrain import Checkpoint, RunConfig, ScalingConfig
from minitrain.torch import TorchTrainer


def _write(path: str, record: dict) -> None:
    with open(path + ".tmp", "w") as handle:
        json.dump(record, handle)
    os.replace(path + ".tmp", path)


def train(config):
    import torch

    from minitrain.torch import prepare_model

    rank = minitrain.get_context().get_world_rank()
    start = 0
    checkpoint = minitrain.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as directory:
            with open(os.path.join(directory, "step")) as handle:
                start = int(handle.read()) + 1
    model = prepare_model(torch.nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(start, config["steps"]):
        x = torch.randn(8, 4)
        loss = ((model(x) - x.sum(dim=1, keepdim=True)) ** 2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        with tempfile.TemporaryDirectory() as directory:
            if rank == 0:
                with open(os.path.join(directory, "step"), "w") as handle:
                    handle.write(str(step))
            minitrain.report({"step": step}, checkpoint=Checkpoint.from_directory(directory) if rank == 0 else None)
        if step == start:
            _write(os.path.join(config["out"], f"first_step_{rank}_{start}.json"),
                   {"rank": rank, "start": start, "time": time.time()})
        time.sleep(config["step_s"])


if __name__ == "__main__":
    out, storage, steps, step_s = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    pods = int(os.environ.get("PET_NNODES") or os.environ["WORLD_SIZE"])
    trainer = TorchTrainer(train, train_loop_config={"out": out, "steps": steps, "step_s": step_s},
                           scaling_config=ScalingConfig(num_workers=pods, placement_strategy="STRICT_SPREAD"),
                           run_config=RunConfig(name="bench", storage_path=storage))
    trainer.fit()
