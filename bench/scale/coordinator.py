"""The coordinator process of the scale simulation: the real `run_coordinator`, fake agents.

`python -m bench.scale.coordinator --role coordinator --spec SPEC.json` runs one simulated
run exactly as `TorchTrainer.fit()` runs its coordinator (`minitrain.coordinator.run.run_coordinator`:
the grpc.aio server with the token interceptor, the controller, commits, the metrics log, a local run
directory and per-rank log files), but with `FakeAgentLauncher` instead of the launcher of real
agents: its "agents" are client processes (`bench.scale.clients`) that serve many fake
nodes each (their workers' streams relayed by the fake agents, or one connection per worker). Their
CPU is therefore not this process's; the benchmark samples this process from
outside. At the end this process writes what the coordinator recorded (the run's outcome, rank 0's
reports as its metrics.jsonl holds them, the number of completed rounds) and its own peak RSS to the spec's result file.
"""

from __future__ import annotations

import argparse
import array
import gc
import json
import os
import subprocess
import sys
import time
import uuid

from bench.common import peak_rss_mib, read_json, self_peak_rss_mib, write_json
from bench.scale import relaunch

CLIENTS_MODULE = "bench.scale.clients"
PAYLOAD_BYTES = 4096  # a small training function's cloudpickle
RUN_NAME = "run"  # the run directory, in the spec's out_dir


class FakeAgents:
    """The handles `run_coordinator` expects from a launcher (see `minitrain.hosts.launcher.LaunchedAgents`).

    With `relaunch` (spec key "relaunch"), a lost node gets a new fake agent: its client process is asked
    on its stdin (`bench.scale.relaunch`) and serves the node again (the run regains the host)."""

    def __init__(self, procs: list[tuple[subprocess.Popen, list[str]]], relaunch: bool = False):
        self._procs = procs
        self._relaunch = relaunch
        self._proc_of = {node: proc for proc, nodes in procs for node in nodes}
        self.relaunched_at: list[float] = []  # wall clock of each relaunch asked

    def dead_agents(self) -> dict[str, str]:
        """node_id -> why, for nodes whose client process ended early (with an error)."""
        dead = {}
        for proc, nodes in self._procs:
            if proc.poll() not in (None, 0):
                dead.update({n: f"its client process exited with {proc.returncode}" for n in nodes})
        return dead

    def relaunch(self, node_id: str) -> bool:
        """Ask the node's client process for a new agent (only with `relaunch`, while it runs)."""
        proc = self._proc_of.get(node_id)
        if not self._relaunch or proc is None or proc.poll() is not None:
            return False
        try:
            proc.stdin.write(relaunch.request(node_id))
            proc.stdin.flush()
        except (BrokenPipeError, ValueError):  # the process is ending
            return False
        self.relaunched_at.append(time.time())
        return True

    def forget(self, node_id: str) -> None:
        """Nothing to forget."""

    def stop(self, timeout_s: float = 60.0) -> None:
        """Wait for the client processes (they end after the coordinator's Shutdown); kill stragglers."""
        for proc, _ in self._procs:
            if not proc.stdin.closed:
                proc.stdin.close()  # no more relaunches: the client's reader sees the end
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


