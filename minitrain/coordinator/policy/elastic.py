"""Elastic sizes (pure): what makes a run elastic, how many workers its next attempt gets, and why it was
resized.

`Sizing` is the one record of an elastic run's bounds and clocks: the trainer builds it from
`ScalingConfig(num_workers=(min, max))`, `RunSpec.sizing` carries it, and `Rules` reads it (`Rules.elastic`
is the one answer to "is this run elastic?"). `decide` says *that* an elastic run restarts as a resize
(actions.SHRINK after a node loss, GROW when more workers fit); this module is the one owner of *how many*
workers that is (`fitting_workers`, `attempt_size`) and of the one line that explains a resize (`Resize`,
`resize_reason`). `coordinator/sizing.py` asks it at every start and whenever the usable nodes change.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Mapping, Optional

from minitrain.coordinator.policy.actions import GROW, SHRINK
from minitrain.coordinator.policy.ranks import node_capacity, rank_counts
from minitrain.errors import ConfigError
from minitrain.records import NodeInfo


@dataclass(frozen=True)
class Sizing:
    """An elastic run's sizing: an attempt starts with at least `min_workers` workers (its most is the run's
    `RunSpec.num_workers`); lost hosts are probed again, and growth looked for, every `resize_interval_s`
    (ScalingConfig.elastic_resize_monitor_interval_s); the first start waits up to `start_wait_s`
    (knobs.ELASTIC_START_WAIT_S) for more hosts once `min_workers` fit. A fixed-size run has none."""

    min_workers: int
    resize_interval_s: float = 60.0
    start_wait_s: float = 5.0


@dataclass(frozen=True)
class Resize:
    """An elastic run's attempt `attempt` started with `to_workers` workers where the one before had
    `from_workers`, at `time` (the driver's clock), because of `reason` (one line)."""

    attempt: int
    from_workers: int
    to_workers: int
    reason: str
    time: float

    @property
    def line(self) -> str:
        """The log's line: "resize 2 -> 1 workers: host h1 lost (...)"."""
        return f"resize {self.from_workers} -> {self.to_workers} workers: {self.reason}"

    def as_dict(self) -> dict:
        """The fields as a dict (an events.jsonl "resize" entry, `minitrain.result.Resize.from_dict`)."""
        return {"attempt": self.attempt, "from_workers": self.from_workers, "to_workers": self.to_workers,
                "reason": self.reason, "time": self.time}


def fitting_workers(nodes: list[NodeInfo], most: int, gpus_per_worker: float = 0.0, placement_strategy: str = "PACK",
                    cpus_per_worker: float = 1.0, slots: Optional[Mapping[str, Optional[int]]] = None) -> int:
    """The largest worker count <= `most` that `assign_ranks` places on `nodes` (0 when none fits).

    Starts from the nodes' summed room, so a cluster with room for all `most` costs one count of the
    ranks per node (`rank_counts`, O(nodes): it is recomputed whenever a node connects or is lost)."""
    slots = dict(slots or {})
    room = sum(node_capacity(node, gpus_per_worker, cpus_per_worker, slots.get(node.node_id), len(nodes) == 1)
               for node in nodes)
    count = int(min(most, room)) if room != math.inf else most
    while count > 0:
        try:
            rank_counts(nodes, count, gpus_per_worker, placement_strategy, cpus_per_worker, slots)
            return count
        except ConfigError:  # a STRICT_ strategy refuses counts the summed room allows
            count -= 1
    return 0


def attempt_size(fits: int, min_workers: int, max_workers: int) -> int:
    """An elastic attempt's worker count: what fits, at most `max_workers`; ConfigError (naming the
    numbers and the fix) when fewer than `min_workers` fit."""
    if fits < min_workers:
        raise ConfigError(f"only {fits} worker(s) fit on the hosts that are in the run, but "
                          f"ScalingConfig(num_workers=({min_workers}, {max_workers})) needs at least {min_workers}. "
                          f"Add hosts (or slots), or lower the elastic minimum.")
    return min(fits, max_workers)


def resize_reason(kind: str, lost: Mapping[str, str], joined: Iterable[str]) -> str:
    """Why an elastic run was resized: for SHRINK the nodes of the previous attempt that were lost
    (node -> why), for GROW the nodes the new attempt uses that the previous one did not."""
    if kind == SHRINK and lost:
        return "; ".join(f"host {node} lost ({why})" for node, why in sorted(lost.items()))
    if kind == GROW:
        names = sorted(joined)
        return (f"host(s) {', '.join(names)} back in the run" if names else "more workers fit") + \
            ", at the checkpoint boundary"
    return "the hosts in the run hold a different number of workers"
