"""The scale simulation's fake agents (bench/scale/clients.py) behave as the real node agent on the wire:
their upward stream coalesces relayed worker messages exactly as `minitrain.agent.transport.relay.coalesced_requests`
does, and relayed commands reach the right fake worker. Also the report pacing of `--phase` and the
command line of `python -m bench scale`. (The whole simulation against the real coordinator runs in
tests/e2e/test_bench_quick.py and tests/process/test_fake_cluster.py.)
"""

from __future__ import annotations

import asyncio
import io
import json
import queue

import pytest

from bench import cli
from bench.scale import client_stats, clients, fake_worker, links, relaunch
from minitrain.agent.transport import relay
from minitrain.rpc import report_window
from minitrain.rpc._gen import minitrain_pb2 as pb
from minitrain.rpc.channel import END_OF_STREAM
from minitrain.rpc.digest import fold_reports

RUN, NODE = "run-1", "node0000"


def _relayed(stream: int, text: str = "x") -> pb.RelayedMessage:
    report = pb.Report(round=0, metrics_json=json.dumps({"t": text}))
    return pb.RelayedMessage(stream=stream, message=pb.WorkerMessage(run_id=RUN, rank=stream, report=report))


def _heartbeat() -> pb.AgentMessage:
    return pb.AgentMessage(run_id=RUN, node_id=NODE, heartbeat=pb.Heartbeat(sent_at=1.0))


async def _take(upstream: links.AgentUpstream, count: int) -> list:
    """The next `count` messages of the fake agent's request iterator, then its end."""
    requests = upstream.requests()
    taken = [await requests.__anext__() for _ in range(count)]
    with pytest.raises(StopAsyncIteration):
        await requests.__anext__()
    return taken


def _real_agent(items: list) -> list:
    """What the real agent's request iterator makes of the same queue (its runs of reports folded into
    digests, as `minitrain.agent.transport.stream` folds them)."""
    outbox: "queue.SimpleQueue" = queue.SimpleQueue()
    for at, item in enumerate(items):  # relayed items are queued with their time, as the agent's stream does
        outbox.put((float(at), [item]) if isinstance(item, pb.RelayedMessage) else item)
    outbox.put(END_OF_STREAM)
    batch = lambda batched, queued_at: pb.AgentMessage(run_id=RUN, node_id=NODE, sent_at=queued_at,  # noqa: E731
                                                       relayed=pb.RelayedUp(items=fold_reports(batched, RUN)))
    bundle = lambda messages: pb.AgentMessage(run_id=RUN, node_id=NODE, sent_at=messages[0].sent_at,  # noqa: E731
                                              batch=pb.AgentBatch(messages=messages))
    return list(relay.coalesced_requests(outbox, batch, bundle))


