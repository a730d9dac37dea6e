"""A fake worker of the scale simulation (`bench.scale.clients`): one simulated rank on the real protocol.

It walks the real worker's protocol (hello, STARTUP, assignment, DIST_INIT, rank 0's StoreReady or the
others' Rendezvous, TRAINING and its PhaseAck), then puts its reports when its process's ticker says so, with
the real report window, acks, telemetry at the real worker's interval, rank 0's checkpoints, and the faults
of the configuration; `bench.scale.clients` says how all of it is paced and what each fault does.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import TYPE_CHECKING

from minitrain.rpc import report_window
from minitrain.rpc._gen import minitrain_pb2 as pb

if TYPE_CHECKING:
    from bench.scale.clients import FakeAgent, Simulation

ACK_WAIT_S = 120.0
PHASE_WAIT_S = 120.0
START_TRIES = 5


class StreamBroke(RuntimeError):
    """A worker's stream ended before the worker reached training."""


class FakeWorker:
    """One simulated rank; see the module docstrings (this one's and `bench.scale.clients`')."""

    def __init__(self, sim: "Simulation", agent: "FakeAgent", attempt: int, rank: int):
        self.sim, self.agent, self.attempt, self.rank = sim, agent, attempt, rank
        self.link = None
        self.assignment = asyncio.Event()
        self.rendezvous = asyncio.Event()
        self.training = asyncio.Event()
        self.released = asyncio.Event()
        self.all_acked = asyncio.Event()
        self.reporting_over = asyncio.Event()  # every report put, or failed, or frozen
        self.sent_at: list[float] = []
        self.next_ack = self._next_acked(0)
        self.recorded = -1  # the highest round the coordinator recorded (a receipt or an ack says so)
        self.fault = sim.fault_for(attempt, rank)
        self.failed = self.frozen = self.closed = False
        self.telemetry_every = 0  # one Telemetry message every this many reports (set with the assignment)
        sim.workers.append(self)

    def _put(self, **body) -> None:
        self.link.put(pb.WorkerMessage(run_id=self.sim.run_id, attempt=self.attempt, rank=self.rank, **body))

    def report(self) -> bool:
        """Put this worker's next report on its stream (called by the ticker), or fire its fault;
        True when a report was put."""
        if self.failed or self.frozen or self.closed or self.attempt in self.sim.frozen_attempts:
            return False  # a DDP peer of a frozen rank blocks in its next collective
        i = len(self.sent_at)
        if i >= self.sim.reports:
            return False
        if report_window.must_wait(i, self.recorded):
            self.sim.stats.held_back += 1  # a real report() waits here for the receipt
            return False
        if self.fault is not None and i == self.fault["after"] and self.fault["kind"] != "host_lost":
            if self.fault["kind"] in ("freeze", "silent"):
                self.frozen = True
                self.sim.frozen_attempts.add(self.attempt)
                if self.fault["kind"] == "silent":
                    self.agent.upstream.silence()
            else:
                self.failed = True
                self._put(failure=pb.WorkerFailure(
                    phase=pb.PHASE_TRAINING, exc_type="builtins.RuntimeError", failed_at=time.time(),
                    message=f"injected fault on rank {self.rank} after {i} reports"))
            self.reporting_over.set()
            return False
        # Built in place, and the metrics' JSON written directly (what json.dumps would write): the
        # clients' cost per report bounds how many workers one process can drive.
        sim, link = self.sim, self.link
        out, message = link.new_message()
        message.run_id, message.attempt, message.rank = sim.run_id, self.attempt, self.rank
        report = message.report
        report.round, report.wants_ack = i, self._acked(i)
        report.wants_receipt = report_window.wants_receipt(i)
        report.metrics_json = f'{{"step": {i}, "loss": {1.0 / (i + 1)!r}, "rank": {self.rank}, "lr": 0.001}}'
        if self._checkpointed(i):
            report.checkpoint_dir_name = self._write_checkpoint(i)
        self.sent_at.append(time.perf_counter())
        report.reported_at = time.time()
        link.send(out)
        if self.telemetry_every and i % self.telemetry_every == 0:
            # A real worker's sampler (minitrain.worker.telemetry): one a second, less often in a run of
            # more ranks than its budget.
            out, message = link.new_message()
            message.run_id, message.attempt, message.rank = sim.run_id, self.attempt, self.rank
            sample = message.telemetry
            sample.sampled_at, sample.reports, sample.step_time_s = time.time(), i + 1, 1.0 / sim.rate_hz
            sample.report_wait_s, sample.collective_wait_s, sample.cpu_percent = 0.0, 0.0, 95.0
            sample.rss_bytes, sample.total = 2 << 30, sim.reports
            link.send(out)
        if i + 1 >= self.sim.reports:
            self.reporting_over.set()
        return True

    def lose_host_at(self, period: int) -> None:
        """The "host_lost" fault, fired by the ticker at period `after` of the attempt, whatever this
        rank is doing (a host dies even while its rank waits in report() for its window), so that every
        host lost "at once" goes in the same tick of its process."""
        if self.fault is not None and self.fault["kind"] == "host_lost" and period == self.fault["after"] \
                and not self.frozen:
            self.frozen = True  # it dies with its host: its agent reports nothing more of it
            self.agent.lose()
            self.reporting_over.set()

    def can_report(self) -> bool:
        """True while this rank has reports left to put and nothing stops it for good."""
        return not (self.failed or self.frozen or self.closed or self.attempt in self.sim.frozen_attempts
                    or len(self.sent_at) >= self.sim.reports)

    def _next_acked(self, start: int) -> int:
        """The first round >= start that asks for an ack (self.sim.reports when none does)."""
        while start < self.sim.reports and not self._acked(start):
            start += 1
        return start

    def expected_acks(self) -> int:
        """How many of this worker's reports ask for an ack."""
        return sum(self._acked(i) for i in range(self.sim.reports))

    def _acked(self, i: int) -> bool:
        """Whether report i asks for an ack: every `ack_every`-th (spread over the ranks), the last, and a
        checkpoint's (a real report() with a checkpoint returns once it is committed)."""
        return (i + self.rank) % self.sim.ack_every == 0 or i == self.sim.reports - 1 or self._checkpointed(i)

    def _checkpointed(self, i: int) -> bool:
        """Whether report i carries a checkpoint: rank 0's every `checkpoint_every`-th (0: none)."""
        every = self.sim.checkpoint_every
        return self.rank == 0 and every > 0 and (i + 1) % every == 0

    def _write_checkpoint(self, i: int) -> str:
        """Write report i's checkpoint into the run directory (as a rank that saves where it is committed,
        without staging) and return its directory name."""
        name = f"checkpoint_attempt{self.attempt}_{i:06d}"
        path = os.path.join(self.sim.run_dir, name)
        os.makedirs(path)
        with open(os.path.join(path, "state.txt"), "w") as f:
            f.write(f"attempt {self.attempt} report {i}\n")
        return name

    def handle(self, command: pb.WorkerCommand) -> None:
        """One command from the coordinator (read from its own stream, or routed by its agent)."""
        kind = command.WhichOneof("body")
        if kind == "report_receipt":
            self.recorded = max(self.recorded, command.report_receipt.round)
        elif kind == "report_ack":
            stats = self.sim.stats
            now = time.perf_counter()
            acked = command.report_ack.round
            self.recorded = max(self.recorded, acked)
            if acked != self.next_ack:
                stats.reordered += 1  # not the next acknowledged round of this rank
            elif acked >= stats.warmup_rounds:
                stats.latencies.append(now - self.sent_at[acked])
            self.next_ack = self._next_acked(max(self.next_ack, acked + 1))
            stats.acked += 1
            second = int(time.time())
            stats.acks_per_second[second] = stats.acks_per_second.get(second, 0) + 1
            if self.next_ack >= self.sim.reports:
                self.all_acked.set()
        elif kind == "assignment":
            self.telemetry_every = self.sim.telemetry_every(command.assignment.world_size)
            self.assignment.set()
        elif kind == "rendezvous":
            self.rendezvous.set()
        elif kind == "phase_ack" and command.phase_ack.phase >= pb.PHASE_TRAINING:
            self.training.set()
        elif kind == "release":
            self.released.set()

    async def _until(self, event: asyncio.Event, what: str) -> None:
        """Wait for `event`; StreamBroke if the stream ends first, TimeoutError after PHASE_WAIT_S."""
        waiter = asyncio.ensure_future(event.wait())
        ended = self.link.ended
        done, _ = await asyncio.wait({waiter, ended}, timeout=PHASE_WAIT_S, return_when=asyncio.FIRST_COMPLETED)
        if waiter in done:
            return
        waiter.cancel()
        if ended in done:
            why = "cancelled" if ended.cancelled() else repr(ended.exception())
            raise StreamBroke(f"its stream ended before the {what}: {why}"[:300])
        raise TimeoutError(f"no {what} within {PHASE_WAIT_S:g} s")

    async def _start_up(self) -> None:
        """Open the stream and walk the phases up to the PhaseAck of TRAINING."""
        sim = self.sim
        self.assignment, self.rendezvous, self.training = asyncio.Event(), asyncio.Event(), asyncio.Event()
        self.link = self.agent.open_link(self)
        try:
            self._put(hello=pb.WorkerHello(pid=sim.pid, hostname=sim.hostname))
            self._put(phase=pb.PhaseChange(phase=pb.PHASE_STARTUP))
            await self._until(self.assignment, "assignment")
            self._put(phase=pb.PhaseChange(phase=pb.PHASE_DIST_INIT))
            if self.rank == 0:
                self._put(store_ready=pb.StoreReady(address="127.0.0.1", port=29500))
            else:
                await self._until(self.rendezvous, "rendezvous")
            self._put(phase=pb.PhaseChange(phase=pb.PHASE_TRAINING))
            await self._until(self.training, "PhaseAck(TRAINING)")
        except BaseException:
            await self.link.close()
            raise

    async def run(self) -> bool:
        """The worker's whole life; True when it ended cleanly.

        A stream that breaks during start-up is opened again, after a growing pause (at most START_TRIES
        times, counted as `reopened`): under a storm of thousands of new connections in one process, the gRPC client
        library sometimes fails some of them (see docs/benchmarks/scale.md).
        """
        sim = self.sim
        for attempt in range(START_TRIES):
            try:
                await self._start_up()
                break
            except StreamBroke as exc:
                if attempt == START_TRIES - 1:
                    sim.stats.error(f"{sim.elapsed():.1f}s rank {self.rank}: {exc}")
                    return False
                sim.stats.reopened += 1
                await asyncio.sleep(0.5 * 2 ** attempt)  # such breakage comes in bursts: let it pass
            except Exception as exc:  # noqa: BLE001 - recorded, and the exit code says it
                sim.stats.error(f"{sim.elapsed():.1f}s rank {self.rank}: {type(exc).__name__}: {exc}"[:300])
                return False
        try:
            sim.training_started(self)
            await sim.go_for(self.attempt).wait()
            await self.reporting_over.wait()  # (never set for a peer of a frozen rank: it waits to be stopped)
            if self.failed:
                self.link.half_close()
                return False  # its agent reports exit code 1, as for a worker that raised
            if self.frozen or self.attempt in sim.frozen_attempts:
                await asyncio.Event().wait()  # until its agent stops it (StopWorkers)
            try:
                await asyncio.wait_for(self.all_acked.wait(), ACK_WAIT_S)
            except asyncio.TimeoutError:
                pass  # counted as lost
            self._put(phase=pb.PhaseChange(phase=pb.PHASE_FINISHING))
            self._put(done=pb.WorkerDone(finished_at=time.time(), reports=len(self.sent_at)))
            if self.rank == 0:
                await _wait(self.released, "release", ACK_WAIT_S)
            self.link.half_close()
            await asyncio.wait_for(asyncio.shield(self.link.ended), ACK_WAIT_S)
            return True
        except Exception as exc:  # noqa: BLE001 - recorded, and the exit code says it
            sim.stats.error(f"{sim.elapsed():.1f}s rank {self.rank}: {type(exc).__name__}: {exc}"[:300])
            return False
        finally:
            self.closed = True
            await self.link.close()


async def _wait(event: asyncio.Event, what: str, timeout_s: float = PHASE_WAIT_S) -> None:
    """Wait for `event`; TimeoutError naming `what` after `timeout_s`."""
    try:
        await asyncio.wait_for(event.wait(), timeout_s)
    except asyncio.TimeoutError:
        raise TimeoutError(f"no {what} within {timeout_s:g} s") from None
