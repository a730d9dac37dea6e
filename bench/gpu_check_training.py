"""Checks of the GPU check (`bench.gpu_check`) that train: the FSDP and DeepSpeed examples with their
sharded checkpoints and resume, and the DDP benchmark row against torchrun. Run by `bench.gpu_check_jobs`.

fsdp_dcp: `examples/fsdp_train.py`'s training function (FSDP2 `fully_shard`, a DCP checkpoint from
    every rank each epoch) at its smoke-test sizes: 2 epochs, then a second fit() of the same run to
    3 epochs, which must resume from the merged DCP checkpoint at epoch 2.
deepspeed_zero2, deepspeed_zero3: `examples/deepspeed_train.py`'s training function with ZeRO stage 2
    and 3 (`engine.save_checkpoint` on every rank), the same two fits. SKIP when DeepSpeed is absent.
ddp_bench: the `ddp` benchmark's loop (bench.ddp: the MLP, batch, SGD, a report() every step) on the
    GPUs, one rank each, NCCL: minitrain (`prepare_model`) against the same loop under `torchrun
    --standalone` (its own DistributedDataParallel when the world size is above 1; neither side wraps
    at world size 1). Rank 0 times `steps` steps after `warmup`, CUDA synchronised at both ends; the
    sides alternate and the row is the ratio of the medians (the benchmark's target, >= 0.98, is
    shown, not enforced: one short run is a figure, not a verdict).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import statistics
import sys
import time

from bench.common import BenchError, read_json, run_timed, torchrun_argv, write_json
from bench.gpu_check_support import CheckSkipped, fit, require

FSDP_CONFIG = {"api": "fully_shard", "epochs": 2, "lr": 3e-3, "batch_size": 64, "samples": 512, "features": 8,
               "hidden": 32, "layers": 2}  # examples/fsdp_train.py --smoke-test
DEEPSPEED_CONFIG = {"epochs": 2, "lr": 1e-2, "batch_size": 32, "samples": 256, "features": 8,
                    "hidden": 16}  # examples/deepspeed_train.py --smoke-test
BENCH = {"gpu": {"steps": 3000, "warmup": 300, "repeats": 5}, "cpu": {"steps": 200, "warmup": 20, "repeats": 1}}
TORCHRUN_TIMEOUT_S = 150.0
TARGET_RATIO = 0.98  # bench.ddp's target


def _example(spec: dict, name: str):
    """The module examples/<name>.py, importable by name here and in the workers (they unpickle its
    training function by reference)."""
    examples = os.path.join(spec["root"], "examples")
    if examples not in sys.path:
        sys.path.insert(0, examples)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (examples, os.environ.get("PYTHONPATH")) if p)
    return importlib.import_module(name)


def _files(root: str) -> list[str]:
    return sorted(os.path.relpath(os.path.join(d, f), root) for d, _, files in os.walk(root) for f in files)


def _trained_then_resumed(spec: dict, train_func, name: str, config: dict):
    """Fit 2 epochs, check the first run, fit again to 3 epochs: (first result, its files, second result,
    seconds of each)."""
    start = time.perf_counter()
    first = fit(train_func, spec, name, config)
    first_s = time.perf_counter() - start
    metrics = first.metrics or {}
    require(metrics.get("epoch") == 1 and metrics.get("start_epoch") == 0, f"first fit: metrics {metrics}")
    require(metrics["loss"] < metrics["first_loss"], f"first fit: the loss did not drop: {metrics}")
    files = _files(first.checkpoint.path)
    start = time.perf_counter()
    second = fit(train_func, spec, name, dict(config, epochs=3))
    second_s = time.perf_counter() - start
    resumed = second.metrics or {}
    require(resumed.get("start_epoch") == 2 and resumed.get("epoch") == 2,
            f"the second fit did not resume at epoch 2 from the checkpoint: metrics {resumed}")
    return files, {"first_fit_s": round(first_s, 2), "resumed_fit_s": round(second_s, 2), "files": files,
                   "metrics": metrics, "resumed_metrics": resumed}


def check_fsdp_dcp(spec: dict):
    """See the module doc."""
    module = _example(spec, "fsdp_train")
    workers = spec["workers"]
    files, figures = _trained_then_resumed(spec, module.train_func, "fsdp", dict(FSDP_CONFIG))
    shards = [f"__{rank}_0.distcp" for rank in range(workers)]
    require(".metadata" in files and all(s in files for s in shards),
            f"the DCP checkpoint lacks .metadata or a rank's shard {shards}: {files}")
    return (f"{workers} rank(s) FSDP2, DCP checkpoint {files}, resumed at epoch 2 "
            f"({figures['first_fit_s']} s + {figures['resumed_fit_s']} s)"), figures


def _check_deepspeed(spec: dict, stage: int):
    if importlib.util.find_spec("deepspeed") is None:
        raise CheckSkipped("DeepSpeed is not installed in this Python (not a minitrain dependency; it cannot be "
                           "downloaded on the GPU machine: carry its wheel in .whl to run this check)")
    module = _example(spec, "deepspeed_train")
    workers = spec["workers"]
    files, figures = _trained_then_resumed(spec, module.train_func, f"zero{stage}",
                                           dict(DEEPSPEED_CONFIG, zero_stage=stage))
    for rank in range(workers):
        mine = [f for f in files if f"zero_pp_rank_{rank}_" in f and f.endswith("optim_states.pt")]
        require(bool(mine), f"ZeRO-{stage}: rank {rank} wrote no optimizer shard: {files}")
        if stage == 3:
            require(any(f"zero_pp_rank_{rank}_" in f and f.endswith("model_states.pt") for f in files),
                    f"ZeRO-3: rank {rank} wrote no model shard: {files}")
    return (f"{workers} rank(s) ZeRO-{stage}, every rank's shard in the checkpoint ({len(files)} files), resumed "
            f"at epoch 2 ({figures['first_fit_s']} s + {figures['resumed_fit_s']} s)"), figures


def check_deepspeed_zero2(spec: dict):
    """See the module doc."""
    return _check_deepspeed(spec, 2)


def check_deepspeed_zero3(spec: dict):
    """See the module doc."""
    return _check_deepspeed(spec, 3)


# ---------------------------------------------------------------------- ddp_bench


def timed_loop(model, device, steps: int, warmup: int, after_step) -> dict:
    """bench.ddp.train_loop on `device`: `warmup` + `steps` SGD steps on a fixed batch, the device
    synchronised before the clock starts and before it stops."""
    import torch
    import torch.nn.functional as F

    from bench.ddp import BATCH, MLP_IN, MLP_OUT

    rank = int(os.environ.get("RANK", "0"))
    generator = torch.Generator().manual_seed(rank)
    x = torch.randn(BATCH, MLP_IN, generator=generator).to(device)
    y = torch.randint(0, MLP_OUT, (BATCH,), generator=generator).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    synchronize = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    start = 0.0
    for step in range(warmup + steps):
        if step == warmup:
            synchronize()
            start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        after_step(step, loss)
    synchronize()
    seconds = time.perf_counter() - start
    return {"steps": steps, "seconds": seconds, "steps_per_s": steps / seconds, "device": str(device)}


def bench_train(config: dict) -> None:
    """The minitrain side: prepare_model, a report() every step; rank 0 writes its figures."""
    import minitrain
    from bench.ddp import build_mlp
    from minitrain.torch import get_device, prepare_model

    from minitrain import _session

    model = prepare_model(build_mlp())
    inside: list[float] = []  # seconds inside each timed report() call (the rest of its cost is elsewhere)

    def after_step(step: int, loss) -> None:
        value = loss.item()
        started = time.perf_counter()
        minitrain.report({"step": step, "loss": value})
        if step >= config["warmup"]:
            inside.append(time.perf_counter() - started)

    figures = timed_loop(model, get_device(), config["steps"], config["warmup"], after_step)
    inside.sort()
    waits = getattr(_session._current, "phase_seconds", {})  # the session's own wait counters
    figures.update(report_call_median_us=inside[len(inside) // 2] * 1e6,
                   report_call_mean_us=sum(inside) / len(inside) * 1e6,
                   report_call_p99_us=inside[int(len(inside) * 0.99)] * 1e6,
                   report_window_wait_s=waits.get("window_wait_s"))
    figures["report_parts_us"] = report_parts_us()
    if minitrain.get_context().get_world_rank() == 0:
        write_json(config["out"], figures)


def report_parts_us(calls: int = 20000) -> dict:
    """What report()'s parts cost on this machine, in us a call (mean of `calls`): the clocks it reads,
    the metrics' encoding, the telemetry's wait accounting and the queued record. On a VM a clock read
    or a lock can cost far more than on bare metal; the parts say which."""
    from minitrain import waits
    from minitrain.metrics import encode_metrics
    from minitrain.worker.transport.client import QueuedReport

    recorder = waits._recorder
    parts = {"time.time": time.time, "time.perf_counter": time.perf_counter,
             "time.monotonic": time.monotonic,
             "encode_metrics": lambda: encode_metrics({"step": 1, "loss": 0.5}),
             "waits.begin+end": lambda: recorder.end(waits.REPORT, recorder.begin(waits.REPORT)),
             "QueuedReport": lambda: QueuedReport(1, "{}", "", False)}
    out = {}
    for name, part in parts.items():
        started = time.perf_counter()
        for _ in range(calls):
            part()
        out[name] = (time.perf_counter() - started) / calls * 1e6
    return out


def role_torchrun_ddp(spec: dict) -> None:
    """One torchrun worker: env:// init (NCCL on a GPU), DDP above world size 1, the same loop."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from bench.ddp import build_mlp

    cuda = not spec["cpu"]
    dist.init_process_group("nccl" if cuda else "gloo")
    device = torch.device(f"cuda:{int(os.environ['LOCAL_RANK'])}") if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    model = build_mlp().to(device)
    if dist.get_world_size() > 1:
        model = DistributedDataParallel(model, device_ids=[device] if cuda else None)
    figures = timed_loop(model, device, spec["steps"], spec["warmup"],
                         lambda step, loss: loss.item())  # the same host sync as minitrain's report
    if dist.get_rank() == 0:
        write_json(spec["out"], figures)
    dist.barrier()
    dist.destroy_process_group()


