"""Pure analysis of the `restart` and `detect` records: kills paired with first steps, phases from
the driver's timestamped log records, torchrun's failures and hangs. No processes, no I/O but reading
the stack files of hung torchrun workers.
"""

from __future__ import annotations

import os
import re
import statistics

from bench.common import summary


def analyse_restarts(records: list[dict], attempts: list[int], max_attempt=None, hung: bool = False) -> dict:
    """Pair each attempt's kill with the next attempt's first step (records carry "attempt"); and, where
the start record says when the training function was entered ("entered"), with its first line
(`first_line`: kill -> rank 0's first line of user code).

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
        if "fork_servers" in before.get("kill", {}):
            fork_servers = before["kill"]["fork_servers"]
            entry["fork_servers_at_kill"] = (f"{sum(x['ready'] for x in fork_servers)}/{len(fork_servers)} ready, "
                                             f"{sum(x.get('quick_server', False) for x in fork_servers)} quick")
            entry["all_fork_servers_ready"] = bool(fork_servers) and all(x["ready"] for x in fork_servers)
        if entry["ok"] and "kill" in before:
            entry["latency_s"] = after["start"]["time"] - before["kill"]["time"]
            if "entered" in after["start"]:
                entry["first_line_s"] = after["start"]["entered"] - before["kill"]["time"]
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
    first_lines = [r["first_line_s"] for r in after_kill if "first_line_s" in r]
    fork_servers = {}
    if any("fork_servers_at_kill" in r for r in after_kill):
        ready = [r["latency_s"] for r in after_kill if r.get("all_fork_servers_ready") and "latency_s" in r]
        cold = [r["latency_s"] for r in after_kill if not r.get("all_fork_servers_ready") and "latency_s" in r]
        fork_servers = {"kills_with_all_fork_servers_ready": sum(bool(r.get("all_fork_servers_ready")) for r in after_kill),
                  "latency_fork_servers_ready": summary(ready), "latency_fork_servers_not_ready": summary(cold)}
    return {"attempts": len(ordered), "kills": len(after_kill), "restarts": len(restarts), **fork_servers,
            "succeeded_after_kill": sum(r["ok"] for r in after_kill),
            "failed": sum(not r["ok"] for r in restarts), "restarts_exhausted": exhausted,
            "hung_in_attempt": hung_in,
            "last_attempt_reached_first_step": bool(ordered) and "start" in by_attempt[ordered[-1]],
            "per_restart": restarts, "first_line": summary(first_lines),
            "latencies_s": latencies, **summary(latencies)}


def parse_log(log_events: list[dict]) -> dict:
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


def attempt_at(starts: list[tuple], t: float) -> int:
    """The attempt running at time t: the last one whose start log record came before t."""
    attempt = 0
    for when, number, _ in starts:
        if when <= t:
            attempt = int(number)
    return attempt


def first_after(marks: list[tuple], t: float):
    """The first mark (time, ...) at or after t, or None."""
    return next((m for m in marks if m[0] >= t), None)


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


def phases_of_minitrain(figures: dict, marks: dict, kill_kind: str) -> dict:
    """Where each minitrain restart's time went, from the driver's log marks and the start records."""
    phases: dict[str, list[float]] = {"kill_to_detected_log": [], "detected_to_failed_log": [],
                                      "kill_to_failed_log": [], "failed_log_to_starting_log": [],
                                      "starting_log_to_train_fn": [], "starting_log_to_process": [],
                                      "process_to_train_fn": [], "train_fn_to_prepared": [],
                                      "prepared_to_loaded": [], "kill_to_lost_log": [], "lost_to_new_agent_log": []}
    for restart in figures["per_restart"]:
        if "latency_s" not in restart:
            continue
        kill, start = restart["kill_time"], restart["start"]
        failed = first_after(marks["failed"], kill)
        starting = first_after(marks["starting"], kill)
        detected = first_after(marks["detected"], kill)
        if detected and failed and detected[0] <= failed[0]:
            phases["kill_to_detected_log"].append(detected[0] - kill)
            phases["detected_to_failed_log"].append(failed[0] - detected[0])
        if failed and starting:
            phases["kill_to_failed_log"].append(failed[0] - kill)
            phases["failed_log_to_starting_log"].append(starting[0] - failed[0])
            phases["starting_log_to_train_fn"].append(start["entered"] - starting[0])
            if "created" in start:
                phases["starting_log_to_process"].append(start["created"] - starting[0])
        if "created" in start:
            phases["process_to_train_fn"].append(start["entered"] - start["created"])
        phases["train_fn_to_prepared"].append(start["prepared"] - start["entered"])
        phases["prepared_to_loaded"].append(start["time"] - start["prepared"])
        lost = first_after(marks["lost"], kill)
        if kill_kind != "worker" and lost and (not starting or lost[0] <= starting[0]):
            phases["kill_to_lost_log"].append(lost[0] - kill)
            agent = first_after(marks["new_agent"], lost[0])
            if agent:
                phases["lost_to_new_agent_log"].append(agent[0] - lost[0])
    return {k: {"median_s": statistics.median(v), "max_s": max(v), "values_s": v} for k, v in phases.items() if v}


def phases_of_torchrun(figures: dict) -> dict:
    """Where each torchrun restart's time went, from its workers' records."""
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
    return {k: {"median_s": statistics.median(v), "max_s": max(v), "values_s": v} for k, v in phases.items() if v}


def locate_failed_attempts(figures: dict, records: list[dict]) -> None:
    """Mark where each failed torchrun attempt stopped and how long it took to fail (in place)."""
    enters: dict[int, float] = {}
    for r in records:
        if r["kind"] == "enter":
            enters[r["attempt"]] = min(enters.get(r["attempt"], r["time"]), r["time"])
    in_init = {r["attempt"] for r in records if r["kind"] == "init"}
    for restart in figures["per_restart"]:
        if not restart["ok"] and restart["attempt"] in enters:
            restart["stopped_in"] = ("init_process_group" if restart["attempt"] in in_init
                                     else "start-up (before init_process_group)")
            if restart["attempt"] + 1 in enters:
                restart["failed_after_s"] = enters[restart["attempt"] + 1] - enters[restart["attempt"]]


def error_lines(text: str, limit: int = 12) -> dict:
    """The distinct `SomethingError: message` lines of an output, counted, most frequent first."""
    errors: dict[str, int] = {}
    for line in text.splitlines():
        match = re.search(r"\b(\w+(?:Error|Exception))\b:?\s*(.*)", line)
        if match and "Traceback" not in line:
            key = f"{match.group(1)}: {match.group(2)[:140]}"
            errors[key] = errors.get(key, 0) + 1
    return dict(sorted(errors.items(), key=lambda kv: -kv[1])[:limit])
