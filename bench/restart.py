"""Workloads `restart` and `detect`: recovery from a worker SIGKILL against `torchrun --max-restarts`,
and the time the coordinator takes to learn that a node agent is gone (2 CPU workers, gloo, a small
DDP MLP, localhost). The measured code is in `restart_jobs.py`, the analysis in `restart_analysis.py`.

restart, minitrain: ONE job with FailureConfig(max_failures=-1). Every attempt builds the model, wraps
    it with prepare_model (DDP), loads the latest committed checkpoint and records time.time() right
    after the load, before its first step. It trains (a report every 10 steps, a SYNC checkpoint every
    50) for `train_s` seconds; then rank 1 records the time and SIGKILLs itself, `kills` times; the
    last attempt trains 60 steps and the job ends. Latency = the first step of attempt i+1 - the kill
    in attempt i; a restart succeeded when that attempt reached its first step. Where the time went
    comes from the driver's timestamped log records and the training function's records, and the
    latencies are split by whether the agent's fork server was ready at the kill.
    Also measured: kill -> rank 0's first line of user code in attempt i+1 (the training function
    entered), and the new process's creation (fork or spawn) time, which splits the agent's part from
    the worker's start-up. Target: first line median <= 1.0 s and p90 <= 1.5 s, first step median
    <= 1.0 s, every restart succeeded.
restart, early crash: `early_crashes` jobs in which rank 1 SIGKILLs itself at the first line of the
    first attempt's training function (a start-up crash: the agent's fork server has had no time to
    warm up), one restart each, pooled. Same figures and phases; target: first line median <= 1.0 s,
    p90 <= 1.5 s (the first step includes prepare_model's own import of torch._dynamo when the worker
    was forked before the fork server had imported it).
restart, torchrun: `torchrun --standalone --nproc-per-node 2 --max-restarts N` of the same training
    (its own checkpoint file, torch.save + rename every 50 steps); rank 1 SIGKILLs itself while
    TORCHELASTIC_RESTART_COUNT < N. A restart fails when its attempt never reaches the first step, when
    torchrun exits, or when nothing happens for `stall_s` (the workers' stacks are then dumped and the
    tree stopped). Nothing is retried; `torchrun_runs` jobs run one after the other and are pooled.
detect: a minitrain job (max_failures=-1) where rank 1 ends its node agent every attempt but the last:
    "agent": SIGKILL (the session breaks at once);
    "agent-stop": SIGSTOP, a silent agent (its connections stay open and nothing answers: a host that
    hangs or drops off the network); the coordinator must notice from keepalive pings and the lease.
    Measured: the event -> the driver's "node ... lost" log record; and the event -> the new attempt's
    first step. Target: detection <= 5 s (the lease). Peer: none (torchrun without an etcd rendezvous
    ends the job when its agent dies).

Every job runs in its own session with a stall timeout; every process started carries a tag in its
environment, and after each job any tagged process still alive is killed and counted
(`leftover_processes`, which should be 0).
"""

from __future__ import annotations

import os
import shutil
import signal
import statistics
import subprocess
import time

from bench.common import (NUM_WORKERS, BenchError, fmt_s, read_jsonl, reap_tagged, role_argv, say,
                                    stop_tree, summary, tagged_env, tail, torchrun_argv, write_json)
from bench.restart_analysis import (analyse_restarts, attempt_at, error_lines, hang_stacks,
                                              locate_failed_attempts, parse_log, phases_of_minitrain,
                                              phases_of_torchrun)
from bench.table import Row, WorkloadResult, ratio

TARGET_RESTART_MEDIAN_S = 1.0
TARGET_RESTART_P90_S = 1.5
TARGET_DETECT_S = 5.0
TAG_VAR = "MINITRAIN_BENCH_RESTART_TAG"
# torchrun restarts in 1.5-2.4 s when it does (TORCHRUN_REFERENCE); one that showed no progress for a minute
# is its known hang in init_process_group, recorded as such. A longer stall (the minitrain jobs' --stall-s,
# sized for a busy machine) only made CI wait: 240 s per hung torchrun job.
TORCHRUN_STALL_S = 60.0
TORCHRUN_REFERENCE = ("reference: torchrun --max-restarts 1 restarted in 1.5-2.4 s in 4 of 9 tries; "
                      "4 failed (gloo dialled the dead attempt's address), 1 hung")


