"""The only translation between protobuf messages and minitrain records (L1).

Servicers and clients call these functions at the edge; everything past them works with the records of
`minitrain.records` and the commands of `minitrain.commands`. Every record made from a message is made
here; the transport modules wrap the records in the coordinator's events (which rpc/, one layer down,
cannot import).

The report conversions (`report_records`, `reports_from_digest`) run once per report of every rank: they
read each field once and build the `ReportRecord` named tuple directly, with nothing per report in between.
"""

from __future__ import annotations

import json
import time
from itertools import repeat
from typing import Callable, Iterable, Optional

from minitrain import commands as cmd
from minitrain.records import (FailureKind, GpuSample, NodeInfo, Phase, ReportRecord, TelemetrySample,
                               WorkerAssignment, WorkerFailure)
from minitrain.rpc._gen import minitrain_pb2 as pb


def node_from_hello(node_id: str, hello: pb.AgentHello, peer_address: str) -> NodeInfo:
    """A NodeInfo from an agent's hello. The node's address is the one it reported on its route to
    the coordinator; `peer_address` (how the coordinator saw it connect) is the fallback."""
    return NodeInfo(
        node_id=node_id,
        hostname=hello.hostname,
        address=hello.address or peer_address,
        ifname=hello.ifname,
        agent_pid=hello.pid,
        cpus=hello.cpus,
        memory_bytes=hello.memory_bytes,
        gpu_ids=tuple(hello.gpu_ids),
        python=hello.python,
        minitrain_version=hello.minitrain_version,
    )


def hello_from_node(node: NodeInfo) -> pb.AgentHello:
    """The agent's hello for a NodeInfo (the address is observed by the coordinator, not sent)."""
    return pb.AgentHello(
        hostname=node.hostname, pid=node.agent_pid, minitrain_version=node.minitrain_version,
        python=node.python, cpus=node.cpus, memory_bytes=node.memory_bytes, gpu_ids=list(node.gpu_ids),
        address=node.address, ifname=node.ifname,
    )


def failure_from_message(rank: int, node: str, pid: int, message: pb.WorkerFailure) -> WorkerFailure:
    """A WorkerFailure from the exception a worker reported (exit code/signal are added later): a
    worker only ever reports FailureKind.EXCEPTION."""
    return WorkerFailure(
        rank=rank, node=node, pid=pid, phase=Phase(message.phase), time=message.failed_at,
        exc_type=message.exc_type, message=message.message, traceback=message.traceback,
        kind=FailureKind.EXCEPTION,
    )


def failure_message(failure: WorkerFailure, exc_pickle: bytes = b"") -> pb.WorkerFailure:
    """The proto form of a captured exception, sent by the worker."""
    return pb.WorkerFailure(
        phase=int(failure.phase), exc_type=failure.exc_type, message=failure.message,
        traceback=failure.traceback, exc_pickle=exc_pickle, failed_at=failure.time,
    )


def telemetry_message(sample: TelemetrySample) -> pb.Telemetry:
    """The Telemetry message of a worker's sample, sent by the worker (at most once a second per rank).
    A None figure stays unset (the coordinator reads it back as None); `attempt` and `rank` are not
    sent (the stream carries them), nor are `host`, `pid` and `phase` (the coordinator knows them)."""
    message = pb.Telemetry(sampled_at=sample.time, reports=sample.reports, total=sample.total or 0,
                           step_time_s=sample.step_time_s, report_wait_s=sample.report_wait_s,
                           collective_wait_s=sample.collective_wait_s, data_wait_s=sample.data_wait_s,
                           cpu_percent=sample.cpu_percent, rss_bytes=sample.rss_bytes)
    message.gpus.extend(pb.GpuSample(index=g.index, util_percent=g.util_percent,
                                     memory_used_bytes=g.memory_used_bytes,
                                     memory_total_bytes=g.memory_total_bytes) for g in sample.gpus)
    return message


# ---------------------------------------------------------------------------- what workers and agents send


def report_records(attempt: int, rank: int, reports: Iterable[pb.Report]) -> list[ReportRecord]:
    """The records of one worker message's reports (its `report`, or its `report_batch`'s), in order."""
    return [ReportRecord(attempt, rank, report.round, report.metrics_json, report.reported_at,
                         report.checkpoint_dir_name, report.wants_ack, report.staged, report.wants_receipt,
                         report.in_tier)
            for report in reports]


