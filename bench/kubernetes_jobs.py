"""The script every "pod" runs, in the `kubernetes` workload (bench/kubernetes.py) and in the pods tests
(tests/e2e/test_kubernetes_pods.py, tests/e2e/test_join_straggle.py):

    python -m minitrain.launch bench/kubernetes_jobs.py OUT STORAGE STEPS STEP_S [MAX_FAILURES]

On pod 0 it is the driver of a DDP (gloo) run named RUN_NAME, one worker a pod (as many as the job's
pods: ``PET_NNODES`` or ``WORLD_SIZE``), a checkpoint every step (the step, from rank 0), resuming from
the latest; on the other pods minitrain.launch runs a joining agent and this script is not run. What it
writes into OUT (each file replaced whole: the callers poll the directory):

- ``rank_RANK_start_START.json`` when a rank starts an attempt at step START: its rank, world size,
  network namespace, time, and whether the token variable reached it (it must not);
- ``first_step_RANK_START.json``: the time that rank's first step of the attempt was reported (the
  bench's "first resumed step");
- ``done_RANK.json``: the latest step the rank computed, written before its report (a preempted rank
  holds after its report of the agreed round, so this says whether any rank computed past it);
- ``result.json`` on pod 0: the final metrics (step, world, and `params_equal`: every rank's parameters
  equal after the step, gathered, as DDP must keep them).

A `PreemptionError` is left to escape: ``python -m minitrain.launch`` makes it exit 143.
Only the standard library is imported at module level (bench.kubernetes imports RUN_NAME).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time

RUN_NAME = "pods"  # the run's directory under STORAGE


def _write(out: str, name: str, record: dict) -> None:
    path = os.path.join(out, name)
    with open(path + ".tmp", "w") as handle:
        json.dump(record, handle)
    os.replace(path + ".tmp", path)  # the callers poll the directory: never a half-written file


def train(config):
    import torch
    import torch.distributed as dist

    import minitrain
    from minitrain import Checkpoint
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
        _write(config["out"], f"done_{rank}.json", {"step": step})
        with tempfile.TemporaryDirectory() as directory:
            if rank == 0:
                with open(os.path.join(directory, "step"), "w") as handle:
                    handle.write(str(step))
            minitrain.report({"step": step, "world": world,
                              "params_equal": all(torch.equal(g, gathered[0]) for g in gathered)},
                             checkpoint=Checkpoint.from_directory(directory) if rank == 0 else None)
        if step == start:
            _write(config["out"], f"first_step_{rank}_{start}.json",
                   {"rank": rank, "start": start, "time": time.time()})
        time.sleep(config["step_s"])


def main(argv: list[str]) -> None:
    from minitrain import FailureConfig, RunConfig, ScalingConfig
    from minitrain.torch import TorchTrainer

    out, storage, steps, step_s = argv[0], argv[1], int(argv[2]), float(argv[3])
    max_failures = int(argv[4]) if len(argv) > 4 else 0
    pods = int(os.environ.get("PET_NNODES") or os.environ["WORLD_SIZE"])
    trainer = TorchTrainer(train, train_loop_config={"out": out, "steps": steps, "step_s": step_s},
                           scaling_config=ScalingConfig(num_workers=pods, placement_strategy="STRICT_SPREAD"),
                           run_config=RunConfig(name=RUN_NAME, storage_path=storage,
                                                failure_config=FailureConfig(max_failures=max_failures)))
    result = trainer.fit()
    _write(out, "result.json", {"metrics": result.metrics})


if __name__ == "__main__":
    main(sys.argv[1:])
