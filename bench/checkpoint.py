"""Workloads `checkpoint` and `async`: checkpoint persist throughput against a plain file copy, and the
step-time cost of ASYNC checkpoints. The measured code is in `checkpoint_jobs.py`.

checkpoint: one checkpoint of `size_mib` MiB (default 1024): 2 ranks, each with 4 files of size/8 in its
    own scratch directory, written (random bytes) before anything is timed, on the same disk as the
    run's storage. minitrain: a 2-worker job; after a barrier, rank 0 syncs and drops the page cache, a
    second barrier, then every rank times its `report(metrics, checkpoint=..., SYNC)`. Both ranks upload
    at once into the same checkpoint directory; the round's time is the slower rank's report() and the
    throughput is size / that time. Peer: the same bytes copied by two concurrent `cp` processes into a
    fresh directory on the same disk, timed from spawn to exit, after the same sync and cache drop.
    Neither side fsyncs. The two alternate (the order flips every repetition); outputs are deleted after
    each measurement. Target: median throughput ratio >= 0.9.
async: a 2-worker DDP MLP (~5 MiB of weights); rank 0 times each step (forward, backward, optimizer
    step, then the variant's saving and reporting). Variants: plain (report only); metrics (torch.save
    into a fresh directory, deleted again, and report: the same user work, no checkpoint); async (the
    same torch.save, then report(..., ASYNC)); sync (the same, SYNC). All four run in ONE job,
    interleaved in blocks of 10 timed steps (each after an untimed lead-in step and followed by a drain
    of the ASYNC queue), the variants' order rotating. The ASYNC overhead is the median over all rounds
    of (ASYNC block's median step / `metrics` block's median step in the same round), a paired estimate
    that outside load moves far less than a ratio of overall medians. Target: <= 5%.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import time

from bench.checkpoint_jobs import MLP_HIDDEN, MLP_IN, MLP_OUT, BATCH, drop_caches
from bench.common import (NUM_WORKERS, BenchError, read_json, run_role, say, stop_tree)
from bench.table import Row, WorkloadResult

FILES_PER_RANK = 4
MIB = 1 << 20
TARGET_THROUGHPUT_RATIO = 0.9
TARGET_ASYNC_OVERHEAD_PCT = 5.0
JOB_TIMEOUT_S = 300.0
COPY_TIMEOUT_S = 300.0
STEP_VARIANTS = ("plain", "metrics", "async", "sync")
STEP_BLOCK = 10


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


def measure_minitrain_persist(tmp: str, source_dirs: list[str], drop: bool, index: int) -> dict:
    """One minitrain round: a 2-worker job whose ranks each report their directory (SYNC)."""
    out_dir = os.path.join(tmp, "out", f"persist_{index}")
    storage = os.path.join(tmp, "storage", f"persist_{index}")
    os.makedirs(out_dir)
    spec = {"sources": source_dirs, "out_dir": out_dir, "storage": storage, "drop_caches": drop}
    wall = run_role(tmp, "checkpoint_jobs", "persist-job", spec, f"persist_{index}", JOB_TIMEOUT_S)
    ranks = [read_json(os.path.join(out_dir, f"persist_rank{rank}.json")) for rank in range(NUM_WORKERS)]
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
            stop_tree(proc)
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
    """`checkpoint`: alternate the minitrain round and the `cp` peer; medians and their ratio."""
    drop_error = drop_caches() if drop else "disabled (--no-drop-caches)"
    drop = drop and not drop_error
    if drop_error:
        say(f"  note: the page cache is not dropped between measurements ({drop_error})")
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
        say(f"  run {index + 1}/{repeats}: minitrain {m['seconds']:6.3f} s "
            f"({size_bytes / MIB / m['seconds']:7.1f} MiB/s)   cp {c['seconds']:6.3f} s "
            f"({size_bytes / MIB / c['seconds']:7.1f} MiB/s)   [{parts}]")
    m_med = statistics.median(r["seconds"] for r in runs["minitrain"])
    c_med = statistics.median(r["seconds"] for r in runs["copy"])
    m_mibs, c_mibs = size_bytes / MIB / m_med, size_bytes / MIB / c_med
    return {"size_bytes": size_bytes, "files_per_rank": FILES_PER_RANK, "repeats": repeats,
            "page_cache_dropped": drop, "drop_caches_note": drop_error, "minitrain": runs["minitrain"],
            "copy": runs["copy"], "minitrain_median_s": m_med, "copy_median_s": c_med,
            "minitrain_mib_s": m_mibs, "copy_mib_s": c_mibs, "ratio": m_mibs / c_mibs,
            "target_ratio": TARGET_THROUGHPUT_RATIO}


def bench_steps(tmp: str, steps: int, warmup: int, block: int, repeats: int) -> dict:
    """`async`: `repeats` jobs, each running every variant in interleaved blocks; rank 0's steps."""
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
        wall = run_role(tmp, "checkpoint_jobs", "steps-job", spec, f"steps_{index}", JOB_TIMEOUT_S)
        ranks = [read_json(os.path.join(out_dir, f"steps_rank{rank}.json"))["variants"]
                 for rank in range(NUM_WORKERS)]
        shutil.rmtree(storage)
        shutil.rmtree(scratch)
        for variant in STEP_VARIANTS:  # block i of every variant ran in round i, close together in time
            paired[variant].extend(v / m for v, m in zip(ranks[0][variant]["block_median_s"],
                                                          ranks[0]["metrics"]["block_median_s"]))
        say(f"  run {index + 1}/{repeats} (one job, {wall:.1f} s):")
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
            say(f"    {variant:>7}: step median {run['median_ms']:6.2f} ms, mean {run['mean_ms']:6.2f} ms; "
                f"torch.save {run['save_ms']:5.2f} ms, report() {run['report_ms']:5.2f} ms; workers' CPU "
                f"{run['cpu_ms_per_step']:6.2f} ms/step; rank 0 upload {run['upload_ms_per_step']:5.2f} ms, "
                f"ack wait {run['ack_wait_ms_per_step']:5.2f} ms per step")
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


