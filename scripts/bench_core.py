"""Core benchmark of minitrain against torchrun, both measured in the same run on the same machine.

    python scripts/bench_core.py                 # full: 5 repetitions (+1 warm-up each), 20,000 report calls
    python scripts/bench_core.py --repeats 9 --json bench.json
    python scripts/bench_core.py --quick         # CI: 1 repetition, no warm-up, 2,000 report calls

What is measured, and how:

1. Whole-job wall time of a trivial 2-worker job: init the process group (gloo), one all_reduce, a few
   reports (minitrain only: torchrun has none), exit. Each job is a whole fresh process timed from spawn
   to exit, so interpreter start, imports, launching, rendezvous and teardown all count:
     minitrain: `python scripts/bench_core.py --role minitrain-job` (a driver calling TorchTrainer.fit());
     torchrun:  `torchrun --standalone --nproc-per-node 2 scripts/bench_core.py --role torchrun-worker`
                (each worker inits with env://, does the same all_reduce, destroys the group, exits).
   The two run back to back, alternating, after one warm-up each (excluded); printed: the median of each
   and the ratio minitrain / torchrun. Target: <= 1.2x.
2. Per-call cost of `minitrain.report({3 floats})` without a checkpoint, inside real workers: a 2-worker
   minitrain job whose train function times every call with time.perf_counter_ns and writes the median
   and p99 to a JSON file under the temp dir (the train function's return value does not travel back).
   Target: <= 50 us median. Peer: Ray Train's report is a barrier across ranks, ~2 s per report.

The measured processes run this same file with `--role ...`, so the code they run is right here.
Everything (storage paths, JSON from the workers) lives under one tempfile.TemporaryDirectory(); every
child runs in its own session with a timeout, and on a timeout its whole tree is stopped.
Only the standard library is imported at the top, so the measured processes pay nothing for this file.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from importlib import metadata

SCRIPT = os.path.abspath(__file__)
NUM_WORKERS = 2
TARGET_JOB_RATIO = 1.2
TARGET_REPORT_MEDIAN_US = 50.0
RAY_REPORT_NOTE = "Ray Train ~2 s (a barrier per report)"
JOB_TIMEOUT_S = 180.0
REPORT_JOB_TIMEOUT_S = 600.0
STOP_GRACE_S = 5.0


# ---------------------------------------------------------------------- code run by the measured processes


def trivial_train_func(config: dict) -> None:
    """The minitrain side of benchmark 1: one all_reduce and a few reports."""
    import torch
    import torch.distributed as dist

    import minitrain

    t = torch.ones(1)
    dist.all_reduce(t)
    for step in range(3):
        minitrain.report({"x": t.item(), "step": float(step), "loss": 1.0 / (step + 1)})


def report_train_func(config: dict) -> None:
    """Benchmark 2: time `config["calls"]` report() calls one by one; write the figures as JSON."""
    import json
    import os
    import time

    import minitrain

    rank = minitrain.get_context().get_world_rank()
    clock = time.perf_counter_ns
    samples = []
    for i in range(config["calls"]):
        metrics = {"loss": 1.0 / (i + 1), "accuracy": i / (i + 1.0), "lr": 1e-3}
        start = clock()
        minitrain.report(metrics)
        samples.append(clock() - start)
    samples.sort()
    figures = {"rank": rank, "calls": len(samples),
               "median_ns": samples[len(samples) // 2],
               "p99_ns": samples[max(0, math.ceil(0.99 * len(samples)) - 1)],
               "mean_ns": sum(samples) / len(samples), "max_ns": samples[-1]}
    path = os.path.join(config["out_dir"], f"report_rank{rank}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(figures, f)
    os.replace(path + ".tmp", path)


def _fit(train_func, config: dict, storage: str):
    from minitrain import RunConfig, ScalingConfig
    from minitrain.torch import TorchTrainer

    return TorchTrainer(train_func, train_loop_config=config,
                        scaling_config=ScalingConfig(num_workers=NUM_WORKERS),
                        run_config=RunConfig(name="bench", storage_path=storage)).fit()


def role_torchrun_worker() -> None:
    """One torchrun worker: env:// init, the same all_reduce, teardown."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    t = torch.ones(1)
    dist.all_reduce(t)
    assert t.item() == dist.get_world_size()
    dist.destroy_process_group()


# ---------------------------------------------------------------------- the benchmark driver


class BenchError(RuntimeError):
    """A measured process failed or timed out; the message carries its output tail."""


def _stop_tree(proc: subprocess.Popen) -> None:
    """SIGTERM the child's group and every descendant (launchers put workers in sessions of their own),
    wait out a grace, then SIGKILL whatever is left."""
    import psutil  # a minitrain dependency; needed only on this error path

    try:
        procs = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        procs = []
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for p in procs:
            try:
                p.send_signal(sig)
            except psutil.NoSuchProcess:
                pass
        _, procs = psutil.wait_procs(procs, timeout=STOP_GRACE_S)
        if not procs:
            break
    proc.wait(timeout=STOP_GRACE_S)


