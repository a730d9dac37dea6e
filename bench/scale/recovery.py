"""Restart and detection at scale, in the simulation (issue 31 item 3): the real coordinator, fake workers.

Two scenarios, each one coordinator process (`python -m bench.scale.recovery --spec SPEC.json`, which
runs `coordinator.simulate` with a `Timeline` observer) and its fake client processes:

- *worker lost*: among W workers, one rank raises after a few reports of attempt 0 (the fake worker
  sends its WorkerFailure and its agent reports exit code 1, as a real worker that raised), with one
  restart allowed. Timed from the failure's own timestamp: detected (the run moves to RESTARTING),
  every rank of attempt 0 stopped (the attempt's end, told once all its ranks are gone), the new
  attempt assigned (attempt 1 started: placed, StartWorkers sent to every host) and running (every rank
  of attempt 1 training). Attempt 1 must then complete every round.
- *silent host*: among H hosts, one host's agent goes silent after a few reports (it sends nothing more,
  no heartbeat either, its connection left open: `bench.scale.clients`, fault "silent"): only the
  coordinator's lease (`minitrain.lease`, LEASE_TIMEOUT_S) can find it. Timed from the silence to the
  first move of the run's state after it (the node lost, its ranks failed). The lease is the floor of
  this figure: the lease timeout plus up to one lease-watch tick.

Every time is the wall clock of one machine (the clients and the coordinator share it).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

from bench.common import BenchError, read_json, role_argv, say, stop_tree, tail, write_json
from bench.table import Row

RECOVERY_TIMEOUT_S = 900.0
TARGET_S = 5.0
RATE_HZ = 1.0
REPORTS = 8
FAULT_AFTER = 3


class Timeline:
    """A RunObserver that stamps the run's moves with the wall clock (the coordinator's process)."""

    def __init__(self):
        self.states: list[tuple[float, str, str, int, str]] = []  # (time, from, to, attempt, reason)
        self.attempt_starts: dict[int, float] = {}
        self.attempt_ends: dict[int, dict] = {}

    def on_state(self, previous, next_state, reason, attempt) -> None:
        self.states.append((time.time(), previous.name, next_state.name, attempt, reason[:300]))

    def on_attempt_start(self, attempt) -> None:
        self.attempt_starts[attempt.attempt] = time.time()

    def on_attempt_end(self, end) -> None:
        self.attempt_ends[end.attempt] = {"at": time.time(), "restarting": end.restarting,
                                          "failed_at": {f.rank: f.time for f in end.failures},
                                          "root_cause": end.root_cause[:300]}


def run(spec: dict) -> dict:
    """The scenario of `spec` (see the module docstring); what the Timeline saw, and the outcome."""
    from bench.scale.coordinator import simulate

    timeline = Timeline()
    outcome, tap, checkpoints, _ = simulate(spec, observers=[timeline])
    clients = [read_json(os.path.join(spec["out_dir"], n)) for n in sorted(os.listdir(spec["out_dir"]))
               if n.startswith("client_") and n.endswith(".json")]
    return {"state": outcome.state.value, "attempt": outcome.attempt, "error": (outcome.error_message or "")[:2000],
            "states": timeline.states, "attempt_starts": timeline.attempt_starts,
            "attempt_ends": timeline.attempt_ends, "rounds_completed": checkpoints.report_index,
            "silenced_at": [t for c in clients for t in c.get("silenced_at", [])]}


def _simulate(tmp: str, name: str, workers: int, slots: int, faults: list, client_procs: int,
              max_failures: int) -> dict:
    out_dir = os.path.join(tmp, name)
    os.makedirs(out_dir)
    spec = {"workers": workers, "slots": slots, "reports": REPORTS, "rate_hz": RATE_HZ, "warmup_rounds": 0,
            "client_procs": client_procs, "out_dir": out_dir, "ack_every": 10, "faults": faults,
            "max_failures": max_failures, "stop_grace_s": 5.0, "telemetry": True, "monitor": True,
            "result": os.path.join(out_dir, "recovery.json")}
    spec_path = os.path.join(out_dir, "spec.json")
    write_json(spec_path, spec)
    output = os.path.join(out_dir, "coordinator.log")
    with open(output, "wb") as out:
        proc = subprocess.Popen(role_argv("scale.recovery", "recovery", spec_path), cwd=out_dir, stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        proc.wait(timeout=RECOVERY_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        stop_tree(proc)
        raise BenchError(f"the {name} scenario did not end in {RECOVERY_TIMEOUT_S:g} s; output:\n{tail(output)}") from None
    if proc.returncode != 0 or not os.path.exists(spec["result"]):
        raise BenchError(f"the {name} scenario's coordinator exited with {proc.returncode}; output:\n{tail(output)}")
    return read_json(spec["result"])


def _first_state_after(states: list, since: float, to: str = "", attempt: int = -1):
    for at, _, next_state, state_attempt, reason in states:
        if at >= since and (not to or next_state == to) and (attempt < 0 or state_attempt == attempt):
            return at, next_state, reason
    return None


def worker_lost(tmp: str, workers: int, slots: int, client_procs: int) -> dict:
    """The worker-lost scenario among `workers`; its figures (seconds from the failure)."""
    rank = workers // 2 + 3  # a rank of neither the first nor the last host
    got = _simulate(tmp, f"lost_{workers}", workers, slots,
                    [{"attempt": 0, "rank": rank, "after": FAULT_AFTER, "kind": "exception"}], client_procs, 1)
    ends, starts = got["attempt_ends"], got["attempt_starts"]
    end0 = ends.get("0") or {}
    failed_at = (end0.get("failed_at") or {}).get(str(rank))  # the injected rank's own stamp (JSON keys: text)
    figures = {"workers": workers, "rank": rank, "state": got["state"], "attempts": got["attempt"] + 1,
               "rounds_completed": got["rounds_completed"], "error": got["error"][:500]}
    if failed_at is None:
        return {**figures, "detected_s": None, "stopped_s": None, "assigned_s": None, "running_s": None}
    detected = _first_state_after(got["states"], failed_at, "RESTARTING")
    running = _first_state_after(got["states"], failed_at, "RUNNING", 1)
    return {**figures,
            "detected_s": detected[0] - failed_at if detected else None,
            "stopped_s": end0["at"] - failed_at if end0 else None,
            "assigned_s": starts["1"] - failed_at if "1" in starts else None,
            "running_s": running[0] - failed_at if running else None,
            "other_failures": max(0, len(end0.get("failed_at") or {}) - 1),
            "complete": got["state"] == "SUCCEEDED" and got["attempt"] == 1 and got["rounds_completed"] >= REPORTS}


def silent_host(tmp: str, hosts: int, slots: int, client_procs: int) -> dict:
    """The silent-host scenario among `hosts` hosts; seconds from the silence to the run's reaction."""
    rank = (hosts // 2) * slots + (1 if slots > 1 else 0)
    got = _simulate(tmp, f"silent_{hosts}", hosts * slots, slots,
                    [{"attempt": 0, "rank": rank, "after": FAULT_AFTER, "kind": "silent"}], client_procs, 0)
    silenced = min(got["silenced_at"]) if got["silenced_at"] else None
    found = _first_state_after(got["states"], silenced) if silenced else None
    return {"hosts": hosts, "workers": hosts * slots, "rank": rank, "state": got["state"],
            "found_s": found[0] - silenced if found else None, "found_as": found[1] if found else None,
            "reason": found[2] if found else got["error"][:300]}


def _fmt(value) -> str:
    return "-" if value is None else f"{value:.2f} s"


def bench_recovery(tmp: str, workers: int, hosts: int, slots: int, client_procs: int) -> tuple[list[Row], dict]:
    """Both scenarios; their rows and figures."""
    say(f"\nscale recovery: a worker lost among {workers} fake workers ({RATE_HZ:g} report/s, one restart allowed)")
    lost = worker_lost(tmp, workers, slots, client_procs)
    say(f"  rank {lost['rank']} raised: detected {_fmt(lost['detected_s'])}, every rank of attempt 0 stopped "
        f"{_fmt(lost['stopped_s'])}, attempt 1 assigned {_fmt(lost['assigned_s'])}, running "
        f"{_fmt(lost['running_s'])} after its failure; run {lost['state']} after {lost['attempts']} attempt(s), "
        f"{lost['rounds_completed']} rounds; other ranks failed in attempt 0: {lost.get('other_failures', '-')} "
        f"{lost['error'][:300]}")
    say(f"\nscale recovery: a silent host among {hosts} fake hosts ({hosts * max(1, min(slots, workers // hosts))} "
        "workers)")
    silent = silent_host(tmp, hosts, max(1, min(slots, workers // hosts)), client_procs)
    say(f"  the host of rank {silent['rank']} went silent: found after {_fmt(silent['found_s'])} "
        f"(the run moved to {silent['found_as']}: {silent['reason'][:200]})")
    rows = [
        Row("scale", f"restart at scale: a worker lost among {workers} -> every rank stopped, attempt 1 assigned",
            f"{_fmt(lost['assigned_s'])} (detected {_fmt(lost['detected_s'])}, stopped {_fmt(lost['stopped_s'])})",
            target=f"<= {TARGET_S:g} s", met=lost["assigned_s"] is not None and lost["assigned_s"] <= TARGET_S
            and lost.get("complete", False)),
        Row("scale", f"detection at scale: a silent host among {hosts} found", _fmt(silent["found_s"]),
            target=f"<= {TARGET_S:g} s", met=silent["found_s"] is not None and silent["found_s"] <= TARGET_S),
    ]
    return rows, {"worker_lost": lost, "silent_host": silent}


def main(argv=None) -> int:
    """`--role recovery --spec PATH`: run the scenario, write its result file."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--role", choices=["recovery"], required=True)
    parser.add_argument("--spec", required=True)
    args = parser.parse_args(argv)
    spec = read_json(args.spec)
    write_json(spec["result"], run(spec))
    return 0


if __name__ == "__main__":
    sys.exit(main())
