"""The scale workload: one simulated run per worker count and transport, measured from outside the coordinator.

For each count W a coordinator process (`coordinator.py`) runs the real coordinator with W fake
workers on W/slots fake nodes (`clients.py`), their streams relayed by the fake agents (one
connection per node, as the product runs) or direct (one connection per worker); with both
transports, the two runs of a count follow each other. While it runs, this process samples the coordinator
process's CPU time and RSS every SAMPLE_S seconds (psutil; its threads included, the client
processes not). Figures per run:

- offered: W x rate reports per second; generated: reports the clients actually put per second
  (below offered when the client processes cannot keep up); absorbed: reports the coordinator
  recorded per second over the steady window (every client process reporting);
- gRPC messages per second into the coordinator over the steady window, and how many agent or worker
  messages each carried on average (relayed: the agents' batches);
- report latency send -> recorded p50/p99/max (see coordinator.ReportTap; "send" as clients.py
  stamps it, relayed: handed to the agent's queue), and the round trip to the ReportAck read back,
  the first `warmup` seconds excluded;
- lost: reports never acknowledged; reordered: acks out of order; and what the coordinator itself
  recorded: the outcome, rank 0's history in order, every round completed (each round needs every
  rank's report);
- coordinator CPU: cores used over the steady window (CPU seconds / wall seconds); clients' CPU too,
  since they share the machine's cores;
- coordinator RSS: before any client connected (baseline), median over the steady window, and peak
  (VmHWM at exit), and the growth per worker over the baseline.
"""

from __future__ import annotations

import array
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from typing import Optional

from bench.common import (BenchError, percentile, read_json, role_argv, say, stop_tree, tail,
                                    write_json)
from bench.table import Row, WorkloadResult

SAMPLE_S = 0.25
SLOTS = 8  # workers per fake node (an 8-GPU host)
RATE_HZ = 10.0
TARGET_WORKERS = 1024
TARGET_P99_MS = 20.0
# The targets at scale, per (workers, reports/s per worker): p99 send -> recorded, milliseconds.
TARGETS_P99_MS = {(4096, 10.0): 50.0, (16384, 1.0): 100.0}
TARGET_RSS_MIB = 500.0
RUN_TIMEOUT_S = 900.0
TRANSPORTS = ("relayed", "direct")  # the order of the runs at each count ("both")
PHASES = ("lockstep", "random")


