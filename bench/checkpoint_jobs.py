"""The measured processes of the `checkpoint` and `async` workloads (see `bench.checkpoint`).

`python -m bench.checkpoint_jobs --role persist-job|steps-job --spec SPEC` is a driver
calling `TorchTrainer.fit()` with one of the training functions below. Only the standard library is
imported at module level.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

from bench.common import NUM_WORKERS, read_json, write_json

MLP_IN, MLP_HIDDEN, MLP_OUT, BATCH = 256, 1024, 10, 384
DROP_CACHES = "/proc/sys/vm/drop_caches"


def drop_caches() -> str:
    """sync, then drop the page cache; "" when done, else why not (not root, no /proc...)."""
    os.sync()
    try:
        with open(DROP_CACHES, "w") as f:
            f.write("3\n")
    except OSError as exc:
        return f"{type(exc).__name__}: {exc}"
    return ""


def _phase_seconds() -> tuple[dict, bool]:
    """The live `phase_seconds` of this rank's session (seconds spent uploading, waiting for acks and
    staging, the exported seam of minitrain.worker.session.WorkerSession), and whether it exists."""
    from minitrain import _session

    seconds = getattr(_session.current("report"), "phase_seconds", None)
    return (seconds, True) if isinstance(seconds, dict) else ({}, False)


def persist_train_func(config: dict) -> None:
    """`checkpoint`, every rank: time one SYNC report() of this rank's pre-written shard directory."""
    import torch.distributed as dist

    import minitrain

    rank = minitrain.get_context().get_world_rank()
    stats, instrumented = _phase_seconds()
    dist.barrier()
    drop_note = drop_caches() if rank == 0 and config["drop_caches"] else ""
    dist.barrier()
    checkpoint = minitrain.Checkpoint.from_directory(config["sources"][rank])
    start = time.perf_counter()
    minitrain.report({"rank": rank}, checkpoint=checkpoint,
                     checkpoint_upload_mode=minitrain.CheckpointUploadMode.SYNC)
    end = time.perf_counter()  # CLOCK_MONOTONIC: comparable across the processes of this machine
    write_json(os.path.join(config["out_dir"], f"persist_rank{rank}.json"),
               {"rank": rank, "start": start, "end": end, "seconds": end - start,
                 "instrumented": instrumented, **dict(stats), "drop_caches_error": drop_note})


