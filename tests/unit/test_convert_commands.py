"""Every command record of `minitrain.commands` survives its trip through protobuf (`minitrain.rpc.convert`):
the coordinator's `Hub` converts it to a message, the agent or worker converts it back. And the facts the
agents and workers send read back as the coordinator's records (reports, exits; telemetry in test_telemetry.py,
digests in test_report_digest.py)."""

from __future__ import annotations

import dataclasses
import typing

import pytest

from minitrain import commands as cmd
from minitrain.coordinator.facts import events as ev
from minitrain.records import Phase, ReportRecord, WorkerAssignment
from minitrain.rpc import convert
from minitrain.rpc._gen import minitrain_pb2 as pb

AGENT_COMMANDS = [
    cmd.StartWorkers(attempt=2, workers=(cmd.WorkerLaunch(4, 0), cmd.WorkerLaunch(5, 1)), cwd="/w",
                     env={"A": "1", "B": ""}, relay=True),
    cmd.StartWorkers(attempt=0, workers=(), cwd="", env={}, coordinator_address="10.0.0.1:5000",
                     preemption_signals=("SIGUSR2", "SIGTERM")),
    cmd.StopWorkers(attempt=3, grace_s=2.5),
    cmd.DumpStacks(attempt=1),
    cmd.PrepareForkServers(count=8),
    cmd.PrepareForkServers(count=1, env={"GLOO_SOCKET_IFNAME": "eth0"}, cwd="/w"),
    cmd.PrepareForkServers(count=1, env={}, cwd=""),
    cmd.Shutdown(reason="run ended"),
    cmd.Shutdown(reason="run preempted", preempted=True),
    cmd.StartWorkers(attempt=1, workers=(cmd.WorkerLaunch(0, 0),), cwd="", env={}, memory_tier_bytes=-1,
                     storage=b"\x80pickled", restore=cmd.RestoreView("checkpoint_000004", (
                         cmd.Shard(0, 0, "checkpoint_000004"), cmd.Shard(0, 1, "checkpoint_000004")))),
    cmd.PersistShards(attempt=3, dir_name="checkpoint_000007", ranks=(0, 2)),
    cmd.PersistShards(attempt=0, dir_name="c", ranks=(1,), to_peer=cmd.Peer("node-b", "10.0.0.2", 40123)),
    cmd.StartWorkers(attempt=4, workers=(), cwd="", env={}, memory_tier_bytes=1 << 30, replicas=True,
                     restore=cmd.RestoreView("c", (cmd.Shard(3, 0, "c", ("10.0.0.1:4000", "10.0.0.2:4001")),))),
    cmd.DropShards(shards=(cmd.Shard(1, 0, "c"), cmd.Shard(2, 5, "d"))),
    cmd.DropShards(shards=()),
]
WORKER_COMMANDS = [
    cmd.Assignment(worker=WorkerAssignment(3, 1, 4, 2, 1, "node-b", (0, 1)), experiment_name="exp",
                   backend="nccl", dist_timeout_s=30.0, payload=b"\x00pickle", store_address="10.0.0.1",
                   storage_path="s3://bucket/run", initial_checkpoint_dir="checkpoint_000002",
                   report_index_base=3, committed_dir_names=("checkpoint_000001", "checkpoint_000002")),
    cmd.Assignment(worker=WorkerAssignment(0, 0, 1, 1, 0, "n"), experiment_name="", backend="gloo",
                   dist_timeout_s=1.0, payload=b"", store_address="127.0.0.1", storage_path="/tmp/run"),
    cmd.Rendezvous(address="10.0.0.1", port=29500),
    cmd.PhaseAck(phase=Phase.CHECKPOINT_UPLOAD),
    cmd.ReportReceipt(round=255),
    cmd.ReportAck(round=0),
    cmd.CheckpointList(request_id=7, checkpoints=(cmd.CheckpointEntry("c1", {"loss": 0.5, "tag": "x"}),
                                                  cmd.CheckpointEntry("c2", {}))),
    cmd.CheckpointList(request_id=1, checkpoints=()),
    cmd.Release(),
    cmd.PreemptionNotice(),
    cmd.PreemptionRound(round=7, deadline_ms=1_800_000_000_123, node_ranks=(("n1", (0, 1)), ("n2", ())),
                        signal="SIGUSR2"),
]


