"""Workloads `job`, `memory` and `report`: a trivial 2-worker job against torchrun, the peak RSS of the
driver and the agent, and the per-call cost of `report()` without a checkpoint.

job: whole-process wall time of a trivial 2-worker job (process-group init with gloo, one
    all_reduce, a few reports, exit), spawn to exit, so interpreter start, imports, launching,
    rendezvous and teardown all count. minitrain: a fresh driver calling `TorchTrainer.fit()`;
    torchrun: `torchrun --standalone --nproc-per-node 2 -m bench.core --role torchrun-worker`
    (env:// init, the same all_reduce, teardown). The two alternate after one warm-up each (excluded).
    Target: median ratio <= 1.2.
memory: measured during the same minitrain jobs: the driver's own peak RSS (ru_maxrss, written by the
    driver when fit() returned) and the agent's peak RSS (VmHWM, sampled every 50 ms from outside),
    with a check that neither maps libtorch; torchrun's launcher (which imports torch) beside them.
    Target: agent < 60 MiB.
report: `minitrain.report({3 floats})` timed call by call (perf_counter_ns) inside both workers of one
    job, back to back; the worse rank's median and p99. Peer: Ray Train's report is a barrier across
    ranks (~2 s). The loop reports faster than the driver records reports, so the report window holds it
    back (backpressure): the rate a rank sustains and the mean time per call are what the driver absorbs.
    The driver's CPU per report: a thread in the driver samples its process's CPU time (getrusage) every
    10 ms; the CPU between the first rank's first call and the last rank's last call (wall-clock stamps the
    workers write), over every report of both ranks. Targets: median <= 10 us a call; back to
    back <= 100 us a call (>= 20,000 reports/s absorbed on 2 shared cores); driver CPU <= 30 us a report.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys

from bench.common import (NUM_WORKERS, PeakRssSampler, read_json,
                                    role_argv, run_timed, say, self_peak_rss_mib, torchrun_argv, write_json)
from bench.table import Row, WorkloadResult, ratio

TARGET_JOB_RATIO = 1.2
TARGET_REPORT_MEDIAN_US = 10.0
TARGET_BACK_TO_BACK_US = 100.0
TARGET_ABSORBED_PER_S = 20_000
TARGET_DRIVER_US_PER_REPORT = 30.0
CPU_SAMPLE_S = 0.01
TARGET_AGENT_RSS_MIB = 60.0
RAY_REPORT_NOTE = "Ray Train ~2 s (a barrier per report)"
JOB_TIMEOUT_S = 180.0
REPORT_JOB_TIMEOUT_S = 600.0


# ---------------------------------------------------------------------- code run by the measured processes


def trivial_train_func(config: dict) -> None:
    """The minitrain side of `job`: one all_reduce and a few reports."""
    import torch
    import torch.distributed as dist

    import minitrain

    t = torch.ones(1)
    dist.all_reduce(t)
    for step in range(3):
        minitrain.report({"x": t.item(), "step": float(step), "loss": 1.0 / (step + 1)})


def report_train_func(config: dict) -> None:
    """`report`: time `config["calls"]` report() calls one by one; write the figures as JSON."""
    import time

    import minitrain

    rank = minitrain.get_context().get_world_rank()
    clock = time.perf_counter_ns
    samples = []
    loop_start_wall = time.time()
    loop_start = clock()
    for i in range(config["calls"]):
        metrics = {"loss": 1.0 / (i + 1), "accuracy": i / (i + 1.0), "lr": 1e-3}
        start = clock()
        minitrain.report(metrics)
        samples.append(clock() - start)
    loop_ns = clock() - loop_start
    loop_end_wall = time.time()
    samples.sort()
    write_json(os.path.join(config["out_dir"], f"report_rank{rank}.json"),
               {"rank": rank, "calls": len(samples), "loop_ns": loop_ns, "loop_start_wall": loop_start_wall,
                "loop_end_wall": loop_end_wall, "median_ns": samples[len(samples) // 2],
                "p99_ns": samples[max(0, math.ceil(0.99 * len(samples)) - 1)],
                "mean_ns": sum(samples) / len(samples), "max_ns": samples[-1]})


def fit(train_func, config: dict, storage: str, **run_kwargs):
    """`TorchTrainer(train_func, ...).fit()` with 2 workers, the run "bench" under `storage`."""
    from minitrain import RunConfig, ScalingConfig
    from minitrain.torch import TorchTrainer

    return TorchTrainer(train_func, train_loop_config=config,
                        scaling_config=ScalingConfig(num_workers=NUM_WORKERS),
                        run_config=RunConfig(name="bench", storage_path=storage, **run_kwargs)).fit()


def role_job(spec: dict) -> None:
    """A driver running the trivial job; checks the result; writes its own peak RSS."""
    result = fit(trivial_train_func, {}, spec["storage"])
    # A fast job must also be a correct one: the all_reduce summed both ranks, every report arrived.
    assert result.metrics == {"x": float(NUM_WORKERS), "step": 2.0, "loss": 1 / 3}, result.metrics
    write_json(spec["result"], {"peak_rss_mib": self_peak_rss_mib(), "torch_imported": "torch" in sys.modules})


def role_report(spec: dict) -> None:
    """A driver running the report-timing job; checks that the last report arrived; writes its own CPU
    time, sampled every CPU_SAMPLE_S, as [(wall clock, CPU seconds)] to `spec["driver_cpu"]`."""
    import resource
    import threading
    import time

    samples: list = []
    stop = threading.Event()

    def sample() -> None:
        while True:
            usage = resource.getrusage(resource.RUSAGE_SELF)
            samples.append((time.time(), usage.ru_utime + usage.ru_stime))
            if stop.wait(CPU_SAMPLE_S):
                return

    sampler = threading.Thread(target=sample, name="bench-cpu-sampler", daemon=True)
    sampler.start()
    result = fit(report_train_func, {"calls": spec["calls"], "out_dir": spec["out_dir"]}, spec["storage"])
    stop.set()
    sampler.join()
    assert result.metrics["loss"] == 1.0 / spec["calls"], result.metrics
    write_json(spec["driver_cpu"], samples)


def cpu_between(samples: list, start: float, end: float) -> float:
    """CPU seconds between wall-clock `start` and `end`, from [(wall, cpu)] samples (the last sample at
    or before `start`, the first at or after `end`: a slight overestimate, never an under-estimate)."""
    before = [cpu for wall, cpu in samples if wall <= start]
    after = [cpu for wall, cpu in samples if wall >= end]
    if not before or not after:
        raise ValueError("the driver's CPU samples do not cover the report loop")
    return after[0] - before[-1]


def role_torchrun_worker() -> None:
    """One torchrun worker: env:// init, the same all_reduce, teardown."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    t = torch.ones(1)
    dist.all_reduce(t)
    assert t.item() == dist.get_world_size()
    dist.destroy_process_group()


