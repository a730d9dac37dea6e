"""How many workers each attempt of a run gets and where they go, as the nodes come and go (the shell,
beside the controller).

A fixed-size run's attempt gets `RunSpec.num_workers` workers; an elastic run's (`Rules.elastic`) as many as
fit on the usable nodes, between its `Sizing.min_workers` and `num_workers` (the numbers are
coordinator/policy/elastic.py's). For an elastic run `AttemptSizes` also
- adds what `decide` reads of sizes to its `Seen` (`fits`, `fits_ready`, `size`, `lost_in_attempt`,
  `probe_due`), recomputing what fits only when the membership changed;
- explains a resize (one log line) and tells the observers (`on_resize`) when an attempt starts at another
  size than the one before, naming the nodes lost in that attempt or the nodes joined;
- gets a node that connects while an attempt runs without it ready for the start it would get if the run
  grew now (its warm-up), so that growing onto it forks warm workers.
It decides nothing: *that* a run resizes is `decide`'s; the controller calls this at its moments.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Callable, Mapping, Optional, Protocol

from minitrain.coordinator.facts import events as ev
from minitrain.coordinator.facts.attempt import AttemptTracker
from minitrain.coordinator.facts.membership import Membership
from minitrain.coordinator.facts.outbox import Outbox
from minitrain.coordinator.facts.worker_group import LaunchSettings, WorkerGroup, warm_up_command
from minitrain.coordinator.observers import Observers
from minitrain.coordinator.policy.elastic import Resize, attempt_size, fitting_workers, resize_reason
from minitrain.coordinator.policy.loop import Rules, Seen
from minitrain.coordinator.policy.ranks import assign_ranks, node_assignments
from minitrain.errors import ConfigError
from minitrain.records import NodeInfo, WorkerAssignment

logger = logging.getLogger("minitrain")


class SizedRun(Protocol):
    """The part of the controller's `RunSpec` that sizes and places an attempt."""

    num_workers: int  # an elastic run's max
    gpus_per_worker: float
    cpus_per_worker: float
    placement_strategy: str
    node_slots: Mapping[str, Optional[int]]
    launch: LaunchSettings  # what a node readied for growth is told


