"""`python -m bench`: every workload back to back, then one table of medians, ratios and targets.

    python -m bench                          # the default set, full sizes (about 20 minutes, plus 10-15 for memory_tier)
    python -m bench --quick                  # tiny sizes, 1 repetition: proves it still works
    python -m bench --only restart,report --repeats 9 --json bench.json
    python -m bench scale --workers 64,256,1024,4096
    python -m bench scale --workers 1024,4096 --transport both   # relayed and direct at each count
    sudo python -m bench --only multihost    # optional: a fake 2-host cluster over SSH
    sudo python -m bench --only slurm        # optional: a real Slurm of 2 nodes (Debian's packages)
    sudo python -m bench --only kubernetes   # optional: 2 "pods" (network namespaces) recreated

Workloads (each module's docstring says exactly what it measures and how):
  job         trivial 2-worker job, whole-process wall time, vs torchrun --standalone; with `memory`:
              peak RSS of the driver (coordinator) and the agent, and whether either imported torch
  report      report() without a checkpoint, per call, inside real workers
  restart     worker SIGKILL -> first line and first step of the new attempt, vs torchrun --max-restarts; and
              a crash at the first line of the first attempt (the fork server still cold)
  checkpoint  checkpoint persist (1 GiB, local disk) vs two concurrent `cp`
  memory_tier the node agent's memory tier, 2 ranks x 1 GiB (S3 storage: moto on loopback): report()
              blocking (tier SYNC/ASYNC, no tier) vs 2 concurrent copies into /dev/shm; restart ->
              checkpoint read from the tier (and from S3) vs reading /dev/shm; memory commit -> durable
              vs s3fs put (S3) and `cp -r` (local disk)
  ddp         steady-state DDP steps/s (2 CPU workers, small MLP) vs the same loop under torchrun
  detect      agent SIGKILL and SIGSTOP (silent) -> the coordinator knows, and the new attempt's first step
  async       step time with an ASYNC checkpoint every step vs the same loop without checkpoints
  ledger      a run waiting for the whole host: holds it after the holder releases, and after it is SIGKILLed
  elastic     an elastic (1, 2) DDP job on 2 local hosts loses one host's agent and grows back: detection ->
              attempt at size 1 running; checkpoint boundary after the interval -> first step at size 2
  preempt     a preemption signal (driver, agent) -> every rank knows the agreed round; work lost; signal
              -> agreed checkpoint committed -> driver exited
  scale       the control plane with 64..4096 fake workers over real gRPC (bench.scale); with --recovery W:
              restart, detection and an elastic run losing 10% of its hosts among W fake workers and
              regaining them
  multihost   (not in the default set: needs root and sshd) 2 fake hosts over SSH: start-up, link cut
  slurm       (not in the default set: needs root and Slurm) 2 Slurm nodes: sbatch -> first step, one node's
              agent step cancelled -> first step of the new attempt
  kubernetes  (not in the default set: needs root) 2 "pods" with PyTorchJob variables: all pods recreated ->
              first resumed step

Machine load moves every figure: the machine's CPU, cores and load average are printed with them.
The exit status is 1 when a workload could not be measured (its error is printed), not when a
target is missed: benchmarks are figures, not tests.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Callable

from bench.common import BenchError, machine_info, machine_line, say
from bench.table import Row, WorkloadResult, markdown, plain

ORDER = ("job", "report", "restart", "checkpoint", "memory_tier", "ddp", "detect", "async", "ledger", "preempt",
         "elastic", "scale", "multihost", "slurm", "kubernetes")
OPTIONAL = ("multihost", "slurm", "kubernetes")  # need root and system packages: run only when asked
DEFAULT = tuple(w for w in ORDER if w not in OPTIONAL)
KEPT_SUFFIXES = (".txt", ".jsonl", ".log", ".json")
KEPT_MAX_BYTES = 16 << 20


@dataclass(frozen=True)
class Sizes:
    """How big each workload runs: the full defaults, or `--quick`'s tiny ones."""

    repeats: int
    warmup: bool
    calls: int
    ddp_steps: int
    restarts: int
    early_crashes: int
    agent_kills: int
    agent_stops: int
    train_s: float
    stall_s: float
    torchrun_runs: int
    size_mib: int
    async_steps: int
    workers: tuple
    seconds: float
    ledger_rounds: int
    ledger_kills: int
    tier_size_mib: int  # memory_tier's total over both ranks (what --size-mib sets for it)