# ---------------------------------------------------------------------- the benchmark side


def _maps_torch(pid: int) -> bool:
    """True when the process has libtorch mapped (it imported torch)."""
    try:
        with open(f"/proc/{pid}/maps") as f:
            return "libtorch" in f.read()
    except OSError:
        return False


def _classify(cmdline: list[str]):
    text = " ".join(cmdline)
    if "minitrain.agent" in text:
        return "agent"
    if "minitrain.worker" in text:
        return "worker"
    return None


class _AgentWatch(PeakRssSampler):
    """The RSS sampler of a minitrain job, which also notes whether the agent ever mapped libtorch."""

    agent_torch = False

    def _run(self) -> None:  # sample, and check the agent's mappings once in a while
        import threading

        def check() -> None:
            while not self._stop.wait(0.5):
                for pid, label in list(self.pids.items()):
                    if label == "agent" and _maps_torch(pid):
                        self.agent_torch = True

        threading.Thread(target=check, daemon=True).start()
        super()._run()


def _timed_with_rss(argv: list[str], cwd: str, root_label: str) -> tuple[float, _AgentWatch]:
    """run_timed(argv) while sampling the peak RSS of the process (`root_label`) and its agents/workers."""
    holder: list[_AgentWatch] = []
    try:
        wall = run_timed(argv, cwd=cwd, timeout_s=JOB_TIMEOUT_S,
                         on_start=lambda proc: holder.append(_AgentWatch(proc.pid, root_label, _classify).__enter__()))
    finally:
        for watch in holder:
            watch.__exit__()
    return wall, holder[0]