class FakeAgentLauncher:
    """A `run.Launcher` whose agents are fake: `client_procs` processes share the nodes.

    `start()` also records this process's RSS just before any client connects (the baseline).
    """

    def __init__(self, spec: dict):
        self._spec = spec
        self.baseline_rss_mib = 0.0
        self.agents: FakeAgents | None = None

    def bind_hosts(self) -> tuple[str, ...]:
        """Loopback only."""
        return ("127.0.0.1",)

    def bind_host_for(self, node_id: str) -> str:
        """Every fake node dials loopback."""
        return "127.0.0.1"

    def start(self, node_ids: list[str], address_for, token: str, run_id: str,
              tls_cert: bytes = b"", local_stream: str = "") -> FakeAgents:
        """Start the client processes, each with its share of `node_ids`; the token goes on stdin.
        `tls_cert` is always empty: the simulation binds loopback only. `local_stream` is not used: the
        fake agents stand for remote hosts, whose streams are gRPC (what the simulation measures)."""
        self.baseline_rss_mib = peak_rss_mib(os.getpid()) or 0.0
        spec = self._spec
        count = max(1, min(spec["client_procs"], len(node_ids)))
        shares = [node_ids[i::count] for i in range(count)]
        barrier = os.path.join(spec["out_dir"], "barrier")
        relaunches = bool(spec.get("relaunch", False))
        os.makedirs(barrier)
        procs = []
        for index, nodes in enumerate(shares):
            config = {"address": address_for(nodes[0]), "token": token, "run_id": run_id, "node_ids": nodes,
                      "slots": spec["slots"], "workers": len(nodes) * spec["slots"], "reports": spec["reports"],
                      "rate_hz": spec["rate_hz"], "warmup_rounds": spec["warmup_rounds"], "ack_every": spec["ack_every"],
                      "out": os.path.join(spec["out_dir"], f"client_{index}.json"),
                      "barrier_dir": barrier, "processes": count, "faults": spec.get("faults", []),
                      "telemetry": spec.get("telemetry", False), "transport": spec.get("transport", "relayed"),
                      "phase": spec.get("phase", "lockstep"), "digest": spec.get("digest", True),
                      "checkpoint_every": spec.get("checkpoint_every", 0),
                      "run_dir": os.path.join(spec["out_dir"], RUN_NAME), "relaunch": relaunches}
            with open(os.path.join(spec["out_dir"], f"client_{index}.log"), "wb") as log:
                proc = subprocess.Popen([sys.executable, "-m", CLIENTS_MODULE], stdin=subprocess.PIPE,
                                        stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            proc.stdin.write(json.dumps(config).encode() + b"\n")
            proc.stdin.flush()
            if not relaunches:
                proc.stdin.close()  # (kept open for relaunch requests otherwise)
            procs.append((proc, nodes))
        self.agents = FakeAgents(procs, relaunches)
        return self.agents


class ReportTap:
    """A `RunObserver` (minitrain.coordinator.observers) that times and checks every report.

    latency = the controller's wall clock when it starts recording a report - the report's
    `reported_at` (the worker's wall clock when it put the report on its stream; same machine).
    Order: each rank's rounds must arrive as 0, 1, 2, ...; anything else counts as reordered.
    """

    def __init__(self, warmup_rounds: int):
        self.warmup_rounds = warmup_rounds
        self.latencies = array.array("d")
        self.next_round: dict[int, int] = {}
        self.recorded = 0
        self.reordered = 0
        self.per_second: dict[int, int] = {}

    def on_report(self, report) -> None:
        """The controller received one report of the current attempt."""
        self.seen(report.rank, report.round, report.reported_at)

    def seen(self, rank: int, round_: int, reported_at: float) -> None:
        """One report reached the controller."""
        now = time.time()
        expected = self.next_round.get(rank, 0)
        if round_ != expected:
            self.reordered += 1
        self.next_round[rank] = max(expected, round_ + 1)
        self.recorded += 1
        second = int(now)
        self.per_second[second] = self.per_second.get(second, 0) + 1
        if round_ >= self.warmup_rounds:
            self.latencies.append(now - reported_at)


class GcWatch:
    """Times every cyclic-GC collection of this process (gc.callbacks): they pause every thread."""

    def __init__(self):
        self.pauses: list[tuple[int, float]] = []  # (generation, seconds)
        self._started = 0.0

    def install(self) -> "GcWatch":
        """Start timing collections."""
        gc.callbacks.append(self._callback)
        return self

    def _callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.pauses.append((info["generation"], time.perf_counter() - self._started))

    def figures(self) -> dict:
        """Collections, total and longest pause (seconds), per generation."""
        return {str(g): {"collections": len(p), "total_s": sum(p), "max_s": max(p, default=0.0)}
                for g in range(3) for p in [[s for gen, s in self.pauses if gen == g]]}


def simulate(spec: dict, observers=()):
    """One simulated run in this process: the real coordinator and the spec's fake clients;
    `observers` (RunObserver) are told of the run, beside the ReportTap.

    Returns (RunOutcome, ReportTap, the run's CheckpointManager, the launcher). Optional spec keys
    beyond the benchmark's: `max_failures` (0), `worker_hang_timeout_s` ("auto"),
    `worker_hang_floor_s` (None), `stop_grace_s` (5), `faults` for the clients (see `bench.scale.clients`),
    `telemetry` (False: the fake workers send no Telemetry), `monitor` (False: no `RunMonitor`, which
    TorchTrainer always installs), `transport` ("relayed": the workers' streams carried by their fake
    agents; "direct": a connection per worker) and `phase` ("lockstep" or "random"; see `bench.scale.clients`); an elastic run with `min_workers`
    (None: a fixed size; `workers` is then the max), `resize_interval_s` (60) and `elastic_start_wait_s`
    (300: the first attempt waits for every fake agent rather than starting with those in after 5 s),
    `relaunch` (False: a lost fake node stays lost; True: the controller's relaunch starts a new fake
    agent for it, so an elastic run regains the host) and `checkpoint_every` (0: no checkpoints; N: rank 0
    reports a checkpoint with every N-th report, which the coordinator commits: an elastic run grows at
    a committed checkpoint). tests/process/test_fake_cluster.py
    drives the controller through it.
    """
    from minitrain.storage.checkpoint_manager import CheckpointManager
    from minitrain.config import CheckpointConfig, FailureConfig
    from minitrain.coordinator.controller import LaunchSettings, RunSpec, Sizing
    from minitrain.coordinator.facts.metrics_log import MetricsLog
    from minitrain.coordinator.run import run_coordinator
    from minitrain.driver.logs import LogSink
    from minitrain.storage.layout import LOGS_DIR
    from minitrain.storage.filesystem import Storage

    storage = Storage.for_run(spec["out_dir"], RUN_NAME)
    storage.makedirs()
    checkpoints = CheckpointManager.load(storage, CheckpointConfig())
    workers, slots = spec["workers"], spec["slots"]
    node_ids = tuple(f"node{i:04d}" for i in range(workers // slots))
    policy = FailureConfig(max_failures=spec.get("max_failures", 0),
                           worker_hang_timeout_s=spec.get("worker_hang_timeout_s", "auto"),
                           worker_hang_floor_s=spec.get("worker_hang_floor_s"),
                           worker_stop_grace_s=spec.get("stop_grace_s", 5.0))
    run_spec = RunSpec(
        run_id=uuid.uuid4().hex, num_workers=workers, node_ids=node_ids,
        launch=LaunchSettings(experiment_name="scale", run_path=storage.url(), payload=bytes(PAYLOAD_BYTES),
                              backend="gloo", dist_timeout_s=600.0, cwd="", worker_env={}),
        failure_limits=policy, node_slots={n: slots for n in node_ids}, agent_start_timeout_s=300.0,
        sizing=None if spec.get("min_workers") is None else Sizing(
            spec["min_workers"], resize_interval_s=spec.get("resize_interval_s", 60.0),
            start_wait_s=spec.get("elastic_start_wait_s", 300.0)))
    launcher = FakeAgentLauncher(spec)
    tap = ReportTap(spec["warmup_rounds"])
    log_sink = LogSink(storage.path(LOGS_DIR), console=False)
    if spec.get("monitor", False):  # as TorchTrainer.fit() does: its RunMonitor is the first observer
        from minitrain.monitoring.monitor import RunMonitor

        observers = [RunMonitor(storage, kept_dir_names=lambda: checkpoints.committed_dir_names), *observers]
    try:
        outcome = run_coordinator(run_spec, launcher, log_sink, checkpoints, MetricsLog(storage),
                                  observers=[tap, *observers])
    finally:
        log_sink.close()
    return outcome, tap, checkpoints, launcher


def rank0_metrics(spec: dict) -> list[dict]:
    """Rank 0's metrics of every report of the simulated run in the spec's `out_dir`, in order, as the
    run's metrics.jsonl holds them (the run's one record of them; the outcome keeps only the latest)."""
    from minitrain.coordinator.facts.metrics_log import read_metrics_history
    from minitrain.storage.filesystem import Storage

    return [entry["metrics"] for entry in read_metrics_history(Storage.for_run(spec["out_dir"], RUN_NAME))]


def run(spec: dict) -> dict:
    """One simulated run; returns what the coordinator recorded (see the module docstring)."""
    workers = spec["workers"]
    outcome, tap, checkpoints, launcher = simulate(spec)
    steps = [m.get("step") for m in rank0_metrics(spec)]
    latencies_file = os.path.join(spec["out_dir"], "coordinator.latencies")
    with open(latencies_file, "wb") as f:
        tap.latencies.tofile(f)
    per_rank = [tap.next_round.get(rank, 0) for rank in range(workers)]
    return {"state": outcome.state.value, "error": (outcome.error_message or "")[:3000],
            "rank0_reports": len(steps), "rank0_in_order": steps == list(range(len(steps))),
            "rounds_completed": checkpoints.report_index, "baseline_rss_mib": launcher.baseline_rss_mib,
            "recorded": tap.recorded, "reordered": tap.reordered, "latencies_file": latencies_file,
            "recorded_per_second": tap.per_second,
            "ranks_complete": sum(n == spec["reports"] for n in per_rank),
            "peak_rss_mib": self_peak_rss_mib()}


def main(argv=None) -> int:
    """`--role coordinator --spec PATH`: run the spec, write its result file."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--role", choices=["coordinator"], required=True)
    parser.add_argument("--spec", required=True)
    args = parser.parse_args(argv)
    spec = read_json(args.spec)
    gc_watch = GcWatch().install()
    result = run(spec)
    result["gc"] = gc_watch.figures()
    write_json(spec["result"], result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
