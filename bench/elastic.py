"""Workload `elastic` (the resize targets): an elastic `ScalingConfig(num_workers=(1, 2))` DDP job
over two hosts loses one host's agent mid-run, goes on at world size 1, and grows back to 2 when the
host returns. The measured code is in `elastic_jobs.py`.

The two hosts are this machine twice (`localhost:1,127.0.0.1:1`: one node agent and one rank each, gloo
on CPU), as tests/e2e/test_elastic_reshard.py runs them: no root or sshd needed, so the workload is in
the default set. What that changes against real hosts: an agent is started without ssh, and a lost
local node gets a new agent at once (a lost remote host is probed over ssh once per resize interval),
so "the host comes back" right after the loss and the growth waits only for the interval and the next
checkpoint. The coordinator's path (loss, stop, resize, start, rendezvous) is the same.

Each job (a fresh driver process, `max_failures=0`, resize interval INTERVAL_S or `--resize-interval-s`, a
step every STEP_S with a checkpoint from rank 0 at every step): rank 1 SIGKILLs its agent at step KILL_AT.
Timed with the driver's clock from the run's events.jsonl (`state_changed`, `checkpoint_committed`, `resize`) and the
workers' own first-step times (first_steps.jsonl; the same machine's clock):

- shrink: the kill (the worker's timestamp) -> detected (the run moves to RESTARTING) -> the attempt at
  size 1 RUNNING; the figure is detected -> RUNNING (target <= 2 s after detection), with the first
  step at size 1 beside it;
- grow: the checkpoint boundary that follows the interval (the last `checkpoint_committed` before the
  run moved to RESTARTING for "resize 1 -> 2") -> the first step at size 2 (the earlier of the two
  ranks' first steps: both step together, DDP's all_reduce joins them; target <= 5 s), with the attempt
  at size 2 RUNNING beside it;
- no failure charged: `max_failures=0`, so a charged failure would fail the run; the run must end
  SUCCEEDED with resizes [(2, 1), (1, 2)].
"""

from __future__ import annotations

import os
import statistics
import subprocess
import time

from bench.common import BenchError, read_json, read_jsonl, role_argv, say, stop_tree, tail, write_json
from bench.table import Row, WorkloadResult

INTERVAL_S = 3.0  # elastic_resize_monitor_interval_s (docs/elastic.md: "a few seconds is fine")
STEP_S = 0.1
KILL_AT = 5
AFTER_GROW = 5
MAX_STEPS = 600  # a job that never grows back fails
JOB_TIMEOUT_S = 240.0
TARGET_SHRINK_S = 2.0
TARGET_GROW_S = 5.0


def _state_at(events: list, to: str, since: float = 0.0, attempt: int = -1, reason: str = ""):
    """The first `state_changed` event at or after `since` into `to` (of `attempt`; whose reason starts
    with `reason`), or None."""
    for event in events:
        if event.get("kind") == "state_changed" and event["next"] == to and event["time"] >= since and \
                (attempt < 0 or event.get("attempt") == attempt) and event.get("reason", "").startswith(reason):
            return event
    return None