def bench_job(tmp: str, repeats: int, warmup: bool) -> WorkloadResult:
    """`job` and `memory`: alternate minitrain and torchrun jobs; medians, ratio, peak RSS."""
    times: dict[str, list[float]] = {"minitrain": [], "torchrun": []}
    rss: dict[str, list[float]] = {"coordinator": [], "agent": [], "worker": [], "torchrun": []}
    agent_torch = driver_torch = False
    rounds = ([False] if warmup else []) + [True] * repeats
    for index, keep in enumerate(rounds):
        spec = {"storage": os.path.join(tmp, "storage", f"job_{index}"),
                "result": os.path.join(tmp, f"job_{index}.json")}
        path = os.path.join(tmp, f"spec_job_{index}.json")
        write_json(path, spec)
        m, mt_watch = _timed_with_rss(role_argv("core", "job", path), tmp, "coordinator")
        t, tr_watch = _timed_with_rss(torchrun_argv("core", ["--role", "torchrun-worker"]), tmp, "torchrun")
        watch = [mt_watch, tr_watch]
        driver = read_json(spec["result"])
        label = "run %d/%d" % (index + (0 if warmup else 1), repeats) if keep else "warm-up"
        say(f"  {label:>9}: minitrain {m:6.2f} s   torchrun {t:6.2f} s   peak RSS: driver "
            f"{driver['peak_rss_mib']:.0f} MiB, agent {watch[0].peaks.get('agent', 0):.0f} MiB, worker "
            f"{watch[0].peaks.get('worker', 0):.0f} MiB, torchrun launcher {watch[1].peaks.get('torchrun', 0):.0f} MiB")
        if keep:
            times["minitrain"].append(m)
            times["torchrun"].append(t)
            rss["coordinator"].append(driver["peak_rss_mib"])
            for key, source in (("agent", 0), ("worker", 0), ("torchrun", 1)):
                if key in watch[source].peaks:
                    rss[key].append(watch[source].peaks[key])
        agent_torch |= watch[0].agent_torch
        driver_torch |= driver["torch_imported"]
    m_med, t_med = statistics.median(times["minitrain"]), statistics.median(times["torchrun"])
    mem = {k: statistics.median(v) if v else None for k, v in rss.items()}
    say(f"  median: minitrain {m_med:.2f} s, torchrun {t_med:.2f} s, ratio {m_med / t_med:.2f}x "
        f"(target <= {TARGET_JOB_RATIO}x); agent imported torch: {agent_torch}, driver: {driver_torch}")
    result = WorkloadResult("job", figures={
        "repeats": repeats, "warmup": warmup, "minitrain_s": times["minitrain"], "torchrun_s": times["torchrun"],
        "minitrain_median_s": m_med, "torchrun_median_s": t_med, "ratio": m_med / t_med,
        "peak_rss_mib": mem, "peak_rss_runs_mib": rss, "agent_imported_torch": agent_torch,
        "driver_imported_torch": driver_torch})
    result.rows.append(Row("job", f"trivial {NUM_WORKERS}-worker job, whole-process wall time (median of {repeats})",
                           f"{m_med:.2f} s", f"torchrun --standalone {t_med:.2f} s", ratio(m_med, t_med),
                           f"<= {TARGET_JOB_RATIO}x", m_med / t_med <= TARGET_JOB_RATIO))
    agent = mem["agent"]
    result.rows += [
        Row("memory", f"peak RSS of the agent ({NUM_WORKERS}-worker job); torch imported: "
            f"{'yes' if agent_torch else 'no'}", "-" if agent is None else f"{agent:.0f} MiB",
            "-" if mem["torchrun"] is None else f"torchrun launcher {mem['torchrun']:.0f} MiB",
            ratio(agent, mem["torchrun"]), f"< {TARGET_AGENT_RSS_MIB:g} MiB, no torch",
            agent is not None and agent < TARGET_AGENT_RSS_MIB and not agent_torch),
        Row("memory", f"peak RSS of the coordinator (the driver process); torch imported: "
            f"{'yes' if driver_torch else 'no'}", f"{mem['coordinator']:.0f} MiB", "-", "-", "-", None),
        Row("memory", "peak RSS of one worker (torch, gloo), for scale",
            "-" if mem["worker"] is None else f"{mem['worker']:.0f} MiB"),
    ]
    return result