def dump_stacks(proc: subprocess.Popen, marker: str) -> None:
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
                                start_new_session=True, env=tagged_env(TAG_VAR, tag))
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
                dump_stacks(proc, dump_marker)
            stop_tree(proc)
            break
    wall = time.monotonic() - start
    return {"returncode": proc.wait(), "hung": hung, "wall_s": wall, "leftover_processes": reap_tagged(TAG_VAR, tag),
            "load_1min": [round(load_start, 2), round(os.getloadavg()[0], 2)]}


def minitrain_job(tmp: str, name: str, kill_kind: str, kills: int, train_s: float, stall_s: float,
                  crash_at: str = "train_s") -> dict:
    """Run one minitrain job (see the module docstring); its restarts, phases and raw figures. `crash_at`:
    "train_s" (rank 1 dies `train_s` seconds into each attempt) or "first_line" (at the first line of the
    training function of the first attempt)."""
    out_dir = os.path.join(tmp, name)
    os.makedirs(out_dir)
    spec = {"storage": os.path.join(out_dir, "storage"), "events": os.path.join(out_dir, "events.jsonl"),
            "log_events": os.path.join(out_dir, "driver_log.jsonl"), "kill_kind": kill_kind, "kills": kills,
            "train_s": train_s, "crash_at": crash_at}
    spec_path = os.path.join(out_dir, "spec.json")
    write_json(spec_path, spec)
    output = os.path.join(out_dir, "output.txt")
    run = run_watched(role_argv("restart_jobs", "minitrain-job", spec_path), cwd=out_dir, output=output,
                      tag=f"{tmp}/{name}", watch=spec["events"], stall_s=stall_s)
    if run["returncode"] != 0 or run["hung"]:
        how = f"made no progress for {stall_s:g} s" if run["hung"] else f"exited with {run['returncode']}"
        raise BenchError(f"the minitrain {kill_kind}-kill job {how}; output tail:\n{tail(output)}")
    marks = parse_log(read_jsonl(spec["log_events"]))
    records = read_jsonl(spec["events"])
    for r in records:
        r["attempt"] = attempt_at(marks["starting"], r["time"])
    attempts = sorted({int(n) for _, n, _ in marks["starting"]})
    figures = analyse_restarts(records, attempts)
    figures["phases"] = phases_of_minitrain(figures, marks, kill_kind)
    if kill_kind != "worker":  # the fork server dies with its agent: nothing to say about it
        for key in ("kills_with_all_fork_servers_ready", "latency_fork_servers_ready", "latency_fork_servers_not_ready"):
            figures.pop(key, None)
    figures["run"] = run
    figures["resumed_every_attempt"] = all(r.get("resumed") for r in records
                                           if r["kind"] == "start" and r["attempt"] > 0)
    figures["unexpected_failures"] = len(marks["failed"]) - figures["kills"]
    return figures


def torchrun_job(tmp: str, name: str, restarts: int, train_s: float, stall_s: float) -> dict:
    """One `torchrun --max-restarts N` job; every restart's outcome as observed."""
    out_dir = os.path.join(tmp, name)
    os.makedirs(out_dir)
    events = os.path.join(out_dir, "events.jsonl")
    spec_path = os.path.join(out_dir, "spec.json")
    write_json(spec_path, {"out_dir": out_dir, "restarts": restarts, "train_s": train_s})
    argv = torchrun_argv("restart_jobs", ["--role", "torchrun-worker", "--spec", spec_path],
                         max_restarts=restarts)
    output = os.path.join(out_dir, "output.txt")
    run = run_watched(argv, cwd=out_dir, output=output, tag=f"{tmp}/{name}", watch=events, stall_s=stall_s,
                      dump_marker="torchrun-worker")
    records = read_jsonl(events)
    seen = sorted({r["attempt"] for r in records})
    figures = analyse_restarts(records, list(range(seen[-1] + 1)) if seen else [], max_attempt=restarts,
                               hung=run["hung"])
    figures["phases"] = phases_of_torchrun(figures)
    locate_failed_attempts(figures, records)
    figures["run"] = run
    figures["command"] = " ".join(["torchrun", *argv[argv.index("--standalone"):]])
    with open(output, errors="replace") as f:
        text = f.read()
    figures["error_lines"] = error_lines(text)
    figures["hang_stacks"] = hang_stacks(out_dir)
    figures["output_tail"] = text[-2000:]
    return figures