def reports_from_digest(digest: pb.ReportDigest) -> list[ReportRecord]:
    """The reports of a progress digest (`minitrain.rpc.digest`) as records, in order; a digest carries no
    checkpoints. One `map` over the columns, which the protobuf runtime decodes in C: no Python per field.
    Raises ValueError when its columns differ in length (a malformed digest: nothing of it is used)."""
    count = len(digest.stream)
    columns = (digest.attempt, digest.rank, digest.round, digest.metrics_json, digest.reported_at,
               digest.wants_ack, digest.wants_receipt)
    if any(len(column) != count for column in columns):
        raise ValueError(f"a report digest's columns differ in length ({count} streams, "
                         f"{[len(c) for c in columns]}): the agent runs another minitrain version")
    attempts, ranks, rounds, metrics, stamps, acks, receipts = columns
    return list(map(ReportRecord, attempts, ranks, rounds, metrics, stamps, repeat(""), acks, repeat(False),
                    receipts))


def telemetry_from_message(attempt: int, rank: int, message: pb.Telemetry) -> TelemetrySample:
    """The sample a Telemetry message carries (an absent optional field is None; `host`, `pid` and
    `phase` stay empty: the coordinator knows them)."""
    def optional(name: str):
        return getattr(message, name) if message.HasField(name) else None

    gpus = tuple(GpuSample(g.index, g.util_percent, g.memory_used_bytes, g.memory_total_bytes)
                 for g in message.gpus)
    return TelemetrySample(
        attempt=attempt, rank=rank, time=message.sampled_at, reports=message.reports,
        step_time_s=optional("step_time_s"), report_wait_s=optional("report_wait_s"),
        collective_wait_s=optional("collective_wait_s"), data_wait_s=optional("data_wait_s"),
        cpu_percent=optional("cpu_percent"), rss_bytes=optional("rss_bytes"), gpus=gpus,
        total=message.total or None)


def unknown_message_failure(rank: int, kind: Optional[str]) -> WorkerFailure:
    """The failure of a rank that sent a message of a kind this side does not know (`kind`, None for an
    empty one): it runs another minitrain version."""
    return WorkerFailure(
        rank=rank, node="", pid=0, phase=Phase.TRAINING, time=time.time(), exc_type="ProtocolMismatch",
        message=f"rank {rank} sent a message this coordinator does not know ({kind or 'empty'}): the worker "
                "runs another minitrain version than the driver; install the same version on every host")


def exited_fields(exited: pb.WorkerExited) -> dict:
    """The facts of an agent's WorkerExited message, as the keyword arguments (all but `node_id`) of the
    coordinator's event of the same name (`minitrain.coordinator.facts.events.WorkerExited`, a layer up).
    A process killed by a signal has no exit code, and one that exited has no signal: the wire's zero is
    None here."""
    return dict(attempt=exited.attempt, rank=exited.rank, pid=exited.pid,
                exit_code=None if exited.signal else exited.exit_code, signal=exited.signal or None,
                stopped_by_agent=exited.stopped_by_agent, time=exited.exited_at, spawn_error=exited.spawn_error,
                oom_suspected=exited.oom_suspected)


# ---------------------------------------------------------------------------- commands to agents


def _shards(shards) -> list:
    return [pb.Shard(attempt=s.attempt, rank=s.rank, dir_name=s.dir_name, sources=list(s.sources)) for s in shards]


def _shard_records(shards) -> tuple[cmd.Shard, ...]:
    return tuple(cmd.Shard(s.attempt, s.rank, s.dir_name, tuple(s.sources)) for s in shards)


def _persist(c: cmd.PersistShards) -> pb.AgentCommand:
    persist = pb.PersistShards(attempt=c.attempt, dir_name=c.dir_name, ranks=list(c.ranks))
    if c.to_peer is not None:
        persist.to_peer.CopyFrom(pb.Peer(node_id=c.to_peer.node_id, host=c.to_peer.host, port=c.to_peer.port))
    return pb.AgentCommand(persist=persist)