def test_the_fake_agent_batches_exactly_as_the_real_agent():
    big = "y" * (relay.MAX_BATCH_BYTES // 2)  # two of them do not fit in one batch
    items = [_relayed(1), _relayed(2), _heartbeat(), _relayed(1), pb.RelayedMessage(stream=2, closed=True),
             _relayed(3, big), _relayed(4, big), _relayed(5), _heartbeat()]
    upstream = links.AgentUpstream(RUN, NODE, client_stats.Stats(0))
    for at, item in enumerate(items):
        upstream.put(item, queued_at=float(at))
    upstream.put(links._END)
    fake = asyncio.run(_take(upstream, 2))
    real = _real_agent(items)
    assert [m.SerializeToString() for m in fake] == [m.SerializeToString() for m in real]
    # What was queued together goes as one AgentBatch, stamped with its first message's time; inside,
    # nothing is reordered, runs of relayed items are one RelayedUp (stamped with their first item's
    # time), and the byte cap is kept (the two big items go in different messages). Runs of reports go
    # as digests (their streams listed), the closing item keeps its own place.
    assert [m.WhichOneof("body") for m in fake] == ["batch", "batch"]
    assert [m.sent_at for m in fake] == [0.0, 6.0]
    inner = [list(m.batch.messages) for m in fake]
    assert [[x.sent_at for x in messages if x.HasField("relayed")] for messages in inner] == [[0.0, 3.0], [6.0]]
    shapes = [[[i.stream or list(i.digest.stream) for i in x.relayed.items] if x.HasField("relayed") else "heartbeat"
               for x in messages] for messages in inner]
    assert shapes == [[[[1, 2]], "heartbeat", [[1], 2, [3]]], [[[4, 5]], "heartbeat"]]


def test_an_idle_fake_agent_sends_an_item_at_once_and_batches_what_queues_during_a_write():
    async def scenario():
        stats = client_stats.Stats(0)
        upstream = links.AgentUpstream(RUN, NODE, stats)
        requests = upstream.requests()
        waiting = asyncio.ensure_future(requests.__anext__())
        await asyncio.sleep(0)  # the iterator waits on an empty queue
        upstream.put(_relayed(1))
        alone = await waiting  # an item put while the iterator waits goes at once, alone
        # While gRPC writes that message, three more come: they go together in the next one.
        for stream in (2, 3, 1):
            upstream.put(_relayed(stream))
        together = await requests.__anext__()
        upstream.put(links._END)
        with pytest.raises(StopAsyncIteration):
            await requests.__anext__()
        return alone, together, stats

    alone, together, stats = asyncio.run(scenario())
    assert [list(i.digest.stream) for i in alone.relayed.items] == [[1]]
    assert [list(i.digest.stream) for i in together.relayed.items] == [[2, 3, 1]]  # one digest of the three
    assert (alone.run_id, alone.node_id) == (RUN, NODE)
    assert (stats.messages_up, stats.items_up) == (2, 4) and sum(stats.messages_per_second.values()) == 2


def _simulation(tmp_path, **config) -> clients.Simulation:
    base = {"address": "127.0.0.1:1", "token": "t", "run_id": RUN, "reports": 20, "rate_hz": 10.0, "ack_every": 10,
            "workers": 8, "warmup_rounds": 0, "barrier_dir": str(tmp_path), "processes": 1, "node_ids": [NODE],
            "slots": 8}
    return clients.Simulation({**base, **config})


def test_relayed_commands_reach_their_worker_and_close_ends_its_stream(tmp_path):
    async def scenario():
        sim = _simulation(tmp_path)
        agent = sim.agents[0]
        worker = fake_worker.FakeWorker(sim, agent, attempt=0, rank=3)
        worker.link = agent.open_link(worker)
        other = fake_worker.FakeWorker(sim, agent, attempt=0, rank=4)
        other.link = agent.open_link(other)
        assert (worker.link.number, other.link.number) == (1, 2)  # numbered from 1 in opening order
        worker.sent_at = [0.0] * 8
        down = pb.RelayedDown(items=[
            pb.RelayedCommand(stream=1, command=pb.WorkerCommand(assignment=pb.Assignment(world_size=8))),
            pb.RelayedCommand(stream=1, command=pb.WorkerCommand(report_ack=pb.ReportAck(round=7))),
            pb.RelayedCommand(stream=9, command=pb.WorkerCommand(report_ack=pb.ReportAck(round=0))),  # gone
            pb.RelayedCommand(stream=1, close=True)])
        agent._route(down)
        assert worker.assignment.is_set() and not other.assignment.is_set()
        assert sim.stats.acked == 1 and sim.stats.reordered == 0  # rank 3's first acked round is 7
        assert worker.link.ended.done() and not other.link.ended.done()
        worker.report()  # after its stream was closed: nothing more goes up for it
        # A worker that is gone: its stream's `closed` goes up once, and commands for it are dropped.
        other.link.abort()
        await other.link.close()
        agent._route(pb.RelayedDown(items=[pb.RelayedCommand(stream=2, close=True)]))
        return list(agent.upstream.queued())

    queued = asyncio.run(scenario())
    # Each stream's end goes up once, as the real relay reports it, whoever ended it.
    assert [(m.stream, m.closed) for m in queued] == [(1, True), (2, True)]


def test_lockstep_reports_within_two_milliseconds_random_spread_over_the_period(tmp_path):
    lockstep = clients.slot_offsets("lockstep", 0.1)
    assert len(lockstep) == clients.LOCKSTEP_SLOTS and 0.0 == min(lockstep) and max(lockstep) < 0.002
    spread = clients.slot_offsets("random", 0.1)
    assert len(spread) == clients.RANDOM_SLOTS and max(spread) >= 0.09
    with pytest.raises(ValueError, match="phase"):
        clients.slot_offsets("sometimes", 0.1)
    with pytest.raises(ValueError, match="transport"):
        _simulation(tmp_path, transport="pigeon")
    assert _simulation(tmp_path).transport == "relayed" and _simulation(tmp_path).phase == "lockstep"


def test_scale_command_line_transport_and_phase():
    args = cli.parser().parse_args(["scale"])
    assert (args.transport, args.phase) == ("relayed", "lockstep")
    args = cli.parser().parse_args(["scale", "--transport", "both", "--phase", "random"])
    assert (args.transport, args.phase) == ("both", "random")
    for bad in (["scale", "--transport", "grpc"], ["scale", "--phase", "sync"]):
        with pytest.raises(SystemExit):
            cli.parser().parse_args(bad)


def test_in_lockstep_one_rank_held_by_its_report_window_holds_the_group(tmp_path, monkeypatch):
    """The fake workers keep the real report window; in lockstep a rank waiting for its receipt holds
    every rank (DDP's all_reduce couples them), so their rounds never drift apart."""
    monkeypatch.setattr(report_window, "REPORT_WINDOW", 4)
    monkeypatch.setattr(report_window, "RECEIPT_EVERY", 2)

    def receipt(worker, round_):
        worker.handle(pb.WorkerCommand(report_receipt=pb.ReportReceipt(round=round_)))

    async def until(condition, what):
        deadline = asyncio.get_running_loop().time() + 30.0
        while not condition():
            assert asyncio.get_running_loop().time() < deadline, what
            await asyncio.sleep(0.005)

    async def scenario():
        sim = _simulation(tmp_path, reports=12, rate_hz=500.0)
        agent = sim.agents[0]
        first, second = (fake_worker.FakeWorker(sim, agent, attempt=0, rank=r) for r in (0, 1))
        for worker in (first, second):
            worker.link = agent.open_link(worker)
        slots = [[first, second]] + [[] for _ in sim.offsets[1:]]
        ticker = asyncio.ensure_future(sim._ticker(slots))
        await until(lambda: sim.stats.held_back > 0, "the window held the group")
        assert [len(w.sent_at) for w in (first, second)] == [4, 4]
        receipt(first, 1)  # only one rank may go on: the group may not
        held = sim.stats.held_back
        await until(lambda: sim.stats.held_back >= held + 4, "the group still held")
        assert [len(w.sent_at) for w in (first, second)] == [4, 4]
        receipt(second, 1)
        await until(lambda: sim.stats.held_back >= held + 8 and len(second.sent_at) == 6, "two more rounds")
        assert [len(w.sent_at) for w in (first, second)] == [6, 6]
        for worker in (first, second):
            receipt(worker, 11)
        await asyncio.wait_for(ticker, 30.0)
        sent = [item.message.report for item in agent.upstream.queued() if item.message.HasField("report")]
        return [(r.round, r.wants_receipt) for r in sent]

    sent = asyncio.run(scenario())
    assert [round_ for round_, _ in sent] == sorted(list(range(12)) * 2)
    assert {round_ for round_, wants in sent if wants} == {1, 3, 5, 7, 9, 11}


def test_a_relaunch_request_round_trips_and_the_reader_ends_with_its_stream():
    posted = []
    lines = io.StringIO((relaunch.request("node0007") + b"\n" + relaunch.request("node0001")).decode())
    relaunch.read_requests(lines, posted.append).join(timeout=10)
    assert posted == ["node0007", "node0001"]  # in order; a blank line is skipped; EOF ends the thread


def test_a_relaunched_agent_counts_in_an_attempt_only_once_it_got_its_workers(tmp_path):
    """An attempt placed before the relaunched agent connected leaves it out: the clients' barrier must
    not wait for its workers there; it counts in the first attempt that starts workers on it."""
    async def scenario():
        sim = _simulation(tmp_path, node_ids=["node0000", "node0001"], workers=16)
        assert sim.expected_in_attempt(0) == 16
        sim.agents[1].lose()
        assert sim.expected_in_attempt(1) == 8 and len(sim.stats.lost_at) == 1
        lost = sim.agents[1]
        sim.relaunch("node0001")
        back = sim.agents[1]
        assert back is not lost and back.relaunched and back.node_id == "node0001"
        assert len(sim.stats.relaunched_at) == 1 and len(sim.stats.lost_at) == 1  # a relaunch is no loss
        assert sim.expected_in_attempt(1) == 8  # attempt 1 was placed without it
        back.started_attempts.add(2)
        assert sim.expected_in_attempt(2) == 16
        for run in sim._agent_runs:
            run.cancel()

    asyncio.run(scenario())


def test_rank_0_reports_a_checkpoint_every_n_reports_written_where_it_is_committed(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()

    async def scenario():
        sim = _simulation(tmp_path, checkpoint_every=3, run_dir=str(run_dir), reports=7)
        agent = sim.agents[0]
        zero, one = (fake_worker.FakeWorker(sim, agent, attempt=2, rank=r) for r in (0, 1))
        for worker in (zero, one):
            worker.link = agent.open_link(worker)
            while worker.report():
                pass
        return zero, [(i.message.rank, i.message.report) for i in agent.upstream.queued()
                      if i.message.HasField("report")]

    zero, sent = asyncio.run(scenario())
    named = [(rank, r.round, r.checkpoint_dir_name, r.wants_ack) for rank, r in sent if r.checkpoint_dir_name]
    assert named == [(0, 2, "checkpoint_attempt2_000002", True), (0, 5, "checkpoint_attempt2_000005", True)]
    for _, _, name, _ in named:
        assert (run_dir / name / "state.txt").read_text().startswith("attempt 2")
    assert not any(r.staged for _, r in sent)  # written in place: the coordinator commits without moving
    assert zero.expected_acks() == len([r for rank, r in sent if rank == 0 and r.wants_ack])