FULL = Sizes(repeats=5, warmup=True, calls=20000, ddp_steps=1000, restarts=20, early_crashes=5, agent_kills=5,
             agent_stops=5, train_s=5.0, stall_s=60.0, torchrun_runs=3, size_mib=1024, async_steps=40,
             workers=(64, 256, 1024, 4096), seconds=20.0, ledger_rounds=100, ledger_kills=10,
             tier_size_mib=2048)
QUICK = Sizes(repeats=1, warmup=False, calls=2000, ddp_steps=50, restarts=1, early_crashes=1, agent_kills=1,
              agent_stops=1, train_s=1.0, stall_s=30.0, torchrun_runs=1, size_mib=16, async_steps=4,
              workers=(64,), seconds=3.0, ledger_rounds=3, ledger_kills=1,
              tier_size_mib=32)


def _sizes(args: argparse.Namespace) -> dict:
    """The sizes in force: the mode's defaults, overridden by the options given."""
    base = QUICK if args.quick else FULL
    chosen = {name: getattr(base, name) for name in Sizes.__dataclass_fields__}
    for name in chosen:
        value = getattr(args, name, None)
        if value is not None:
            chosen[name] = value
    return chosen


def _run_job(tmp, s, args):
    from bench.core import bench_job

    return bench_job(tmp, s["repeats"], s["warmup"])


def _run_report(tmp, s, args):
    from bench.core import bench_report

    return bench_report(tmp, s["calls"])


def _run_restart(tmp, s, args):
    from bench.restart import bench_restart

    return bench_restart(tmp, s["restarts"], s["train_s"], s["stall_s"], 0 if args.no_torchrun else s["torchrun_runs"],
                         s["early_crashes"])


def _run_checkpoint(tmp, s, args):
    from bench.checkpoint import checkpoint_workload

    drop = not (args.no_drop_caches or args.quick)  # dropping the page cache would slow whatever runs beside
    return checkpoint_workload(tmp, s["size_mib"], max(1, min(s["repeats"], 3)), drop)


def _run_memory_tier(tmp, s, args):
    from bench.memory_tier import memory_tier_workload

    return memory_tier_workload(tmp, tier_total_mib(s, args), max(1, min(s["repeats"], 3)))


def tier_total_mib(s: dict, args: argparse.Namespace) -> int:
    """memory_tier's checkpoint size over both ranks: `--size-mib` when given (the total, as for checkpoint),
    else its own default (2048: 1024 MiB per rank; 32 with --quick)."""
    return args.size_mib if args.size_mib is not None else s["tier_size_mib"]


def _run_ddp(tmp, s, args):
    from bench.ddp import bench_ddp

    return bench_ddp(tmp, s["repeats"], s["ddp_steps"], warmup=5 if args.quick else 50,
                     ab_pairs=1 if args.quick else 6, ab_steps=10 if args.quick else 150)


def _run_detect(tmp, s, args):
    from bench.restart import bench_detect

    return bench_detect(tmp, s["agent_kills"], s["agent_stops"], s["train_s"], s["stall_s"])


def _run_async(tmp, s, args):
    from bench.checkpoint import async_workload

    return async_workload(tmp, s["async_steps"], 2 if args.quick else 5, 4 if args.quick else 10,
                          max(1, min(s["repeats"], 3)))


def _run_ledger(tmp, s, args):
    from bench.ledger import bench_ledger

    return bench_ledger(tmp, s["ledger_rounds"], s["ledger_kills"])


