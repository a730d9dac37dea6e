"""Restart benchmark of minitrain against torchrun, both measured in the same run on the same machine.

    python scripts/bench_restart.py                   # full: 20 worker kills each, 5 agent kills
    python scripts/bench_restart.py --restarts 50 --json bench.json
    python scripts/bench_restart.py --quick           # CI: 3 kills each (proves the benchmark still works)

What is measured, and how (2 CPU workers, gloo, a small DDP MLP, localhost):

1. minitrain restart latency after a worker's SIGKILL. ONE job with FailureConfig(max_failures=-1). On
   every attempt the training function builds the model, wraps it with prepare_model (DDP), loads the
   latest committed checkpoint (`minitrain.get_checkpoint()`, a torch.save state of model, optimizer
   and step) and records time.time() right after the load, before its first step (rank 0 appends it to
   a JSON-lines file under the temp dir). It then trains: a report every REPORT_EVERY steps, a SYNC
   checkpoint every CHECKPOINT_EVERY steps, for `--train-s` seconds; then rank 1 records time.time()
   and SIGKILLs itself, until `--restarts` kills happened; the last attempt trains FINAL_STEPS steps
   and the job ends. Latency = the first-step time of attempt i+1 minus the kill time of attempt i.
   A restart succeeded when the attempt right after the kill reached its first step. Where the time
   goes comes from the driver's `minitrain` log records (timestamped by a logging.Handler in the
   driver: "attempt i: ...; stopping every rank", "attempt i failed ...; restarting", "attempt i+1:
   starting") and from the training function (entry, after prepare_model, after the load). Just before
   the kill, rank 1 also notes whether each of the agent's warm spares is ready (blocked reading its
   bootstrap line), and the latencies are split by that. Target: median <= 1.0 s, every restart ok.
2. The same under torchrun: `torchrun --standalone --nproc-per-node 2 --max-restarts N` of this file
   as a worker that inits the process group (env://), wraps the same model in DDP, loads its own
   checkpoint (torch.save by rank 0 every CHECKPOINT_EVERY steps, atomic rename), records the time
   after the load and trains for the same while; rank 1 SIGKILLs itself while
   TORCHELASTIC_RESTART_COUNT < N. Attempt i is TORCHELASTIC_RESTART_COUNT. A restart fails when its
   attempt never reaches the first step (an error before it: torchrun then spends a restart on it),
   when torchrun exits, or when nothing happens for `--stall-timeout` s (the tree is then killed).
   Everything observed is reported, nothing is retried; a failed attempt is located (before or inside
   init_process_group), the distinct error lines of torchrun's output are counted, and on a hang the
   workers' Python stacks are dumped (faulthandler on SIGUSR1) before the tree is stopped. A hang ends
   a torchrun job, so `--torchrun-runs` (default 3) jobs run one after the other, each printed, and
   their restarts are pooled for the table.
3. A lost agent: a minitrain job (max_failures=-1) where rank 1 records the time and SIGKILLs its node
   agent (`os.getppid()`, the parent of every worker) after `--train-s` s, `--agent-kills` times. The
   workers die with their agent; the coordinator sees the agent's session break, starts a new agent
   and a new attempt. Measured: the kill -> the driver's "node localhost lost" log record (detection),
   and the kill -> the new attempt's first step after its checkpoint load. Target: detection <= 5 s
   (the lease timeout of a silent host). Peer: none (torchrun without an etcd rendezvous ends the job
   when its agent dies).

The measured processes run this same file with `--role ...`, so the code they run is right here.
Everything (storage, checkpoints, the JSON-lines records, the outputs) lives under one
tempfile.TemporaryDirectory(); every job runs in its own session with a stall timeout, and on a timeout
its whole tree is stopped (torchrun's workers run in sessions of their own: the tree is walked).
Every process started carries a tag in its environment; after each job, any tagged process still alive
is killed and counted (`leftover_processes`, which should be 0). `--save-logs DIR` keeps every job's
output and timestamped records. `--quick` uses a 30 s stall timeout.
Only the standard library is imported at the top, so the measured processes pay nothing for this file.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_core import BenchError, _stop_tree, machine_info  # noqa: E402

SCRIPT = os.path.abspath(__file__)
NUM_WORKERS = 2
DEFAULT_RESTARTS = 20
DEFAULT_AGENT_KILLS = 5
DEFAULT_TORCHRUN_RUNS = 3
QUICK_KILLS = 3
TRAIN_S = 5.0  # failures every few seconds are not the case to optimise; a spare warms up in ~2.5 s of CPU
REPORT_EVERY = 10
CHECKPOINT_EVERY = 50
FINAL_STEPS = 60
MLP_IN, MLP_HIDDEN, BATCH = 64, 256, 64
TARGET_RESTART_MEDIAN_S = 1.0
TARGET_DETECT_S = 5.0
STALL_TIMEOUT_S = 60.0
QUICK_STALL_TIMEOUT_S = 30.0
TAG_VAR = "MINITRAIN_BENCH_RESTART_TAG"
TORCHRUN_REFERENCE = ("reference: torchrun --max-restarts 1 restarted in 1.5-2.4 s in 4 of 9 tries; "
                      "4 failed (gloo dialled the dead attempt's address), 1 hung")


# ---------------------------------------------------------------------- code run by the measured processes


def _append(path: str, record: dict) -> None:
    """Append one JSON line (one write(2) on an O_APPEND file: lines of several processes never mix)."""
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")


def _read_records(path: str) -> list[dict]:
    try:
        with open(path) as f:
            return [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        return []


def _build(torch):
    """The same small MLP, optimizer and fixed batch on every rank and every attempt."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(MLP_IN, MLP_HIDDEN), torch.nn.ReLU(),
                                torch.nn.Linear(MLP_HIDDEN, MLP_HIDDEN), torch.nn.ReLU(),
                                torch.nn.Linear(MLP_HIDDEN, 1))
    x, y = torch.randn(BATCH, MLP_IN), torch.randn(BATCH, 1)
    return model, x, y


