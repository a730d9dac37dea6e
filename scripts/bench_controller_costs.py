"""Per-message Python cost of the coordinator's controller thread, in process (no gRPC, no workers).

Measures, at several world sizes (docs/benchmarks/scale.md):
- telemetry: one Telemetry event through `Controller._handle` (host/pid/phase added, then `RunMonitor`
  with a run directory, as `TorchTrainer.fit()` installs it), with no straggler and with a few;
- report: one report event through `Controller._handle` plus one loop turn (`_observe` and `decide`)
  for it, the worst case of a quiet loop that wakes for every event;
- pace: one `Pace.reported` with every rank's window full;
- round: one lockstep round of every rank's report as the coordinator gets it relayed (one serialized
  `ReportDigest` of 8 reports per host: parsed, unfolded with `reports_from_digest`, one `ReportsReceived` through
  `Controller._handle` and one loop turn per host, `RunMonitor` on): what a round costs the coordinator's
  Python apart from gRPC (its per-message floor is scripts/bench_grpc_floor.py's), in ms per round.
Usage: .venv/bin/python scripts/bench_controller_costs.py [--ranks 64,1024,4096] [--seconds 1.0]
Figures are CPU microseconds per call (median of 5 repeats); they are meant for before/after
comparisons on one machine, not as absolute numbers.
"""

from __future__ import annotations

import argparse
import logging
import queue
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from minitrain.config import CheckpointConfig, FailureConfig  # noqa: E402
from minitrain.coordinator.controller import Controller, RunSpec  # noqa: E402
from minitrain.coordinator.facts import events as ev  # noqa: E402
from minitrain.coordinator.facts.attempt import AttemptTracker  # noqa: E402
from minitrain.coordinator.facts.metrics_log import MetricsLog  # noqa: E402
from minitrain.coordinator.facts.worker_group import LaunchSettings, ResumePoint, WorkerGroup  # noqa: E402
from minitrain.coordinator.observers import AttemptInfo, RunInfo, TelemetrySample  # noqa: E402
from minitrain.coordinator.outcome import run_outcome  # noqa: E402
from minitrain.coordinator.policy.decide import decide  # noqa: E402
from minitrain.coordinator.policy.hangs import Pace  # noqa: E402
from minitrain.coordinator.policy.loop import Loop, Wait  # noqa: E402
from minitrain.coordinator.transport.service import Hub  # noqa: E402
from minitrain.monitoring.monitor import RunMonitor  # noqa: E402
from minitrain.records import NodeInfo, Phase, ReportRecord, WorkerAssignment  # noqa: E402
from minitrain.rpc._gen import minitrain_pb2 as pb  # noqa: E402
from minitrain.rpc.convert import reports_from_digest  # noqa: E402
from minitrain.run_state import RunState  # noqa: E402
from minitrain.storage.checkpoint_manager import CheckpointManager  # noqa: E402
from minitrain.storage.filesystem import Storage  # noqa: E402

SLOTS = 8


class _NoAgents:
    def dead_agents(self):
        return {}

    def relaunch(self, node_id):
        return False

    def forget(self, node_id):
        pass