def _run_preempt(tmp, s, args):
    from bench.preempt import bench_preempt

    return bench_preempt(tmp, 2 if args.quick else 10, s["size_mib"])


def _run_elastic(tmp, s, args):
    from bench.elastic import bench_elastic

    return bench_elastic(tmp, max(1, min(s["repeats"], 5)), args.resize_interval_s)


def _run_scale(tmp, s, args):
    from bench.scale.workload import bench_scale

    transports = ("relayed", "direct") if args.transport == "both" else (args.transport,)
    return bench_scale(tmp, list(s["workers"]), s["seconds"], min(3.0, s["seconds"] / 3), args.client_procs,
                       profile_at=args.profile_at, transports=transports, phase=args.phase,
                       rate_hz=args.rate_hz, digest=not args.no_digest, recovery=args.recovery,
                       recovery_hosts=args.recovery_hosts, recovery_scenarios=args.recovery_scenarios)


def _run_multihost(tmp, s, args):
    from bench.multihost import bench_multihost

    return bench_multihost(tmp, max(1, min(s["repeats"], 3)), s["warmup"], keep_dns=args.keep_dns)


def _run_slurm(tmp, s, args):
    from bench.slurm import bench_slurm

    return bench_slurm(tmp, max(1, min(s["repeats"], 3)))


def _run_kubernetes(tmp, s, args):
    from bench.kubernetes import bench_kubernetes

    return bench_kubernetes(tmp, max(1, min(s["repeats"], 3)))


RUNNERS: dict[str, Callable] = {"job": _run_job, "report": _run_report, "restart": _run_restart,
                                "checkpoint": _run_checkpoint, "memory_tier": _run_memory_tier, "ddp": _run_ddp,
                                "detect": _run_detect,
                                "async": _run_async, "ledger": _run_ledger, "preempt": _run_preempt,
                                "elastic": _run_elastic,
                                "scale": _run_scale, "multihost": _run_multihost, "slurm": _run_slurm,
                                "kubernetes": _run_kubernetes}


def _workers(text: str) -> tuple:
    try:
        counts = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"--workers takes counts like 64,256,1024, got {text!r}") from None
    if not counts or min(counts) < 8 or any(c % 8 for c in counts):
        raise argparse.ArgumentTypeError(f"--workers: each count must be a multiple of 8 (fake nodes of 8 "
                                         f"workers), got {text!r}")
    return counts


def _selection(text: str) -> tuple:
    names = tuple(part.strip() for part in text.split(",") if part.strip())
    unknown = [n for n in names if n not in RUNNERS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"--only: unknown workload(s) {unknown or text!r}; choose from "
                                          f"{', '.join(ORDER)}")
    return names


