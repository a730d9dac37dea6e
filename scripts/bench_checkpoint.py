"""Checkpoint benchmark of minitrain: persist throughput vs a plain file copy, and ASYNC step overhead.

Everything is measured in the same run on the same machine.

    python scripts/bench_checkpoint.py                  # full: 1 GiB checkpoint, 3 repetitions, 40 steps
    python scripts/bench_checkpoint.py --repeats 5 --json bench.json
    python scripts/bench_checkpoint.py --quick          # CI: 64 MiB, 1 repetition, 8 steps

What is measured, and how:

1. Persist throughput of one checkpoint of `--size-mib` MiB (default 1024): 2 ranks, each with 4 files
   of size/8 in its own scratch directory, written (random bytes) before anything is timed, on the same
   disk as the run's storage. minitrain: a 2-worker job; after a barrier, rank 0 syncs and drops the page
   cache, a second barrier, then every rank times its `minitrain.report(metrics,
   checkpoint=Checkpoint.from_directory(scratch), checkpoint_upload_mode=SYNC)`. Both ranks upload at
   once into the same checkpoint directory; the round's time is the slower rank's report() and the
   throughput is size / that time. Peer: the same bytes copied by two concurrent `cp` processes (one per
   rank's files) into a fresh directory on the same disk, timed from spawn to exit, after the same sync
   and cache drop. Neither side fsyncs the copied files. The two alternate (the order flips every
   repetition); outputs are deleted after each measurement, so disk use stays near 2x the size.
   Printed: the medians and the ratio minitrain / copy. Target: >= 0.9. Each minitrain rank also
   reports where its report() time went (upload, waiting for the coordinator's ack).
2. Step time with a checkpoint every step: a 2-worker DDP MLP (gloo, a fixed batch, ~5 MiB of weights);
   rank 0 times each step (forward, backward, optimizer step, then the variant's saving and reporting),
   so start-up is excluded. Variants:
     plain:    report(metrics) only;
     metrics:  torch.save of this rank's state dict into a fresh scratch directory (deleted again) and
               report(metrics): the same user work as the checkpoint variants, no checkpoint reported;
     async:    the same torch.save, then report(metrics, checkpoint, ASYNC);
     sync:     the same torch.save, then report(metrics, checkpoint, SYNC).
   All four run in ONE job, interleaved in blocks of 10 timed steps (each after an untimed lead-in step,
   and followed by a drain of the ASYNC queue, so no upload spills into another variant's block), so
   load from elsewhere on the machine hits every variant alike; `--steps` timed steps per variant, one
   job per repetition, the variants' order rotating. CheckpointConfig(num_to_keep=2). Printed: median
   and mean step per variant (medians over repetitions), the workers' CPU time per step, and the ASYNC
   overhead against `metrics` (identical user work, so the difference is minitrain's): the median over
   all rounds of (ASYNC block's median step / `metrics` block's median step in the same round), a paired
   estimate that a burst of outside load moves far less than a ratio of overall medians (also printed).
   Target: <= 5%. The overhead against `plain` (which also counts torch.save, the user's own cost) is
   printed too. On a machine whose cores the ranks fill, ASYNC's cost is the CPU its background work
   takes (the uploading threads, the coordinator's commits); the workers' CPU per step shows it.

The measured processes run this same file with `--role ...`. Everything (sources, storage, the
workers' JSON) lives under one tempfile.TemporaryDirectory(); every child runs in its own session with a
timeout, and on a timeout its whole tree is stopped. Only the standard library is imported at the top.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_core import BenchError, _stop_tree, machine_info, run_timed  # noqa: E402

SCRIPT = os.path.abspath(__file__)
NUM_WORKERS = 2
FILES_PER_RANK = 4
MIB = 1 << 20
TARGET_THROUGHPUT_RATIO = 0.9
TARGET_ASYNC_OVERHEAD_PCT = 5.0
JOB_TIMEOUT_S = 300.0
COPY_TIMEOUT_S = 300.0
STEP_VARIANTS = ("plain", "metrics", "async", "sync")
STEP_BLOCK = 10
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


def _write_json(path: str, data: dict) -> None:
    with open(path + ".tmp", "w") as f:
        json.dump(data, f)
    os.replace(path + ".tmp", path)


# ---------------------------------------------------------------------- code run by the measured processes


def _instrument(stats: dict) -> bool:
    """Accumulate the seconds the session spends uploading, waiting for acks and staging in `stats`.

    This wraps private names of minitrain.worker.session; if they change, only the breakdown is lost.
    """
    def timed(name, fn):
        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                stats[name] = stats.get(name, 0.0) + time.perf_counter() - start
        return wrapper

    try:
        import minitrain.worker.session as worker_session
        from minitrain import _session

        session = _session.current("report")
        session._upload = timed("upload_s", session._upload)
        session._client.wait_report_ack = timed("ack_wait_s", session._client.wait_report_ack)
        worker_session._stage = timed("stage_s", worker_session._stage)
    except (AttributeError, ImportError, RuntimeError):
        return False
    return True


def persist_train_func(config: dict) -> None:
    """Benchmark 1, every rank: time one SYNC report() of this rank's pre-written shard directory."""
    import torch.distributed as dist

    import minitrain

    rank = minitrain.get_context().get_world_rank()
    stats: dict = {}
    instrumented = _instrument(stats)
    dist.barrier()
    drop_note = drop_caches() if rank == 0 and config["drop_caches"] else ""
    dist.barrier()
    checkpoint = minitrain.Checkpoint.from_directory(config["sources"][rank])
    start = time.perf_counter()
    minitrain.report({"rank": rank}, checkpoint=checkpoint,
                     checkpoint_upload_mode=minitrain.CheckpointUploadMode.SYNC)
    end = time.perf_counter()  # CLOCK_MONOTONIC: comparable across the processes of this machine
    _write_json(os.path.join(config["out_dir"], f"persist_rank{rank}.json"),
                {"rank": rank, "start": start, "end": end, "seconds": end - start,
                 "instrumented": instrumented, **stats, "drop_caches_error": drop_note})


