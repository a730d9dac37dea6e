"""Fake agents and workers of the scale simulation: asyncio clients of the real proto, no torch.

`python -m bench.scale.clients` serves a share of the simulated nodes. Its configuration,
the run token included, is one JSON line on stdin (as a real agent's token is).

Each fake agent opens its own channel and AgentStream, says hello, sends a Heartbeat every second
(as `NodeAgent` does) and, on StartWorkers, reports each worker spawned and starts it; when a worker
ends it reports the exit, as an agent does once the process is gone. Each fake worker (`bench.scale.fake_worker`) walks the real
worker's protocol: hello, STARTUP, assignment, DIST_INIT, rank 0's StoreReady or the others' Rendezvous,
TRAINING and its PhaseAck, then `reports` reports at `rate_hz`, Done, the Release (rank 0), and a
half-close that the coordinator answers by closing. Every channel uses minitrain's client options, so
gRPC keepalive pings flow every second on every connection, as they do for real agents and workers.

Transport (`transport` in the configuration), how a worker's stream reaches the coordinator: "relayed"
(the default, as the product runs) or "direct"; see `bench.scale.links`.

A report is stamped (`reported_at`, and the worker's send time) when it leaves the worker: relayed,
when the worker hands it to its agent's queue, so time spent waiting for the agent's write and in a
batch counts as latency (the relay's hop from a real worker to its agent over a local socket is not
simulated); direct, when gRPC takes it from the worker's stream to write it. Every `ack_every`-th report
asks for an acknowledgement (`wants_ack`), which the controller sends after it recorded the report
(rank-0 history, rounds): round trip = send -> its ReportAck read back by the worker (relayed: routed to
it by its agent). Acks must come for the acknowledged rounds in order; anything else counts as
reordered, a report never acknowledged as lost. With `telemetry` in the configuration, each worker also
sends a Telemetry message (with its report of that tick) as often as a real worker's sampler does: one a
second, less often in an attempt of more ranks than its budget (`minitrain.worker.telemetry.interval_s`).
(The coordinator process checks every report's order and timing itself: see `coordinator.ReportTap`.)

Backpressure, as a real worker's report() has it (`minitrain.rpc.report_window`): every
RECEIPT_EVERY-th report asks for a receipt, and a rank with REPORT_WINDOW reports in flight that the
coordinator has not recorded (no receipt, no commit ack for them) skips its tick, as a real training loop
would wait in report(); it puts that report at a later tick (`held_back` counts the skipped ticks), and
the ticker goes on past `reports` periods until every rank that can report has put all of its reports.
In "lockstep" one rank held back holds every rank of the process (a DDP step ends in an all_reduce that
no rank leaves before the waiting one joins), so the ranks stay on the same round; in "random" each rank
is held alone.

Faults (the test fixture of tests/process/test_fake_cluster.py uses them): `faults` in the configuration
lists {"attempt", "rank", "after", "kind"}: after `after` reports of that attempt the rank either fails
("exception": a WorkerFailure, then its agent reports exit code 1, as a real worker that raised) or
freezes ("freeze": it stays connected, sends nothing more, and never answers a stack dump, as a
SIGSTOPped process), or silences its host ("silent": the rank freezes and its fake agent sends nothing
more, no heartbeat either, its connection left open: a host that hangs or drops its traffic, found only by
the coordinator's lease), or loses its host ("host_lost", at the ticker's period `after` rather than after
`after` reports, so that hosts lost together go in one tick even when the report window holds ranks back:
its fake agent cancels its AgentStream, as an agent
that was SIGKILLed or whose host died: the connection ends, and every worker stream it carried with it;
`Stats.lost_at` records when). A lost host comes back when the coordinator relaunches its agent (with `relaunch`
in the configuration, the coordinator's fake launcher asks on stdin: `bench.scale.relaunch`): a new fake
agent for the node connects at once and takes workers from the next attempt that places them.

Checkpoints (`checkpoint_every` N in the configuration, 0 for none): rank 0's every N-th report carries a
checkpoint, written into the run directory (`run_dir`) beforehand and committed by the coordinator as a
real rank's (an elastic run grows at a committed checkpoint); it asks for an ack, as a real report() with a
checkpoint waits for the commit. After "freeze" or "silent" the other ranks of that attempt in the same client
process stop reporting too, as DDP peers blocked in their next collective. A stack dump is answered for every other live rank with a faulthandler-style text
whose main thread waits in torch.distributed's all_reduce, as a DDP peer of a frozen rank would. Each
attempt starts with reports from round 0 after its own barrier, so a restarted run is paced as the first.

Pacing (`phase` in the configuration): one ticker per process and attempt puts every report (a timer
per worker would cost the client more than the coordinator). Each rank has a fixed slot within the
period (1 / rate_hz):
- "lockstep" (the default): every rank reports at the start of each period plus a fixed per-rank jitter
  of 0 to LOCKSTEP_JITTER_S (one of LOCKSTEP_SLOTS sub-slots). This is what DDP does: every step ends
  in a collective (the gradients' all_reduce) that no rank leaves before every rank has entered it, so
  the ranks of a job step, and report, within a millisecond or two of each other, and the coordinator
  receives each round as one burst of every rank's report (relayed: a batch from every agent at once).
- "random": each rank reports in one pseudo-random slot of RANDOM_SLOTS spread over the period, so a
  round's reports arrive spread out and in no rank order (the figures before lockstep). Smoother
  traffic than DDP makes, so it flatters the coordinator's latency.
Either way a rank that is late in one round is late in every round, as a slow host is. Reporting starts
once every worker of every client process is training (a barrier of files in a shared directory).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import random
import resource
import sys
import time
from typing import Optional

from grpc import aio

from minitrain.rpc._gen import minitrain_pb2 as pb
from minitrain.rpc._gen import minitrain_pb2_grpc as pb_grpc
from bench.scale import relaunch
from bench.scale.client_stats import Stats
from bench.scale.fake_worker import PHASE_WAIT_S, START_TRIES, FakeWorker
from bench.scale.links import _END, OPTIONS, AgentUpstream, DirectLink, RelayedLink
from minitrain.lease import HEARTBEAT_INTERVAL_S, until_heartbeat_s
from minitrain.rpc import report_window
from minitrain.rpc.auth import call_metadata
from minitrain.worker import telemetry

TRANSPORTS = ("relayed", "direct")
PHASES = ("lockstep", "random")
RANDOM_SLOTS = 20  # "random": slots spread over the period
LOCKSTEP_SLOTS = 8  # "lockstep": sub-slots 0, 0.25, ..., 1.75 ms after the period starts
LOCKSTEP_JITTER_S = 0.002
# Fake agents of one process that may be connecting at the same time (their channel, then their stream
# until it is open). Real agents start on their own hosts over seconds; thousands of connections opened in
# the same instant by one process make the gRPC client library fail some of the new streams ("Internal
# error from Core" in execute_batch, CANCELLED; seen with 512 and 1024 fake agents a process at 16384
# workers), and an agent's broken stream loses its node.
CONNECTING_AT_ONCE = 64
# What a rank blocked in DDP's all_reduce shows on a stack dump (faulthandler's format).
WAITING_STACK = """Current thread 0x00007f0000000001 (most recent call first):
  File "/venv/torch/distributed/distributed_c10d.py", line 2501 in all_reduce
  File "/work/train.py", line 12 in train_func
  File "/venv/minitrain/worker/bootstrap.py", line 182 in execute