def parser() -> argparse.ArgumentParser:
    """The command line (see the module docstring)."""
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n".join(__doc__.splitlines()[1:]))
    p.add_argument("command", nargs="?", choices=["scale"], help="`scale`: the scale simulation alone")
    p.add_argument("--quick", action="store_true", help="tiny sizes, 1 repetition, no warm-up (used by CI)")
    p.add_argument("--only", type=_selection, help=f"comma-separated workloads (default: {','.join(DEFAULT)})")
    p.add_argument("--repeats", type=int, help="repetitions of job, ddp (default 5), elastic (at most 5), "
                                               "checkpoint, memory_tier, async, multihost and slurm (at most 3)")
    p.add_argument("--json", metavar="PATH", help="also write every figure, the rows and the table as JSON")
    p.add_argument("--tmp-dir", metavar="DIR", help="where the temporary directory goes (its disk is measured)")
    p.add_argument("--save-logs", metavar="DIR", help="keep every job's outputs and records (and profiles) in DIR")
    p.add_argument("--calls", type=int, help="report: calls per worker (default 20000)")
    p.add_argument("--ddp-steps", type=int, help="ddp: timed steps per job (default 1000)")
    p.add_argument("--restarts", type=int, help="restart: worker kills, for minitrain and torchrun (default 20)")
    p.add_argument("--early-crashes", type=int, help="restart: jobs whose rank 1 dies at the first line of "
                                                     "the first attempt, cold fork server (default 5)")
    p.add_argument("--torchrun-runs", type=int, help="restart: torchrun jobs, pooled (default 3)")
    p.add_argument("--no-torchrun", action="store_true", help="restart: skip torchrun")
    p.add_argument("--agent-kills", type=int, help="detect: agent SIGKILLs (default 5)")
    p.add_argument("--agent-stops", type=int, help="detect: agent SIGSTOPs (default 5)")
    p.add_argument("--train-s", type=float, help="restart, detect: seconds of training per attempt (default 5)")
    p.add_argument("--stall-s", type=float, help="restart, detect: stop a job idle this long (default 60; torchrun's "
                   "jobs at most 60)")
    p.add_argument("--size-mib", type=int, help="checkpoint, preempt, memory_tier: total checkpoint size over both "
                                                "ranks (default 1024; memory_tier 2048, i.e. 1024 per rank)")
    p.add_argument("--no-drop-caches", action="store_true", help="checkpoint: keep the page cache between runs")
    p.add_argument("--async-steps", type=int, help="async: timed steps per variant and job (default 40)")
    p.add_argument("--resize-interval-s", type=float, default=3.0,
                   help="elastic: elastic_resize_monitor_interval_s of the job (default 3; Ray's default is 60)")
    p.add_argument("--ledger-rounds", type=int, help="ledger: hand-overs from a releasing holder (default 100)")
    p.add_argument("--ledger-kills", type=int, help="ledger: SIGKILLed holders, of each kind (default 10)")
    p.add_argument("--workers", type=_workers, help="scale: fake worker counts (default 64,256,1024,4096)")
    p.add_argument("--seconds", type=float, help="scale: seconds of reporting per count (default 20)")
    p.add_argument("--client-procs", type=int, default=0, help="scale: fake-client processes (default: 1 per "
                                                               "4096 workers relayed, at most 4; 1 per 1024 "
                                                               "direct, at most 2)")
    p.add_argument("--transport", choices=["relayed", "direct", "both"], default="relayed",
                   help="scale: the fake workers' streams relayed by their fake agents (one connection per "
                        "node, as the product runs), direct (one connection per worker), or both at each count "
                        "(default relayed)")
    p.add_argument("--phase", choices=["lockstep", "random"], default="lockstep",
                   help="scale: every rank reports at the same instant of each period, as DDP's collectives "
                        "impose (lockstep, the default), or at a fixed pseudo-random point of it (random)")
    p.add_argument("--rate-hz", type=float, default=10.0,
                   help="scale: reports per second per fake worker (default 10; the 16384-worker target is at 1)")
    p.add_argument("--recovery", type=int, metavar="WORKERS", default=0,
                   help="scale: also time restart and detection at scale: a worker lost among WORKERS, and a "
                        "silent host among WORKERS/8 hosts (the target: 16384)")
    p.add_argument("--recovery-hosts", type=int, metavar="HOSTS", default=0,
                   help="scale: the silent-host scenario among HOSTS hosts (default WORKERS/8; the target: 2048)")
    p.add_argument("--recovery-scenarios", type=lambda text: tuple(p.strip() for p in text.split(",") if p.strip()),
                   metavar="NAMES", help="scale: which --recovery scenarios run (default all: worker_lost, "
                                         "silent_host, hosts_lost; hosts_lost is an elastic run losing 10%% "
                                         "of its hosts and regaining them)")
    p.add_argument("--no-digest", action="store_true",
                   help="scale: the fake agents send every report as its own relayed item (the figures before "
                        "progress digests)")
    p.add_argument("--profile-at", type=int, metavar="WORKERS", help="scale: profile the coordinator (py-spy) "
                                                                      "at this count")
    p.add_argument("--keep-dns", action="store_true", help="multihost: leave the fake hosts' DNS as is")
    return p


