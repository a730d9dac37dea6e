"""What one gRPC message costs a Python grpc.aio server, with nothing of minitrain's behind it.

The coordinator's floor at scale (docs/benchmarks/scale.md): each node agent sends at least one
`AgentMessage` per report round (DDP's ranks report in lockstep), so a round costs the coordinator at
least (hosts x the server's CPU per message) before any of minitrain's own work. This measures that
per-message CPU on this machine: a grpc.aio server with the coordinator's server options serves one
bidirectional `AgentStream` per fake agent and only iterates its requests (no parsing beyond what
grpc does, no events); fake agents in another process send `RelayedUp` messages of 8 relayed
reports (the size the coordinator gets at 8 workers per host) in lockstep rounds. Figures: the
server process' CPU per message (sampled from outside, over the rounds only) and the time from a
round's first send to the server having read all of the round's messages.

Usage: .venv/bin/python scripts/bench_grpc_floor.py [--agents 64,512] [--rounds 50] [--period-s 0.1]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import grpc  # noqa: E402
import psutil  # noqa: E402
from grpc import aio  # noqa: E402

from minitrain.rpc._gen import minitrain_pb2 as pb  # noqa: E402
from minitrain.rpc._gen import minitrain_pb2_grpc as pb_grpc  # noqa: E402
from minitrain.rpc.channel import server_options  # noqa: E402


class CountingService(pb_grpc.CoordinatorServicer):
    """Reads every message of every agent stream and counts them; answers nothing."""

    def __init__(self, counts: "multiprocessing.sharedctypes.Synchronized"):
        self._counts = counts
        self._seen = 0

    async def AgentStream(self, request_iterator, context):
        async for _ in request_iterator:
            self._seen += 1
            self._counts.value = self._seen  # one writer (this loop): no lock needed
        return
        yield  # an async generator, like the coordinator's handler


def serve(port_out, counts) -> None:
    """The server process: grpc.aio with the coordinator's options on a free loopback port."""
    async def main() -> None:
        server = aio.server(options=server_options())
        pb_grpc.add_CoordinatorServicer_to_server(CountingService(counts), server)
        port_out.value = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        await server.wait_for_termination()

    asyncio.run(main())


def round_message() -> bytes:
    """One agent's message of one round: 8 relayed reports with the bench's metrics."""
    up = pb.AgentMessage(run_id="r" * 32, node_id="node-000")
    for stream in range(1, 9):
        item = up.relayed.items.add(stream=stream)
        message = item.message
        message.run_id, message.attempt, message.rank = "r" * 32, 0, stream
        report = message.report
        report.round, report.reported_at = 17, time.time()
        report.metrics_json = f'{{"step": 17, "loss": 0.0555, "rank": {stream}, "lr": 0.001}}'
    return up.SerializeToString()


def agents(port: int, count: int, rounds: int, period_s: float, go, done, started) -> None:
    """The fake agents' process: `count` streams, each sending one message per round, all at once."""
    payload = pb.AgentMessage.FromString(round_message())

    async def main() -> None:
        channels = [aio.insecure_channel(f"127.0.0.1:{port}") for _ in range(count)]
        queues = [asyncio.Queue() for _ in range(count)]

        async def requests(q: asyncio.Queue):
            while True:
                item = await q.get()
                if item is None:
                    return
                yield item

        calls = [pb_grpc.CoordinatorStub(ch).AgentStream(requests(q)) for ch, q in zip(channels, queues)]
        for ch in channels:
            await ch.channel_ready()
        start = started.value = time.time() + 0.5  # the rounds' schedule, shared with the measurer
        go.set()
        for r in range(rounds):
            await asyncio.sleep(max(0.0, start + r * period_s - time.time()))
            for q in queues:
                q.put_nowait(payload)
        for q in queues:
            q.put_nowait(None)
        for call in calls:
            try:
                async for _ in call:
                    pass
            except grpc.RpcError:
                pass
        done.set()
        for ch in channels:
            await ch.close()

    asyncio.run(main())


def measure(count: int, rounds: int, period_s: float) -> dict:
    """One run with `count` fake agents; the server's CPU per message and the rounds' read times."""
    ctx = multiprocessing.get_context("spawn")
    port, counts, started = ctx.Value("i", 0), ctx.Value("q", 0), ctx.Value("d", 0.0)
    server = ctx.Process(target=serve, args=(port, counts), daemon=True)
    server.start()
    deadline = time.monotonic() + 30
    while port.value == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    go, done = ctx.Event(), ctx.Event()
    client = ctx.Process(target=agents, args=(port.value, count, rounds, period_s, go, done, started),
                         daemon=True)
    client.start()
    try:
        if not go.wait(120):
            raise RuntimeError("the fake agents did not connect")
        proc = psutil.Process(server.pid)
        time.sleep(max(0.0, started.value - time.time()))
        cpu0, t0 = sum(proc.cpu_times()[:2]), time.monotonic()
        expected, lags = count * rounds, []
        for r in range(rounds):
            round_start = started.value + r * period_s
            target = count * (r + 1)
            while counts.value < target and time.time() < round_start + 30:
                time.sleep(0.0005)
            lags.append(time.time() - round_start)
        cpu1, t1 = sum(proc.cpu_times()[:2]), time.monotonic()
        done.wait(60)
    finally:
        client.terminate()
        server.terminate()
        client.join(10)
        server.join(10)
    lags.sort()
    return {"agents": count, "messages": expected, "read": counts.value,
            "server_cpu_us_per_message": (cpu1 - cpu0) / max(counts.value, 1) * 1e6,
            "server_cores": (cpu1 - cpu0) / (t1 - t0),
            "round_read_ms_p50": statistics.median(lags) * 1e3, "round_read_ms_max": lags[-1] * 1e3}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", default="64,512")
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--period-s", type=float, default=0.1)
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f}; {len(round_message())} bytes per message")
    print("| agents | messages | server CPU per message (us) | server cores | all of a round read: p50 / max (ms) |")
    print("|---|---|---|---|---|")
    for count in (int(a) for a in args.agents.split(",")):
        f = measure(count, args.rounds, args.period_s)
        print(f"| {count} | {f['read']}/{f['messages']} | {f['server_cpu_us_per_message']:.0f} | "
              f"{f['server_cores']:.2f} | {f['round_read_ms_p50']:.1f} / {f['round_read_ms_max']:.1f} |", flush=True)
    print(json.dumps({"load_after": os.getloadavg()[0]}))


if __name__ == "__main__":
    main()