def _controller(ranks: int, out_dir: str, monitor: bool) -> tuple[Controller, RunMonitor | None]:
    """A controller in RUNNING with one attempt of `ranks` training ranks (no agents, no server)."""
    storage = Storage.for_run(out_dir, "run")
    storage.makedirs()
    node_ids = tuple(f"node{i:04d}" for i in range(-(-ranks // SLOTS)))  # (the last may be partly used)
    settings = LaunchSettings(experiment_name="bench", run_path=storage.url(), payload=b"", backend="gloo",
                              dist_timeout_s=600.0, cwd="", worker_env={})
    spec = RunSpec(run_id="bench", num_workers=ranks, node_ids=node_ids, launch=settings,
                   failure_limits=FailureConfig(max_failures=0), node_slots={n: SLOTS for n in node_ids})
    mon = RunMonitor(storage) if monitor else None
    checkpoints = CheckpointManager.load(storage, CheckpointConfig())
    controller = Controller(spec, Hub(), queue.SimpleQueue(), _NoAgents(), checkpoints, MetricsLog(storage),
                            observers=[mon] if mon is not None else [])
    now = time.time()
    assignments = [WorkerAssignment(rank=r, local_rank=r % SLOTS, world_size=ranks, node_id=node_ids[r // SLOTS],
                                    node_rank=r // SLOTS, local_world_size=SLOTS) for r in range(ranks)]
    tracker = AttemptTracker.create(0, assignments, {n: n for n in node_ids})
    for state in tracker.ranks.values():
        state.connected = state.stream_open = True
        state.pid = 1000 + state.assignment.rank
        state.phase = Phase.TRAINING
        state.last_progress = now
    nodes = {n: NodeInfo(node_id=n, hostname=n, address="127.0.0.1", agent_pid=1, cpus=SLOTS, memory_bytes=1 << 34)
             for n in node_ids}
    for node in nodes.values():
        controller._membership.connected(ev.AgentConnected(node))
    controller._commits.start_attempt(ranks)
    controller._current.group = WorkerGroup(
        tracker, controller._outbox, nodes, settings,
        ResumePoint(checkpoint_dir="", report_index_base=0, committed_dir_names=()), time.time)
    controller._loop = Loop(state=RunState.RUNNING, waiting_for=Wait.WORKERS, attempt=0)
    if mon is not None:
        mon.on_run_start(RunInfo("bench", "bench", storage.url(), ranks, now))
        mon.on_attempt_start(AttemptInfo(0, tuple(node_ids[r // SLOTS] for r in range(ranks)), now))
    for rank in range(ranks):  # every rank has a pace (two intervals): its hang deadline is known
        controller._hangs.pace.started(rank)
        for k in range(3):
            controller._hangs.pace.reported(rank, now - 3 + k)
    return controller, mon


def _cpu_us_per_call(call, count: int) -> float:
    """CPU microseconds per call of `call(i)`, i = 0..count-1, median of 5 repeats."""
    figures = []
    base = 0
    for _ in range(5):
        start = time.process_time()
        for i in range(base, base + count):
            call(i)
        figures.append((time.process_time() - start) / count * 1e6)
        base += count
    return statistics.median(figures)


def bench_telemetry(ranks: int, stragglers: int, count: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        controller, monitor = _controller(ranks, tmp, monitor=True)
        rng = random.Random(ranks)
        slow = set(range(ranks - stragglers, ranks))
        t0 = time.time()

        def event(i: int) -> ev.TelemetryReceived:
            rank = i % ranks
            step = (0.3 if rank in slow else 0.1) * rng.uniform(0.9, 1.1)
            return ev.TelemetryReceived(0, TelemetrySample(
                attempt=0, rank=rank, time=t0 + i / ranks, reports=i // ranks, step_time_s=step,
                report_wait_s=0.001, collective_wait_s=0.002, data_wait_s=0.003, cpu_percent=95.0,
                rss_bytes=1 << 30, total=1000))

        for i in range(ranks * 6):  # every rank past min_samples: the stragglers are flagged
            controller._handle(event(i))
        assert len(monitor.stragglers()) == stragglers, monitor.stragglers()
        handle = controller._handle
        events = [event(ranks * 6 + i) for i in range(count * 5)]
        figure = _cpu_us_per_call(lambda i: handle(events[i]), count)
        monitor.on_run_end(run_outcome(controller._loop, controller._current.group.tracker,
                                       controller._commits.history, max_failures=0, run_path="", start_error=""))
        return figure


def bench_report_turn(ranks: int, count: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        controller, _ = _controller(ranks, tmp, monitor=False)
        rules = controller._rules

        def turn(i: int) -> None:
            controller._handle(ev.ReportsReceived((ReportRecord(attempt=0, rank=i % ranks, round=i // ranks,
                                                                metrics_json='{"loss": 1.0}', reported_at=0.0),)))
            now = controller._clock()
            decision = decide(controller._loop, controller._observe(now), now, rules)
            assert not decision.actions
            controller._loop = decision.loop

        return _cpu_us_per_call(turn, count)


def bench_pace(ranks: int, count: int) -> float:
    pace = Pace()
    now = 0.0
    for rank in range(ranks):
        pace.started(rank)
    for k in range(101):
        for rank in range(ranks):
            pace.reported(rank, k * 0.1 + (0.05 if rank % 7 == 0 and k % 13 == 0 else 0.0))
    now = 101 * 0.1
    reported = pace.reported

    def call(i: int) -> None:
        reported(i % ranks, now + i * 0.1 / ranks)

    return _cpu_us_per_call(call, count)


def bench_round(ranks: int, rounds: int) -> float:
    """CPU ms per lockstep round of `ranks` reports arriving as one digest per host (median of `rounds`)."""
    with tempfile.TemporaryDirectory() as tmp:
        controller, monitor = _controller(ranks, tmp, monitor=True)
        rules = controller._rules
        hosts = range(0, ranks, SLOTS)
        figures = []
        for round_ in range(rounds + 1):
            now = time.time()
            wire = [pb.ReportDigest(  # what the agents folded (rpc/digest.py), as bytes on the wire
                stream=list(range(1, SLOTS + 1)), attempt=[0] * SLOTS, rank=list(range(first, first + SLOTS)),
                round=[round_] * SLOTS, reported_at=[now] * SLOTS,
                metrics_json=['{"loss": 0.5, "step": %d, "lr": 0.001}' % round_] * SLOTS,
                wants_ack=[False] * SLOTS, wants_receipt=[(round_ + 1) % 64 == 0] * SLOTS).SerializeToString()
                for first in hosts]
            start = time.process_time()
            for data in wire:
                records = reports_from_digest(pb.ReportDigest.FromString(data))
                controller._handle(ev.ReportsReceived(tuple(records)))
                now = controller._clock()
                decision = decide(controller._loop, controller._observe(now), now, rules)
                controller._loop = decision.loop
            if round_:  # the first round is a warm-up
                figures.append((time.process_time() - start) * 1e3)
        assert controller._commits.checkpoints.report_index == rounds + 1, "every round completed"
        monitor.on_run_end(run_outcome(controller._loop, controller._current.group.tracker,
                                       controller._commits.history, max_failures=0, run_path="", start_error=""))
        return statistics.median(figures)


def main() -> None:
    logging.getLogger("minitrain").setLevel(logging.ERROR)  # the stragglers flagged on purpose
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", default="64,1024,4096")
    parser.add_argument("--count", type=int, default=4000, help="calls per repeat")
    parser.add_argument("--rounds", type=int, default=20, help="round: rounds measured")
    parser.add_argument("--only-round", action="store_true", help="measure the round alone")
    args = parser.parse_args()
    if args.only_round:
        for ranks in [int(s) for s in args.ranks.split(",")]:
            figure = bench_round(ranks, args.rounds)
            print(f"round of {ranks} ranks: {figure:.1f} ms of CPU ({figure * 1e3 / ranks:.1f} us per report)")
        return
    sizes = [int(s) for s in args.ranks.split(",")]
    print("| ranks | telemetry, no straggler (us) | telemetry, 8 stragglers (us) | report + loop turn (us) "
          "| Pace.reported (us) |")
    print("|---|---|---|---|---|")
    for ranks in sizes:
        row = [bench_telemetry(ranks, 0, args.count), bench_telemetry(ranks, min(8, ranks // 8), args.count),
               bench_report_turn(ranks, args.count), bench_pace(ranks, args.count * 10)]
        print(f"| {ranks} | " + " | ".join(f"{x:.1f}" for x in row) + " |", flush=True)


if __name__ == "__main__":
    main()
