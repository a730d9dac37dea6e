"""`python -m bench.gpu_check` (what `scripts/gpu_check.sh` runs): the paths only a GPU exercises, as
small real minitrain jobs on this machine's GPUs, in one command of at most a few minutes.

Checks, in order (each in a process of its own, `bench.gpu_check_jobs`, under a timeout):
  env             torch, CUDA, the GPUs, NCCL, NVML, DeepSpeed, minitrain's dependencies; one trivial
                  CPU job through the whole stack (coordinator, agent, worker over gRPC)
  devices         one rank per GPU: get_device() is cuda:<local rank> and the current CUDA device,
                  CUDA_VISIBLE_DEVICES lists the run's GPUs, the backend is NCCL, no GPU shared
  ddp_nccl        DDP over NCCL: the replicas stay equal, the loss drops (world size 1 on one GPU)
  shared_gpu      two ranks on one GPU (resources_per_worker={"GPU": 0.5}, gloo over CUDA tensors)
  cuda_restart    a CUDA error, then an exit after CUDA work, in the last rank; the run restarts and
                  finishes in fresh processes that use CUDA again; crash -> restart times
  nvml_dashboard  NVML utilisation and memory of every rank's GPU on the live dashboard and /metrics
  fsdp_dcp        examples/fsdp_train.py: FSDP2, a DCP checkpoint from every rank, and its resume
  ddp_bench       the `ddp` benchmark row on the GPUs: minitrain against torchrun (steps/s)
  deepspeed_zero2, deepspeed_zero3
                  examples/deepspeed_train.py with ZeRO-2 and ZeRO-3, every rank's shard, resume;
                  SKIP when DeepSpeed is not installed
The multi-rank checks use one rank per GPU torch sees. On a machine with one GPU, NCCL runs with world
size 1 (NCCL refuses two ranks on one device, so collectives between GPUs and a rank's choice among
several GPUs are not exercised there); `shared_gpu` puts two ranks on that GPU over gloo.

The run stops starting checks when `--budget-s` (default 450 s, within the 8 minutes the whole check is meant to take)
would be exceeded: the checks left are SKIP. It prints one summary table (PASS / FAIL / SKIP, seconds,
figures), writes every figure as JSON to `--json` (default `$OUT/gpu_check.json` when OUT is set), and
exits 1 when a check FAILED (SKIP is not a failure). Without CUDA the env check FAILs and the rest SKIP;
`--allow-no-gpu` makes that a success (the script's own plumbing, what CI runs), and `--cpu` runs every
check on CPU workers (gloo) to test the checks themselves where there is no GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass, field

from bench.common import machine_info, reap_tagged, read_json, stop_tree, tagged_env, tail, write_json

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TAG_VAR = "MINITRAIN_GPU_CHECK_TAG"  # every process of a check carries it: leftovers are found and ended
DEFAULT_BUDGET_S = 450.0
MIN_CHECK_S = 20.0  # a check is not started with less time than this left
SUMMARY_WIDTH = 150


@dataclass(frozen=True)
class Check:
    """One check: its name (a function of bench.gpu_check_jobs) and its own timeout."""

    name: str
    timeout_s: float


CHECKS = (Check("env", 120), Check("devices", 90), Check("ddp_nccl", 90), Check("shared_gpu", 90),
          Check("cuda_restart", 150), Check("nvml_dashboard", 120), Check("fsdp_dcp", 150),
          Check("ddp_bench", 240), Check("deepspeed_zero2", 180), Check("deepspeed_zero3", 180))


@dataclass(frozen=True)
class Outcome:
    """What one check gave: PASS, FAIL or SKIP, its wall time, one line of summary, every figure."""

    name: str
    status: str
    seconds: float
    summary: str
    figures: dict = field(default_factory=dict)


def run_one(check: Check, base_spec: dict, work: str, timeout_s: float) -> Outcome:
    """Run `check` in its own process (its output in <work>/<name>.log); FAIL on a timeout or when the
    process leaves no result (with the log's tail). Processes it leaves behind are ended and counted."""
    tmp = os.path.join(work, check.name)
    os.makedirs(tmp, exist_ok=True)
    spec = dict(base_spec, tmp=tmp, result=os.path.join(tmp, "result.json"))
    spec_path = os.path.join(tmp, "spec.json")
    write_json(spec_path, spec)
    log_path = os.path.join(work, f"{check.name}.log")
    tag = f"{check.name}-{uuid.uuid4().hex[:8]}"
    argv = [sys.executable, "-m", "bench.gpu_check_jobs", "--check", check.name, "--spec", spec_path]
    start = time.perf_counter()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(argv, cwd=tmp, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, env=tagged_env(TAG_VAR, tag))
        try:
            proc.wait(timeout=timeout_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            stop_tree(proc)
            timed_out = True
    seconds = round(time.perf_counter() - start, 1)
    left_behind = reap_tagged(TAG_VAR, tag)
    if timed_out:
        return Outcome(check.name, "FAIL", seconds, f"timed out after {timeout_s:.0f} s",
                       {"log_tail": tail(log_path, 4000)})
    if not os.path.exists(spec["result"]):
        return Outcome(check.name, "FAIL", seconds, f"the check process exited with {proc.returncode} and no result",
                       {"log_tail": tail(log_path, 4000)})
    result = read_json(spec["result"])
    figures = dict(result["figures"])
    summary = result["summary"]
    if result["status"] == "FAIL":
        figures["log_tail"] = tail(log_path, 4000)
    if left_behind:
        figures["processes_left_behind"] = left_behind
        summary += f" (note: {left_behind} process(es) of the check were still running after it and were ended)"
    return Outcome(check.name, result["status"], seconds, summary, figures)


def _commit() -> str | None:
    try:
        done = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() or None


def table(outcomes: list[Outcome]) -> str:
    """The summary table: check, status, seconds, summary (cut to SUMMARY_WIDTH characters)."""
    rows = [("check", "status", "seconds", "summary")]
    for o in outcomes:
        line = o.summary.replace("\n", " ")
        rows.append((o.name, o.status, f"{o.seconds:.1f}", line if len(line) <= SUMMARY_WIDTH
                     else line[:SUMMARY_WIDTH - 3] + "..."))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    out = ["  ".join(r[i].ljust(widths[i]) for i in range(3)) + "  " + r[3] for r in rows]
    out.insert(1, "  ".join("-" * w for w in widths) + "  " + "-" * 7)
    return "\n".join(out)


def _skip_reason(env: Outcome, args) -> str | None:
    """Why the checks after env cannot run, or None when they can."""
    if env.status != "PASS":
        return f"the env check did not pass ({env.status})"
    if not args.cpu and not env.figures.get("cuda"):
        return f"no CUDA: torch.cuda.is_available() is False in {env.figures.get('executable', sys.executable)}"
    return None


def _mode(args) -> str:
    return "cpu" if args.cpu else ("gpu, or none allowed" if args.allow_no_gpu else "gpu")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.gpu_check", description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="comma-separated checks to run (env always runs)")
    parser.add_argument("--budget-s", type=float, default=DEFAULT_BUDGET_S,
                        help=f"start no check past this many seconds in all (default {DEFAULT_BUDGET_S:g})")
    parser.add_argument("--check-timeout-s", type=float, default=None,
                        help="cap on every check's own timeout (default: each check's)")
    parser.add_argument("--cpu", action="store_true", help="run every check on 2 CPU workers (gloo): tests the "
                                                           "checks themselves on a machine without a GPU")
    parser.add_argument("--allow-no-gpu", action="store_true",
                        help="without CUDA, SKIP the checks instead of failing (the script's own plumbing)")
    parser.add_argument("--json", default=None, help="where to write the results (default $OUT/gpu_check.json "
                                                     "when OUT is set)")
    parser.add_argument("--work", default=None, help="keep the checks' logs and runs here (default: a temporary "
                                                     "directory, removed unless a check failed)")
    return parser


def main(argv=None) -> int:
    """Run the checks; print the table; write the JSON; 1 when a check FAILED."""
    args = _parser().parse_args(argv)
    names = [c.name for c in CHECKS]
    only = [n for n in args.only.split(",") if n]
    unknown = sorted(set(only) - set(names))
    if unknown:
        print(f"unknown check(s) {unknown}; the checks are {names}", file=sys.stderr)
        return 2
    started = time.perf_counter()
    deadline = started + args.budget_s
    work = args.work or tempfile.mkdtemp(prefix="minitrain-gpu-check-")
    os.makedirs(work, exist_ok=True)
    machine = {**machine_info(), "commit": _commit()}
    print(f"minitrain GPU check: {machine['cpu']}, {machine['cores']} cores, {machine['os']}; Python "
          f"{machine['python']} ({sys.executable}); torch {machine['torch']}; commit {machine['commit']}; work {work}",
          flush=True)
    base = {"root": ROOT, "cpu": args.cpu, "need_cuda": not (args.cpu or args.allow_no_gpu), "workers": 2}
    planned = [c for c in CHECKS if c.name == "env" or not only or c.name in only]
    outcomes: list[Outcome] = []
    skip = None
    for check in planned:
        left = deadline - time.perf_counter()
        if skip is None and left < MIN_CHECK_S:
            skip = f"the time budget ({args.budget_s:g} s) is spent"
        if skip is not None and check.name != "env":
            outcome = Outcome(check.name, "SKIP", 0.0, skip)
        else:
            timeout = min(check.timeout_s, max(left, MIN_CHECK_S), args.check_timeout_s or check.timeout_s)
            print(f"[{len(outcomes) + 1}/{len(planned)}] {check.name} (timeout {timeout:.0f} s) ...", flush=True)
            outcome = run_one(check, base, work, timeout)
        outcomes.append(outcome)
        print(f"    {check.name}: {outcome.status} ({outcome.seconds:.1f} s): {outcome.summary}", flush=True)
        if outcome.status == "FAIL" and "log_tail" in outcome.figures:
            print("    --- the end of its log ---\n" + outcome.figures["log_tail"][-2500:] + "\n    ---", flush=True)
        if check.name == "env":
            skip = _skip_reason(outcome, args)
            gpus = outcome.figures.get("gpus") or 0
            base["workers"] = 2 if args.cpu else max(1, gpus)
            machine.update({k: outcome.figures.get(k) for k in ("gpus", "gpu_names", "torch_cuda", "nccl",
                                                                 "nvidia_smi", "deepspeed")})
    total = round(time.perf_counter() - started, 1)
    failed = [o.name for o in outcomes if o.status == "FAIL"]
    print("\n" + table(outcomes))
    counts = {s: sum(o.status == s for o in outcomes) for s in ("PASS", "FAIL", "SKIP")}
    print(f"\n{counts['PASS']} passed, {counts['FAIL']} failed, {counts['SKIP']} skipped in {total} s "
          f"(mode: {_mode(args)}; {base['workers']} rank(s) in the multi-rank checks)")
    report = {"machine": machine, "mode": _mode(args), "workers": base["workers"],
              "budget_s": args.budget_s, "total_s": total, "failed": failed,
              "checks": [asdict(o) for o in outcomes]}
    path = args.json or (os.path.join(os.environ["OUT"], "gpu_check.json") if os.environ.get("OUT") else None)
    if path:
        with open(path, "w") as handle:
            json.dump(report, handle, indent=1, default=str)
        print(f"results: {path}")
    if not failed and not args.work:
        import shutil

        shutil.rmtree(work, ignore_errors=True)
    elif failed:
        print(f"logs of every check: {work}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
