"""The batch job of the `slurm` workload (bench/slurm.py): a driver that runs inside the allocation.

    python -m bench.slurm_jobs OUT RESULTS STEPS STEP_S

fit() takes the allocation's nodes (Slurm mode) and trains 2 workers, one per node, with a checkpoint
every step; each attempt's ranks write their start step and the time of their first step into OUT, and
the driver writes `result.json` there at the end.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
import time

import minitrain


def _write(out: str, name: str, record: dict) -> None:
    path = os.path.join(out, name)
    with open(path + ".tmp", "w") as handle:
        json.dump(record, handle)
    os.replace(path + ".tmp", path)


def train(config):
    """Resumes after the last checkpoint; an all_reduce, a report with a checkpoint and a sleep per step."""
    import torch
    import torch.distributed as dist

    rank, start = minitrain.get_context().get_world_rank(), 0
    checkpoint = minitrain.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as directory, open(os.path.join(directory, "state.json")) as handle:
            start = json.load(handle)["step"] + 1
    for step in range(start, config["steps"]):
        dist.all_reduce(torch.ones(1))
        if step == start:
            _write(config["out"], f"first_step_{os.getpid()}.json",
                   {"rank": rank, "start": start, "time": time.time(), "node": os.environ.get("SLURMD_NODENAME")})
        with tempfile.TemporaryDirectory() as directory:
            if rank == 0:
                with open(os.path.join(directory, "state.json"), "w") as handle:
                    json.dump({"step": step}, handle)
            minitrain.report({"step": step}, checkpoint=minitrain.Checkpoint.from_directory(directory))
        time.sleep(config["step_s"])


def main(argv: list[str]) -> int:
    from minitrain import FailureConfig, RunConfig, ScalingConfig
    from minitrain.torch import TorchTrainer

    out, results, steps, step_s = argv[0], argv[1], int(argv[2]), float(argv[3])
    # The requeue fit() asks for makes Slurm SIGTERM this batch script at once: ignored, so that the
    # preempted driver's record below is written (it raced the signal and was lost in 1 run of 3). The
    # workload preempts with SIGUSR2, so SIGTERM is not one of its preemption signals here.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    trainer = TorchTrainer(train, train_loop_config={"out": out, "steps": steps, "step_s": step_s},
                           scaling_config=ScalingConfig(num_workers=2),
                           run_config=RunConfig(name="bench", storage_path=results,
                                                failure_config=FailureConfig(max_failures=1)))
    try:
        result = trainer.fit()
    except minitrain.PreemptionError as exc:  # fit() asked Slurm to requeue the job just before raising
        _write(out, f"preempted_{os.getpid()}.json", {"time": time.time(), "round": exc.preemption_info.round})
        return 143
    _write(out, "result.json", {"metrics": result.metrics})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