def _ending(job: dict) -> str:
    if job["run"]["hung"]:
        return f"hung in attempt {job['hung_in_attempt']}"
    return f"exit {job['run']['returncode']}" + (" (restarts spent)" if job["restarts_exhausted"] else "")


def torchrun_section(tmp: str, runs: int, restarts: int, train_s: float, stall_s: float) -> dict:
    """`runs` torchrun jobs one after the other (a hang ends a job: more jobs, more restarts
    observed); each job is printed, and the restarts of all of them are pooled. A job stalls after
    `stall_s` or TORCHRUN_STALL_S, whichever is shorter."""
    jobs = []
    stall_s = min(stall_s, TORCHRUN_STALL_S)
    for index in range(runs):
        job = torchrun_job(tmp, f"torchrun_{index + 1}", restarts, train_s, stall_s)
        jobs.append(job)
        print_restarts(f"torchrun job {index + 1}/{runs}", job)
        print_phases(job)
        end = (f"HUNG: no progress for {stall_s:g} s in attempt {job['hung_in_attempt']}, its tree was stopped "
               f"(exit code {job['run']['returncode']} after that)" if job["run"]["hung"] else
               f"torchrun exited with code {job['run']['returncode']}")
        spent = "; all --max-restarts spent" if job["restarts_exhausted"] else ""
        say(f"    {end}{spent}; wall time {job['run']['wall_s']:.1f} s (load average {job['run']['load_1min'][0]} -> "
            f"{job['run']['load_1min'][1]}), leftover processes "
            f"{job['run']['leftover_processes']}; error lines in its output:")
        for line, count in job["error_lines"].items():
            say(f"    {count:3d}x {line}")
        if job["hang_stacks"]:
            say("    where the hung workers' threads were (innermost torch frames first; count of threads):")
            for line, count in job["hang_stacks"].items():
                say(f"    {count:3d}x {line}")
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
              "latencies_s": latencies, **summary(latencies),
              "phases": {k: {"median_s": statistics.median(v), "max_s": max(v), "values_s": v}
                         for k, v in phases.items()}}
    if runs > 1:
        say(f"  torchrun, {runs} jobs pooled: {pooled['succeeded_after_kill']}/{pooled['kills']} restarts after "
            f"a kill succeeded, {pooled['failed']} failed restart(s), {pooled['hung_jobs']} job(s) hung; median "
            f"{fmt_s(pooled['median_s'])}, p90 {fmt_s(pooled['p90_s'])}, max {fmt_s(pooled['max_s'])} "
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


def print_restarts(label: str, figures: dict) -> None:
    """The restarts of one job (or pooled jobs) as progress lines."""
    lat = ", ".join(f"{v:.2f}" for v in figures["latencies_s"])
    first_line = figures.get("first_line")
    if first_line and first_line["n"]:
        say(f"  {label}: exit -> rank 0's first line of user code in the next attempt: median "
            f"{fmt_s(first_line['median_s'])}, p90 {fmt_s(first_line['p90_s'])}, max {fmt_s(first_line['max_s'])}; "
            f"(s): {', '.join(f'{v:.2f}' for v in first_line['values_s'])}")
    say(f"  {label}: {figures['succeeded_after_kill']}/{figures['kills']} restarts after a kill succeeded, "
        f"{figures['failed']} failed restart(s); median {fmt_s(figures['median_s'])}, p90 "
        f"{fmt_s(figures['p90_s'])}, max {fmt_s(figures['max_s'])}")
    say(f"    latencies (s): {lat or 'none'}")
    if "kills_with_all_fork_servers_ready" in figures:
        ready, cold = figures["latency_fork_servers_ready"], figures["latency_fork_servers_not_ready"]
        say(f"    fork server ready at the kill: {figures['kills_with_all_fork_servers_ready']}/{figures['kills']} "
            f"kills; median latency {fmt_s(ready['median_s'])} when ready (n={ready['n']}), "
            f"{fmt_s(cold['median_s'])} when not (n={cold['n']})")
    for restart in figures["per_restart"]:
        if not restart["ok"]:
            what = ("never started (the job ended or hung)" if restart.get("never_started") else
                    "HUNG before its first step" if restart.get("hung") else "did not reach its first step")
            took = f" in {restart['stopped_in']}" if "stopped_in" in restart else ""
            took += f" (failed after {restart['failed_after_s']:.1f} s)" if "failed_after_s" in restart else ""
            say(f"    restart into attempt {restart['attempt']} (after a {restart['cause']}): {what}{took}")


def print_phases(figures: dict) -> None:
    """Where the restarts' time went, as progress lines."""
    names = {"kill_to_lost_log": "kill -> 'node lost' log (detection)",
             "lost_to_new_agent_log": "'node lost' -> 'starting a new agent' log",
             "kill_to_detected_log": "kill -> 'stopping every rank' log (failure detected)",
             "detected_to_failed_log": "'stopping every rank' -> 'restarting' log (the group stopped)",
             "kill_to_failed_log": "kill -> 'attempt failed; restarting' log (detect + stop the group)",
             "failed_log_to_starting_log": "'restarting' -> 'attempt N: starting' log",
             "starting_log_to_train_fn": "'starting' -> training function entered (spawn, connect, rendezvous)",
             "starting_log_to_process": "  of which 'starting' -> rank 0's process exists (agent: fork or spawn, "
                                        "waiting for the fork server included)",
             "process_to_train_fn": "  of which process exists -> training function entered (imports, connect, "
                                    "assignment, process group)",
             "train_fn_to_prepared": "function entry -> model built, prepare_model (DDP) done",
             "prepared_to_loaded": "DDP -> get_checkpoint() + torch.load done (= the first step)",
             "kill_to_process_started": "kill -> new worker process running (detect, stop, respawn)",
             "process_to_torch_imported": "process start -> torch imported",
             "imported_to_process_group": "torch imported -> init_process_group (rendezvous) done",
             "process_group_to_ddp": "process group -> model built, DDP done",
             "ddp_to_loaded": "DDP -> torch.load done (= the first step)"}
    for key, label in names.items():
        if key in figures["phases"]:
            p = figures["phases"][key]
            say(f"    {label}: median {p['median_s']:.3f} s, max {p['max_s']:.3f} s")


def _torchrun_outcome(tr: dict) -> str:
    return (f"torchrun {tr['succeeded_after_kill']}/{tr['kills']} after a kill, {tr['failed']} restart(s) failed "
            f"in {tr['runs']} job(s) ({'; '.join(tr['endings'])})")


def _tidy(figures: dict) -> dict:
    """The figures without torchrun's output tail (--save-logs keeps whole outputs)."""
    return {k: v for k, v in figures.items() if k not in ("output_tail",)}


def early_crash_section(tmp: str, runs: int, stall_s: float) -> dict:
    """`runs` minitrain jobs whose rank 1 dies at the first line of the first attempt's training function
    (the fork server is then still cold, or not started); their single restarts pooled."""
    jobs = [minitrain_job(tmp, f"early_crash_{index + 1}", "worker", 1, 1.0, stall_s, crash_at="first_line")
            for index in range(runs)]
    first_lines = [v for job in jobs for v in job["first_line"]["values_s"]]
    latencies = [v for job in jobs for v in job["latencies_s"]]
    phases: dict[str, list[float]] = {}
    for job in jobs:
        for key, phase in job["phases"].items():
            phases.setdefault(key, []).extend(phase["values_s"])
    return {"jobs": [_tidy(job) for job in jobs], "runs": runs, "kills": sum(j["kills"] for j in jobs),
            "succeeded_after_kill": sum(j["succeeded_after_kill"] for j in jobs),
            "failed": sum(j["failed"] for j in jobs),
            "unexpected_failures": sum(j["unexpected_failures"] for j in jobs),
            "leftover_processes": sum(j["run"]["leftover_processes"] for j in jobs),
            "load_1min": [j["run"]["load_1min"] for j in jobs],
            "forked": [r["start"].get("forked") for j in jobs for r in j["per_restart"] if "start" in r],
            "fork_servers_at_kill": [r.get("fork_servers_at_kill", "none") for j in jobs for r in j["per_restart"]],
            "per_restart": [r for j in jobs for r in j["per_restart"]],
            "first_line": summary(first_lines), "latencies_s": latencies, **summary(latencies),
            "phases": {k: {"median_s": statistics.median(v), "max_s": max(v), "values_s": v}
                       for k, v in phases.items()}}


def _restart_rows(label: str, figures: dict) -> list[Row]:
    """The table rows of one case: exit -> first line (the target) and exit -> first step."""
    line = figures["first_line"]
    line_met = (line["median_s"] is not None and line["median_s"] <= TARGET_RESTART_MEDIAN_S
                and line["p90_s"] <= TARGET_RESTART_P90_S)
    return [
        Row("restart", f"{label}: exit -> rank 0's first line of user code in the next attempt, median of "
            f"{line['n']} (p90 {fmt_s(line['p90_s'])})", fmt_s(line["median_s"]), "-", "-",
            f"<= {TARGET_RESTART_MEDIAN_S:g} s, p90 <= {TARGET_RESTART_P90_S:g} s", line_met),
        Row("restart", f"{label}: exit -> first step (model built, checkpoint loaded), median of {figures['n']} "
            f"(p90 {fmt_s(figures['p90_s'])})", fmt_s(figures["median_s"])),
    ]


def bench_restart(tmp: str, restarts: int, train_s: float, stall_s: float, torchrun_runs: int,
                  early_crashes: int = 0) -> WorkloadResult:
    """`restart`: minitrain's restarts after worker kills `train_s` into each attempt (the fork server
    warm), then after `early_crashes` crashes at the first line of a job's first attempt (cold), then
    torchrun's (0 runs: skipped)."""
    say(f"  minitrain: {restarts} worker SIGKILLs in one job (max_failures=-1, {train_s:g} s of DDP training per "
        "attempt)")
    mt = minitrain_job(tmp, "worker_kill", "worker", restarts, train_s, stall_s)
    print_restarts("minitrain", mt)
    print_phases(mt)
    say(f"    job wall time {mt['run']['wall_s']:.1f} s (load average {mt['run']['load_1min'][0]} -> "
        f"{mt['run']['load_1min'][1]}); unexpected failures {mt['unexpected_failures']}; every attempt resumed "
        f"from a checkpoint: {mt['resumed_every_attempt']}; leftover processes {mt['run']['leftover_processes']}")
    early = None
    if early_crashes:
        say(f"  minitrain: {early_crashes} job(s) whose rank 1 SIGKILLs itself at the first line of the first "
            "attempt's training function (a start-up crash, the fork server not warm yet)")
        early = early_crash_section(tmp, early_crashes, stall_s)
        print_restarts("minitrain, early crash", early)
        print_phases(early)
        say(f"    fork server at the kill: {', '.join(early['fork_servers_at_kill'])}; the new rank 0 was forked: "
            f"{early['forked']}; load average (start -> end of each job) {early['load_1min']}; unexpected failures "
            f"{early['unexpected_failures']}; leftover processes {early['leftover_processes']} (no checkpoint existed "
            "yet: the new attempt starts from step 0)")
    tr = None
    if torchrun_runs:
        say(f"  torchrun --standalone --nproc-per-node {NUM_WORKERS} --max-restarts {restarts}: the same kills, "
            f"{torchrun_runs} job(s) ({TORCHRUN_REFERENCE})")
        tr = torchrun_section(tmp, torchrun_runs, restarts, train_s, stall_s)
    result = WorkloadResult("restart", figures={"minitrain": _tidy(mt), "early_crash": early, "torchrun": tr,
                                                "train_s": train_s})
    med = mt["median_s"]
    ok_all = mt["succeeded_after_kill"] == mt["kills"] and mt["failed"] == 0
    if tr is not None and tr["median_s"]:
        peer = f"torchrun --max-restarts {fmt_s(tr['median_s'])} (n={tr['n']})"
    else:
        peer = "torchrun not run" if tr is None else "torchrun: no successful restart"
    peer_ok = "-" if tr is None else (f"torchrun {tr['succeeded_after_kill']}/{tr['kills']}, {tr['hung_jobs']} "
                                      f"job(s) hung")
    detected = mt["phases"].get("kill_to_detected_log", {}).get("median_s")
    warm = f"crash {train_s:g} s in"
    rows = _restart_rows(warm, mt)
    rows[1] = Row("restart", f"{warm}: exit -> first step of the new attempt, median of {mt['n']} "
                  f"(p90 {fmt_s(mt['p90_s'])})", fmt_s(med), peer, ratio(med, (tr or {}).get("median_s")),
                  f"<= {TARGET_RESTART_MEDIAN_S:g} s", med is not None and med <= TARGET_RESTART_MEDIAN_S)
    result.rows += rows
    if early is not None:
        result.rows += _restart_rows("crash at the first line of the first attempt", early)
    kills = mt["kills"] + (early["kills"] if early else 0)
    succeeded = mt["succeeded_after_kill"] + (early["succeeded_after_kill"] if early else 0)
    ok_all = ok_all and (early is None or (early["succeeded_after_kill"] == early["kills"] and not early["failed"]))
    result.rows += [
        Row("restart", "restarts that succeeded (both cases)", f"{succeeded}/{kills}", peer_ok, "-", "all", ok_all),
        Row("restart", "worker SIGKILL -> failure detected (driver log), median", fmt_s(detected, 3)),
    ]
    return result


def bench_detect(tmp: str, kills: int, stops: int, train_s: float, stall_s: float) -> WorkloadResult:
    """`detect`: agents SIGKILLed (`kills` times) and SIGSTOPped (`stops` times) mid-training."""
    result = WorkloadResult("detect")
    for kind, count in (("agent", kills), ("agent-stop", stops)):
        if not count:
            continue
        what = "SIGKILLs" if kind == "agent" else "SIGSTOPs (a silent agent)"
        say(f"  minitrain: {count} {what} of the node agent (rank 1 signals its parent)")
        figures = minitrain_job(tmp, f"{kind}_loss", kind, count, train_s, stall_s)
        print_restarts("minitrain", figures)
        print_phases(figures)
        say(f"    job wall time {figures['run']['wall_s']:.1f} s; unexpected failures "
            f"{figures['unexpected_failures']}; leftover processes {figures['run']['leftover_processes']}")
        result.figures[kind] = _tidy(figures)
        detect = figures["phases"].get("kill_to_lost_log", {})
        worst = detect.get("max_s")
        label = "agent SIGKILL" if kind == "agent" else "agent SIGSTOP (silent: keepalive and lease)"
        result.rows += [
            Row("detect", f"{label} -> coordinator knows (\"node lost\"), median of "
                f"{len(detect.get('values_s', []))} (max {fmt_s(worst, 3)})", fmt_s(detect.get("median_s"), 3),
                "- (torchrun's job ends)", "-", f"<= {TARGET_DETECT_S:g} s",
                worst is not None and worst <= TARGET_DETECT_S),
            Row("detect", f"{label} -> first step of the new attempt, median ({figures['succeeded_after_kill']}/"
                f"{figures['kills']} ok)", fmt_s(figures["median_s"])),
        ]
    return result