def bench_report(tmp: str, calls: int) -> WorkloadResult:
    """`report`: per-call report() cost inside real workers; the worse rank is the figure."""
    out_dir = os.path.join(tmp, "report_out")
    os.makedirs(out_dir, exist_ok=True)
    spec = {"storage": os.path.join(tmp, "storage", "report"), "calls": calls, "out_dir": out_dir,
            "driver_cpu": os.path.join(tmp, "report_driver_cpu.json")}
    path = os.path.join(tmp, "spec_report.json")
    write_json(path, spec)
    wall = run_timed(role_argv("core", "report", path), cwd=tmp, timeout_s=REPORT_JOB_TIMEOUT_S)
    ranks = [read_json(os.path.join(out_dir, f"report_rank{rank}.json")) for rank in range(NUM_WORKERS)]
    for r in ranks:
        say(f"  rank {r['rank']}: median {r['median_ns'] / 1e3:6.2f} us   p99 {r['p99_ns'] / 1e3:7.2f} us   "
            f"mean {r['mean_ns'] / 1e3:6.2f} us   max {r['max_ns'] / 1e3:9.1f} us   ({r['calls']} calls)")
    median_us = max(r["median_ns"] for r in ranks) / 1e3
    p99_us = max(r["p99_ns"] for r in ranks) / 1e3
    # The loop reports back to back, faster than the driver records reports: once a rank has
    # REPORT_WINDOW unrecorded reports, report() waits (backpressure), so the p99 and this rate show
    # what the driver sustains, and the median what a call costs.
    rate = min(r["calls"] / (r["loop_ns"] / 1e9) for r in ranks)
    mean_us = max(r["mean_ns"] for r in ranks) / 1e3
    absorbed = sum(r["calls"] for r in ranks) / (max(r["loop_end_wall"] for r in ranks)
                                                 - min(r["loop_start_wall"] for r in ranks))
    driver_cpu_s = cpu_between(read_json(spec["driver_cpu"]), min(r["loop_start_wall"] for r in ranks),
                               max(r["loop_end_wall"] for r in ranks))
    driver_us = driver_cpu_s / sum(r["calls"] for r in ranks) * 1e6
    result = WorkloadResult("report", figures={"calls": calls, "workers": NUM_WORKERS, "job_wall_s": wall,
                                               "per_rank": ranks, "median_us": median_us, "p99_us": p99_us,
                                               "sustained_per_rank_per_s": rate, "mean_us": mean_us,
                                               "absorbed_per_s": absorbed, "driver_cpu_s": driver_cpu_s,
                                               "driver_us_per_report": driver_us})
    result.rows += [
        Row("report", f"`report()` without checkpoint, per call, median ({calls:,} calls x {NUM_WORKERS} ranks)",
            f"{median_us:.1f} us", RAY_REPORT_NOTE, "-", f"<= {TARGET_REPORT_MEDIAN_US:g} us",
            median_us <= TARGET_REPORT_MEDIAN_US),
        Row("report", "`report()` without checkpoint, per call, p99 (back to back: includes waits for the "
            "report window)", f"{p99_us:.1f} us"),
        Row("report", "back-to-back `report()` calls a rank sustains (the driver's intake, backpressure)",
            f"{rate:,.0f} /s"),
        Row("report", f"back to back: mean time per call (worse rank) / reports absorbed per s ({NUM_WORKERS} ranks)",
            f"{mean_us:.1f} us / {absorbed:,.0f} /s", "-", "-",
            f"<= {TARGET_BACK_TO_BACK_US:g} us / >= {TARGET_ABSORBED_PER_S:,}",
            mean_us <= TARGET_BACK_TO_BACK_US and absorbed >= TARGET_ABSORBED_PER_S),
        Row("report", "the driver's CPU per report, back to back (direct streams, telemetry, console and monitor on)",
            f"{driver_us:.1f} us", "-", "-", f"<= {TARGET_DRIVER_US_PER_REPORT:g} us",
            driver_us <= TARGET_DRIVER_US_PER_REPORT),
    ]
    return result


def main(argv=None) -> int:
    """The measured processes: `--role job|report --spec PATH`, or `--role torchrun-worker`."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--role", choices=["job", "report", "torchrun-worker"], required=True)
    parser.add_argument("--spec")
    args = parser.parse_args(argv)
    if args.role == "torchrun-worker":
        role_torchrun_worker()
    else:
        {"job": role_job, "report": role_report}[args.role](read_json(args.spec))
    return 0


if __name__ == "__main__":
    sys.exit(main())
