"""Rank assignment: which node runs which rank (pure).

Ranks are ordered by node (in the order the nodes are given), then by local rank; on GPU nodes the
local rank follows the GPU index, so rank r on a node drives that node's r-th assigned GPU.
"""

from __future__ import annotations

import math
from typing import Optional

from minitrain.errors import ConfigError
from minitrain.records import NodeInfo, WorkerAssignment


def _gpus_held(gpus_per_worker: float) -> float:
    """GPUs one worker occupies: a fraction shares a GPU; above one, whole GPUs are taken."""
    return gpus_per_worker if gpus_per_worker <= 1 else math.ceil(gpus_per_worker - 1e-9)


def _capacity(node: NodeInfo, gpus_per_worker: float, cpus_per_worker: float, slots: Optional[int],
              single_node: bool) -> float:
    room = math.inf if slots is None else slots
    if gpus_per_worker > 0:
        return min(room, math.floor(len(node.gpu_ids) / _gpus_held(gpus_per_worker) + 1e-9))
    if single_node or cpus_per_worker <= 0:
        return room  # on one machine CPU workers may oversubscribe cores, as torchrun allows
    return min(room, math.floor(node.cpus / cpus_per_worker + 1e-9))


def node_capacity(node: NodeInfo, gpus_per_worker: float, cpus_per_worker: float, slots: Optional[int],
                  single_node: bool) -> float:
    """How many workers `node` holds (math.inf: no limit), as `assign_ranks` counts its room."""
    return _capacity(node, gpus_per_worker, cpus_per_worker, slots, single_node)


def _table(nodes: list[NodeInfo], capacity: list[float], slots: dict) -> str:
    rows = [("host", "cpus", "memory", "gpus", "slots", "room")]
    for node, room in zip(nodes, capacity):
        rows.append((node.hostname or node.node_id, str(node.cpus), f"{node.memory_bytes / 2**30:.1f}GiB",
                     str(len(node.gpu_ids)), str(slots.get(node.node_id) or "-"),
                     "any" if room == math.inf else str(int(room))))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths)) for row in rows)


def _gpu_indices(local_rank: int, gpus_per_worker: float) -> tuple[int, ...]:
    if gpus_per_worker <= 0:
        return ()
    if gpus_per_worker <= 1:
        return (math.floor(local_rank * gpus_per_worker + 1e-9),)
    each = int(_gpus_held(gpus_per_worker))
    return tuple(range(local_rank * each, (local_rank + 1) * each))


def _strict_check(nodes: list[NodeInfo], counts: list[int], num_workers: int, strategy: str) -> None:
    used = sum(1 for c in counts if c > 0)
    if strategy == "STRICT_PACK" and used > 1:
        raise ConfigError(
            f"ScalingConfig(placement_strategy='STRICT_PACK') needs all {num_workers} workers on one node, "
            "but no node has room for them all. Use placement_strategy='PACK' to allow several nodes.")
    if strategy == "STRICT_SPREAD" and any(c > 1 for c in counts):
        raise ConfigError(
            f"ScalingConfig(placement_strategy='STRICT_SPREAD') needs a separate node for each of the "
            f"{num_workers} workers, but there are {len(nodes)} node(s). Use placement_strategy='SPREAD' "
            "to allow several workers per node.")


def assign_ranks(nodes: list[NodeInfo], num_workers: int, gpus_per_worker: float = 0.0,
                 placement_strategy: str = "PACK", cpus_per_worker: float = 1.0,
                 slots: Optional[dict] = None) -> list[WorkerAssignment]:
    """Place `num_workers` ranks on `nodes`; ConfigError with a table of what each host has when
    they do not fit.

    A node's room: its `slots` (from the hostfile) if given, and for GPU workers its GPUs; for CPU
    workers on a multi-node run its CPUs / `cpus_per_worker` (one node alone may oversubscribe).

    PACK fills each node to its capacity before the next; SPREAD deals ranks round-robin over the
    nodes that still have room; the STRICT_ variants fail instead of bending (one node for
    STRICT_PACK, one worker per node for STRICT_SPREAD). A fractional GPU share places several
    workers on one GPU; above one GPU, each worker takes whole GPUs.
    """
    counts = rank_counts(nodes, num_workers, gpus_per_worker, placement_strategy, cpus_per_worker, slots)
    assignments = []
    rank = 0
    for node_rank, (i, count) in enumerate((i, c) for i, c in enumerate(counts) if c > 0):
        assignments += _node_ranks(nodes[i], node_rank, rank, count, num_workers, gpus_per_worker)
        rank += count
    return assignments


def node_assignments(nodes: list[NodeInfo], num_workers: int, node_id: str, gpus_per_worker: float = 0.0,
                     placement_strategy: str = "PACK", cpus_per_worker: float = 1.0,
                     slots: Optional[dict] = None) -> list[WorkerAssignment]:
    """Exactly the assignments of `assign_ranks` (same arguments) that land on `node_id`, without
    building the others': an elastic run asks this when a host connects while an attempt runs, and
    placing every rank for each of 2,048 hosts coming back was quadratic (the controller's largest
    cost in the 16,384-worker regain simulation)."""
    counts = rank_counts(nodes, num_workers, gpus_per_worker, placement_strategy, cpus_per_worker, slots)
    rank = node_rank = 0
    for i, count in enumerate(counts):
        if count <= 0:
            continue
        if nodes[i].node_id == node_id:
            return _node_ranks(nodes[i], node_rank, rank, count, num_workers, gpus_per_worker)
        rank += count
        node_rank += 1
    return []


def rank_counts(nodes: list[NodeInfo], num_workers: int, gpus_per_worker: float = 0.0,
                placement_strategy: str = "PACK", cpus_per_worker: float = 1.0,
                slots: Optional[dict] = None) -> list[int]:
    """How many of `num_workers` ranks `assign_ranks` puts on each of `nodes` (in order), with its
    ConfigError when they do not fit. O(nodes): no assignment is built."""
    if num_workers <= 0:
        return [0] * len(nodes)
    slots = slots or {}
    capacity = [_capacity(n, gpus_per_worker, cpus_per_worker, slots.get(n.node_id), len(nodes) == 1)
                for n in nodes]
    counts = [0] * len(nodes)
    if placement_strategy == "STRICT_SPREAD":
        capacity = [min(c, 1) for c in capacity]
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
            f"ScalingConfig asks for {num_workers} workers with {gpus_per_worker:g} GPU(s) and "
            f"{cpus_per_worker:g} CPU(s) each ({placement_strategy}), but the nodes have room for "
            f"{sum(counts)} ({have}). Lower ScalingConfig.num_workers or resources_per_worker['GPU'] "
            f"/ ['CPU'], or add hosts (or slots).\n{_table(nodes, capacity, slots)}"
        )
    _strict_check(nodes, counts, num_workers, placement_strategy)
    return counts


def _node_ranks(node: NodeInfo, node_rank: int, first_rank: int, count: int, num_workers: int,
                gpus_per_worker: float) -> list[WorkerAssignment]:
    """The `count` assignments of `node`, the `node_rank`-th node used, from global rank `first_rank`."""
    return [WorkerAssignment(rank=first_rank + local_rank, local_rank=local_rank, world_size=num_workers,
                             local_world_size=count, node_rank=node_rank, node_id=node.node_id,
                             gpu_ids=_gpu_indices(local_rank, gpus_per_worker))
            for local_rank in range(count)]