class ProcessSampler:
    """(time, CPU seconds, RSS MiB) of a process, and the summed CPU of its descendants, every SAMPLE_S."""

    def __init__(self, pid: int):
        self.pid = pid
        self.samples: list[tuple[float, float, float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="scale-sampler", daemon=True)

    def _run(self) -> None:
        import psutil

        try:
            proc = psutil.Process(self.pid)
        except psutil.Error:
            return
        children: dict[int, "psutil.Process"] = {}
        while not self._stop.is_set():
            try:
                with proc.oneshot():
                    cpu = sum(proc.cpu_times()[:2])
                    rss = proc.memory_info().rss / (1 << 20)
                for child in proc.children(recursive=True):
                    children.setdefault(child.pid, child)
            except psutil.Error:
                return
            clients = 0.0
            for child in children.values():
                try:
                    clients += sum(child.cpu_times()[:2])
                except psutil.Error:
                    pass
            self.samples.append((time.time(), cpu, rss, clients))
            self._stop.wait(SAMPLE_S)

    def start(self) -> "ProcessSampler":
        """Start sampling in the background."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop sampling."""
        self._stop.set()
        self._thread.join(timeout=5)

    def window(self, start: float, end: float) -> dict:
        """Cores used by the process and its clients, and its median RSS, between two wall times."""
        inside = [s for s in self.samples if start <= s[0] <= end]
        if len(inside) < 2:
            return {"coordinator_cores": None, "clients_cores": None, "rss_mib": None}
        (t0, c0, _, k0), (t1, c1, _, k1) = inside[0], inside[-1]
        return {"coordinator_cores": (c1 - c0) / (t1 - t0), "clients_cores": (k1 - k0) / (t1 - t0),
                "rss_mib": statistics.median(s[2] for s in inside)}


def _profile(pid: int, out_dir: str, processes: int, delay_s: float, duration_s: float) -> Optional[subprocess.Popen]:
    """py-spy (if installed) records the coordinator for `duration_s` s from `delay_s` s after the
    `processes` client processes started reporting: raw stacks
    (collapsed, one line per stack) in out_dir/profile.txt, every thread, native frames excluded."""
    spy = os.path.join(os.path.dirname(sys.executable), "py-spy")
    if not os.access(spy, os.X_OK):
        spy = shutil.which("py-spy") or spy  # (installed elsewhere, e.g. pip install --target, on PATH)
    if not os.access(spy, os.X_OK):
        say("  note: py-spy is not installed (pip install py-spy); no profile taken")
        return None
    barrier = os.path.join(out_dir, "barrier")
    deadline = time.monotonic() + RUN_TIMEOUT_S
    # Reporting starts once every client process is training (its barrier file): the start-up of
    # thousands of fake workers takes from seconds to a minute, so a fixed delay misses the steady state.
    while time.monotonic() < deadline and not (os.path.isdir(barrier) and len(os.listdir(barrier)) >= processes):
        time.sleep(0.2)
    time.sleep(delay_s)
    return subprocess.Popen([spy, "record", "--pid", str(pid), "--duration", str(int(duration_s)), "--rate", "200",
                             "--format", "raw", "--threads", "--output", os.path.join(out_dir, "profile.txt")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)


def profile_top(path: str, count: int = 15) -> list[str]:
    """The threads and the `count` functions (inclusive) with the most samples in a py-spy raw profile."""
    import collections

    threads: collections.Counter = collections.Counter()
    functions: collections.Counter = collections.Counter()
    total = 0
    with open(path) as f:
        for line in f:
            stack, _, number = line.rstrip().rpartition(" ")
            if not stack or not number.isdigit():
                continue
            frames, n = stack.split(";"), int(number)
            total += n
            threads[frames[0]] += n
            for frame in set(frames[1:]):
                if "threading.py" not in frame and "runpy" not in frame:
                    functions[frame] += n
    if not total:
        return ["(no samples)"]
    lines = [f"{n / total:6.1%}  {thread}" for thread, n in threads.most_common()]
    return lines + [f"{n / total:6.1%}  {frame}" for frame, n in functions.most_common(count)]


def _merge_clients(out_dir: str) -> dict:
    clients = [read_json(os.path.join(out_dir, name)) for name in sorted(os.listdir(out_dir))
               if name.startswith("client_") and name.endswith(".json")]
    if not clients:
        raise BenchError(f"no client wrote results; client log:\n{tail(os.path.join(out_dir, 'client_0.log'))}")
    rate_hz = read_json(os.path.join(out_dir, "spec.json"))["rate_hz"]
    latencies = array.array("d")
    for client in clients:
        with open(client["latencies_file"], "rb") as f:
            latencies.frombytes(f.read())
    per_second: dict[int, int] = {}
    messages: dict[int, int] = {}
    for client in clients:
        for second, count in client["acks_per_second"].items():
            per_second[int(second)] = per_second.get(int(second), 0) + count
        for second, count in client["messages_per_second"].items():
            messages[int(second)] = messages.get(int(second), 0) + count
    # A client's reports span its first round's start to its last round's (one period short of its rounds).
    generated = [c["sent"] / (c["last_report_at"] - c["first_report_at"] + 1.0 / rate_hz) for c in clients
                 if c["last_report_at"] and c["first_report_at"]]
    starts = [c["first_report_at"] for c in clients if c["first_report_at"]]
    ends = [c["last_report_at"] for c in clients if c["last_report_at"]]
    return {"clients": clients, "latencies": sorted(latencies), "acks_per_second": per_second,
            "messages_per_second": messages, "generated_per_s": sum(generated) if generated else None,
            "messages_up": sum(c["messages_up"] for c in clients), "items_up": sum(c["items_up"] for c in clients),
            "window": (max(starts), min(ends)) if starts and ends else None,
            "sent": sum(c["sent"] for c in clients), "acked": sum(c["acked"] for c in clients),
            "expected": sum(c["expected"] for c in clients), "reordered": sum(c["reordered"] for c in clients),
            "reopened": sum(c.get("reopened", 0) for c in clients),
            "held_back": sum(c.get("held_back", 0) for c in clients),
            "errors": [e for c in clients for e in c["errors"]], "clients_cpu_s": sum(c["cpu_s"] for c in clients),
            "tick_lag_p99_s": max((c["tick_lag_p99_s"] or 0.0) for c in clients)}


def run_count(tmp: str, workers: int, seconds: float, warmup_s: float, client_procs: int,
              profile: bool, ack_every: int = 10, monitored: bool = True, transport: str = "relayed",
              phase: str = "lockstep", rate_hz: float = RATE_HZ, digest: bool = True) -> dict:
    """One simulated run of `workers` fake workers; its figures (see the module docstring).
    `monitored`: as a real run, each worker also sends one Telemetry message a second and the
    coordinator runs TorchTrainer's RunMonitor (False: reports only, as the earliest figures).
    `transport`, `phase`: see `bench.scale.clients`."""
    out_dir = os.path.join(tmp, f"scale_{workers}_{transport}" + ("" if digest else "_undigested"))
    os.makedirs(out_dir)
    spec = {"workers": workers, "slots": SLOTS, "reports": int(round(seconds * rate_hz)), "rate_hz": rate_hz,
            "warmup_rounds": int(round(warmup_s * rate_hz)), "client_procs": client_procs, "out_dir": out_dir,
            "ack_every": ack_every, "telemetry": monitored, "monitor": monitored, "transport": transport,
            "phase": phase, "digest": digest,
            "result": os.path.join(out_dir, "coordinator.json")}
    spec_path = os.path.join(out_dir, "spec.json")
    write_json(spec_path, spec)
    output = os.path.join(out_dir, "coordinator.log")
    started = time.time()
    with open(output, "wb") as out:
        proc = subprocess.Popen(role_argv("scale.coordinator", "coordinator", spec_path), cwd=out_dir, stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    sampler = ProcessSampler(proc.pid).start()
    spy = None
    try:
        if profile:
            spy = _profile(proc.pid, out_dir, client_procs, delay_s=min(warmup_s, seconds / 4), duration_s=seconds / 2)
        try:
            proc.wait(timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            stop_tree(proc)
            raise BenchError(f"the {workers}-worker simulation did not end in {RUN_TIMEOUT_S:g} s; output:\n"
                             + tail(output)) from None
    finally:
        sampler.stop()
        if spy is not None:
            spy.wait(timeout=120)
    if proc.returncode != 0 or not os.path.exists(spec["result"]):
        raise BenchError(f"the {workers}-worker ({transport}) coordinator exited with {proc.returncode}; output:\n{tail(output)}")
    return _figures(workers, spec, read_json(spec["result"]), _merge_clients(out_dir), sampler,
                    time.time() - started, out_dir if profile else None)


def _latencies(path: str) -> list[float]:
    samples = array.array("d")
    with open(path, "rb") as f:
        samples.frombytes(f.read())
    return sorted(samples)


def _ms(ordered: list[float], q: float) -> Optional[float]:
    return percentile(ordered, q) * 1e3 if ordered else None


def _figures(workers: int, spec: dict, coord: dict, clients: dict, sampler: ProcessSampler, wall_s: float,
             profile_dir: Optional[str]) -> dict:
    lat = _latencies(coord["latencies_file"])
    trip = clients["latencies"]
    start, end = clients["window"] or (0.0, 0.0)
    per_second = {int(k): v for k, v in coord["recorded_per_second"].items()}
    seconds = [s for s in per_second if start <= s and s + 1 <= end]
    absorbed = (sum(per_second[s] for s in seconds) / len(seconds)) if seconds else None
    messages = clients["messages_per_second"]
    messages_per_s = (sum(messages.get(s, 0) for s in seconds) / len(seconds)) if seconds else None
    usage = sampler.window(start, end)
    expected = workers * spec["reports"]
    cores = usage["coordinator_cores"]
    return {
        "workers": workers, "nodes": workers // SLOTS, "client_procs": len(clients["clients"]),
        "monitored": spec["monitor"], "transport": spec["transport"], "digest": spec["digest"], "phase": spec["phase"],
        "reports_per_worker": spec["reports"], "ack_every": spec["ack_every"], "rate_hz": spec["rate_hz"], "offered_per_s": workers * spec["rate_hz"],
        "generated_per_s": clients["generated_per_s"], "absorbed_per_s": absorbed,
        "messages_in_per_s": messages_per_s,
        "items_per_message": clients["items_up"] / clients["messages_up"] if clients["messages_up"] else None, "p50_ms": _ms(lat, 50), "p99_ms": _ms(lat, 99),
        "max_ms": lat[-1] * 1e3 if lat else None, "latency_samples": len(lat),
        "round_trip_p50_ms": _ms(trip, 50), "round_trip_p99_ms": _ms(trip, 99), "round_trip_samples": len(trip),
        "sent": clients["sent"], "recorded": coord["recorded"], "expected": expected,
        "lost": expected - coord["recorded"] + (clients["expected"] - clients["acked"]),
        "reordered": coord["reordered"] + clients["reordered"], "client_errors": clients["errors"][:10],
        "streams_reopened": clients["reopened"], "held_back": clients["held_back"],
        "state": coord["state"], "coordinator_error": coord["error"], "rank0_reports": coord["rank0_reports"],
        "rank0_in_order": coord["rank0_in_order"], "rounds_completed": coord["rounds_completed"],
        "all_recorded": (coord["state"] == "SUCCEEDED" and coord["rank0_in_order"]
                         and coord["rank0_reports"] == spec["reports"] and coord["ranks_complete"] == workers
                         and coord["rounds_completed"] == spec["reports"]),
        "coordinator_cores": cores, "clients_cores": usage["clients_cores"],
        "cpu_us_per_report": cores / absorbed * 1e6 if cores and absorbed else None,
        "rss_baseline_mib": coord["baseline_rss_mib"], "rss_steady_mib": usage["rss_mib"],
        "rss_peak_mib": coord["peak_rss_mib"],
        "rss_per_worker_kib": ((coord["peak_rss_mib"] - coord["baseline_rss_mib"]) * 1024 / workers),
        "gc_collections": sum(g["collections"] for g in coord["gc"].values()),
        "gc_pause_total_ms": sum(g["total_s"] for g in coord["gc"].values()) * 1e3,
        "gc_pause_max_ms": max(g["max_s"] for g in coord["gc"].values()) * 1e3,
        "steady_window_s": end - start, "tick_lag_p99_ms": clients["tick_lag_p99_s"] * 1e3, "wall_s": wall_s,
        "load_1min": round(os.getloadavg()[0], 2),
        "profile": os.path.join(profile_dir, "profile.txt") if profile_dir else None,
    }


def _fmt(value, spec: str = ".1f", unit: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{unit}"


def scale_table(runs: list[dict]) -> str:
    """The Markdown table of every run: a row per count and transport (relayed, then direct)."""
    lines = ["| workers (nodes) | transport | reports/s offered / generated / absorbed | gRPC messages/s into the "
             "coordinator (items each) | latency send -> recorded p50 / p99 / max | round trip to ack p50 / p99 "
             "| lost / reordered / all recorded | coordinator CPU: cores (us per report) | clients CPU (cores) "
             "| coordinator RSS before / steady / peak (per worker) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for run in runs:
        lines.append(
            f"| {run['workers']} ({run['nodes']}) | {run['transport']}{'' if run.get('digest', True) else ' (no digest)'} "
            f"| {run['offered_per_s']:.0f} / {_fmt(run['generated_per_s'], '.0f')} / {_fmt(run['absorbed_per_s'], '.0f')} "
            f"| {_fmt(run['messages_in_per_s'], '.0f')} ({_fmt(run['items_per_message'], '.1f')}) "
            f"| {_fmt(run['p50_ms'], '.1f')} / {_fmt(run['p99_ms'], '.1f')} / {_fmt(run['max_ms'], '.0f')} ms "
            f"| {_fmt(run['round_trip_p50_ms'], '.1f')} / {_fmt(run['round_trip_p99_ms'], '.1f')} ms "
            f"| {run['lost']} / {run['reordered']} / {'yes' if run['all_recorded'] else '**no**'} "
            f"| {_fmt(run['coordinator_cores'], '.2f')} ({_fmt(run['cpu_us_per_report'], '.0f')}) "
            f"| {_fmt(run['clients_cores'], '.2f')} "
            f"| {run['rss_baseline_mib']:.0f} / {_fmt(run['rss_steady_mib'], '.0f')} / {run['rss_peak_mib']:.0f} MiB "
            f"({run['rss_per_worker_kib']:.0f} KiB) |")
    return "\n".join(lines)


def print_run(run: dict) -> None:
    """One count's figures as progress lines."""
    say(f"  {run['workers']} workers on {run['nodes']} nodes, {run['transport']}, {run['phase']} "
        f"{'' if run['digest'] else '(no digest) '}({run['client_procs']} client process(es)): generated {_fmt(run['generated_per_s'], '.0f')}/s and absorbed "
        f"{_fmt(run['absorbed_per_s'], '.0f')}/s of {run['offered_per_s']:.0f}/s offered, in "
        f"{_fmt(run['messages_in_per_s'], '.0f')} gRPC messages/s ({_fmt(run['items_per_message'], '.1f')} "
        f"messages each); send -> recorded "
        f"p50 {_fmt(run['p50_ms'], '.2f')} ms, p99 {_fmt(run['p99_ms'], '.2f')} ms, max {_fmt(run['max_ms'], '.1f')} ms "
        f"({run['latency_samples']} samples); round trip to ack p50 {_fmt(run['round_trip_p50_ms'], '.2f')} ms, p99 "
        f"{_fmt(run['round_trip_p99_ms'], '.2f')} ms ({run['round_trip_samples']} samples, 1 report in "
        f"{run['ack_every']})")
    say(f"    lost {run['lost']}, reordered {run['reordered']}, fake workers' streams re-opened during start-up "
        f"{run['streams_reopened']}, ticks held back by the report window {run['held_back']}; coordinator recorded all: {run['all_recorded']} "
        f"({run['state']}, {run['recorded']}/{run['expected']} reports, rank 0 history {run['rank0_reports']} in "
        f"order: {run['rank0_in_order']}, rounds {run['rounds_completed']})")
    say(f"    coordinator CPU {_fmt(run['coordinator_cores'], '.2f')} cores ({_fmt(run['cpu_us_per_report'], '.0f')} us "
        f"per report), clients {_fmt(run['clients_cores'], '.2f')} cores (steady window {run['steady_window_s']:.1f} s, "
        f"client ticker lag p99 {run['tick_lag_p99_ms']:.1f} ms); coordinator RSS {run['rss_baseline_mib']:.0f} MiB "
        f"before the clients, {_fmt(run['rss_steady_mib'], '.0f')} MiB steady, {run['rss_peak_mib']:.0f} MiB peak "
        f"({run['rss_per_worker_kib']:.0f} KiB per worker); GC: {run['gc_collections']} collections, "
        f"{run['gc_pause_total_ms']:.0f} ms in all, longest {run['gc_pause_max_ms']:.1f} ms; wall {run['wall_s']:.1f} s, "
        f"load average {run['load_1min']}")
    if run["profile"] and os.path.exists(run["profile"]):
        say(f"    profile of the coordinator (py-spy, {run['profile']}), share of samples:")
        for line in profile_top(run["profile"]):
            say(f"      {line}")
    if run["client_errors"] or run["coordinator_error"]:
        say(f"    errors: {run['client_errors'][:3]} {run['coordinator_error'][:500]}")


def client_procs_for(workers: int, transport: str) -> int:
    """The default number of fake-client processes. Direct: 1 per 1024 workers, at most 2 (each worker
    costs its process a connection; the machine's other core runs the coordinator). Relayed: 1 per 4096
    workers, at most 4: a fake agent carries its 8 workers, and more than about 1000 agents' connections
    opened by one process make the gRPC client library cancel some of their streams (seen at 16384
    workers in 2 processes; 4 processes started cleanly)."""
    if transport == "direct":
        return max(1, min(2, workers // 1024))
    return max(1, min(4, workers // 4096))


def bench_scale(tmp: str, counts: list[int], seconds: float, warmup_s: float, client_procs: int,
                profile_at: Optional[int] = None, ack_every: int = 10, transports: tuple = ("relayed",),
                phase: str = "lockstep", rate_hz: float = RATE_HZ, digest: bool = True,
                recovery: int = 0, recovery_hosts: int = 0, recovery_scenarios: Optional[tuple] = None) -> WorkloadResult:
    """Every count in turn, each with every transport of `transports` (in TRANSPORTS order), each worker
    reporting `rate_hz` times a second; rows for the main table at TARGET_WORKERS (or the largest count
    below it), from the first transport's run, and a latency row for every count that has a target in
    TARGETS_P99_MS (4096 x 10 Hz, 16384 x 1 Hz). `recovery` (a worker count, 0: none): also the
    restart and detection scenarios of `bench.scale.recovery` at that count, the silent host among
    `recovery_hosts` hosts (0: recovery / SLOTS; each with `recovery / recovery_hosts` workers, at least 1),
    and the elastic hosts-lost scenario at that count; `recovery_scenarios` picks some of them (None: all)."""
    if not rate_hz > 0:
        raise BenchError(f"--rate-hz: {rate_hz!r}; give reports per second per worker, above 0")
    unknown = [t for t in transports if t not in TRANSPORTS]
    if unknown or not transports:
        raise BenchError(f"--transport: {unknown or transports!r}; choose relayed, direct or both")
    if phase not in PHASES:
        raise BenchError(f"--phase: {phase!r}; choose {' or '.join(PHASES)}")
    transports = tuple(t for t in TRANSPORTS if t in transports)
    runs = []
    for workers in counts:
        if workers % SLOTS:
            raise BenchError(f"--workers: {workers} is not a multiple of {SLOTS} (workers per fake node)")
        for transport in transports:
            procs = client_procs or client_procs_for(workers, transport)
            say(f"\nscale: {workers} fake workers, {transport}, {phase}, {rate_hz:g} reports/s each for {seconds:g} s "
                f"(warm-up {warmup_s:g} s excluded)")
            run = run_count(tmp, workers, seconds, warmup_s, procs, profile=profile_at == workers,
                            ack_every=ack_every, transport=transport, phase=phase, rate_hz=rate_hz,
                            digest=digest)
            print_run(run)
            runs.append(run)
    result = WorkloadResult("scale", figures={"runs": runs, "rate_hz": rate_hz, "seconds": seconds, "phase": phase,
                                              "transports": list(transports), "slots": SLOTS,
                                              "markdown": scale_table(runs)})
    first = [r for r in runs if r["transport"] == transports[0]]
    at = [r for r in first if r["workers"] <= TARGET_WORKERS] or first[:1]
    run = at[-1]
    label = f"control plane, {run['workers']} fake workers x {rate_hz:g} Hz ({run['transport']}, {phase})"
    result.rows += [
        Row("scale", f"{label}: report latency p99 (p50)", f"{_fmt(run['p99_ms'], '.1f')} ms "
            f"({_fmt(run['p50_ms'], '.1f')} ms)", target=f"< {TARGET_P99_MS:g} ms at {TARGET_WORKERS}",
            met=run["p99_ms"] is not None and run["p99_ms"] < TARGET_P99_MS if run["workers"] == TARGET_WORKERS
            else None),
        Row("scale", f"{label}: lost / reordered reports", f"{run['lost']} / {run['reordered']}",
            target="0 / 0, all recorded", met=run["lost"] == 0 and run["reordered"] == 0 and run["all_recorded"]),
        Row("scale", f"{label}: coordinator RSS peak", f"{run['rss_peak_mib']:.0f} MiB",
            target=f"< {TARGET_RSS_MIB:g} MiB", met=run["rss_peak_mib"] < TARGET_RSS_MIB),
    ]
    if recovery:
        from bench.scale.recovery import bench_recovery

        if recovery % SLOTS:
            raise BenchError(f"--recovery: {recovery} is not a multiple of {SLOTS} (workers per fake node)")
        hosts = recovery_hosts or recovery // SLOTS
        from bench.scale.recovery import SCENARIOS

        rows, figures = bench_recovery(tmp, recovery, hosts, SLOTS,
                                       client_procs or client_procs_for(max(recovery, hosts * SLOTS), "relayed"),
                                       tuple(recovery_scenarios or SCENARIOS))
        result.rows += rows
        result.figures["recovery"] = figures
    for other in first:
        target_ms = TARGETS_P99_MS.get((other["workers"], rate_hz))
        if target_ms is None:
            continue
        label = f"control plane, {other['workers']} fake workers x {rate_hz:g} Hz ({other['transport']}, {phase})"
        result.rows.append(Row(
            "scale", f"{label}: report latency p99 (p50), lost", f"{_fmt(other['p99_ms'], '.1f')} ms "
            f"({_fmt(other['p50_ms'], '.1f')} ms), {other['lost']} lost",
            target=f"< {target_ms:g} ms, 0 lost",
            met=(other["p99_ms"] is not None and other["p99_ms"] < target_ms and other["lost"] == 0
                 and other["all_recorded"])))
    return result
