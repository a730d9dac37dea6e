"""Workload `ddp`: steady-state DDP training steps per second, minitrain against the same loop under
torchrun.

Both sides run `train_loop` on 2 CPU workers (gloo): the same small MLP, fixed batch, SGD, the same
seeds, with each framework's own thread defaults (both give a worker one OpenMP thread when several
share a machine; the figures record `torch.get_num_threads()`). minitrain wraps the model with
`prepare_model` (DDP) and reports the loss every step (`report()` without a checkpoint, the common
case); torchrun's side builds `DistributedDataParallel` itself and reports nothing. Rank 0 times
`steps` steps after `warmup` untimed ones, so start-up is excluded; steps/s = steps / that time. The
two alternate (the order flips every repetition); the figure is the ratio of the medians.
Target: >= 0.99. Beside it, what the supervising processes cost during the timed steps, per
step: the CPU time of minitrain's driver and node agent, and of torchrun's launcher (`supervisor_cpu_s`,
read by each rank from its ancestors). On a CPU-bound host that CPU is taken from the training; it is the
report path's cost without the jobs' placement noise that moves the steps/s by several percent.

A third side measures what per-rank telemetry costs (target: within 1%): the minitrain side again with
`MINITRAIN_TELEMETRY=0` (no sampling thread, nothing recorded). Jobs of one machine differ by several
percent from one to the next (where the scheduler puts 2 workers, a driver and an agent on the cores),
more than the 1% to be measured, so the two minitrain sides always run back to back (which goes first
alternates) and the row's ratio is the median of those pairs' ratios (on / off), with its quartiles.
Target: >= 0.99 (within 1%). Because those pairs still differ by placement (measured quartiles 0.82-1.04
on a shared VM), each minitrain job also times telemetry on and off in alternating blocks of the same
job, same processes (`telemetry_blocks`: `minitrain.waits.ENABLED` switched at the same step on every
rank); that row is the median of the blocks' ratios. Beside it, the cost measured directly on rank 0 after its timed steps:
the telemetry bookkeeping of one report() (`minitrain.waits.reporting()`, timed over many calls, minus
an empty loop) and one sample (`Sampler.sample()`: waits totals, psutil CPU and RSS, converted to its
message and serialized as the worker's stream sends it), and what they come
to at the measured step rate and one sample a second, as a fraction of the time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

from bench.common import (NUM_WORKERS, BenchError, read_json, role_argv, run_timed, say,
                                    torchrun_argv, write_json)
from bench.table import Row, WorkloadResult, ratio

MLP_IN, MLP_HIDDEN, MLP_OUT, BATCH = 256, 512, 10, 128
TARGET_RATIO = 0.99
TELEMETRY_TARGET_RATIO = 0.99
SIDES = ("minitrain", "torchrun", "minitrain_telemetry_off")
# Each repetition's order: the telemetry pair back to back, which goes first alternating, torchrun
# before or after them.
ORDERS = (("minitrain", "minitrain_telemetry_off", "torchrun"),
          ("torchrun", "minitrain_telemetry_off", "minitrain"))
DIRECT_REPORT_CALLS = 100_000
DIRECT_SAMPLES = 300
JOB_TIMEOUT_S = 300.0


def train_loop(model, steps: int, warmup: int, after_step) -> dict:
    """The loop both sides run: `warmup` + `steps` SGD steps of `model` on a fixed batch; returns the
    timed figures. `after_step(step, loss_tensor)` is the framework's per-step hook."""
    import torch
    import torch.nn.functional as F

    rank = int(os.environ.get("RANK", "0"))
    generator = torch.Generator().manual_seed(rank)
    x = torch.randn(BATCH, MLP_IN, generator=generator)
    y = torch.randint(0, MLP_OUT, (BATCH,), generator=generator)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    start = 0.0
    supervisors_before: dict = {}
    for step in range(warmup + steps):
        if step == warmup:
            supervisors_before = supervisor_cpu_s()
            start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        after_step(step, loss)
    seconds = time.perf_counter() - start
    supervisors_after = supervisor_cpu_s()
    supervisors_ms = {name: (supervisors_after[name] - used) * 1e3 / max(steps, 1)
                      for name, used in supervisors_before.items() if name in supervisors_after}
    return {"steps": steps, "seconds": seconds, "steps_per_s": steps / seconds, "threads": torch.get_num_threads(),
            "supervisor_cpu_ms_per_step": supervisors_ms}