def _over_the_wire(message):
    """The message as the other side parses it."""
    return type(message).FromString(message.SerializeToString())


@pytest.mark.parametrize("command", AGENT_COMMANDS, ids=lambda c: type(c).__name__)
def test_agent_commands_round_trip(command):
    message = convert.agent_command_message(command)
    assert isinstance(message, pb.AgentCommand)
    assert convert.agent_command_from_message(_over_the_wire(message)) == command


@pytest.mark.parametrize("command", WORKER_COMMANDS, ids=lambda c: type(c).__name__)
def test_worker_commands_round_trip(command):
    message = convert.worker_command_message(command)
    assert isinstance(message, pb.WorkerCommand)
    back = convert.worker_command_from_message(_over_the_wire(message))
    assert back == command and type(back) is type(command)


def test_every_command_record_is_converted_and_tested():
    """A record added to minitrain.commands needs a converter and a case above."""
    for union, tested in ((cmd.AgentCommand, AGENT_COMMANDS), (cmd.WorkerCommand, WORKER_COMMANDS)):
        assert set(typing.get_args(union)) == {type(c) for c in tested}
    records = {obj for obj in vars(cmd).values() if dataclasses.is_dataclass(obj) and obj.__module__ == cmd.__name__}
    parts = {cmd.WorkerLaunch, cmd.CheckpointEntry, cmd.Shard, cmd.RestoreView, cmd.Peer}  # carried inside other commands
    assert records == set(typing.get_args(cmd.AgentCommand)) | set(typing.get_args(cmd.WorkerCommand)) | parts


def test_transport_messages_are_not_commands():
    assert convert.agent_command_from_message(pb.AgentCommand(heartbeat=pb.Heartbeat(sent_at=1.0))) is None
    assert convert.agent_command_from_message(pb.AgentCommand(relayed=pb.RelayedDown())) is None
    assert convert.agent_command_from_message(pb.AgentCommand()) is None
    assert convert.worker_command_from_message(pb.WorkerCommand()) is None


def test_a_phase_ack_reads_back_as_a_phase():
    message = convert.worker_command_message(cmd.PhaseAck(Phase.TRAINING))
    assert message.phase_ack.phase == pb.PHASE_TRAINING
    assert convert.worker_command_from_message(message).phase is Phase.TRAINING


def test_a_message_s_reports_read_back_as_records_in_order():
    batch = pb.ReportBatch(reports=[
        pb.Report(round=4, metrics_json='{"loss": 1}', reported_at=10.0, wants_receipt=True),
        pb.Report(round=5, metrics_json="{}", reported_at=11.0, checkpoint_dir_name="checkpoint_000001",
                  wants_ack=True, staged=True)])
    assert convert.report_records(2, 7, _over_the_wire(batch).reports) == [
        ReportRecord(2, 7, 4, '{"loss": 1}', 10.0, wants_receipt=True),
        ReportRecord(2, 7, 5, "{}", 11.0, "checkpoint_000001", wants_ack=True, staged=True)]


def test_an_exit_reads_back_with_none_for_the_code_or_signal_it_did_not_have():
    """The wire's zero is "none": a killed process has no exit code, one that exited has no signal."""
    killed = pb.WorkerExited(attempt=1, rank=3, pid=99, signal=9, exited_at=5.0, oom_suspected=True)
    event = ev.WorkerExited("node-a", **convert.exited_fields(_over_the_wire(killed)))
    assert event == ev.WorkerExited("node-a", attempt=1, rank=3, pid=99, exit_code=None, signal=9,
                                    stopped_by_agent=False, time=5.0, oom_suspected=True)
    exited = pb.WorkerExited(attempt=1, rank=0, pid=98, exit_code=0, stopped_by_agent=True, exited_at=6.0,
                             spawn_error="")
    event = ev.WorkerExited("node-a", **convert.exited_fields(exited))
    assert (event.exit_code, event.signal, event.stopped_by_agent) == (0, None, True)
    unborn = convert.exited_fields(pb.WorkerExited(rank=1, exit_code=1, spawn_error="OSError: no memory"))
    assert (unborn["exit_code"], unborn["signal"], unborn["spawn_error"]) == (1, None, "OSError: no memory")