def checkpoint_workload(tmp: str, size_mib: int, repeats: int, drop: bool) -> WorkloadResult:
    """`checkpoint`: the persist figures and their row."""
    say(f"  {size_mib} MiB in {NUM_WORKERS} ranks x {FILES_PER_RANK} files, SYNC report() vs {NUM_WORKERS} "
        f"concurrent `cp` ({repeats} repetition(s), alternating)")
    persist = bench_persist(tmp, size_mib, repeats, drop)
    shutil.rmtree(os.path.join(tmp, "sources"), ignore_errors=True)
    say(f"  median: minitrain {persist['minitrain_mib_s']:.1f} MiB/s, cp {persist['copy_mib_s']:.1f} MiB/s, ratio "
        f"{persist['ratio']:.2f}x (target >= {TARGET_THROUGHPUT_RATIO}x)")
    cache = "page cache dropped before each" if persist["page_cache_dropped"] else "page cache NOT dropped"
    result = WorkloadResult("checkpoint", figures=persist)
    result.rows.append(Row(
        "checkpoint", f"checkpoint persist, {persist['size_bytes'] / MIB:.0f} MiB in {NUM_WORKERS}x{FILES_PER_RANK} "
        f"files, SYNC report(), local disk (median of {repeats}; {cache})", f"{persist['minitrain_mib_s']:.0f} MiB/s",
        f"2 concurrent `cp` {persist['copy_mib_s']:.0f} MiB/s", f"{persist['ratio']:.2f}x",
        f">= {TARGET_THROUGHPUT_RATIO}x", persist["ratio"] >= TARGET_THROUGHPUT_RATIO))
    return result


def async_workload(tmp: str, steps: int, warmup: int, block: int, repeats: int) -> WorkloadResult:
    """`async`: the step-time figures and their rows."""
    say(f"  {NUM_WORKERS}-worker DDP MLP {MLP_IN}-{MLP_HIDDEN}-{MLP_HIDDEN}-{MLP_OUT} (batch {BATCH}): {steps} timed "
        f"steps per variant ({', '.join(STEP_VARIANTS)}) in interleaved blocks of {block}, +{warmup} warm-up steps "
        f"each, one job per repetition ({repeats})")
    steps_figures = bench_steps(tmp, steps, warmup, block, repeats)
    s = steps_figures["summary"]
    for variant in STEP_VARIANTS:
        say(f"    {variant:>7}: step median {s[variant]['median_ms']:6.2f} ms, mean {s[variant]['mean_ms']:6.2f} ms, "
            f"report() median {s[variant]['report_ms']:5.2f} ms, workers' CPU {s[variant]['cpu_ms_per_step']:6.2f} "
            f"ms/step, drain after a block {s[variant]['drain_ms']:5.2f} ms")
    overhead = steps_figures["async_overhead_pct"]
    say(f"  ASYNC overhead vs `metrics`: {overhead:+.1f}% (median of the paired block ratios; ratio of the medians "
        f"{steps_figures['async_overhead_of_medians_pct']:+.1f}%); {steps_figures['async_overhead_vs_plain_pct']:+.1f}% "
        f"vs `plain`; SYNC {steps_figures['sync_overhead_pct']:+.1f}% vs `metrics`")
    base = s["metrics"]
    peer = f"same loop, torch.save, no checkpoint: {base['median_ms']:.1f} ms"
    blocks = len(steps_figures["paired_block_ratios_vs_metrics"]["async"])
    result = WorkloadResult("async", figures=steps_figures)
    result.rows += [
        Row("async", f"step with an ASYNC checkpoint every step, median ({steps} steps x {repeats} jobs; ratio: "
            f"median of {blocks} paired blocks)", f"{s['async']['median_ms']:.1f} ms", peer,
            f"{1 + overhead / 100:.3f}x", f"<= {1 + TARGET_ASYNC_OVERHEAD_PCT / 100:.2f}x",
            overhead <= TARGET_ASYNC_OVERHEAD_PCT),
        Row("async", "step with a SYNC checkpoint every step, median", f"{s['sync']['median_ms']:.1f} ms", peer,
            f"{1 + steps_figures['sync_overhead_pct'] / 100:.3f}x"),
    ]
    return result
