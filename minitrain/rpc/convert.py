"""The only translation between protobuf messages and minitrain records (L1).

Servicers and clients call these functions at the edge; everything past them works with the frozen
dataclasses of `minitrain.records`.
"""

from __future__ import annotations

from minitrain.records import FailureKind, NodeInfo, Phase, WorkerAssignment, WorkerFailure
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


def assignment_message(assignment: WorkerAssignment, *, experiment_name: str, backend: str,
                       dist_timeout_s: float, payload: bytes, store_address: str,
                       storage_path: str) -> pb.Assignment:
    """The Assignment a worker receives after its hello."""
    return pb.Assignment(
        rank=assignment.rank,
        local_rank=assignment.local_rank,
        world_size=assignment.world_size,
        local_world_size=assignment.local_world_size,
        node_rank=assignment.node_rank,
        node_id=assignment.node_id,
        experiment_name=experiment_name,
        backend=backend,
        dist_timeout_s=dist_timeout_s,
        payload=payload,
        store_address=store_address,
        gpu_ids=list(assignment.gpu_ids),
        storage_path=storage_path,
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