def supervisor_cpu_s() -> dict:
    """CPU seconds used so far by the processes that supervise this worker: minitrain's node agent and
    its driver (the coordinator), or torchrun's launcher. Whatever they use on a CPU-bound host is taken
    from the training; the steps/s ratio is noisy on a shared VM, this figure much less."""
    import psutil

    used = {}
    try:
        for ancestor in psutil.Process().parents()[:3]:  # (a worker's parent may be its fork server)
            command = " ".join(ancestor.cmdline())
            if "minitrain.agent" in command:
                used["agent"] = sum(ancestor.cpu_times()[:2])
                driver = ancestor.parent()
                if driver is not None:
                    used["driver"] = sum(driver.cpu_times()[:2])
                break
            if "torchrun" in command or "torch.distributed.run" in command:
                used["launcher"] = sum(ancestor.cpu_times()[:2])
                break
    except psutil.Error:
        pass
    return used


def build_mlp():
    """The same MLP on every rank and both sides."""
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(MLP_IN, MLP_HIDDEN), torch.nn.ReLU(),
                               torch.nn.Linear(MLP_HIDDEN, MLP_HIDDEN), torch.nn.ReLU(),
                               torch.nn.Linear(MLP_HIDDEN, MLP_OUT))


def minitrain_train_func(config: dict) -> None:
    """The minitrain side: prepare_model, a report every step; rank 0 writes its figures, with the
    MINITRAIN_TELEMETRY its worker process saw ("telemetry_env", None when unset: the side that sets
    it to 0 must have it reach the workers)."""
    import minitrain
    from minitrain.torch import prepare_model

    model = prepare_model(build_mlp())
    figures = train_loop(model, config["steps"], config["warmup"],
                         lambda step, loss: minitrain.report({"step": step, "loss": loss.item()}))
    figures["telemetry_env"] = os.environ.get("MINITRAIN_TELEMETRY")
    if config.get("ab_pairs"):
        figures["telemetry_blocks"] = telemetry_blocks(model, config["ab_pairs"], config["ab_steps"],
                                                       config["warmup"] + config["steps"])
    if minitrain.get_context().get_world_rank() == 0:
        figures.update(telemetry_direct_cost())
        write_json(config["out"], figures)


def telemetry_blocks(model, pairs: int, block_steps: int, first_step: int) -> list[tuple[float, float]]:
    """Telemetry on and off in alternating blocks of `block_steps` steps within this job (which goes
    first alternates per pair); [(seconds with telemetry on, seconds off)] per pair, as timed by this
    rank. Off = `minitrain.waits.ENABLED` False: no bookkeeping in report() and no samples sent (the
    thread checks the switch at each tick), so the driver has no telemetry to process either. Every
    rank switches at the same step (the loop is the same everywhere), so DDP's collectives pair up.
    The blocks share the job's processes, cores and placement, which back-to-back jobs do not: job to
    job differences of several percent cancel out."""
    import minitrain
    from minitrain import waits

    report = lambda step, loss: minitrain.report({"step": step, "loss": loss.item()})  # noqa: E731
    step = first_step
    timed = []
    for pair in range(pairs):
        seconds = {}
        for on in ((True, False) if pair % 2 == 0 else (False, True)):
            waits.ENABLED = on
            offset = step
            seconds[on] = train_loop(model, block_steps, 0, lambda i, loss: report(offset + i, loss))["seconds"]
            step += block_steps
        timed.append((seconds[True], seconds[False]))
    waits.ENABLED = True
    return timed