def run_timed(argv: list[str], cwd: str, timeout_s: float) -> float:
    """Run argv to completion in its own session; return its wall time in seconds."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _stop_tree(proc)
        output, _ = proc.communicate()
        raise BenchError(f"{' '.join(argv)} timed out after {timeout_s:g} s; output tail:\n"
                         + output.decode(errors="replace")[-3000:]) from None
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise BenchError(f"{' '.join(argv)} exited with {proc.returncode}; output tail:\n"
                         + output.decode(errors="replace")[-3000:])
    return elapsed


def torchrun_argv() -> list[str]:
    """torchrun from this interpreter's environment (`python -m torch.distributed.run` if absent)."""
    candidate = os.path.join(os.path.dirname(sys.executable), "torchrun")
    base = [candidate] if os.access(candidate, os.X_OK) else [sys.executable, "-m", "torch.distributed.run"]
    return [*base, "--standalone", "--nproc-per-node", str(NUM_WORKERS), SCRIPT, "--role", "torchrun-worker"]


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def machine_info() -> dict:
    """CPU model, cores, versions and load: the context every figure needs."""
    model = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"cpu": model, "cores": usable, "python": platform.python_version(),
            "torch": _version("torch"), "grpcio": _version("grpcio"), "minitrain": _version("minitrain"),
            "os": f"{platform.system()} {platform.release()}", "load_1min": round(os.getloadavg()[0], 2)}


def bench_job(tmp: str, repeats: int, warmup: bool) -> dict:
    """Benchmark 1: alternate whole-process minitrain and torchrun jobs; medians and their ratio."""
    minitrain_argv = [sys.executable, SCRIPT, "--role", "minitrain-job", "--storage"]
    times: dict[str, list[float]] = {"minitrain": [], "torchrun": []}
    rounds = ([False] if warmup else []) + [True] * repeats
    for index, keep in enumerate(rounds):
        storage = os.path.join(tmp, "storage", f"job_{index}")  # a fresh run directory every time
        m = run_timed(minitrain_argv + [storage], cwd=tmp, timeout_s=JOB_TIMEOUT_S)
        t = run_timed(torchrun_argv(), cwd=tmp, timeout_s=JOB_TIMEOUT_S)
        label = "run %d/%d" % (index + (0 if warmup else 1), repeats) if keep else "warm-up"
        print(f"  {label:>9}: minitrain {m:6.2f} s   torchrun {t:6.2f} s", flush=True)
        if keep:
            times["minitrain"].append(m)
            times["torchrun"].append(t)
    m_med, t_med = statistics.median(times["minitrain"]), statistics.median(times["torchrun"])
    return {"repeats": repeats, "warmup": warmup, "minitrain_s": times["minitrain"],
            "torchrun_s": times["torchrun"], "minitrain_median_s": m_med, "torchrun_median_s": t_med,
            "ratio": m_med / t_med, "target_ratio": TARGET_JOB_RATIO}


def bench_report(tmp: str, calls: int) -> dict:
    """Benchmark 2: per-call report() cost inside real workers; the worse rank is the figure."""
    out_dir = os.path.join(tmp, "report_out")
    os.makedirs(out_dir, exist_ok=True)
    argv = [sys.executable, SCRIPT, "--role", "minitrain-report", "--storage",
            os.path.join(tmp, "storage", "report"), "--calls", str(calls), "--out-dir", out_dir]
    wall = run_timed(argv, cwd=tmp, timeout_s=REPORT_JOB_TIMEOUT_S)
    ranks = []
    for rank in range(NUM_WORKERS):
        with open(os.path.join(out_dir, f"report_rank{rank}.json")) as f:
            ranks.append(json.load(f))
    for r in ranks:
        print(f"  rank {r['rank']}: median {r['median_ns'] / 1e3:6.2f} us   p99 {r['p99_ns'] / 1e3:7.2f} us   "
              f"mean {r['mean_ns'] / 1e3:6.2f} us   max {r['max_ns'] / 1e3:9.1f} us   ({r['calls']} calls)")
    return {"calls": calls, "workers": NUM_WORKERS, "job_wall_s": wall, "per_rank": ranks,
            "median_us": max(r["median_ns"] for r in ranks) / 1e3,
            "p99_us": max(r["p99_ns"] for r in ranks) / 1e3,
            "target_median_us": TARGET_REPORT_MEDIAN_US, "peer_note": RAY_REPORT_NOTE}