class AttemptSizes:
    """The size and placement of each attempt of the run `spec` under `rules`, on the nodes `membership`
    holds; resizes are told to `observers`, warm-ups sent through `outbox`."""

    def __init__(self, spec: SizedRun, rules: Rules, membership: Membership, outbox: Outbox,
                 observers: Observers, clock: Callable[[], float]):
        self._spec = spec
        self._rules = rules
        self._membership = membership
        self._outbox = outbox
        self._observers = observers
        self._clock = clock
        self._fits = (-1, 0)  # (membership version, workers its usable nodes hold)
        self._fits_ready = (-1, 0)  # (membership version, workers its ready nodes hold)
        self._lost_in_attempt: dict[str, str] = {}  # node id -> why, for the current attempt's lost nodes

    # ------------------------------------------------------------------ placing an attempt

    def placed(self, nodes: list[NodeInfo]) -> list[WorkerAssignment]:
        """The ranks of an attempt started on `nodes` now: `num_workers` of them, or for an elastic run
        as many as fit (`elastic.attempt_size`); ConfigError when they do not fit."""
        spec = self._spec
        count = spec.num_workers
        if self._rules.elastic:
            count = attempt_size(self._fitting(nodes), self._rules.sizing.min_workers, spec.num_workers)
        return assign_ranks(nodes, count, spec.gpus_per_worker, spec.placement_strategy, spec.cpus_per_worker,
                            dict(spec.node_slots))

    def started(self, attempt: int, resize: str, previous: Optional[AttemptTracker],
                current: AttemptTracker) -> None:
        """`attempt` started (`current`; `previous` is the attempt before, None for the first), as a
        resize of kind `resize` ("" for any other start). When an elastic run's size differs from the
        previous attempt's, say why (one log line) and tell the observers."""
        lost, self._lost_in_attempt = self._lost_in_attempt, {}
        if not self._rules.elastic or previous is None:
            return
        before, after = len(previous.ranks), len(current.ranks)
        if before == after:
            if resize:
                logger.warning("attempt %d: %d workers again (not a failure: %s)", attempt, after,
                               resize_reason(resize, lost, ()))
            return
        joined = current.nodes() - previous.nodes()
        change = Resize(attempt, before, after, resize_reason(resize, lost, joined), self._clock())
        logger.warning("%s (attempt %d; not a failure)", change.line, attempt)
        self._observers.on_resize(change)

    def node_lost(self, node_id: str, reason: str, tracker: Optional[AttemptTracker]) -> None:
        """`node_id` is out of the run: when the current attempt (`tracker`) ran on it, a resize that
        follows names it."""
        if tracker is not None and node_id in tracker.nodes():  # the host as listed (hostnames may repeat)
            self._lost_in_attempt[node_id] = reason

    # ------------------------------------------------------------------ what decide reads

    def seen(self, seen: Seen, group: Optional[WorkerGroup], judging: bool, checkpoints_committed: int) -> Seen:
        """`seen` with an elastic run's facts added (unchanged for a fixed-size run): what fits now, the
        current attempt's (`group`'s) size, the checkpoints committed so far, whether a lost host may be
        probed, and (while a failed attempt is being `judging`) whether it lost a node."""
        if not self._rules.elastic:
            return seen
        membership = self._membership
        size = len(group.tracker.ranks) if group is not None else 0
        lost = judging and group is not None and group.tracker.lost_a_node()
        return dataclasses.replace(
            seen, fits=self._fits_now(), fits_ready=self._fits_ready_now(), size=size, lost_in_attempt=lost,
            checkpoints_committed=checkpoints_committed,
            probe_due=bool(membership.lost) and size < self._spec.num_workers and membership.probe_due())

    def _fitting(self, nodes: list[NodeInfo]) -> int:
        """How many workers `nodes` hold, at most the run's max (`elastic.fitting_workers`)."""
        spec = self._spec
        return fitting_workers(nodes, spec.num_workers, spec.gpus_per_worker, spec.placement_strategy,
                               spec.cpus_per_worker, spec.node_slots)

    def _fits_now(self) -> int:
        """How many workers the usable nodes hold now (`_fitting`), recomputed only when the membership
        changed: it is asked at every turn of an elastic run and at every connection."""
        membership = self._membership
        if self._fits[0] != membership.version:
            self._fits = (membership.version, self._fitting(membership.usable()))
        return self._fits[1]

    def _fits_ready_now(self) -> int:
        """How many workers the nodes ready to grow onto hold now (`Membership.ready`: not still warming
        up), recomputed only when the membership changed."""
        membership = self._membership
        if self._fits_ready[0] != membership.version:
            self._fits_ready = (membership.version, self._fitting(membership.ready()))
        return self._fits_ready[1]

    # ------------------------------------------------------------------ joiners' warm-up

    def connected(self, node: NodeInfo, group: Optional[WorkerGroup], attempt_runs: bool) -> None:
        """`node`'s agent connected (again; the membership has it). In an elastic run whose attempt
        (`group`) runs (`attempt_runs`: STARTING or RUNNING) without the node (a host that came back, a
        late joiner), the node is readied for the start it would get if the run grew now
        (`warm_up_command`)."""
        node_id = node.node_id
        if not self._rules.elastic or group is None or not attempt_runs or node_id in group.tracker.nodes():
            return
        spec = self._spec
        try:
            count = attempt_size(self._fits_now(), self._rules.sizing.min_workers, spec.num_workers)
        except ConfigError:  # fewer than min fit: nothing to get ready for
            return
        # Only this node's ranks of that start (placing every rank at each connection was quadratic).
        mine = node_assignments(self._membership.usable(), count, node_id, spec.gpus_per_worker,
                                spec.placement_strategy, spec.cpus_per_worker, dict(spec.node_slots))
        # Growth waits for its answer (NodeWarmed): the group trains on meanwhile instead of idling in the
        # next attempt's rendezvous while this node imports torch.
        if mine and self._outbox.to_agent(node_id, warm_up_command(spec.launch, node, mine)):
            self._membership.warming(node_id)

    def warmed(self, event: ev.NodeWarmed) -> None:
        """A node readied for growth answered: from now on the run may grow onto it."""
        if not self._membership.warmed(event):
            return
        if event.ready:
            logger.info("node %s is ready to grow onto (its fork server is warm)", event.node_id)
        else:
            logger.warning("node %s has no warm worker (%s); growing onto it starts its worker(s) cold",
                           event.node_id, event.detail)