def _torchrun_side(spec: dict, sizes: dict, out: str, index: int) -> None:
    path = os.path.join(spec["tmp"], f"spec_torchrun_{index}.json")
    write_json(path, {**sizes, "cpu": spec["cpu"], "out": out})
    argv = torchrun_argv("gpu_check_jobs", ["--role", "torchrun-ddp", "--spec", path], nproc=spec["workers"])
    try:
        run_timed(argv, cwd=spec["tmp"], timeout_s=TORCHRUN_TIMEOUT_S)
    except BenchError:
        if not os.path.exists(out):
            raise
        # The steps were timed; the process failed afterwards (a teardown can abort): the figure stands.


def check_ddp_bench(spec: dict):
    """See the module doc."""
    sizes = BENCH["cpu" if spec["cpu"] else "gpu"]
    runs: dict[str, list[dict]] = {"minitrain": [], "torchrun": []}
    for index in range(sizes["repeats"]):
        for side in (("minitrain", "torchrun") if index % 2 == 0 else ("torchrun", "minitrain")):
            out = os.path.join(spec["tmp"], f"{side}_{index}.json")
            if side == "minitrain":
                fit(bench_train, spec, f"bench_{index}", {"steps": sizes["steps"], "warmup": sizes["warmup"], "out": out})
            else:
                _torchrun_side(spec, {"steps": sizes["steps"], "warmup": sizes["warmup"]}, out, index)
            runs[side].append(read_json(out))
    mine = statistics.median(r["steps_per_s"] for r in runs["minitrain"])
    theirs = statistics.median(r["steps_per_s"] for r in runs["torchrun"])
    ratio = mine / theirs
    figures = {"minitrain_steps_per_s": mine, "torchrun_steps_per_s": theirs, "ratio": ratio, "runs": runs,
               "target_ratio": TARGET_RATIO, "met": ratio >= TARGET_RATIO, **sizes, "workers": spec["workers"]}
    inside = statistics.median(r["report_call_mean_us"] for r in runs["minitrain"])
    summary = (f"{spec['workers']} rank(s) on {runs['minitrain'][0]['device']}: minitrain {mine:.0f} steps/s, "
               f"torchrun {theirs:.0f} steps/s (medians of {sizes['repeats']} x {sizes['steps']} steps), ratio "
               f"{ratio:.3f}x (target >= {TARGET_RATIO}: {'met' if ratio >= TARGET_RATIO else 'not met'}); "
               f"report() itself {inside:.0f} us a call (mean)")
    return summary, figures