def telemetry_direct_cost() -> dict:
    """What telemetry costs this process, timed directly (after the timed steps, on rank 0): the
    bookkeeping of one report() in microseconds ("report_bookkeeping_us": `waits.reporting()` entered
    and left, minus the same loop around a no-op context manager) and one sample ("sample_us"). Empty
    when telemetry is off."""
    from contextlib import nullcontext

    from minitrain import waits
    from minitrain.rpc import convert
    from minitrain.worker.telemetry import GpuProbe, Sampler

    if not waits.ENABLED:
        return {}
    calls = DIRECT_REPORT_CALLS
    empty = nullcontext()
    start = time.perf_counter()
    for _ in range(calls):
        with empty:
            pass
    baseline = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(calls):
        with waits.reporting():
            pass
    recorded = time.perf_counter() - start
    sampler = Sampler(GpuProbe([]))
    start = time.perf_counter()
    for _ in range(DIRECT_SAMPLES):
        convert.telemetry_message(sampler.sample()).SerializeToString()
    sampled = time.perf_counter() - start
    return {"report_bookkeeping_us": max(recorded - baseline, 0.0) / calls * 1e6,
            "sample_us": sampled / DIRECT_SAMPLES * 1e6}


def role_minitrain(spec: dict) -> None:
    """A driver running the minitrain side."""
    from bench.core import fit

    result = fit(minitrain_train_func, spec, spec["storage"])
    blocks = 2 * spec.get("ab_pairs", 0) * spec.get("ab_steps", 0)
    assert result.metrics["step"] == spec["warmup"] + spec["steps"] + blocks - 1, result.metrics


