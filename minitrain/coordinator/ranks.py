"""Rank assignment: which node runs which rank (pure).

Ranks are ordered by node (in the order the nodes are given), then by local rank; on GPU nodes the
local rank follows the GPU index, so rank r on a node drives that node's r-th assigned GPU.
"""

from __future__ import annotations

import math

from minitrain.errors import ConfigError
from minitrain.records import NodeInfo, WorkerAssignment


def _capacity(node: NodeInfo, gpus_per_worker: float) -> float:
    if gpus_per_worker > 0:
        return math.floor(len(node.gpu_ids) / gpus_per_worker + 1e-9)
    return math.inf  # CPU workers may oversubscribe cores, as torchrun allows


def assign_ranks(nodes: list[NodeInfo], num_workers: int, gpus_per_worker: float = 0.0,
                 placement_strategy: str = "PACK") -> list[WorkerAssignment]:
    """Place `num_workers` ranks on `nodes`; ConfigError naming what is missing when they do not fit.

    PACK fills each node to its capacity before the next; SPREAD deals ranks round-robin over the
    nodes that still have room. Each worker gets ceil(gpus_per_worker) GPU indices of its node.
    """
    if num_workers <= 0:
        return []
    capacity = [_capacity(n, gpus_per_worker) for n in nodes]
    counts = [0] * len(nodes)
    if placement_strategy in ("SPREAD", "STRICT_SPREAD"):
        placed = 0
        while placed < num_workers:
            progress = False
            for i in range(len(nodes)):
                if placed < num_workers and counts[i] < capacity[i]:
                    counts[i] += 1
                    placed += 1
                    progress = True
            if not progress:
                break
    else:
        remaining = num_workers
        for i in range(len(nodes)):
            take = min(remaining, capacity[i])
            counts[i] = int(take)
            remaining -= counts[i]
    if sum(counts) < num_workers:
        have = ", ".join(f"{n.hostname}: {len(n.gpu_ids)} GPU(s)" for n in nodes) or "no nodes"
        raise ConfigError(
            f"ScalingConfig asks for {num_workers} workers with {gpus_per_worker:g} GPU(s) each, but the "
            f"nodes have room for {sum(counts)} ({have}). Lower ScalingConfig.num_workers or "
            "resources_per_worker['GPU'], or add hosts."
        )
    gpus_each = math.ceil(gpus_per_worker) if gpus_per_worker > 0 else 0
    used = [(i, c) for i, c in enumerate(counts) if c > 0]
    assignments = []
    rank = 0
    for node_rank, (i, count) in enumerate(used):
        node = nodes[i]
        for local_rank in range(count):
            gpu_ids = tuple(range(local_rank * gpus_each, (local_rank + 1) * gpus_each))
            assignments.append(WorkerAssignment(
                rank=rank, local_rank=local_rank, world_size=num_workers, local_world_size=count,
                node_rank=node_rank, node_id=node.node_id, gpu_ids=gpu_ids,
            ))
            rank += 1
    return assignments