def analyse(events: list, first_steps: list, kill: dict, result: dict, interval_s: float = INTERVAL_S) -> dict:
    """One job's figures (seconds) from its events.jsonl, first_steps.jsonl, kill.json and result."""
    resizes = result["resizes"]
    sizes = [(r["from_workers"], r["to_workers"]) for r in resizes]
    if sizes != [(2, 1), (1, 2)]:
        raise BenchError(f"the job resized {sizes}, not [(2, 1), (1, 2)]: {resizes}")
    shrink, grow = resizes
    detected = _state_at(events, "RESTARTING", kill["time"])
    small_running = _state_at(events, "RUNNING", kill["time"], shrink["attempt"])
    grow_stop = _state_at(events, "RESTARTING", shrink["time"], reason="resize 1 -> 2")
    big_running = _state_at(events, "RUNNING", shrink["time"], grow["attempt"])
    if not (detected and small_running and grow_stop and big_running):
        raise BenchError(f"events.jsonl lacks a move: detected {detected}, size 1 running {small_running}, "
                         f"growth {grow_stop}, size 2 running {big_running}")
    commits = [e["time"] for e in events if e.get("kind") == "checkpoint_committed" and e["time"] <= grow_stop["time"]]
    boundary = max(commits)
    small_first = min(s["time"] for s in first_steps if s["world"] == 1 and s["time"] >= kill["time"])
    big = [s for s in first_steps if s["world"] == 2 and s["time"] >= boundary]
    big_first = min(s["time"] for s in big)
    return {
        "kill_to_detected_s": detected["time"] - kill["time"],
        "detected_to_running_s": small_running["time"] - detected["time"],
        "detected_to_first_step_s": small_first - detected["time"],
        "kill_to_first_step_s": small_first - kill["time"],
        "interval_s": interval_s, "shrink_to_growth_s": grow_stop["time"] - shrink["time"],
        "boundary_to_restarting_s": grow_stop["time"] - boundary,
        "boundary_to_running_s": big_running["time"] - boundary,
        "boundary_to_first_step_s": big_first - boundary,
        # where the time to the first step at size 2 goes: the last rank into the training function, then
        # the slowest rank's imports (torch, minitrain.torch), model and checkpoint load; the other rank
        # waits for it in prepare_model (DDP's broadcast)
        "boundary_to_entered_s": max(s["entered"] for s in big) - boundary,
        "setup_s": max(s["loaded"] - s["entered"] for s in big),
        "slowest_setup_rank": max(big, key=lambda s: s["loaded"] - s["entered"])["rank"],
        "per_rank": {s["rank"]: {"entered_s": s["entered"] - boundary, "setup_s": s["loaded"] - s["entered"],
                                 "prepare_model_s": s["prepared"] - s["loaded"], "step_s": s["time"] - s["prepared"]}
                     for s in big},
        "detected_reason": detected["reason"][:300], "shrink_reason": shrink["reason"][:300],
        "grow_reason": grow["reason"][:300], "resizes": sizes, "final_world": result["metrics"].get("world"),
        "failures_charged": 0,  # max_failures=0 and the run succeeded (a charged failure raises in fit())
    }