def _train(torch, ddp, opt, x, y, step: int, rank: int, loaded: float, kill, report, train_s: float) -> int:
    """Train from `step`: `report(step, loss)` every REPORT_EVERY steps. With `kill` (a callable), rank 1
    calls it after `train_s` seconds and rank 0 trains until the group breaks; without, FINAL_STEPS steps."""
    first = step
    while True:
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % REPORT_EVERY == 0:
            report(step, loss.item())
        step += 1
        if kill is None:
            if step - first >= FINAL_STEPS:
                return step
        elif rank == 1 and time.time() - loaded >= train_s:
            kill()


def _spares_at_kill(exclude: set) -> list[dict]:
    """The agent's warm spares (its `--preload` children but the current workers) and whether each is
    ready: blocked reading its bootstrap line from the pipe (it imported everything it preloads)."""
    import psutil

    spares = []
    try:
        children = psutil.Process(os.getppid()).children()
        with open("/proc/uptime") as f:
            now = float(f.read().split()[0])  # since boot, as the start times in /proc/<pid>/stat
    except (psutil.Error, OSError):
        return spares
    for child in children:
        try:
            if child.pid in exclude or "--preload" not in child.cmdline():
                continue
            with open(f"/proc/{child.pid}/wchan") as f:
                waiting_on = f.read()
            with open(f"/proc/{child.pid}/stat") as f:
                started = int(f.read().rsplit(")", 1)[1].split()[19]) / os.sysconf("SC_CLK_TCK")
            spares.append({"pid": child.pid, "age_s": round(now - started, 3),
                           "cpu_s": round(sum(child.cpu_times()[:2]), 3), "ready": "pipe" in waiting_on})
        except (psutil.Error, OSError):
            continue
    return spares


def minitrain_train_func(config: dict) -> None:
    """Sections 1 and 3: one attempt of the minitrain job (see the module docstring)."""
    import os
    import signal
    import tempfile
    import time

    entered = time.time()
    import torch

    import minitrain
    from minitrain.torch import prepare_model

    rank = minitrain.get_context().get_world_rank()
    events, kind = config["events"], config["kill_kind"]
    kills_so_far = sum(1 for r in _read_records(events) if r["kind"] == "kill")  # same on both ranks
    model, x, y = _build(torch)
    ddp = prepare_model(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
    prepared = time.time()
    step = 0
    checkpoint = minitrain.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as d:
            state = torch.load(os.path.join(d, "state.pt"))
        ddp.module.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        step = state["step"] + 1
    loaded = time.time()
    _append(events, {"kind": "start", "rank": rank, "time": loaded, "entered": entered, "prepared": prepared,
                     "step": step, "resumed": checkpoint is not None, "pid": os.getpid()})

    def report(step: int, loss: float) -> None:
        metrics = {"step": step, "loss": loss}
        if step % CHECKPOINT_EVERY:
            minitrain.report(metrics)
            return
        with tempfile.TemporaryDirectory() as tmp:
            saved = None
            if rank == 0:
                torch.save({"model": ddp.module.state_dict(), "opt": opt.state_dict(), "step": step},
                           os.path.join(tmp, "state.pt"))
                saved = minitrain.Checkpoint.from_directory(tmp)
            minitrain.report(metrics, checkpoint=saved)

    def kill() -> None:
        workers = {r["pid"] for r in _read_records(events) if r["kind"] == "start"}  # every attempt's ranks
        spares = _spares_at_kill(workers | {os.getpid()})
        _append(events, {"kind": "kill", "what": kind, "rank": rank, "time": time.time(), "pid": os.getpid(),
                         "agent_pid": os.getppid(), "spares": spares})
        os.kill(os.getpid() if kind == "worker" else os.getppid(), signal.SIGKILL)
        time.sleep(60)  # an agent kill: the parent-death signal ends this process

    last = _train(torch, ddp, opt, x, y, step, rank, loaded, kill if kills_so_far < config["kills"] else None,
                  report, config["train_s"])
    minitrain.report({"step": last, "final": True})


class _TimedLog(logging.Handler):
    """The driver's `minitrain` log records, each with its creation time, as JSON lines (and on stderr)."""

    def __init__(self, path: str):
        super().__init__(logging.DEBUG)
        self._path = path

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        _append(self._path, {"time": record.created, "level": record.levelname, "msg": message})
        stamp = time.strftime("%H:%M:%S", time.localtime(record.created)) + f".{int(record.msecs):03d}"
        sys.stderr.write(f"{stamp} minitrain {record.levelname}: {message}\n")


def role_minitrain_job(spec: dict) -> None:
    """The driver of sections 1 and 3: TorchTrainer.fit() with unlimited restarts; checks it finished."""
    from minitrain import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from minitrain.torch import TorchTrainer

    log = logging.getLogger("minitrain")
    log.addHandler(_TimedLog(spec["log_events"]))
    log.propagate = False
    config = {"events": spec["events"], "kill_kind": spec["kill_kind"], "kills": spec["kills"],
              "train_s": spec["train_s"]}
    result = TorchTrainer(minitrain_train_func, train_loop_config=config,
                          scaling_config=ScalingConfig(num_workers=NUM_WORKERS),
                          run_config=RunConfig(name="bench", storage_path=spec["storage"],
                                               failure_config=FailureConfig(max_failures=-1),
                                               checkpoint_config=CheckpointConfig(num_to_keep=2))).fit()
    assert result.metrics.get("final") is True, result.metrics
    kills = sum(1 for r in _read_records(spec["events"]) if r["kind"] == "kill")
    assert kills == spec["kills"], (kills, spec["kills"])


_STACKS = None  # a torchrun worker's stack-dump file, open for the life of the process


def role_torchrun_worker(args: argparse.Namespace) -> None:
    """Section 2: one torchrun worker of one attempt (see the module docstring)."""
    entered = time.time()
    rank, attempt = int(os.environ["RANK"]), int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    events = os.path.join(args.out_dir, "events.jsonl")
    _append(events, {"kind": "enter", "rank": rank, "attempt": attempt, "time": entered, "pid": os.getpid()})
    import faulthandler

    # On a hang the benchmark asks for every thread's stack (SIGUSR1); each process writes its own file.
    global _STACKS
    _STACKS = open(os.path.join(args.out_dir, f"stacks_attempt{attempt}_rank{rank}.txt"), "w")
    faulthandler.register(signal.SIGUSR1, file=_STACKS, all_threads=True)
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    imported = time.time()
    _append(events, {"kind": "init", "rank": rank, "attempt": attempt, "time": imported})
    dist.init_process_group("gloo")
    initialized = time.time()
    model, x, y = _build(torch)
    ddp = DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
    prepared = time.time()
    path = os.path.join(args.out_dir, "state.pt")
    step = 0
    if os.path.exists(path):
        state = torch.load(path)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        step = state["step"] + 1
    loaded = time.time()
    _append(events, {"kind": "start", "rank": rank, "attempt": attempt, "time": loaded, "entered": entered,
                     "imported": imported, "initialized": initialized, "prepared": prepared, "step": step,
                     "resumed": step > 0, "pid": os.getpid()})

    def report(step: int, loss: float) -> None:
        if rank == 0 and step % CHECKPOINT_EVERY == 0:
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step}, path + ".tmp")
            os.replace(path + ".tmp", path)

    def kill() -> None:
        _append(events, {"kind": "kill", "what": "worker", "rank": rank, "attempt": attempt, "time": time.time(),
                         "pid": os.getpid()})
        os.kill(os.getpid(), signal.SIGKILL)

    _train(torch, ddp, opt, x, y, step, rank, loaded, kill if attempt < args.restarts else None, report,
           args.train_s)
    dist.destroy_process_group()