"""


def slot_offsets(phase: str, period_s: float) -> list[float]:
    """When each slot of the ticker falls, in seconds after its period starts (see the module docstring)."""
    if phase == "lockstep":
        return [LOCKSTEP_JITTER_S * k / LOCKSTEP_SLOTS for k in range(LOCKSTEP_SLOTS)]
    if phase == "random":
        return [period_s * k / RANDOM_SLOTS for k in range(RANDOM_SLOTS)]
    raise ValueError(f"phase: {phase!r} is not one of {', '.join(PHASES)}")


class FakeAgent:
    """One simulated node agent; see the module docstring."""

    def __init__(self, sim: "Simulation", node_id: str, slots: int, relaunched: bool = False):
        self.sim, self.node_id, self.slots = sim, node_id, slots
        self.relaunched = relaunched  # started for a lost node (the coordinator asked: `Simulation.relaunch`)
        self.started_attempts: set[int] = set()  # attempts it got StartWorkers for
        self.upstream = AgentUpstream(sim.run_id, node_id, sim.stats, sim.digest)
        self.workers: dict[tuple[int, int], asyncio.Task] = {}
        self.fakes: dict[tuple[int, int], FakeWorker] = {}
        self.relayed: dict[int, RelayedLink] = {}  # the worker streams it carries, by number
        self._numbers = itertools.count(1)
        self.call = None  # its AgentStream, once open
        self._broke: Optional[str] = None  # why its last stream broke (None: it did not, or on purpose)
        self._rejoined = False  # a relaunched agent said hello
        self.lost = False  # the "host_lost" fault fired: its stream was cancelled on purpose

    def lose(self, fault: bool = True) -> None:
        """The "host_lost" fault (`fault`), or a node's agent replaced: end this agent's stream at once
        (cancelled, as the connection of a killed agent ends), with every worker stream it carries;
        nothing more goes up."""
        if self.lost:
            return
        self.lost = True
        self.upstream.silent = True
        if fault:
            self.sim.stats.lost_at.append(time.time())
        if self.call is not None:
            self.call.cancel()

    def _put(self, **body) -> None:
        self.upstream.put(pb.AgentMessage(run_id=self.sim.run_id, node_id=self.node_id, sent_at=time.time(), **body))

    def open_link(self, worker: FakeWorker):
        """A new stream for `worker`: carried by this agent, or its own connection (`transport`)."""
        if self.sim.transport == "direct":
            return DirectLink(worker)
        link = RelayedLink(self, worker, next(self._numbers))
        self.relayed[link.number] = link
        return link

    def _route(self, down: pb.RelayedDown) -> None:
        """Deliver each relayed command to its worker stream, in order; drop those for streams gone."""
        for item in down.items:
            link = self.relayed.get(item.stream)
            if link is None:
                continue
            if item.close:
                del self.relayed[item.stream]
                link.end()
            else:
                link.worker.handle(item.command)

    async def _heartbeat(self) -> None:
        """A heartbeat whenever nothing else was queued for HEARTBEAT_INTERVAL_S, as the real agent."""
        wait_s = HEARTBEAT_INTERVAL_S
        while True:
            await asyncio.sleep(wait_s)
            wait_s = until_heartbeat_s(time.monotonic() - self.upstream.last_queued)
            if not wait_s:
                self._put(heartbeat=pb.Heartbeat(sent_at=time.time()))
                wait_s = HEARTBEAT_INTERVAL_S

    async def _worker(self, attempt: int, rank: int, pid: int) -> None:
        worker = FakeWorker(self.sim, self, attempt, rank)
        self.fakes[(attempt, rank)] = worker
        clean = await worker.run()
        self._put(exited=pb.WorkerExited(attempt=attempt, rank=rank, pid=pid, exit_code=0 if clean else 1,
                                         exited_at=time.time()))

    def _start(self, start: pb.StartWorkers) -> None:
        self.started_attempts.add(start.attempt)
        for launch in start.workers:
            pid = next(self.sim.pids)
            self._put(spawned=pb.WorkerSpawned(attempt=start.attempt, rank=launch.rank, pid=pid))
            task = asyncio.ensure_future(self._worker(start.attempt, launch.rank, pid))
            self.workers[(start.attempt, launch.rank)] = task

    def _dump_stacks(self, dump: pb.DumpStacks) -> None:
        """Answer for every live rank of the attempt but a frozen one (a stopped process cannot)."""
        for (attempt, rank), task in self.workers.items():
            worker = self.fakes.get((attempt, rank))
            if attempt == dump.attempt and not task.done() and worker is not None and not worker.frozen:
                self._put(stack_dump=pb.StackDump(attempt=attempt, rank=rank, text=WAITING_STACK))

    def _stop(self, stop: pb.StopWorkers) -> None:
        for (attempt, rank), task in self.workers.items():
            if attempt == stop.attempt and not task.done():
                worker = self.fakes.get((attempt, rank))
                if worker is not None and worker.link is not None:
                    worker.link.abort()  # its stream breaks as the process dies, before its exit is reported
                task.cancel()
                self._put(exited=pb.WorkerExited(attempt=attempt, rank=rank, signal=15, stopped_by_agent=True,
                                                 exited_at=time.time()))

    async def run(self) -> None:
        """Hold the session until Shutdown (or until it breaks). A stream that breaks before its first
        command is opened again, after a growing pause (at most START_TRIES times, counted as
        `reopened`): at 2048 fake agents the gRPC client library cancels some new streams at once
        (CANCELLED within a second of the start; 156 of 2048 in one run), and an agent that gave up
        would leave its node missing for good."""
        for attempt in range(START_TRIES):
            commanded = await self._session()
            if commanded or self.lost or self._broke is None or attempt == START_TRIES - 1:
                break
            self.sim.stats.reopened += 1
            print(f"opening again: {self._broke}", file=sys.stderr, flush=True)
            self.upstream = AgentUpstream(self.sim.run_id, self.node_id, self.sim.stats, self.sim.digest)
            await asyncio.sleep(0.5 * 2 ** attempt)
        if self._broke is not None and not self.lost:
            self.sim.stats.error(self._broke)

    async def _session(self) -> bool:
        """One AgentStream, until Shutdown or until it breaks (`_broke` says why); True once the
        coordinator sent it a command."""
        sim = self.sim
        self._broke = None
        commanded = False
        channel = aio.insecure_channel(sim.address, options=OPTIONS)
        heartbeat = None
        try:
            async with sim.connecting:  # (see CONNECTING_AT_ONCE): until the stream is open
                await asyncio.wait_for(channel.channel_ready(), PHASE_WAIT_S)
                # wait_for_ready, as the real agent's stream: a connection the server closed (idle for
                # IDLE_CONNECTION_MS before the call started, seen at 2048 fake agents) is retried instead
                # of failing the agent, whose node would never connect.
                call = self.call = pb_grpc.CoordinatorStub(channel).AgentStream(
                    self.upstream.requests(), metadata=sim.metadata, wait_for_ready=True)
                self._put(hello=pb.AgentHello(hostname=self.node_id, pid=sim.pid, minitrain_version="bench",
                                              python=sys.executable, cpus=self.slots, memory_bytes=1 << 30,
                                              address="127.0.0.1", ifname="lo"))
                await asyncio.wait_for(call.wait_for_connection(), PHASE_WAIT_S)
            heartbeat = asyncio.ensure_future(self._heartbeat())
            if self.relaunched and not self._rejoined:
                self._rejoined = True  # (its first hello: a stream opened again says hello again)
                sim.stats.rejoined_at.append(time.time())
            async for command in call:
                commanded = True
                kind = command.WhichOneof("body")
                if kind == "relayed":
                    self._route(command.relayed)
                elif kind == "start":
                    self._start(command.start)
                elif kind == "stop":
                    self._stop(command.stop)
                elif kind == "dump_stacks":
                    self._dump_stacks(command.dump_stacks)
                elif kind == "prepare_fork_servers" and command.prepare_fork_servers.for_start:
                    # A real agent answers once its fork server is warm (every import done); a fake worker imports
                    # nothing, so its node is warm at once (the run grows onto it only after this).
                    self._put(warmed=pb.WarmedUp(ready=True))
                elif kind == "shutdown":
                    break
        except asyncio.CancelledError:
            if not self.lost:  # only the "host_lost" fault cancels the stream on purpose
                raise
        except Exception as exc:  # noqa: BLE001 - recorded by run(), and the exit code says it
            if not self.lost:  # (the cancelled stream may also end as an RpcError(CANCELLED))
                self._broke = f"{sim.elapsed():.1f}s agent {self.node_id}: {type(exc).__name__}: {exc}"[:300]
        finally:
            if heartbeat is not None:
                heartbeat.cancel()
            for link in list(self.relayed.values()):
                link.end()  # the streams it carried end with it
            for task in self.workers.values():
                task.cancel()
            self.upstream.put(_END)
            await channel.close()
        return commanded


class Simulation:
    """Every fake agent and worker of this process, and the ticker that paces their reports."""

    def __init__(self, config: dict):
        self.address, self.run_id = config["address"], config["run_id"]
        self.metadata = call_metadata(config["token"])
        self.reports, self.rate_hz = config["reports"], config["rate_hz"]
        self.ack_every = config.get("ack_every", 1)
        self.transport = config.get("transport", "relayed")
        self.digest = bool(config.get("digest", True))
        if self.transport not in TRANSPORTS:
            raise ValueError(f"transport: {self.transport!r} is not one of {', '.join(TRANSPORTS)}")
        self.phase = config.get("phase", "lockstep")
        self.offsets = slot_offsets(self.phase, 1.0 / self.rate_hz)
        self.telemetry = bool(config.get("telemetry", False))
        self.expected_workers = config["workers"]
        self.pid, self.hostname = os.getpid(), "bench-client"
        self.pids = itertools.count(1_000_000 + os.getpid() * 10_000)
        self.stats = Stats(config["warmup_rounds"])
        self.faults = {(f["attempt"], f["rank"]): f for f in config.get("faults", ())}
        self.slots: dict[int, list[list[FakeWorker]]] = {}  # attempt -> its ticker's slots
        self.workers: list[FakeWorker] = []
        self.training = 0  # workers that reached training, every attempt
        self._training_in: dict[int, int] = {}  # attempt -> workers that reached training in it
        self._go: dict[int, asyncio.Event] = {}
        self._tickers: list[asyncio.Future] = []
        self.frozen_attempts: set[int] = set()  # attempts in which a rank froze (in this process)
        self.started = time.monotonic()
        self.barrier_dir, self.processes = config["barrier_dir"], config["processes"]
        self.connecting = asyncio.Semaphore(CONNECTING_AT_ONCE)
        self.agents = [FakeAgent(self, node_id, config["slots"]) for node_id in config["node_ids"]]
        self._agent_runs: set[asyncio.Future] = set()
        self.checkpoint_every = config.get("checkpoint_every", 0)
        self.run_dir = config.get("run_dir", "")
        self._barriers: set[int] = set()  # attempts whose barrier this process entered

    def elapsed(self) -> float:
        """Seconds since this process started its simulation (error messages carry it)."""
        return time.monotonic() - self.started

    def telemetry_every(self, world_size: int) -> int:
        """A worker of a `world_size`-rank attempt sends one Telemetry message every this many reports,
        as often as a real worker's sampler (`minitrain.worker.telemetry.interval_s`); 0: none."""
        return max(1, round(self.rate_hz * telemetry.interval_s(world_size))) if self.telemetry else 0

    def fault_for(self, attempt: int, rank: int) -> Optional[dict]:
        """The fault injected into `rank` in `attempt`, if any (see the module docstring)."""
        return self.faults.get((attempt, rank))

    def expected_in_attempt(self, attempt: int) -> int:
        """Workers of this process `attempt` starts: every slot of its agents whose host is not lost (an
        elastic run's attempt after a loss places every worker that fits on the survivors), a relaunched
        agent's once it got its StartWorkers (it joins an attempt placed after it connected, and the
        count must never wait for an agent the attempt left out; one that starts late joins the ticker
        late)."""
        return sum(agent.slots for agent in self.agents
                   if not agent.lost and (not agent.relaunched or attempt in agent.started_attempts))

    def relaunch(self, node_id: str) -> None:
        """The coordinator asked for a new agent on `node_id` (its host lost): start one, in place of the
        old agent (whose stream ends now, if it had not)."""
        index = next(i for i, agent in enumerate(self.agents) if agent.node_id == node_id)
        old = self.agents[index]
        old.lose(fault=False)
        agent = self.agents[index] = FakeAgent(self, node_id, old.slots, relaunched=True)
        self.stats.relaunched_at.append(time.time())
        self._agent_runs.add(asyncio.ensure_future(agent.run()))

    def go_for(self, attempt: int) -> asyncio.Event:
        """Set once every worker of `attempt`, in every client process, is training."""
        return self._go.setdefault(attempt, asyncio.Event())

    def training_started(self, worker: FakeWorker) -> None:
        """A worker got its PhaseAck(TRAINING); its attempt's reporting starts once every worker of
        the attempt has."""
        # Each rank keeps one pseudo-random slot: a late rank stays late.
        slots = self.slots.setdefault(worker.attempt, [[] for _ in self.offsets])
        slots[random.Random(worker.rank).randrange(len(self.offsets))].append(worker)
        self.training += 1
        count = self._training_in[worker.attempt] = self._training_in.get(worker.attempt, 0) + 1
        if count >= self.expected_in_attempt(worker.attempt) and worker.attempt not in self._barriers:
            self._barriers.add(worker.attempt)
            self._tickers.append(asyncio.ensure_future(self._barrier(worker.attempt)))

    async def _barrier(self, attempt: int) -> None:
        """Every client process marks itself ready in the shared directory and waits for the others
        (as in DDP, where no rank gets past the first collective before every rank is up); then the
        attempt's reports are paced."""
        suffix = f"_attempt{attempt}"
        open(os.path.join(self.barrier_dir, f"ready_{os.getpid()}{suffix}"), "w").close()
        while sum(name.endswith(suffix) for name in os.listdir(self.barrier_dir)) < self.processes:
            await asyncio.sleep(0.02)
        self.go_for(attempt).set()
        await self._ticker(self.slots[attempt])

    async def _ticker(self, slots: list[list[FakeWorker]]) -> None:
        """Put every report at its slot's time, period after period. Between slots it gives way to the
        event loop (at least one turn), so agents start writing one slot's batch while the next waits."""
        loop = asyncio.get_running_loop()
        period = 1.0 / self.rate_hz
        stats = self.stats
        start = loop.time()
        stats.first_report_at = stats.first_report_at or time.time()
        everyone = [w for workers in slots for w in workers]
        losing = [w for w in everyone if w.fault is not None and w.fault["kind"] == "host_lost"]
        round_ = 0
        stepped = 0  # periods the group reported in (lockstep: the round every rank reports next)
        recorded_floor = -1  # lockstep: at most the lowest round the coordinator recorded of any live rank
        # Every rank puts its reports by the last period, unless its window held some back.
        while round_ < self.reports or any(w.can_report() for w in everyone):
            if len(everyone) < sum(map(len, slots)):  # a rank that started late (a relaunched agent's)
                everyone = [w for workers in slots for w in workers]
            for worker in losing:
                worker.lose_host_at(round_)
            if self.phase == "lockstep" and report_window.must_wait(stepped, recorded_floor):
                # DDP couples the ranks: one rank waiting in report() for its window holds every rank
                # in the next step's all_reduce, so the whole group skips the period (lockstep only;
                # "random" ranks are held one by one in FakeWorker.report).
                live = [w.recorded for w in everyone if w.can_report()]
                recorded_floor = min(live, default=stepped)
                if report_window.must_wait(stepped, recorded_floor):
                    stats.held_back += len(live)
                    due = start + round_ * period
                    await asyncio.sleep(max(0.0, due - loop.time()))
                    round_ += 1
                    continue
            for offset, workers in zip(self.offsets, slots):
                if not workers:
                    continue
                due = start + round_ * period + offset
                await asyncio.sleep(max(0.0, due - loop.time()))
                stats.lag.append(max(0.0, loop.time() - due))
                for worker in workers:
                    if worker.report():
                        stats.sent += 1
            round_ += 1
            stepped += 1
        stats.last_report_at = time.time()

    async def run(self, relaunches: bool = False) -> None:
        """Run every agent until the coordinator shuts them down; with `relaunches`, also the agents
        the coordinator asks for on stdin (`bench.scale.relaunch`)."""
        loop = asyncio.get_running_loop()
        if relaunches:
            relaunch.read_requests(sys.stdin, lambda node_id: loop.call_soon_threadsafe(self.relaunch, node_id))
        self._agent_runs.update(asyncio.ensure_future(agent.run()) for agent in self.agents)
        while self._agent_runs:  # (a relaunch adds to it)
            done, _ = await asyncio.wait(self._agent_runs, return_when=asyncio.FIRST_COMPLETED)
            self._agent_runs -= done
            for run in done:
                run.result()  # an agent's unexpected error ends the process, as gather would
        for ticker in self._tickers:
            ticker.cancel()