def _keep_logs(tmp: str, dest: str) -> None:
    """Copy the small text records of every job (not checkpoints or storage) from tmp to dest."""
    for root, _, files in os.walk(tmp):
        for name in files:
            path = os.path.join(root, name)
            if name.endswith(KEPT_SUFFIXES) and os.path.getsize(path) <= KEPT_MAX_BYTES:
                target = os.path.join(dest, os.path.relpath(path, tmp))
                os.makedirs(os.path.dirname(target), exist_ok=True)
                shutil.copy(path, target)


@contextlib.contextmanager
def _torch_caches_in(tmp: str):
    """The jobs' torch compile cache goes into the bench's temporary directory (removed with it) unless
    the caller chose one: DDP's workers make torch's default one, /tmp/torchinductor_<user>, which
    outlived every bench run."""
    if "TORCHINDUCTOR_CACHE_DIR" in os.environ:
        yield
        return
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(tmp, "torchinductor")
    try:
        yield
    finally:
        os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)


def run(names: tuple, sizes: dict, args: argparse.Namespace) -> tuple[list[WorkloadResult], list[str]]:
    """Run the workloads in ORDER; returns their results and the failures (one line each)."""
    results, failures = [], []
    base = os.path.realpath(args.tmp_dir or tempfile.gettempdir())
    with tempfile.TemporaryDirectory(prefix="minitrain-bench-", dir=base) as tmp, _torch_caches_in(tmp):
        try:
            for name in [n for n in ORDER if n in names]:
                say(f"\n== {name}")
                workdir = os.path.join(tmp, name)
                os.makedirs(workdir)
                start = time.monotonic()
                try:
                    result = RUNNERS[name](workdir, sizes, args)
                except BenchError as exc:
                    say(f"  FAILED: {exc}")
                    failures.append(f"{name}: {str(exc).splitlines()[0]}")
                    result = WorkloadResult(name, [Row(name, "could not be measured", "FAILED")], {"error": str(exc)})
                result.figures["wall_s"] = time.monotonic() - start
                results.append(result)
        finally:
            if args.save_logs:
                _keep_logs(tmp, args.save_logs)
    return results, failures


def main(argv=None) -> int:
    """Parse, run, print the table; the exit status says whether every workload was measured."""
    args = parser().parse_args(argv)
    names = ("scale",) if args.command == "scale" and not args.only else (args.only or DEFAULT)
    if args.repeats is not None and args.repeats < 1:
        parser().error("--repeats must be >= 1")
    if args.tmp_dir and not os.path.isdir(args.tmp_dir):
        parser().error(f"--tmp-dir {args.tmp_dir!r} is not a directory: give one that exists (the bench "
                       "makes its temporary directory inside it and removes only that)")
    sizes = _sizes(args)
    machine = machine_info()
    say(machine_line(machine))
    results, failures = run(names, sizes, args)
    machine["load_1min_end"] = round(os.getloadavg()[0], 2)
    rows = [row for result in results for row in result.rows]
    command = "python -m bench " + " ".join(argv if argv is not None else sys.argv[1:])
    footer = (f"_Machine: {machine['cpu']}, {machine['cores']} cores, Python {machine['python']}, torch "
              f"{machine['torch']}, grpcio {machine['grpcio']}; load average {machine['load_1min']} -> "
              f"{machine['load_1min_end']}; `{command.strip()}`._")
    say("\n" + plain(rows))
    say("\n" + markdown(rows) + "\n\n" + footer)
    scale = next((r for r in results if r.name == "scale" and "markdown" in r.figures), None)
    if scale is not None:
        say("\nControl-plane scale:\n\n" + scale.figures["markdown"])
    if failures:
        say("\nnot measured: " + "; ".join(failures))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": machine, "quick": args.quick, "sizes": sizes, "failures": failures,
                       "workloads": {r.name: r.as_json() for r in results}, "markdown": markdown(rows),
                       "footer": footer}, f, indent=2, default=str)
        say(f"\nfigures written to {args.json}")
    return 1 if failures else 0