def role_torchrun_worker(spec: dict) -> None:
    """One torchrun worker: env:// init, DistributedDataParallel, the same loop."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("gloo")
    figures = train_loop(DistributedDataParallel(build_mlp()), spec["steps"], spec["warmup"],
                         lambda step, loss: loss.item())  # the same host sync as minitrain's report
    if dist.get_rank() == 0:
        write_json(spec["out"], figures)
    dist.barrier()  # neither rank tears the group down under the other
    dist.destroy_process_group()


def bench_ddp(tmp: str, repeats: int, steps: int, warmup: int, ab_pairs: int = 0,
              ab_steps: int = 0) -> WorkloadResult:
    """Alternate the sides `repeats` times (the order rotates); medians of rank 0's steps/s and their
    ratios. Each minitrain job (telemetry on) then runs `ab_pairs` pairs of `ab_steps`-step blocks with
    telemetry on and off (`telemetry_blocks`)."""
    runs: dict[str, list[dict]] = {side: [] for side in SIDES}
    for index in range(repeats):
        for side in ORDERS[index % len(ORDERS)]:
            spec = {"steps": steps, "warmup": warmup, "out": os.path.join(tmp, f"ddp_{side}_{index}.json"),
                    "storage": os.path.join(tmp, "storage", f"ddp_{index}")}
            if side == "minitrain" and ab_pairs:
                spec.update(ab_pairs=ab_pairs, ab_steps=ab_steps)
            path = os.path.join(tmp, f"spec_ddp_{side}_{index}.json")
            write_json(path, spec)
            argv = (torchrun_argv("ddp", ["--role", "torchrun-worker", "--spec", path]) if side == "torchrun"
                    else role_argv("ddp", "minitrain", path))
            env = dict(os.environ, MINITRAIN_TELEMETRY="0") if side == "minitrain_telemetry_off" else None
            try:
                wall, failure = run_timed(argv, cwd=tmp, timeout_s=JOB_TIMEOUT_S, env=env), ""
            except BenchError as exc:
                if not os.path.exists(spec["out"]):
                    raise
                # The steps were timed; the process failed afterwards (gloo's teardown can abort).
                wall, failure = None, str(exc).splitlines()[0]
                say(f"  note: {side} failed after its timed steps: {failure[:200]}")
            runs[side].append({**read_json(spec["out"]), "job_wall_s": wall, "failed_after_timing": failure})
        m, t, o = runs["minitrain"][-1], runs["torchrun"][-1], runs["minitrain_telemetry_off"][-1]
        say(f"  run {index + 1}/{repeats}: minitrain {m['steps_per_s']:7.1f} steps/s ({m['threads']} thread(s))   "
            f"torchrun {t['steps_per_s']:7.1f} steps/s ({t['threads']} thread(s))   ratio "
            f"{m['steps_per_s'] / t['steps_per_s']:.3f}   telemetry off {o['steps_per_s']:7.1f} steps/s")
    m_med = statistics.median(r["steps_per_s"] for r in runs["minitrain"])
    t_med = statistics.median(r["steps_per_s"] for r in runs["torchrun"])
    o_med = statistics.median(r["steps_per_s"] for r in runs["minitrain_telemetry_off"])
    pair_ratios = [on["steps_per_s"] / off["steps_per_s"]
                   for on, off in zip(runs["minitrain"], runs["minitrain_telemetry_off"])]
    t_ratio = statistics.median(pair_ratios)
    quartiles = statistics.quantiles(pair_ratios, n=4) if len(pair_ratios) >= 2 else [t_ratio, t_ratio, t_ratio]
    say(f"  median: minitrain {m_med:.1f} steps/s, torchrun {t_med:.1f} steps/s, ratio {m_med / t_med:.3f} "
        f"(target >= {TARGET_RATIO})")
    blocks = [(on, off) for r in runs["minitrain"] for on, off in r.get("telemetry_blocks", ())]
    block_figures = {}
    if blocks:
        block_ratios = [off / on for on, off in blocks]  # steps/s on / steps/s off
        b_ratio = statistics.median(block_ratios)
        b_quartiles = (statistics.quantiles(block_ratios, n=4) if len(block_ratios) >= 2
                       else [b_ratio, b_ratio, b_ratio])
        block_figures = {"telemetry_block_ratios": block_ratios, "telemetry_block_ratio": b_ratio,
                         "telemetry_block_quartiles": [b_quartiles[0], b_quartiles[2]],
                         "telemetry_block_steps": ab_steps}
    supervisors = _supervisor_figures(runs)
    if supervisors:
        say(f"  CPU of the supervising processes per step (median of runs): minitrain driver "
            f"{supervisors['driver']:.3f} ms + agent {supervisors['agent']:.3f} ms; torchrun launcher "
            f"{supervisors['launcher']:.3f} ms")
    direct = [r for r in runs["minitrain"] if "report_bookkeeping_us" in r]
    direct_figures = {}
    if direct:
        per_report_us = statistics.median(r["report_bookkeeping_us"] for r in direct)
        sample_us = statistics.median(r["sample_us"] for r in direct)
        # At the measured step rate, one report() a step and one sample a second (INTERVAL_S).
        fraction = (per_report_us * m_med + sample_us) / 1e6
        direct_figures = {"report_bookkeeping_us": per_report_us, "sample_us": sample_us,
                          "direct_fraction": fraction}
    result = WorkloadResult("ddp", figures={
        "repeats": repeats, "steps": steps, "warmup": warmup, "runs": runs, "minitrain_steps_per_s": m_med,
        "torchrun_steps_per_s": t_med, "ratio": m_med / t_med,
        "telemetry_off_steps_per_s": o_med, "telemetry_pair_ratios": pair_ratios,
        "telemetry_ratio": t_ratio, "telemetry_ratio_quartiles": [quartiles[0], quartiles[2]],
        **direct_figures, **block_figures, "supervisor_cpu_ms_per_step": supervisors,
        "model": f"MLP {MLP_IN}-{MLP_HIDDEN}-{MLP_HIDDEN}-{MLP_OUT}, batch {BATCH}"})
    result.rows.append(Row(
        "ddp", f"steady-state DDP steps/s, {NUM_WORKERS} CPU workers, MLP {MLP_IN}-{MLP_HIDDEN}-{MLP_HIDDEN}-"
        f"{MLP_OUT}, a report() every step (median of {repeats} x {steps} steps)", f"{m_med:.1f} steps/s",
        f"same loop under torchrun {t_med:.1f} steps/s", ratio(m_med, t_med, 3), f">= {TARGET_RATIO}x",
        m_med / t_med >= TARGET_RATIO))
    if supervisors:
        minitrain_ms = supervisors["driver"] + supervisors["agent"]
        result.rows.append(Row(
            "ddp", "CPU used by the processes supervising the workers during the timed steps, per step "
            "(minitrain: driver + node agent; torchrun: its launcher), median of the jobs",
            f"{minitrain_ms:.3f} ms ({supervisors['driver']:.3f} + {supervisors['agent']:.3f}; "
            f"{minitrain_ms * m_med / 10:.1f}% of a core)",
            f"torchrun launcher {supervisors['launcher']:.3f} ms ({supervisors['launcher'] * t_med / 10:.1f}% of a core)",
            "-", "-", None))
    say(f"  telemetry: on {m_med:.1f} steps/s, off {o_med:.1f} steps/s; on/off of back-to-back pairs: median "
        f"{t_ratio:.3f}, quartiles {quartiles[0]:.3f}-{quartiles[2]:.3f} (target >= {TELEMETRY_TARGET_RATIO})")
    result.rows.append(Row(
        "ddp", f"telemetry overhead: DDP steps/s with per-rank telemetry on (default) / MINITRAIN_TELEMETRY=0, "
        f"median of {repeats} back-to-back pairs x {steps} steps (quartiles {quartiles[0]:.3f}-{quartiles[2]:.3f})",
        f"{m_med:.1f} steps/s", f"telemetry off {o_med:.1f} steps/s", f"{t_ratio:.3f}x",
        f">= {TELEMETRY_TARGET_RATIO}x", t_ratio >= TELEMETRY_TARGET_RATIO))
    if block_figures:
        q = block_figures["telemetry_block_quartiles"]
        say(f"  telemetry on/off in alternating {ab_steps}-step blocks of the same jobs: median "
            f"{block_figures['telemetry_block_ratio']:.4f} of {len(blocks)} pairs, quartiles {q[0]:.4f}-{q[1]:.4f}")
        result.rows.append(Row(
            "ddp", f"telemetry on / off in alternating blocks of {ab_steps} steps within each minitrain job: "
            f"median of {len(blocks)} pairs (quartiles {q[0]:.3f}-{q[1]:.3f})", "-", "-",
            f"{block_figures['telemetry_block_ratio']:.3f}x", f">= {TELEMETRY_TARGET_RATIO}x",
            block_figures["telemetry_block_ratio"] >= TELEMETRY_TARGET_RATIO))
    if direct_figures:
        say(f"  telemetry measured directly: {direct_figures['report_bookkeeping_us']:.2f} us per report(), "
            f"{direct_figures['sample_us']:.0f} us per sample -> {direct_figures['direct_fraction'] * 100:.3f}% "
            f"of the time at {m_med:.0f} steps/s and 1 sample/s")
        result.rows.append(Row(
            "ddp", "telemetry cost timed directly on rank 0: bookkeeping per report() + one sample a second, "
            f"as a share of the time at {m_med:.0f} steps/s", f"{direct_figures['report_bookkeeping_us']:.2f} us + "
            f"{direct_figures['sample_us']:.0f} us/s = {direct_figures['direct_fraction'] * 100:.3f}%", "-", "-",
            "< 1%", direct_figures["direct_fraction"] < 0.01))
    return result


def _supervisor_figures(runs: dict) -> dict:
    """Median CPU ms per step of minitrain's driver and agent (telemetry on) and torchrun's launcher;
    empty when a side did not measure them."""
    figures = {}
    for side, names in (("minitrain", ("driver", "agent")), ("torchrun", ("launcher",))):
        for name in names:
            values = [r["supervisor_cpu_ms_per_step"][name] for r in runs[side]
                      if name in r.get("supervisor_cpu_ms_per_step", {})]
            if not values:
                return {}
            figures[name] = statistics.median(values)
    return figures


def main(argv=None) -> int:
    """The measured processes: `--role minitrain|torchrun-worker --spec PATH`."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--role", choices=["minitrain", "torchrun-worker"], required=True)
    parser.add_argument("--spec", required=True)
    args = parser.parse_args(argv)
    spec = read_json(args.spec)
    (role_minitrain if args.role == "minitrain" else role_torchrun_worker)(spec)
    return 0


if __name__ == "__main__":
    sys.exit(main())
