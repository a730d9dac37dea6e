"""Training functions and a driver for tests/e2e/test_slurm_allocation.py, run inside Slurm jobs.

Each rank writes what it saw (its rank, its Slurm node and step, its network namespace) as JSON into
``config["out"]``, so the test can tell where the ranks ran and which attempt started where.

    python slurm_training.py OUT RESULTS STEPS STEP_S     # the driver of the lost-step test: fit()
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time

import minitrain


def _where() -> dict:
    context = minitrain.get_context()
    return {"rank": context.get_world_rank(), "world": context.get_world_size(), "pid": os.getpid(),
            "node": os.environ.get("SLURMD_NODENAME"), "job": os.environ.get("SLURM_JOB_ID"),
            "step": os.environ.get("SLURM_STEP_ID"), "netns": os.readlink("/proc/self/ns/net")}


def _write(out: str, name: str, record: dict) -> None:
    path = os.path.join(out, name)
    with open(path + ".tmp", "w") as handle:
        json.dump(record, handle)
    os.replace(path + ".tmp", path)  # the test polls the directory: never a half-written file


def train_ddp(config):
    """A DDP model (gloo, CPU) trained a few steps; every rank checks that the parameters agree."""
    import torch
    import torch.distributed as dist

    from minitrain.torch import prepare_model

    where = _where()
    _write(config["out"], f"rank_{where['rank']}.json", where)
    torch.manual_seed(where["rank"])  # different starts: DDP's broadcast must make them equal
    model = prepare_model(torch.nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(config.get("steps", 3)):
        x = torch.randn(8, 4)
        loss = ((model(x) - x.sum(dim=1, keepdim=True)) ** 2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        flat = torch.cat([p.detach().flatten() for p in model.parameters()])
        gathered = [torch.zeros_like(flat) for _ in range(where["world"])]
        dist.all_gather(gathered, flat)
        minitrain.report({"step": step, "world": where["world"],
                          "params_equal": all(torch.equal(g, gathered[0]) for g in gathered)})


def train_with_checkpoints(config):
    """Checkpoints every step (rank 0 writes the step); a resumed attempt starts after the checkpoint.
    Each attempt's start and first step are written down, for the test and the benchmark row."""
    import torch
    import torch.distributed as dist

    where = _where()
    start = 0
    checkpoint = minitrain.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as directory:
            with open(os.path.join(directory, "state.json")) as handle:
                start = json.load(handle)["step"] + 1
    _write(config["out"], f"start_{where['pid']}.json", {**where, "start": start})
    for step in range(start, config["steps"]):
        dist.all_reduce(torch.ones(1))
        if step == start:
            _write(config["out"], f"first_step_{where['pid']}.json", {**where, "time": time.time()})
        with tempfile.TemporaryDirectory() as directory:
            if where["rank"] == 0:
                with open(os.path.join(directory, "state.json"), "w") as handle:
                    json.dump({"step": step}, handle)
            minitrain.report({"step": step, "start": start},
                             checkpoint=minitrain.Checkpoint.from_directory(directory))
        time.sleep(config["step_s"])


def train_seeded(config):
    """A seeded DDP model (gloo, CPU) with momentum, a deterministic batch per step and rank, and a
    checkpoint of the model and optimizer every step: an uninterrupted run and a preempted-and-requeued
    one must end with the same bits. Rank 0 writes the final parameters' bytes as hex."""
    import torch

    from minitrain.torch import prepare_model

    where = _where()
    torch.manual_seed(0)
    model = prepare_model(torch.nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    start = 0
    checkpoint = minitrain.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as directory:
            state = torch.load(os.path.join(directory, "state.pt"), weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = state["step"] + 1
    _write(config["out"], f"start_{where['pid']}.json", {**where, "start": start,
                                                        "restart": os.environ.get("SLURM_RESTART_COUNT")})
    for step in range(start, config["steps"]):
        generator = torch.Generator().manual_seed(1000 * step + where["rank"])
        x = torch.randn(8, 4, generator=generator)
        loss = ((model(x) - x.sum(dim=1, keepdim=True)) ** 2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        with tempfile.TemporaryDirectory() as directory:
            if where["rank"] == 0:
                torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step},
                           os.path.join(directory, "state.pt"))
            minitrain.report({"step": step}, checkpoint=minitrain.Checkpoint.from_directory(directory))
        if where["rank"] == 0:
            _write(config["out"], "progress.json", {"step": step, "restart": os.environ.get("SLURM_RESTART_COUNT")})
        time.sleep(config["step_s"])
    if where["rank"] == 0:
        bits = b"".join(p.detach().numpy().tobytes() for p in model.parameters()).hex()
        _write(config["out"], "final_params.json", {"hex": bits})


def _record_the_token(out: str) -> None:
    """Write each run token the coordinator makes to OUT/token, so that the test can look for it on every
    command line and in every environment of the run (a test's own hook; nothing else sees it)."""
    from minitrain.coordinator import run as run_module

    made = run_module.new_token

    def new_token():
        token = made()
        _write(out, "token", {"token": token})
        return token
    run_module.new_token = new_token


def main(argv: list[str]) -> int:
    from minitrain import FailureConfig, RunConfig, ScalingConfig
    from minitrain.torch import TorchTrainer

    out, results, steps, step_s = argv[0], argv[1], int(argv[2]), float(argv[3])
    _record_the_token(out)
    result = TorchTrainer(train_with_checkpoints,
                          train_loop_config={"out": out, "steps": steps, "step_s": step_s},
                          scaling_config=ScalingConfig(num_workers=2),
                          run_config=RunConfig(name="lost_step", storage_path=results,
                                               failure_config=FailureConfig(max_failures=2))).fit()
    _write(out, "result.json", {"metrics": result.metrics, "checkpoint": result.checkpoint.path})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