def _results(sim: Simulation, out: str) -> dict:
    stats = sim.stats
    lag = sorted(stats.lag)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    with open(out + ".latencies", "wb") as f:
        stats.latencies.tofile(f)
    with open(out + ".errors.txt", "w") as f:  # every error, for --save-logs
        f.write("".join(e + "\n" for e in stats.errors))
    return {"pid": os.getpid(), "workers": sim.expected_workers, "training": sim.training, "sent": stats.sent,
            "transport": sim.transport, "phase": sim.phase,
            "acked": stats.acked, "expected": sum(w.expected_acks() for w in sim.workers),
            "held_back": stats.held_back, "silenced_at": stats.silenced_at, "lost_at": stats.lost_at,
            "relaunched_at": stats.relaunched_at, "rejoined_at": stats.rejoined_at,
            "reordered": stats.reordered, "reopened": stats.reopened, "error_count": len(stats.errors),
            "messages_up": stats.messages_up, "items_up": stats.items_up,
            "errors": sorted(stats.errors, key=lambda e: float(e.split("s ", 1)[0]))[:20],  # the earliest
            "first_report_at": stats.first_report_at, "last_report_at": stats.last_report_at,
            "acks_per_second": stats.acks_per_second, "messages_per_second": stats.messages_per_second,
            "tick_lag_p99_s": lag[int(0.99 * (len(lag) - 1))] if lag else None,
            "tick_lag_max_s": lag[-1] if lag else None,
            "cpu_s": usage.ru_utime + usage.ru_stime, "peak_rss_mib": usage.ru_maxrss / 1024,
            "latencies_file": out + ".latencies"}


def main() -> int:
    """Read the configuration from stdin, serve the nodes, write the results file."""
    config = json.loads(sys.stdin.readline())
    sim = Simulation(config)
    asyncio.run(sim.run(relaunches=bool(config.get("relaunch"))))
    results = _results(sim, config["out"])
    with open(config["out"] + ".tmp", "w") as f:
        json.dump(results, f)
    os.replace(config["out"] + ".tmp", config["out"])
    return 0 if not sim.stats.errors else 1


if __name__ == "__main__":
    sys.exit(main())