def _start_workers(c: cmd.StartWorkers) -> pb.AgentCommand:
    start = pb.StartWorkers(
        attempt=c.attempt, workers=[pb.WorkerLaunch(rank=w.rank, local_rank=w.local_rank) for w in c.workers],
        cwd=c.cwd, env=dict(c.env), relay=c.relay, coordinator_address=c.coordinator_address,
        preemption_signals=list(c.preemption_signals), memory_tier_bytes=c.memory_tier_bytes, storage=c.storage,
        replicas=c.replicas)
    if c.restore is not None:
        start.restore.CopyFrom(pb.RestoreView(dir_name=c.restore.dir_name, shards=_shards(c.restore.shards)))
    return pb.AgentCommand(start=start)


_AGENT_COMMANDS: dict[type, Callable[..., pb.AgentCommand]] = {
    cmd.StartWorkers: _start_workers,
    cmd.StopWorkers: lambda c: pb.AgentCommand(stop=pb.StopWorkers(attempt=c.attempt, grace_s=c.grace_s)),
    cmd.DumpStacks: lambda c: pb.AgentCommand(dump_stacks=pb.DumpStacks(attempt=c.attempt)),
    cmd.PrepareForkServers: lambda c: pb.AgentCommand(prepare_fork_servers=pb.PrepareForkServers(
        count=c.count, for_start=c.env is not None, cwd=c.cwd, env=dict(c.env or {}))),
    cmd.Shutdown: lambda c: pb.AgentCommand(shutdown=pb.Shutdown(reason=c.reason, preempted=c.preempted)),
    cmd.PersistShards: _persist,
    cmd.DropShards: lambda c: pb.AgentCommand(drop=pb.DropShards(shards=_shards(c.shards))),
}


def agent_command_message(command: cmd.AgentCommand) -> pb.AgentCommand:
    """The AgentCommand message of a command record (KeyError for anything else)."""
    return _AGENT_COMMANDS[type(command)](command)


def agent_command_from_message(message: pb.AgentCommand) -> Optional[cmd.AgentCommand]:
    """The command record an AgentCommand carries; None for the transport's own messages (heartbeat,
    relayed worker streams) and for an empty one."""
    kind = message.WhichOneof("body")
    if kind == "start":
        s = message.start
        return cmd.StartWorkers(
            attempt=s.attempt, workers=tuple(cmd.WorkerLaunch(w.rank, w.local_rank) for w in s.workers),
            cwd=s.cwd, env=dict(s.env), relay=s.relay, coordinator_address=s.coordinator_address,
            preemption_signals=tuple(s.preemption_signals), memory_tier_bytes=s.memory_tier_bytes,
            storage=s.storage, replicas=s.replicas,
            restore=cmd.RestoreView(s.restore.dir_name, _shard_records(s.restore.shards))
            if s.HasField("restore") else None)
    if kind == "stop":
        return cmd.StopWorkers(attempt=message.stop.attempt, grace_s=message.stop.grace_s)
    if kind == "dump_stacks":
        return cmd.DumpStacks(attempt=message.dump_stacks.attempt)
    if kind == "prepare_fork_servers":
        p = message.prepare_fork_servers
        return cmd.PrepareForkServers(count=p.count, env=dict(p.env) if p.for_start else None, cwd=p.cwd)
    if kind == "shutdown":
        return cmd.Shutdown(reason=message.shutdown.reason, preempted=message.shutdown.preempted)
    if kind == "persist":
        p = message.persist
        peer = cmd.Peer(p.to_peer.node_id, p.to_peer.host, p.to_peer.port) if p.HasField("to_peer") else None
        return cmd.PersistShards(attempt=p.attempt, dir_name=p.dir_name, ranks=tuple(p.ranks), to_peer=peer)
    if kind == "drop":
        return cmd.DropShards(_shard_records(message.drop.shards))
    return None


# ---------------------------------------------------------------------------- commands to workers


def _assignment(c: cmd.Assignment) -> pb.WorkerCommand:
    w = c.worker
    return pb.WorkerCommand(assignment=pb.Assignment(
        rank=w.rank, local_rank=w.local_rank, world_size=w.world_size, local_world_size=w.local_world_size,
        node_rank=w.node_rank, node_id=w.node_id, gpu_ids=list(w.gpu_ids),
        experiment_name=c.experiment_name, backend=c.backend, dist_timeout_s=c.dist_timeout_s,
        payload=c.payload, store_address=c.store_address, storage_path=c.storage_path,
        initial_checkpoint_dir=c.initial_checkpoint_dir, report_index_base=c.report_index_base,
        committed_dir_names=list(c.committed_dir_names)))