def make_block_plan(variants: list, steps: int, block: int) -> list:
    """The variants' blocks in run order: ceil(steps / block) rounds, each running every variant once,
    the order rotating by one every round (so no variant always follows the same one)."""
    rounds = -(-steps // block)
    return [variants[(r + i) % len(variants)] for r in range(rounds) for i in range(len(variants))]


def steps_train_func(config: dict) -> None:
    """`async`, every rank: one DDP MLP trained in blocks of steps, the variants interleaved.

    Each block runs one lead-in step (untimed: it has no earlier checkpoint's upload running beside
    it), `block` timed steps, then drains (get_all_reported_checkpoints waits for this rank's ASYNC
    uploads and their acks), so no background work spills into the next variant's block.
    """
    import statistics

    import torch
    import torch.nn.functional as F

    import minitrain
    from minitrain.torch import prepare_model

    rank = minitrain.get_context().get_world_rank()
    torch.manual_seed(0)
    model = prepare_model(torch.nn.Sequential(
        torch.nn.Linear(MLP_IN, MLP_HIDDEN), torch.nn.ReLU(), torch.nn.Linear(MLP_HIDDEN, MLP_HIDDEN),
        torch.nn.ReLU(), torch.nn.Linear(MLP_HIDDEN, MLP_OUT)))
    module = getattr(model, "module", model)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(rank)
    x = torch.randn(BATCH, MLP_IN, generator=generator)
    y = torch.randint(0, MLP_OUT, (BATCH,), generator=generator)
    modes = {"async": minitrain.CheckpointUploadMode.ASYNC, "sync": minitrain.CheckpointUploadMode.SYNC}
    clock, counter = time.perf_counter, [0]

    def step(variant: str, timed: dict) -> None:
        start = clock()
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        metrics = {"step": counter[0], "variant": variant, "loss": loss.item()}
        counter[0] += 1
        saved = clock()
        directory = None
        if variant != "plain":
            directory = tempfile.mkdtemp(prefix="step_", dir=config["scratch"])
            torch.save(module.state_dict(), os.path.join(directory, f"model_rank{rank}.pt"))
        reported = clock()
        if variant in modes:
            minitrain.report(metrics, checkpoint=minitrain.Checkpoint.from_directory(directory),
                             checkpoint_upload_mode=modes[variant], delete_local_checkpoint_after_upload=True)
        else:
            minitrain.report(metrics)
            if directory is not None:
                shutil.rmtree(directory)
        end = clock()
        if timed is not None:
            timed["step_s"].append(end - start)
            timed["save_s"].append(reported - saved)
            timed["report_s"].append(end - reported)

    variants = config["variants"]
    for variant in variants:  # warm-up: first-time costs of every path (allocations, first upload, ...)
        for _ in range(config["warmup"]):
            step(variant, None)
        minitrain.get_all_reported_checkpoints()
    stats, instrumented = _phase_seconds()
    figures = {v: {"step_s": [], "save_s": [], "report_s": [], "drain_s": [], "block_median_s": [], "cpu_s": 0.0}
               for v in variants}
    for variant in make_block_plan(variants, config["steps"], config["block"]):
        timed = figures[variant]
        step(variant, None)  # lead-in
        before, cpu_before, first = dict(stats), time.process_time(), len(timed["step_s"])
        for _ in range(min(config["block"], config["steps"] - first)):
            step(variant, timed)
        timed["block_median_s"].append(statistics.median(timed["step_s"][first:]))
        drain_start = clock()
        minitrain.get_all_reported_checkpoints()
        timed["drain_s"].append(clock() - drain_start)
        timed["cpu_s"] += time.process_time() - cpu_before  # this worker, every thread, the drain included
        for key, value in stats.items():
            timed[key] = timed.get(key, 0.0) + value - before.get(key, 0.0)
    write_json(os.path.join(config["out_dir"], f"steps_rank{rank}.json"),
               {"rank": rank, "instrumented": instrumented, "variants": figures, "reports": counter[0]})


def _fit(train_func, config: dict, storage: str, num_to_keep=None):
    """fit() with 2 workers and CheckpointConfig(num_to_keep)."""
    from minitrain import CheckpointConfig, RunConfig, ScalingConfig
    from minitrain.torch import TorchTrainer

    return TorchTrainer(train_func, train_loop_config=config,
                        scaling_config=ScalingConfig(num_workers=NUM_WORKERS),
                        run_config=RunConfig(name="bench", storage_path=storage,
                                             checkpoint_config=CheckpointConfig(num_to_keep=num_to_keep))).fit()


def role_persist_job(spec: dict) -> None:
    """The `checkpoint` driver; checks the checkpoint holds every byte."""
    result = _fit(persist_train_func, spec, spec["storage"])
    assert result.checkpoint is not None, "no checkpoint was committed"
    expected = {name: os.path.getsize(os.path.join(src, name))
                for src in spec["sources"] for name in os.listdir(src)}
    landed = {name: os.path.getsize(os.path.join(result.checkpoint.path, name))
              for name in os.listdir(result.checkpoint.path)}
    assert landed == expected, (landed, expected)


def role_steps_job(spec: dict) -> None:
    """The `async` driver; checks the last report arrived and the kept checkpoints."""
    result = _fit(steps_train_func, spec, spec["storage"], num_to_keep=2)
    reports = read_json(os.path.join(spec["out_dir"], "steps_rank0.json"))["reports"]
    assert result.metrics["step"] == reports - 1, result.metrics
    assert len(result.best_checkpoints) == 2, result.best_checkpoints
    for checkpoint, _ in result.best_checkpoints:
        names = sorted(os.listdir(checkpoint.path))
        assert names == [f"model_rank{r}.pt" for r in range(NUM_WORKERS)], (checkpoint.path, names)


# ---------------------------------------------------------------------- the benchmark driver


def main(argv=None) -> int:
    """`--role persist-job|steps-job --spec PATH`."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--role", choices=["persist-job", "steps-job"], required=True)
    parser.add_argument("--spec", required=True)
    args = parser.parse_args(argv)
    spec = read_json(args.spec)
    (role_persist_job if args.role == "persist-job" else role_steps_job)(spec)
    return 0


if __name__ == "__main__":
    sys.exit(main())