def job(tmp: str, index: int, interval_s: float = INTERVAL_S) -> dict:
    """One elastic job in a fresh driver; its figures."""
    name = f"elastic_{index}"
    out = os.path.join(tmp, f"{name}_out")
    os.makedirs(out)
    spec = {"interval_s": interval_s, "storage": os.path.join(tmp, "storage", name),
            "result": os.path.join(tmp, f"{name}.result.json"),
            "config": {"out": out, "step_s": STEP_S, "kill_at": KILL_AT, "after_grow": AFTER_GROW,
                       "max_steps": MAX_STEPS}}
    spec_path = os.path.join(tmp, f"{name}.spec.json")
    write_json(spec_path, spec)
    output = os.path.join(tmp, f"{name}.log")
    env = {k: v for k, v in os.environ.items() if k not in ("MINITRAIN_HOSTS", "MINITRAIN_HOSTFILE")}
    env["PYTHONUNBUFFERED"] = "1"
    with open(output, "wb") as log:
        proc = subprocess.Popen(role_argv("elastic_jobs", "driver", spec_path), cwd=tmp, stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True, env=env)
    try:
        proc.wait(timeout=JOB_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        stop_tree(proc)
        raise BenchError(f"the elastic job did not end in {JOB_TIMEOUT_S:g} s; output tail:\n{tail(output)}") from None
    if proc.returncode != 0 or not os.path.exists(spec["result"]):
        raise BenchError(f"the elastic job's driver exited with {proc.returncode}; output tail:\n{tail(output)}")
    result = read_json(spec["result"])
    events = read_jsonl(os.path.join(result["path"], "events.jsonl"))
    return analyse(events, read_jsonl(os.path.join(out, "first_steps.jsonl")),
                   read_json(os.path.join(out, "kill.json")), result, interval_s)


def _stats(values: list) -> dict:
    return {"median_s": statistics.median(values), "max_s": max(values), "values_s": values}


def bench_elastic(tmp: str, repeats: int, interval_s: float = INTERVAL_S) -> WorkloadResult:
    """`repeats` jobs with a resize interval of `interval_s`; rows with the median and the worst of each figure."""
    if not interval_s > 0:
        raise BenchError(f"--resize-interval-s: {interval_s!r}; give seconds above 0")
    say(f"  elastic (1, 2) DDP job on 2 local hosts, rank 1's agent SIGKILLed at step {KILL_AT}, resize interval "
        f"{interval_s:g} s, a checkpoint every {STEP_S:g} s step; {repeats} job(s), fresh driver each")
    runs = []
    for index in range(repeats):
        started = time.monotonic()
        run = job(tmp, index, interval_s)
        runs.append(run)
        say(f"  job {index + 1}/{repeats}: kill -> detected {run['kill_to_detected_s']:.3f} s; detected -> size 1 "
            f"RUNNING {run['detected_to_running_s']:.3f} s, first step {run['detected_to_first_step_s']:.3f} s; "
            f"shrink -> growth {run['shrink_to_growth_s']:.2f} s; checkpoint boundary -> size 2 RUNNING "
            f"{run['boundary_to_running_s']:.3f} s, first step {run['boundary_to_first_step_s']:.3f} s (train function "
            f"entered {run['boundary_to_entered_s']:.3f} s, then imports + model + checkpoint load on the slowest rank "
            f"(rank {run['slowest_setup_rank']}) {run['setup_s']:.3f} s); "
            f"resizes {run['resizes']}, no failure charged (wall {time.monotonic() - started:.1f} s)")
    figures = {"repeats": repeats, "interval_s": interval_s, "step_s": STEP_S, "kill_at": KILL_AT,
               "hosts": "localhost:1,127.0.0.1:1", "runs": runs,
               **{key: _stats([r[key] for r in runs]) for key in (
                   "kill_to_detected_s", "detected_to_running_s", "detected_to_first_step_s",
                   "boundary_to_running_s", "boundary_to_first_step_s", "shrink_to_growth_s",
                   "boundary_to_entered_s", "setup_s")}}

    def cell(key: str) -> str:
        return f"{figures[key]['median_s']:.2f} s (worst {figures[key]['max_s']:.2f} s)"

    shrink, grow = figures["detected_to_running_s"], figures["boundary_to_first_step_s"]
    rows = [
        Row("elastic", f"host lost (agent SIGKILL) -> attempt at size 1 RUNNING, after detection, median (worst) of "
            f"{repeats}; no failure charged (max_failures=0)", cell("detected_to_running_s"),
            target=f"<= {TARGET_SHRINK_S:g} s", met=shrink["max_s"] <= TARGET_SHRINK_S),
        Row("elastic", "  kill -> detected; detection -> first step at size 1",
            f"{cell('kill_to_detected_s')}; {cell('detected_to_first_step_s')}"),
        Row("elastic", f"returning host -> first step at size 2, after the checkpoint boundary that follows the "
            f"{interval_s:g} s interval, median (worst) of {repeats}", cell("boundary_to_first_step_s"),
            target=f"<= {TARGET_GROW_S:g} s", met=grow["max_s"] <= TARGET_GROW_S),
        Row("elastic", "  checkpoint boundary -> attempt at size 2 RUNNING; -> train function entered",
            f"{cell('boundary_to_running_s')}; {cell('boundary_to_entered_s')}"),
        Row("elastic", "  then the slowest rank's imports (torch, minitrain.torch), model and checkpoint load",
            cell("setup_s")),
    ]
    return WorkloadResult("elastic", rows, figures)