# ---------------------------------------------------------------------- the benchmark driver


def _pct(values: list[float], q: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, -(-len(ordered) * q // 100) - 1))] if ordered else float("nan")


def _summary(values: list[float]) -> dict:
    if not values:
        return {"n": 0, "median_s": None, "p90_s": None, "max_s": None, "min_s": None}
    return {"n": len(values), "median_s": statistics.median(values), "p90_s": _pct(values, 90),
            "max_s": max(values), "min_s": min(values)}


def _tagged_env(tag: str) -> dict:
    env = dict(os.environ)
    env[TAG_VAR] = tag
    env["PYTHONUNBUFFERED"] = "1"
    return env


def reap_leftovers(tag: str) -> int:
    """Kill every process still carrying `tag` in its environment; return how many there were."""
    import psutil  # a minitrain dependency

    left = []
    for proc in psutil.process_iter():
        try:
            if proc.pid != os.getpid() and proc.environ().get(TAG_VAR) == tag:
                left.append(proc)
        except (psutil.Error, OSError):
            continue
    for proc in left:
        try:
            proc.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(left, timeout=5)
    return len(left)


def _dump_stacks(proc: subprocess.Popen, marker: str) -> None:
    """SIGUSR1 to the descendants whose command line holds `marker` (their faulthandler writes every
    thread's stack to their stacks_*.txt file), then a moment for them to write."""
    import psutil

    try:
        targets = [p for p in psutil.Process(proc.pid).children(recursive=True) if marker in " ".join(p.cmdline())]
    except psutil.Error:
        return
    for target in targets:
        try:
            target.send_signal(signal.SIGUSR1)
        except psutil.Error:
            pass
    time.sleep(1.0)


def run_watched(argv: list[str], cwd: str, output: str, tag: str, watch: str, stall_s: float,
                dump_marker: str = "") -> dict:
    """Run argv in its own session until it exits, or until `watch` has not grown for `stall_s` s (then the
    stacks of the processes matching `dump_marker` are dumped and its whole tree is stopped). Returns
    returncode, hung, wall_s and the number of tagged leftovers."""
    start, load_start = time.monotonic(), os.getloadavg()[0]
    with open(output, "wb") as out:
        proc = subprocess.Popen(argv, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, env=_tagged_env(tag))
    last_size, last_change, hung = -1, start, False
    while proc.poll() is None:
        time.sleep(0.2)
        size = os.path.getsize(watch) if os.path.exists(watch) else 0
        now = time.monotonic()
        if size != last_size:
            last_size, last_change = size, now
        elif now - last_change > stall_s:
            hung = True
            if dump_marker:
                _dump_stacks(proc, dump_marker)
            _stop_tree(proc)
            break
    wall = time.monotonic() - start
    return {"returncode": proc.wait(), "hung": hung, "wall_s": wall, "leftover_processes": reap_leftovers(tag),
            "load_1min": [round(load_start, 2), round(os.getloadavg()[0], 2)]}


def _tail(path: str, chars: int = 3000) -> str:
    with open(path, "rb") as f:
        return f.read().decode(errors="replace")[-chars:]


def analyse_restarts(records: list[dict], attempts: list[int], max_attempt=None, hung: bool = False) -> dict:
    """Pair each attempt's kill with the next attempt's first step (records carry "attempt").

    A restart follows every attempt but the last; and the last too when it was killed or never reached its
    first step, unless it was attempt `max_attempt` (no restart left: `restarts_exhausted`) or the job hung
    in it (`hung_in_attempt`). A restart succeeded when its attempt reached the first step (rank 0's
    "start")."""
    by_attempt: dict[int, dict] = {a: {} for a in attempts}
    for r in records:
        slot = by_attempt.setdefault(r["attempt"], {})
        if r["kind"] == "start" and r["rank"] != 0:
            continue
        slot.setdefault(r["kind"], r)
    ordered = sorted(by_attempt)
    restarts = []
    for previous, current in zip(ordered, ordered[1:]):
        before, after = by_attempt[previous], by_attempt[current]
        entry = {"attempt": current, "cause": "kill" if "kill" in before else "failure", "ok": "start" in after}
        if "spares" in before.get("kill", {}):
            spares = before["kill"]["spares"]
            entry["spares_at_kill"] = f"{sum(x['ready'] for x in spares)}/{len(spares)} ready"
            entry["all_spares_ready"] = bool(spares) and all(x["ready"] for x in spares)
        if entry["ok"] and "kill" in before:
            entry["latency_s"] = after["start"]["time"] - before["kill"]["time"]
            entry["kill_time"] = before["kill"]["time"]
            entry["start"] = after["start"]
        restarts.append(entry)
    exhausted, hung_in = False, None
    if ordered:
        last = by_attempt[ordered[-1]]
        if hung and "kill" not in last:
            hung_in = ordered[-1]  # the job hung in this attempt: no restart was due
            if restarts and restarts[-1]["attempt"] == hung_in:
                restarts[-1]["hung"] = True
        elif "kill" in last or "start" not in last:  # a restart was due, and none reached its first step
            if max_attempt is not None and ordered[-1] >= max_attempt:
                exhausted = True
            else:
                restarts.append({"attempt": ordered[-1] + 1, "cause": "kill" if "kill" in last else "failure",
                                 "ok": False, "never_started": True})
    after_kill = [r for r in restarts if r["cause"] == "kill"]
    latencies = [r["latency_s"] for r in after_kill if r["ok"]]
    spares = {}
    if any("spares_at_kill" in r for r in after_kill):
        ready = [r["latency_s"] for r in after_kill if r.get("all_spares_ready") and "latency_s" in r]
        cold = [r["latency_s"] for r in after_kill if not r.get("all_spares_ready") and "latency_s" in r]
        spares = {"kills_with_all_spares_ready": sum(bool(r.get("all_spares_ready")) for r in after_kill),
                  "latency_spares_ready": _summary(ready), "latency_spares_not_ready": _summary(cold)}
    return {"attempts": len(ordered), "kills": len(after_kill), "restarts": len(restarts), **spares,
            "succeeded_after_kill": sum(r["ok"] for r in after_kill),
            "failed": sum(not r["ok"] for r in restarts), "restarts_exhausted": exhausted,
            "hung_in_attempt": hung_in,
            "last_attempt_reached_first_step": bool(ordered) and "start" in by_attempt[ordered[-1]],
            "per_restart": restarts,
            "latencies_s": latencies, **_summary(latencies)}


def _parse_log(log_events: list[dict]) -> dict:
    """Times of the driver's log records that mark a restart's phases."""
    marks: dict[str, list] = {"starting": [], "detected": [], "failed": [], "lost": [], "new_agent": []}
    patterns = {"starting": r"^attempt (\d+): starting", "failed": r"^attempt (\d+) failed",
                "detected": r"^attempt (\d+): .*; stopping every rank of the attempt$",
                "lost": r"^node (\S+) lost", "new_agent": r"^node (\S+): starting a new agent"}
    for record in log_events:
        for key, pattern in patterns.items():
            match = re.match(pattern, record["msg"])
            if match:
                marks[key].append((record["time"], match.group(1), record["msg"]))
    return marks


def _attempt_at(starts: list[tuple], t: float) -> int:
    """The attempt running at time t: the last one whose start log record came before t."""
    attempt = 0
    for when, number, _ in starts:
        if when <= t:
            attempt = int(number)
    return attempt


def _first_after(marks: list[tuple], t: float):
    return next((m for m in marks if m[0] >= t), None)


def minitrain_job(tmp: str, name: str, kill_kind: str, kills: int, train_s: float, stall_s: float) -> dict:
    """Run one minitrain job (sections 1 and 3); return the restarts, phases and raw figures."""
    out_dir = os.path.join(tmp, name)
    os.makedirs(out_dir)
    spec = {"storage": os.path.join(out_dir, "storage"), "events": os.path.join(out_dir, "events.jsonl"),
            "log_events": os.path.join(out_dir, "driver_log.jsonl"), "kill_kind": kill_kind, "kills": kills,
            "train_s": train_s}
    spec_path = os.path.join(out_dir, "spec.json")
    with open(spec_path, "w") as f:
        json.dump(spec, f)
    output = os.path.join(out_dir, "output.txt")
    run = run_watched([sys.executable, SCRIPT, "--role", "minitrain-job", "--spec", spec_path], cwd=out_dir,
                      output=output, tag=f"{tmp}/{name}", watch=spec["events"], stall_s=stall_s)
    if run["returncode"] != 0 or run["hung"]:
        how = f"made no progress for {stall_s:g} s" if run["hung"] else f"exited with {run['returncode']}"
        raise BenchError(f"the minitrain {kill_kind}-kill job {how}; output tail:\n{_tail(output)}")
    marks = _parse_log(_read_records(spec["log_events"]))
    records = _read_records(spec["events"])
    for r in records:
        r["attempt"] = _attempt_at(marks["starting"], r["time"])
    attempts = sorted({int(n) for _, n, _ in marks["starting"]})
    figures = analyse_restarts(records, attempts)
    phases: dict[str, list[float]] = {"kill_to_detected_log": [], "detected_to_failed_log": [],
                                      "kill_to_failed_log": [], "failed_log_to_starting_log": [],
                                      "starting_log_to_train_fn": [], "train_fn_to_prepared": [],
                                      "prepared_to_loaded": [], "kill_to_lost_log": [], "lost_to_new_agent_log": []}
    for restart in figures["per_restart"]:
        if "latency_s" not in restart:
            continue
        kill, start = restart["kill_time"], restart["start"]
        failed = _first_after(marks["failed"], kill)
        starting = _first_after(marks["starting"], kill)
        detected = _first_after(marks["detected"], kill)
        if detected and failed and detected[0] <= failed[0]:
            phases["kill_to_detected_log"].append(detected[0] - kill)
            phases["detected_to_failed_log"].append(failed[0] - detected[0])
        if failed and starting:
            phases["kill_to_failed_log"].append(failed[0] - kill)
            phases["failed_log_to_starting_log"].append(starting[0] - failed[0])
            phases["starting_log_to_train_fn"].append(start["entered"] - starting[0])
        phases["train_fn_to_prepared"].append(start["prepared"] - start["entered"])
        phases["prepared_to_loaded"].append(start["time"] - start["prepared"])
        lost = _first_after(marks["lost"], kill)
        if kill_kind == "agent" and lost and (not starting or lost[0] <= starting[0]):
            phases["kill_to_lost_log"].append(lost[0] - kill)
            agent = _first_after(marks["new_agent"], lost[0])
            if agent:
                phases["lost_to_new_agent_log"].append(agent[0] - lost[0])
    figures["phases"] = {k: {"median_s": statistics.median(v), "max_s": max(v), "values_s": v}
                         for k, v in phases.items() if v}
    if kill_kind == "agent":  # the spares die with their agent: nothing to say about them
        for key in ("kills_with_all_spares_ready", "latency_spares_ready", "latency_spares_not_ready"):
            figures.pop(key, None)
    figures["run"] = run
    figures["resumed_every_attempt"] = all(r.get("resumed") for r in records
                                           if r["kind"] == "start" and r["attempt"] > 0)
    figures["unexpected_failures"] = len(marks["failed"]) - figures["kills"]
    return figures


def torchrun_job(tmp: str, name: str, restarts: int, train_s: float, stall_s: float) -> dict:
    """One torchrun --max-restarts N job of section 2; every restart's outcome as observed."""
    out_dir = os.path.join(tmp, name)
    os.makedirs(out_dir)
    events = os.path.join(out_dir, "events.jsonl")
    candidate = os.path.join(os.path.dirname(sys.executable), "torchrun")
    base = [candidate] if os.access(candidate, os.X_OK) else [sys.executable, "-m", "torch.distributed.run"]
    argv = [*base, "--standalone", "--nproc-per-node", str(NUM_WORKERS), "--max-restarts", str(restarts),
            SCRIPT, "--role", "torchrun-worker", "--out-dir", out_dir, "--restarts", str(restarts),
            "--train-s", str(train_s)]
    output = os.path.join(out_dir, "output.txt")
    run = run_watched(argv, cwd=out_dir, output=output, tag=f"{tmp}/{name}", watch=events, stall_s=stall_s,
                      dump_marker="torchrun-worker")
    records = _read_records(events)
    seen = sorted({r["attempt"] for r in records})
    figures = analyse_restarts(records, list(range(seen[-1] + 1)) if seen else [], max_attempt=restarts,
                               hung=run["hung"])
    phases: dict[str, list[float]] = {"kill_to_process_started": [], "process_to_torch_imported": [],
                                      "imported_to_process_group": [], "process_group_to_ddp": [],
                                      "ddp_to_loaded": []}
    for restart in figures["per_restart"]:
        if "latency_s" in restart:
            start = restart["start"]
            phases["kill_to_process_started"].append(start["entered"] - restart["kill_time"])
            phases["process_to_torch_imported"].append(start["imported"] - start["entered"])
            phases["imported_to_process_group"].append(start["initialized"] - start["imported"])
            phases["process_group_to_ddp"].append(start["prepared"] - start["initialized"])
            phases["ddp_to_loaded"].append(start["time"] - start["prepared"])
    figures["phases"] = {k: {"median_s": statistics.median(v), "max_s": max(v), "values_s": v}
                         for k, v in phases.items() if v}
    enters: dict[int, float] = {}
    for r in records:
        if r["kind"] == "enter":
            enters[r["attempt"]] = min(enters.get(r["attempt"], r["time"]), r["time"])
    in_init = {r["attempt"] for r in records if r["kind"] == "init"}
    for restart in figures["per_restart"]:  # where a failed attempt stopped, and how long it took to fail
        if not restart["ok"] and restart["attempt"] in enters:
            restart["stopped_in"] = ("init_process_group" if restart["attempt"] in in_init
                                     else "start-up (before init_process_group)")
            if restart["attempt"] + 1 in enters:
                restart["failed_after_s"] = enters[restart["attempt"] + 1] - enters[restart["attempt"]]
    figures["run"] = run
    figures["command"] = " ".join(["torchrun", *argv[len(base):]]).replace(SCRIPT, os.path.basename(SCRIPT))
    with open(output, errors="replace") as f:
        text = f.read()
    errors: dict[str, int] = {}
    for line in text.splitlines():
        match = re.search(r"\b(\w+(?:Error|Exception))\b:?\s*(.*)", line)
        if match and "Traceback" not in line:
            key = f"{match.group(1)}: {match.group(2)[:140]}"
            errors[key] = errors.get(key, 0) + 1
    figures["error_lines"] = dict(sorted(errors.items(), key=lambda kv: -kv[1])[:12])
    figures["hang_stacks"] = hang_stacks(out_dir)
    figures["output_tail"] = text[-2000:]
    return figures


def hang_stacks(out_dir: str) -> dict:
    """Where the threads of hung workers were (their faulthandler dumps): the innermost frames of each
    thread, torch's own first, counted over processes."""
    stacks: dict[str, int] = {}
    frame = re.compile(r'^\s*File "(.*)", line (\d+) in (\S+)$')
    for name in sorted(os.listdir(out_dir)):
        if not name.startswith("stacks_"):
            continue
        with open(os.path.join(out_dir, name), errors="replace") as f:
            threads = f.read().split("\n\n")
        for thread in threads:
            frames = [m.groups() for m in map(frame.match, thread.splitlines()) if m]
            torch_frames = [fr for fr in frames if "site-packages/torch/" in fr[0]][:2]
            chosen = torch_frames or frames[:1]
            if chosen:
                key = " <- ".join(f"{func} ({os.path.basename(path)}:{line})" for path, line, func in chosen)
                stacks[key] = stacks.get(key, 0) + 1
    return stacks


def _ending(job: dict) -> str:
    if job["run"]["hung"]:
        return f"hung in attempt {job['hung_in_attempt']}"
    return f"exit {job['run']['returncode']}" + (" (restarts spent)" if job["restarts_exhausted"] else "")


def torchrun_section(tmp: str, runs: int, restarts: int, train_s: float, stall_s: float) -> dict:
    """Section 2: `runs` torchrun jobs one after the other (a hang ends a job: more jobs, more restarts
    observed); each job is printed, and the restarts of all of them are pooled."""
    jobs = []
    for index in range(runs):
        job = torchrun_job(tmp, f"torchrun_{index + 1}", restarts, train_s, stall_s)
        jobs.append(job)
        print_restarts(f"torchrun job {index + 1}/{runs}", job)
        print_phases(job)
        end = (f"HUNG: no progress for {stall_s:g} s in attempt {job['hung_in_attempt']}, its tree was stopped "
               f"(exit code {job['run']['returncode']} after that)" if job["run"]["hung"] else
               f"torchrun exited with code {job['run']['returncode']}")
        spent = "; all --max-restarts spent" if job["restarts_exhausted"] else ""
        print(f"    {end}{spent}; wall time {job['run']['wall_s']:.1f} s (load average {job['run']['load_1min'][0]} -> "
              f"{job['run']['load_1min'][1]}), leftover processes "
              f"{job['run']['leftover_processes']}; error lines in its output:")
        for line, count in job["error_lines"].items():
            print(f"    {count:3d}x {line}")
        if job["hang_stacks"]:
            print("    where the hung workers' threads were (innermost torch frames first; count of threads):")
            for line, count in job["hang_stacks"].items():
                print(f"    {count:3d}x {line}")
    latencies = [v for job in jobs for v in job["latencies_s"]]
    phases: dict[str, list[float]] = {}
    for job in jobs:
        for key, phase in job["phases"].items():
            phases.setdefault(key, []).extend(phase["values_s"])
    pooled = {"jobs": jobs, "runs": runs, "kills": sum(j["kills"] for j in jobs),
              "succeeded_after_kill": sum(j["succeeded_after_kill"] for j in jobs),
              "failed": sum(j["failed"] for j in jobs), "hung_jobs": sum(j["run"]["hung"] for j in jobs),
              "endings": [_ending(j) for j in jobs],
              "leftover_processes": sum(j["run"]["leftover_processes"] for j in jobs),
              "latencies_s": latencies, **_summary(latencies),
              "phases": {k: {"median_s": statistics.median(v), "max_s": max(v), "values_s": v}
                         for k, v in phases.items()}}
    if runs > 1:
        print(f"  torchrun, {runs} jobs pooled: {pooled['succeeded_after_kill']}/{pooled['kills']} restarts after "
              f"a kill succeeded, {pooled['failed']} failed restart(s), {pooled['hung_jobs']} job(s) hung; median "
              f"{_fmt(pooled['median_s'])}, p90 {_fmt(pooled['p90_s'])}, max {_fmt(pooled['max_s'])} "
              f"(n={pooled['n']}); jobs ended: {', '.join(pooled['endings'])}")
    return pooled


def save_logs(tmp: str, dest) -> None:
    """Copy every job's output and JSON-lines records (not storage or checkpoints) to `dest`, if given."""
    if not dest:
        return
    for name in sorted(os.listdir(tmp)):
        if not os.path.isdir(os.path.join(tmp, name)):
            continue
        files = ["output.txt", "events.jsonl", "driver_log.jsonl"]
        files += [f for f in os.listdir(os.path.join(tmp, name)) if f.startswith("stacks_")]
        for file in files:
            if os.path.exists(os.path.join(tmp, name, file)) and os.path.getsize(os.path.join(tmp, name, file)):
                os.makedirs(os.path.join(dest, name), exist_ok=True)
                shutil.copy(os.path.join(tmp, name, file), os.path.join(dest, name, file))


def _fmt(value, unit: str = " s", digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}{unit}"


def print_restarts(label: str, figures: dict) -> None:
    lat = ", ".join(f"{v:.2f}" for v in figures["latencies_s"])
    print(f"  {label}: {figures['succeeded_after_kill']}/{figures['kills']} restarts after a kill succeeded, "
          f"{figures['failed']} failed restart(s); median {_fmt(figures['median_s'])}, p90 "
          f"{_fmt(figures['p90_s'])}, max {_fmt(figures['max_s'])}")
    print(f"    latencies (s): {lat or 'none'}")
    if "kills_with_all_spares_ready" in figures:
        ready, cold = figures["latency_spares_ready"], figures["latency_spares_not_ready"]
        print(f"    warm spares all ready at the kill: {figures['kills_with_all_spares_ready']}/{figures['kills']} "
              f"kills; median latency {_fmt(ready['median_s'])} when ready (n={ready['n']}), "
              f"{_fmt(cold['median_s'])} when not (n={cold['n']})")
    for restart in figures["per_restart"]:
        if not restart["ok"]:
            what = ("never started (the job ended or hung)" if restart.get("never_started") else
                    "HUNG before its first step" if restart.get("hung") else "did not reach its first step")
            took = f" in {restart['stopped_in']}" if "stopped_in" in restart else ""
            took += f" (failed after {restart['failed_after_s']:.1f} s)" if "failed_after_s" in restart else ""
            print(f"    restart into attempt {restart['attempt']} (after a {restart['cause']}): {what}{took}")


def print_phases(figures: dict) -> None:
    names = {"kill_to_lost_log": "kill -> 'node lost' log (detection)",
             "lost_to_new_agent_log": "'node lost' -> 'starting a new agent' log",
             "kill_to_detected_log": "kill -> 'stopping every rank' log (failure detected)",
             "detected_to_failed_log": "'stopping every rank' -> 'restarting' log (the group stopped)",
             "kill_to_failed_log": "kill -> 'attempt failed; restarting' log (detect + stop the group)",
             "failed_log_to_starting_log": "'restarting' -> 'attempt N: starting' log",
             "starting_log_to_train_fn": "'starting' -> training function entered (spawn, connect, rendezvous)",
             "train_fn_to_prepared": "function entry -> model built, prepare_model (DDP) done",
             "prepared_to_loaded": "DDP -> get_checkpoint() + torch.load done (= the first step)",
             "kill_to_process_started": "kill -> new worker process running this script (detect, stop, respawn)",
             "process_to_torch_imported": "process start -> torch imported",
             "imported_to_process_group": "torch imported -> init_process_group (rendezvous) done",
             "process_group_to_ddp": "process group -> model built, DDP done",
             "ddp_to_loaded": "DDP -> torch.load done (= the first step)"}
    for key, label in names.items():
        if key in figures["phases"]:
            p = figures["phases"][key]
            print(f"    {label}: median {p['median_s']:.3f} s, max {p['max_s']:.3f} s")


def _torchrun_outcome(tr: dict) -> str:
    return (f"torchrun {tr['succeeded_after_kill']}/{tr['kills']} after a kill, {tr['failed']} restart(s) failed "
            f"in {tr['runs']} job(s) ({'; '.join(tr['endings'])})")


def markdown_table(machine: dict, mt: dict, tr, agent: dict, command: str) -> str:
    """The README table."""
    def met(ok: bool) -> str:
        return "yes" if ok else "**no**"

    ok_all = mt["succeeded_after_kill"] == mt["kills"] and mt["failed"] == 0
    med = mt["median_s"]
    if tr is not None and tr["median_s"]:
        peer = (f"torchrun {_fmt(tr['median_s'])} (p90 {_fmt(tr['p90_s'])}, max {_fmt(tr['max_s'])}, "
                f"n={tr['n']})")
        ratio = f"{med / tr['median_s']:.2f}x"
        peer_ok = _torchrun_outcome(tr)
    else:
        peer, ratio = ("torchrun not run" if tr is None else "torchrun: no successful restart"), "-"
        peer_ok = "-" if tr is None else _torchrun_outcome(tr)
    spawn = (tr or {}).get("phases", {}).get("kill_to_process_started", {}).get("median_s")
    peer_detect = "-" if spawn is None else f"torchrun: kill -> new worker process started {spawn:.2f} s"
    detect = agent["phases"].get("kill_to_lost_log", {})
    detect_med = detect.get("median_s")
    rows = [
        "| Measure (2 workers, gloo, CPU, localhost) | minitrain | peer | ratio | target | met |",
        "|---|---|---|---|---|---|",
        f"| Restart after a worker SIGKILL: kill -> first step after checkpoint load, median of {mt['n']} "
        f"| {_fmt(med)} (p90 {_fmt(mt['p90_s'])}, max {_fmt(mt['max_s'])}) | {peer} | {ratio} "
        f"| <= {TARGET_RESTART_MEDIAN_S:g} s | {met(med is not None and med <= TARGET_RESTART_MEDIAN_S)} |",
        f"| Restarts that succeeded | {mt['succeeded_after_kill']}/{mt['kills']} | {peer_ok} | - "
        f"| all | {met(ok_all)} |",
        f"| Worker SIGKILL: kill -> failure detected (driver log), median "
        f"| {_fmt(mt['phases'].get('kill_to_detected_log', {}).get('median_s'), digits=3)} "
        f"| {peer_detect} | - | - | - |",
        f"| Lost agent (SIGKILL): kill -> \"node lost\" (detection), median of {len(detect.get('values_s', []))} "
        f"| {_fmt(detect_med, digits=3)} (max {_fmt(detect.get('max_s'), digits=3)}) | lease timeout 5 s "
        f"(silent host) | - | <= {TARGET_DETECT_S:g} s "
        f"| {met(detect_med is not None and detect.get('max_s', 1e9) <= TARGET_DETECT_S)} |",
        f"| Lost agent: kill -> first step of the new attempt, median of {agent['n']} "
        f"| {_fmt(agent['median_s'])} (max {_fmt(agent['max_s'])}), {agent['succeeded_after_kill']}/"
        f"{agent['kills']} ok | - | - | - | - |",
    ]
    footer = (f"\n_Machine: {machine['cpu']}, {machine['cores']} cores, Python {machine['python']}, "
              f"torch {machine['torch']}, grpcio {machine['grpcio']}, load average {machine['load_1min']} -> "
              f"{machine['load_1min_end']}; `{command}`._")
    return "\n".join(rows) + "\n" + footer


def minitrain_source() -> str:
    """Where the measured minitrain is imported from (the jobs import the same), with its git revision."""
    import importlib.util

    spec = importlib.util.find_spec("minitrain")
    if spec is None or not spec.origin:
        return "not found"
    root = os.path.dirname(os.path.dirname(spec.origin))
    try:
        rev = subprocess.run(["git", "-C", root, "describe", "--always", "--dirty"], capture_output=True,
                             text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        rev = ""
    return root + (f" (git {rev})" if rev else "")


def run_benchmarks(args: argparse.Namespace) -> int:
    restarts = QUICK_KILLS if args.quick else args.restarts
    agent_kills = QUICK_KILLS if args.quick else args.agent_kills
    stall = min(args.stall_timeout, QUICK_STALL_TIMEOUT_S) if args.quick else args.stall_timeout
    torchrun_runs = 1 if args.quick else args.torchrun_runs
    machine = machine_info()
    machine["minitrain_source"] = minitrain_source()
    print(f"Machine: {machine['cpu']}, {machine['cores']} cores, {machine['os']}; Python {machine['python']}, "
          f"torch {machine['torch']}, grpcio {machine['grpcio']}, minitrain {machine['minitrain']} from "
          f"{machine['minitrain_source']}; load average {machine['load_1min']}")
    if machine["load_1min"] > 0.5 * machine["cores"]:
        print("  note: the machine is busy; the figures below are noisier than on an idle machine")
    base = os.path.realpath(args.tmp_dir or tempfile.gettempdir())
    tr = None
    with tempfile.TemporaryDirectory(prefix="minitrain-bench-restart-", dir=base) as tmp:
        try:
            print(f"\n1. minitrain: restart after a worker SIGKILL, {restarts} kills in one job "
                  f"(max_failures=-1, {args.train_s:g} s of DDP training per attempt)")
            mt = minitrain_job(tmp, "worker_kill", "worker", restarts, args.train_s, stall)
            print_restarts("minitrain", mt)
            print_phases(mt)
            print(f"    job wall time {mt['run']['wall_s']:.1f} s (load average {mt['run']['load_1min'][0]} -> "
                  f"{mt['run']['load_1min'][1]}); unexpected failures {mt['unexpected_failures']}; "
                  f"every attempt resumed from a checkpoint: {mt['resumed_every_attempt']}; leftover processes "
                  f"{mt['run']['leftover_processes']}")
            if not args.no_torchrun:
                print(f"\n2. torchrun --standalone --nproc-per-node {NUM_WORKERS} --max-restarts {restarts}: the same "
                      f"kills, {torchrun_runs} job(s) ({TORCHRUN_REFERENCE})")
                tr = torchrun_section(tmp, torchrun_runs, restarts, args.train_s, stall)
            print(f"\n3. minitrain: a lost agent, {agent_kills} SIGKILLs of the node agent (rank 1 kills its parent)")
            agent = minitrain_job(tmp, "agent_kill", "agent", agent_kills, args.train_s, stall)
            print_restarts("minitrain", agent)
            print_phases(agent)
            print(f"    job wall time {agent['run']['wall_s']:.1f} s (load average {agent['run']['load_1min'][0]} -> "
                  f"{agent['run']['load_1min'][1]}); unexpected failures "
                  f"{agent['unexpected_failures']}; leftover processes {agent['run']['leftover_processes']}")
        except BenchError as exc:
            print(f"\nbenchmark failed: {exc}", file=sys.stderr)
            return 1
        finally:
            save_logs(tmp, args.save_logs)
    machine["load_1min_end"] = round(os.getloadavg()[0], 2)
    command = "python scripts/bench_restart.py" + (" --quick" if args.quick else
                                                   f" --restarts {restarts} --agent-kills {agent_kills} "
                                                   f"--torchrun-runs {torchrun_runs}")
    if args.no_torchrun:
        command += " --no-torchrun"
    table = markdown_table(machine, mt, tr, agent, command)
    print("\n" + table)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": machine, "quick": args.quick, "train_s": args.train_s, "minitrain_restart": mt,
                       "torchrun_restart": tr, "agent_loss": agent, "markdown": table}, f, indent=2)
        print(f"\nfigures written to {args.json}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--restarts", type=int, default=DEFAULT_RESTARTS,
                        help=f"worker kills (= restarts) for minitrain and torchrun (default {DEFAULT_RESTARTS})")
    parser.add_argument("--agent-kills", type=int, default=DEFAULT_AGENT_KILLS,
                        help=f"agent kills in section 3 (default {DEFAULT_AGENT_KILLS})")
    parser.add_argument("--train-s", type=float, default=TRAIN_S,
                        help=f"seconds of training per attempt before the kill (default {TRAIN_S:g})")
    parser.add_argument("--stall-timeout", type=float, default=STALL_TIMEOUT_S,
                        help=f"stop a job after this many seconds without progress (default {STALL_TIMEOUT_S:g})")
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_KILLS} kills each (proves the benchmark works)")
    parser.add_argument("--torchrun-runs", type=int, default=DEFAULT_TORCHRUN_RUNS,
                        help=f"torchrun jobs in section 2, each with --max-restarts N; a hang ends a job "
                             f"(default {DEFAULT_TORCHRUN_RUNS}; 1 with --quick)")
    parser.add_argument("--no-torchrun", action="store_true", help="skip section 2")
    parser.add_argument("--json", metavar="PATH", help="also write the figures as JSON to PATH")
    parser.add_argument("--tmp-dir", metavar="DIR", help="where the temporary directory goes")
    parser.add_argument("--save-logs", metavar="DIR",
                        help="copy every job's output and timestamped records to DIR before the temp dir goes")
    # Internal: what the measured processes run.
    parser.add_argument("--role", choices=["minitrain-job", "torchrun-worker"], help=argparse.SUPPRESS)
    parser.add_argument("--spec", help=argparse.SUPPRESS)
    parser.add_argument("--out-dir", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.role == "torchrun-worker":
        role_torchrun_worker(args)
        return 0
    if args.role == "minitrain-job":
        with open(args.spec) as f:
            role_minitrain_job(json.load(f))
        return 0
    if min(args.restarts, args.agent_kills, args.torchrun_runs) < 1 or args.train_s <= 0 or args.stall_timeout <= 0:
        parser.error("--restarts, --agent-kills and --torchrun-runs must be >= 1, --train-s and --stall-timeout > 0")
    return run_benchmarks(args)


if __name__ == "__main__":
    sys.exit(main())