def markdown_table(machine: dict, job: dict, report: dict, command: str) -> str:
    """The README table."""
    def met(ok: bool) -> str:
        return "yes" if ok else "**no**"

    n = job["repeats"]
    rows = [
        "| Measure (2 workers, gloo, CPU) | minitrain | peer | ratio | target | met |",
        "|---|---|---|---|---|---|",
        f"| Trivial job, whole-process wall time (median of {n}) | {job['minitrain_median_s']:.2f} s "
        f"| torchrun {job['torchrun_median_s']:.2f} s | {job['ratio']:.2f}x | <= {TARGET_JOB_RATIO}x "
        f"| {met(job['ratio'] <= TARGET_JOB_RATIO)} |",
        f"| `report()` without checkpoint, median per call ({report['calls']:,} calls) "
        f"| {report['median_us']:.1f} us | {RAY_REPORT_NOTE} | - | <= {TARGET_REPORT_MEDIAN_US:g} us "
        f"| {met(report['median_us'] <= TARGET_REPORT_MEDIAN_US)} |",
        f"| `report()` without checkpoint, p99 per call | {report['p99_us']:.1f} us | - | - | - | - |",
    ]
    footer = (f"\n_Machine: {machine['cpu']}, {machine['cores']} cores, Python {machine['python']}, "
              f"torch {machine['torch']}, grpcio {machine['grpcio']}; `{command}`._")
    return "\n".join(rows) + "\n" + footer


def run_benchmarks(args: argparse.Namespace) -> int:
    repeats = 1 if args.quick else args.repeats
    warmup = not args.quick
    calls = 2000 if args.quick else args.calls
    machine = machine_info()
    print(f"Machine: {machine['cpu']}, {machine['cores']} cores, {machine['os']}; Python {machine['python']}, "
          f"torch {machine['torch']}, grpcio {machine['grpcio']}, minitrain {machine['minitrain']}; "
          f"load average {machine['load_1min']}")
    if machine["load_1min"] > 0.5 * machine["cores"]:
        print("  note: the machine is busy; the wall times below are noisier than on an idle machine")
    with tempfile.TemporaryDirectory(prefix="minitrain-bench-") as tmp:
        try:
            print(f"\n1. Trivial {NUM_WORKERS}-worker job, whole-process wall time "
                  f"({repeats} repetition(s){', +1 warm-up each' if warmup else ''}, alternating)")
            job = bench_job(tmp, repeats, warmup)
            print(f"  median: minitrain {job['minitrain_median_s']:.2f} s, torchrun "
                  f"{job['torchrun_median_s']:.2f} s, ratio {job['ratio']:.2f}x (target <= {TARGET_JOB_RATIO}x)")
            print(f"\n2. minitrain.report({{3 floats}}) without a checkpoint, per call, inside "
                  f"{NUM_WORKERS} workers ({calls:,} calls each)")
            report = bench_report(tmp, calls)
            print(f"  median {report['median_us']:.1f} us, p99 {report['p99_us']:.1f} us (worse rank; target "
                  f"<= {TARGET_REPORT_MEDIAN_US:g} us median). Peer: {RAY_REPORT_NOTE}.")
        except BenchError as exc:
            print(f"\nbenchmark failed: {exc}", file=sys.stderr)
            return 1
    machine["load_1min_end"] = round(os.getloadavg()[0], 2)
    command = "python scripts/bench_core.py" + (" --quick" if args.quick else
                                                 f" --repeats {repeats} --calls {calls}")
    table = markdown_table(machine, job, report, command)
    print("\n" + table)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": machine, "quick": args.quick, "job": job, "report": report,
                       "markdown": table}, f, indent=2)
        print(f"\nfigures written to {args.json}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="measured repetitions of each job (default 5)")
    parser.add_argument("--calls", type=int, default=20000, help="report() calls per worker (default 20000)")
    parser.add_argument("--quick", action="store_true",
                        help="1 repetition, no warm-up, 2,000 report calls (proves the benchmark still works)")
    parser.add_argument("--json", metavar="PATH", help="also write the figures as JSON to PATH")
    # Internal: what the measured processes run.
    parser.add_argument("--role", choices=["minitrain-job", "minitrain-report", "torchrun-worker"],
                        help=argparse.SUPPRESS)
    parser.add_argument("--storage", help=argparse.SUPPRESS)
    parser.add_argument("--out-dir", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.role == "torchrun-worker":
        role_torchrun_worker()
    elif args.role == "minitrain-job":
        result = _fit(trivial_train_func, {}, args.storage)
        # A fast job must also be a correct one: the all_reduce summed both ranks, every report arrived.
        assert result.metrics == {"x": float(NUM_WORKERS), "step": 2.0, "loss": 1 / 3}, result.metrics
    elif args.role == "minitrain-report":
        result = _fit(report_train_func, {"calls": args.calls, "out_dir": args.out_dir}, args.storage)
        assert result.metrics["loss"] == 1.0 / args.calls, result.metrics  # the last report arrived
    else:
        if args.repeats < 1 or args.calls < 100:
            parser.error("--repeats must be >= 1 and --calls >= 100")
        return run_benchmarks(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