def _make_block_plan(variants: list, steps: int, block: int) -> list:
    """The variants' blocks in run order: ceil(steps / block) rounds, each running every variant once,
    the order rotating by one every round (so no variant always follows the same one)."""
    rounds = -(-steps // block)
    return [variants[(r + i) % len(variants)] for r in range(rounds) for i in range(len(variants))]


def steps_train_func(config: dict) -> None:
    """Benchmark 2, every rank: one DDP MLP trained in blocks of steps, the variants interleaved.

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
    stats: dict = {}
    instrumented = _instrument(stats)
    figures = {v: {"step_s": [], "save_s": [], "report_s": [], "drain_s": [], "block_median_s": [], "cpu_s": 0.0}
               for v in variants}
    for variant in _make_block_plan(variants, config["steps"], config["block"]):
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
    _write_json(os.path.join(config["out_dir"], f"steps_rank{rank}.json"),
                {"rank": rank, "instrumented": instrumented, "variants": figures, "reports": counter[0]})


def _fit(train_func, config: dict, storage: str, num_to_keep=None):
    from minitrain import CheckpointConfig, RunConfig, ScalingConfig
    from minitrain.torch import TorchTrainer

    return TorchTrainer(train_func, train_loop_config=config,
                        scaling_config=ScalingConfig(num_workers=NUM_WORKERS),
                        run_config=RunConfig(name="bench", storage_path=storage,
                                             checkpoint_config=CheckpointConfig(num_to_keep=num_to_keep))).fit()


def role_persist_job(spec: dict) -> None:
    """The minitrain side of benchmark 1 (a driver process); checks the checkpoint holds every byte."""
    result = _fit(persist_train_func, spec, spec["storage"])
    assert result.checkpoint is not None, "no checkpoint was committed"
    expected = {name: os.path.getsize(os.path.join(src, name))
                for src in spec["sources"] for name in os.listdir(src)}
    landed = {name: os.path.getsize(os.path.join(result.checkpoint.path, name))
              for name in os.listdir(result.checkpoint.path)}
    assert landed == expected, (landed, expected)


def role_steps_job(spec: dict) -> None:
    """Benchmark 2 (a driver process); checks the last report arrived and the kept checkpoints."""
    result = _fit(steps_train_func, spec, spec["storage"], num_to_keep=2)
    with open(os.path.join(spec["out_dir"], "steps_rank0.json")) as f:
        reports = json.load(f)["reports"]
    assert result.metrics["step"] == reports - 1, result.metrics
    assert len(result.best_checkpoints) == 2, result.best_checkpoints
    for checkpoint, _ in result.best_checkpoints:
        names = sorted(os.listdir(checkpoint.path))
        assert names == [f"model_rank{r}.pt" for r in range(NUM_WORKERS)], (checkpoint.path, names)


# ---------------------------------------------------------------------- the benchmark driver


def write_sources(root: str, size_bytes: int) -> list[list[str]]:
    """FILES_PER_RANK files of random bytes per rank under root/rank<r>/; returns the paths per rank."""
    per_file = size_bytes // (NUM_WORKERS * FILES_PER_RANK)
    chunk = os.urandom(min(per_file, 8 * MIB))  # random, so nothing on the way can compress it
    sources = []
    for rank in range(NUM_WORKERS):
        directory = os.path.join(root, f"rank{rank}")
        os.makedirs(directory)
        paths = []
        for index in range(FILES_PER_RANK):
            path = os.path.join(directory, f"shard_r{rank}_{index}.bin")
            with open(path, "wb") as f:
                left = per_file
                while left > 0:
                    left -= f.write(chunk[:left])
            paths.append(path)
        sources.append(paths)
    os.sync()
    return sources


def run_role(tmp: str, role: str, spec: dict, name: str) -> float:
    """Run this file as `--role role` with `spec`; returns the whole process's wall time."""
    path = os.path.join(tmp, f"spec_{name}.json")
    _write_json(path, spec)
    return run_timed([sys.executable, SCRIPT, "--role", role, "--spec", path], cwd=tmp, timeout_s=JOB_TIMEOUT_S)


def measure_minitrain_persist(tmp: str, source_dirs: list[str], drop: bool, index: int) -> dict:
    out_dir = os.path.join(tmp, "out", f"persist_{index}")
    storage = os.path.join(tmp, "storage", f"persist_{index}")
    os.makedirs(out_dir)
    spec = {"sources": source_dirs, "out_dir": out_dir, "storage": storage, "drop_caches": drop}
    wall = run_role(tmp, "persist-job", spec, f"persist_{index}")
    ranks = []
    for rank in range(NUM_WORKERS):
        with open(os.path.join(out_dir, f"persist_rank{rank}.json")) as f:
            ranks.append(json.load(f))
    shutil.rmtree(storage)
    return {"seconds": max(r["seconds"] for r in ranks),
            "span_s": max(r["end"] for r in ranks) - min(r["start"] for r in ranks),
            "job_wall_s": wall, "per_rank": ranks}


def measure_copy(tmp: str, sources: list[list[str]], drop: bool, index: int) -> dict:
    """Two concurrent `cp` processes, one per rank's files, into one fresh directory."""
    dest = os.path.join(tmp, "copy", f"copy_{index}")
    os.makedirs(dest)
    if drop:
        drop_caches()
    start = time.perf_counter()
    procs = [subprocess.Popen(["cp", "--", *files, dest], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, start_new_session=True) for files in sources]
    try:
        outputs = [proc.communicate(timeout=COPY_TIMEOUT_S)[0] for proc in procs]
    except subprocess.TimeoutExpired:
        for proc in procs:
            _stop_tree(proc)
        raise BenchError(f"cp did not finish within {COPY_TIMEOUT_S:g} s") from None
    seconds = time.perf_counter() - start
    for proc, output in zip(procs, outputs):
        if proc.returncode != 0:
            raise BenchError(f"cp exited with {proc.returncode}: {output.decode(errors='replace')[-2000:]}")
    copied = sum(os.path.getsize(os.path.join(dest, name)) for name in os.listdir(dest))
    expected = sum(os.path.getsize(path) for files in sources for path in files)
    if copied != expected:
        raise BenchError(f"cp copied {copied} bytes, expected {expected}")
    shutil.rmtree(dest)
    return {"seconds": seconds}


def bench_persist(tmp: str, size_mib: int, repeats: int, drop: bool) -> dict:
    """Benchmark 1: alternate the minitrain round and the `cp` peer; medians and their ratio."""
    drop_error = drop_caches() if drop else "disabled (--no-drop-caches)"
    drop = drop and not drop_error
    if drop_error:
        print(f"  note: the page cache is not dropped between measurements ({drop_error})")
    sources = write_sources(os.path.join(tmp, "sources"), size_mib * MIB)
    size_bytes = sum(os.path.getsize(path) for files in sources for path in files)
    source_dirs = [os.path.dirname(files[0]) for files in sources]
    runs: dict[str, list] = {"minitrain": [], "copy": []}
    for index in range(repeats):
        order = ("minitrain", "copy") if index % 2 == 0 else ("copy", "minitrain")
        for side in order:
            if side == "minitrain":
                runs[side].append(measure_minitrain_persist(tmp, source_dirs, drop, index))
            else:
                runs[side].append(measure_copy(tmp, sources, drop, index))
        m, c = runs["minitrain"][-1], runs["copy"][-1]
        parts = "   ".join(
            f"rank {r['rank']} {r['seconds']:.3f} s (upload {r.get('upload_s', float('nan')):.3f}, "
            f"ack {r.get('ack_wait_s', float('nan')) * 1e3:.1f} ms)" for r in m["per_rank"])
        print(f"  run {index + 1}/{repeats}: minitrain {m['seconds']:6.3f} s "
              f"({size_bytes / MIB / m['seconds']:7.1f} MiB/s)   cp {c['seconds']:6.3f} s "
              f"({size_bytes / MIB / c['seconds']:7.1f} MiB/s)   [{parts}]", flush=True)
    m_med = statistics.median(r["seconds"] for r in runs["minitrain"])
    c_med = statistics.median(r["seconds"] for r in runs["copy"])
    m_mibs, c_mibs = size_bytes / MIB / m_med, size_bytes / MIB / c_med
    return {"size_bytes": size_bytes, "files_per_rank": FILES_PER_RANK, "repeats": repeats,
            "page_cache_dropped": drop, "drop_caches_note": drop_error, "minitrain": runs["minitrain"],
            "copy": runs["copy"], "minitrain_median_s": m_med, "copy_median_s": c_med,
            "minitrain_mib_s": m_mibs, "copy_mib_s": c_mibs, "ratio": m_mibs / c_mibs,
            "target_ratio": TARGET_THROUGHPUT_RATIO}


def bench_steps(tmp: str, steps: int, warmup: int, block: int, repeats: int) -> dict:
    """Benchmark 2: `repeats` jobs, each running every variant in interleaved blocks; rank 0's steps."""
    runs: dict[str, list] = {variant: [] for variant in STEP_VARIANTS}
    paired: dict[str, list] = {variant: [] for variant in STEP_VARIANTS}
    for index in range(repeats):
        shift = index % len(STEP_VARIANTS)
        variants = list(STEP_VARIANTS[shift:] + STEP_VARIANTS[:shift])
        out_dir, scratch = os.path.join(tmp, "out", f"steps_{index}"), os.path.join(tmp, "scratch", f"steps_{index}")
        storage = os.path.join(tmp, "storage", f"steps_{index}")
        os.makedirs(out_dir)
        os.makedirs(scratch)
        spec = {"variants": variants, "steps": steps, "warmup": warmup, "block": block, "out_dir": out_dir,
                "scratch": scratch, "storage": storage}
        wall = run_role(tmp, "steps-job", spec, f"steps_{index}")
        ranks = []
        for rank in range(NUM_WORKERS):
            with open(os.path.join(out_dir, f"steps_rank{rank}.json")) as f:
                ranks.append(json.load(f)["variants"])
        shutil.rmtree(storage)
        shutil.rmtree(scratch)
        for variant in STEP_VARIANTS:  # block i of every variant ran in round i, close together in time
            paired[variant].extend(v / m for v, m in zip(ranks[0][variant]["block_median_s"],
                                                          ranks[0]["metrics"]["block_median_s"]))
        print(f"  run {index + 1}/{repeats} (one job, {wall:.1f} s):")
        for variant in STEP_VARIANTS:
            figures = ranks[0][variant]
            step_s = figures["step_s"]
            n = len(step_s)
            run = {"median_ms": statistics.median(step_s) * 1e3, "mean_ms": statistics.fmean(step_s) * 1e3,
                   "save_ms": statistics.median(figures["save_s"]) * 1e3,
                   "report_ms": statistics.median(figures["report_s"]) * 1e3,
                   "report_mean_ms": statistics.fmean(figures["report_s"]) * 1e3,
                   "drain_ms": statistics.median(figures["drain_s"]) * 1e3,
                   "cpu_ms_per_step": sum(r[variant]["cpu_s"] for r in ranks) * 1e3 / n,
                   "upload_ms_per_step": figures.get("upload_s", 0.0) * 1e3 / n,
                   "ack_wait_ms_per_step": figures.get("ack_wait_s", 0.0) * 1e3 / n,
                   "stage_ms_per_step": figures.get("stage_s", 0.0) * 1e3 / n, "step_s": step_s}
            runs[variant].append(run)
            print(f"    {variant:>7}: step median {run['median_ms']:6.2f} ms, mean {run['mean_ms']:6.2f} ms; "
                  f"torch.save {run['save_ms']:5.2f} ms, report() {run['report_ms']:5.2f} ms; workers' CPU "
                  f"{run['cpu_ms_per_step']:6.2f} ms/step; rank 0 upload {run['upload_ms_per_step']:5.2f} ms, "
                  f"ack wait {run['ack_wait_ms_per_step']:5.2f} ms per step", flush=True)
    keys = ("median_ms", "mean_ms", "save_ms", "report_ms", "drain_ms", "cpu_ms_per_step",
            "upload_ms_per_step", "ack_wait_ms_per_step", "stage_ms_per_step")
    summary = {variant: {key: statistics.median(r[key] for r in rs) for key in keys}
               for variant, rs in runs.items()}

    def overhead(variant: str, base: str, key: str = "median_ms") -> float:
        return 100.0 * (summary[variant][key] / summary[base][key] - 1.0)

    def paired_overhead(variant: str, base: str) -> float:
        return 100.0 * (statistics.median(v / b for v, b in zip(paired[variant], paired[base])) - 1.0)

    return {"steps": steps, "warmup": warmup, "block": block, "repeats": repeats, "workers": NUM_WORKERS,
            "model": f"MLP {MLP_IN}-{MLP_HIDDEN}-{MLP_HIDDEN}-{MLP_OUT}, batch {BATCH}", "runs": runs,
            "summary": summary, "paired_block_ratios_vs_metrics": paired,
            "async_overhead_pct": paired_overhead("async", "metrics"),
            "async_overhead_of_medians_pct": overhead("async", "metrics"),
            "async_overhead_mean_pct": overhead("async", "metrics", "mean_ms"),
            "async_overhead_vs_plain_pct": paired_overhead("async", "plain"),
            "sync_overhead_pct": paired_overhead("sync", "metrics"),
            "async_extra_cpu_ms_per_step": summary["async"]["cpu_ms_per_step"]
            - summary["metrics"]["cpu_ms_per_step"],
            "target_overhead_pct": TARGET_ASYNC_OVERHEAD_PCT}


def markdown_table(machine: dict, persist: dict, steps: dict, command: str) -> str:
    """The README table."""
    def met(ok: bool) -> str:
        return "yes" if ok else "**no**"

    s, n = steps["summary"], persist["repeats"]
    size = persist["size_bytes"] / MIB
    cache = "page cache dropped before each" if persist["page_cache_dropped"] else "page cache NOT dropped"
    base = s["metrics"]
    peer = f"same loop, torch.save, no checkpoint: {base['median_ms']:.1f} / {base['mean_ms']:.1f} ms"
    blocks = len(steps["paired_block_ratios_vs_metrics"]["async"])

    def step_row(label: str, variant: str, overhead: float, target: str, ok: str) -> str:
        return (f"| {label} | {s[variant]['median_ms']:.1f} / {s[variant]['mean_ms']:.1f} ms "
                f"(report() {s[variant]['report_ms']:.2f} ms) | {peer} | {1 + overhead / 100:.3f}x | {target} | {ok} |")

    rows = [
        "| Measure (2 workers, gloo, CPU) | minitrain | peer | ratio | target | met |",
        "|---|---|---|---|---|---|",
        f"| Checkpoint persist, {size:.0f} MiB in {NUM_WORKERS}x{FILES_PER_RANK} files, SYNC report() "
        f"(median of {n}; {cache}) | {persist['minitrain_mib_s']:.0f} MiB/s "
        f"| 2 concurrent `cp` {persist['copy_mib_s']:.0f} MiB/s | {persist['ratio']:.2f}x "
        f"| >= {TARGET_THROUGHPUT_RATIO}x | {met(persist['ratio'] >= TARGET_THROUGHPUT_RATIO)} |",
        step_row(f"Step with an ASYNC checkpoint every step, median / mean ({steps['steps']} steps x "
                 f"{steps['repeats']} jobs; ratio: median of {blocks} paired blocks)", "async",
                 steps["async_overhead_pct"], f"<= {1 + TARGET_ASYNC_OVERHEAD_PCT / 100:.2f}x",
                 met(steps["async_overhead_pct"] <= TARGET_ASYNC_OVERHEAD_PCT)),
        step_row("Step with a SYNC checkpoint every step, median / mean", "sync", steps["sync_overhead_pct"],
                 "-", "-"),
        f"| Step with metrics-only report(), no torch.save, median / mean | {s['plain']['median_ms']:.1f} / "
        f"{s['plain']['mean_ms']:.1f} ms | - | - | - | - |",
        f"| Workers' CPU per step (both ranks): ASYNC / metrics-only + torch.save | "
        f"{s['async']['cpu_ms_per_step']:.1f} ms | {base['cpu_ms_per_step']:.1f} ms "
        f"| {steps['async_extra_cpu_ms_per_step']:+.1f} ms | - | - |",
    ]
    footer = (f"\n_Machine: {machine['cpu']}, {machine['cores']} cores, {machine['disk']}, Python "
              f"{machine['python']}, torch {machine['torch']}, grpcio {machine['grpcio']}, load average "
              f"{machine['load_1min']} -> {machine['load_1min_end']}; `{command}`._")
    return "\n".join(rows) + "\n" + footer


def disk_info(path: str) -> str:
    """The filesystem type and device under `path` (from /proc/mounts)."""
    best = ("", "unknown device", "unknown filesystem")
    try:
        with open("/proc/mounts") as f:
            for line in f:
                device, mount, fstype = line.split()[:3]
                if (path == mount or path.startswith(mount.rstrip("/") + "/")) and len(mount) >= len(best[0]):
                    best = (mount, device, fstype)
    except OSError:
        pass
    free = shutil.disk_usage(path).free / (1 << 30)
    return f"{best[2]} on {best[1]} ({free:.0f} GiB free)"


def run_benchmarks(args: argparse.Namespace) -> int:
    repeats = 1 if args.quick else args.repeats
    size_mib = 64 if args.quick else args.size_mib
    steps = 8 if args.quick else args.steps
    warmup = 2 if args.quick else 5
    block = 4 if args.quick else STEP_BLOCK
    base = os.path.realpath(args.tmp_dir or tempfile.gettempdir())
    machine = machine_info()
    machine["disk"] = disk_info(base)
    print(f"Machine: {machine['cpu']}, {machine['cores']} cores, {machine['os']}; disk {machine['disk']}; "
          f"Python {machine['python']}, torch {machine['torch']}, grpcio {machine['grpcio']}, minitrain "
          f"{machine['minitrain']}; load average {machine['load_1min']}")
    if machine["load_1min"] > 0.5 * machine["cores"]:
        print("  note: the machine is busy; the figures below are noisier than on an idle machine")
    with tempfile.TemporaryDirectory(prefix="minitrain-bench-ckpt-", dir=base) as tmp:
        try:
            print(f"\n1. Checkpoint persist, {size_mib} MiB in {NUM_WORKERS} ranks x {FILES_PER_RANK} files, "
                  f"SYNC report() vs {NUM_WORKERS} concurrent `cp` ({repeats} repetition(s), alternating)")
            persist = bench_persist(tmp, size_mib, repeats, not args.no_drop_caches)
            print(f"  median: minitrain {persist['minitrain_mib_s']:.1f} MiB/s, cp {persist['copy_mib_s']:.1f} "
                  f"MiB/s, ratio {persist['ratio']:.2f}x (target >= {TARGET_THROUGHPUT_RATIO}x)")
            shutil.rmtree(os.path.join(tmp, "sources"))
            print(f"\n2. Step time with a report every step, {NUM_WORKERS}-worker DDP MLP: {steps} timed steps per "
                  f"variant ({', '.join(STEP_VARIANTS)}) in interleaved blocks of {block}, +{warmup} warm-up "
                  f"steps each, in one job per repetition ({repeats} repetition(s))")
            step_figures = bench_steps(tmp, steps, warmup, block, repeats)
            s = step_figures["summary"]
            print("  medians over the repetitions:")
            for variant in STEP_VARIANTS:
                print(f"    {variant:>7}: step median {s[variant]['median_ms']:6.2f} ms, mean "
                      f"{s[variant]['mean_ms']:6.2f} ms, report() median {s[variant]['report_ms']:5.2f} ms, "
                      f"workers' CPU {s[variant]['cpu_ms_per_step']:6.2f} ms/step, "
                      f"drain after a block {s[variant]['drain_ms']:5.2f} ms")
            print(f"  ASYNC overhead vs `metrics`: {step_figures['async_overhead_pct']:+.1f}% (median of the "
                  f"paired block ratios; ratio of the medians {step_figures['async_overhead_of_medians_pct']:+.1f}%, "
                  f"of the means {step_figures['async_overhead_mean_pct']:+.1f}%; target <= "
                  f"+{TARGET_ASYNC_OVERHEAD_PCT:g}%); {step_figures['async_overhead_vs_plain_pct']:+.1f}% vs "
                  f"`plain`; {step_figures['async_extra_cpu_ms_per_step']:+.2f} ms of workers' CPU per step. "
                  f"SYNC: {step_figures['sync_overhead_pct']:+.1f}% vs `metrics`.")
        except BenchError as exc:
            print(f"\nbenchmark failed: {exc}", file=sys.stderr)
            return 1
    machine["load_1min_end"] = round(os.getloadavg()[0], 2)
    command = "python scripts/bench_checkpoint.py" + (" --quick" if args.quick else
                                                       f" --repeats {repeats} --size-mib {size_mib} --steps {steps}")
    table = markdown_table(machine, persist, step_figures, command)
    print("\n" + table)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": machine, "quick": args.quick, "persist": persist, "steps": step_figures,
                       "markdown": table}, f, indent=2)
        print(f"\nfigures written to {args.json}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="repetitions of every measurement (default 3)")
    parser.add_argument("--size-mib", type=int, default=1024, help="total checkpoint size in MiB (default 1024)")
    parser.add_argument("--steps", type=int, default=40, help="timed training steps per variant and job (default 40)")
    parser.add_argument("--quick", action="store_true",
                        help="64 MiB, 1 repetition, 8 steps (proves the benchmark still works)")
    parser.add_argument("--json", metavar="PATH", help="also write the figures as JSON to PATH")
    parser.add_argument("--tmp-dir", metavar="DIR", help="where the temporary directory goes (its disk is measured)")
    parser.add_argument("--no-drop-caches", action="store_true", help="do not drop the page cache between runs")
    # Internal: what the measured processes run.
    parser.add_argument("--role", choices=["persist-job", "steps-job"], help=argparse.SUPPRESS)
    parser.add_argument("--spec", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.role:
        with open(args.spec) as f:
            spec = json.load(f)
        (role_persist_job if args.role == "persist-job" else role_steps_job)(spec)
        return 0
    if args.repeats < 1 or args.steps < 1 or args.size_mib < NUM_WORKERS * FILES_PER_RANK:
        parser.error(f"--repeats and --steps must be >= 1 and --size-mib >= {NUM_WORKERS * FILES_PER_RANK}")
    return run_benchmarks(args)


if __name__ == "__main__":
    sys.exit(main())