def _checkpoint_list(c: cmd.CheckpointList) -> pb.WorkerCommand:
    entries = [pb.CheckpointEntry(dir_name=e.dir_name, metrics_json=json.dumps(e.metrics)) for e in c.checkpoints]
    return pb.WorkerCommand(checkpoint_list=pb.CheckpointList(request_id=c.request_id, checkpoints=entries))


# The two commands sent per report (receipts, commit acknowledgements) come first: the lookup is by
# exact type, so order does not matter for speed, only for reading.
_WORKER_COMMANDS: dict[type, Callable[..., pb.WorkerCommand]] = {
    cmd.ReportReceipt: lambda c: pb.WorkerCommand(report_receipt=pb.ReportReceipt(round=c.round)),
    cmd.ReportAck: lambda c: pb.WorkerCommand(report_ack=pb.ReportAck(round=c.round)),
    cmd.Assignment: _assignment,
    cmd.Rendezvous: lambda c: pb.WorkerCommand(rendezvous=pb.Rendezvous(master_addr=c.address, master_port=c.port)),
    cmd.PhaseAck: lambda c: pb.WorkerCommand(phase_ack=pb.PhaseAck(phase=int(c.phase))),
    cmd.CheckpointList: _checkpoint_list,
    cmd.Release: lambda c: pb.WorkerCommand(release=pb.Release()),
    cmd.PreemptionNotice: lambda c: pb.WorkerCommand(preemption_notice=pb.PreemptionNotice()),
    cmd.PreemptionRound: lambda c: pb.WorkerCommand(preemption_round=pb.PreemptionRound(
        round=c.round, deadline_ms=c.deadline_ms, signal=c.signal,
        preempted=[pb.NodeRanks(node_id=node, ranks=list(ranks)) for node, ranks in c.node_ranks])),
}


def worker_command_message(command: cmd.WorkerCommand) -> pb.WorkerCommand:
    """The WorkerCommand message of a command record (KeyError for anything else)."""
    return _WORKER_COMMANDS[type(command)](command)


def assignment_from_message(a: pb.Assignment) -> cmd.Assignment:
    """The Assignment record of an Assignment message."""
    worker = WorkerAssignment(rank=a.rank, local_rank=a.local_rank, world_size=a.world_size,
                              local_world_size=a.local_world_size, node_rank=a.node_rank, node_id=a.node_id,
                              gpu_ids=tuple(a.gpu_ids))
    return cmd.Assignment(
        worker=worker, experiment_name=a.experiment_name, backend=a.backend, dist_timeout_s=a.dist_timeout_s,
        payload=a.payload, store_address=a.store_address, storage_path=a.storage_path,
        initial_checkpoint_dir=a.initial_checkpoint_dir, report_index_base=a.report_index_base,
        committed_dir_names=tuple(a.committed_dir_names))


def worker_command_from_message(message: pb.WorkerCommand) -> Optional[cmd.WorkerCommand]:
    """The command record a WorkerCommand carries; None for an empty one (or an Abort, which the
    coordinator never sends)."""
    kind = message.WhichOneof("body")
    if kind == "report_receipt":
        return cmd.ReportReceipt(message.report_receipt.round)
    if kind == "report_ack":
        return cmd.ReportAck(message.report_ack.round)
    if kind == "assignment":
        return assignment_from_message(message.assignment)
    if kind == "rendezvous":
        return cmd.Rendezvous(message.rendezvous.master_addr, message.rendezvous.master_port)
    if kind == "phase_ack":
        return cmd.PhaseAck(Phase(message.phase_ack.phase))
    if kind == "checkpoint_list":
        listing = message.checkpoint_list
        return cmd.CheckpointList(listing.request_id, tuple(
            cmd.CheckpointEntry(e.dir_name, json.loads(e.metrics_json)) for e in listing.checkpoints))
    if kind == "release":
        return cmd.Release()
    if kind == "preemption_notice":
        return cmd.PreemptionNotice()
    if kind == "preemption_round":
        r = message.preemption_round
        return cmd.PreemptionRound(round=r.round, deadline_ms=r.deadline_ms, signal=r.signal,
                                   node_ranks=tuple((n.node_id, tuple(n.ranks)) for n in r.preempted))
    return None
