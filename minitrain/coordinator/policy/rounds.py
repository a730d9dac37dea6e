"""Report rounds: collect round r from every rank of an attempt, then release it (pure).

Round r is the r-th `report()` call of each rank in one attempt. A round completes when every rank
has reported it, or has finished (returned from its training function) without reporting it. A round
is a checkpoint round when any rank passed a checkpoint; all ranks that did must name the same
directory, or the round is refused.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional


class RoundConflict(ValueError):
    """Ranks of one round named different checkpoint directories."""


@dataclass(frozen=True, slots=True)
class CompletedRound:
    """A round every rank has reported (or finished without reporting)."""

    round: int
    checkpoint_dir_name: str  # "" when no rank passed a checkpoint
    metrics_by_rank: dict  # rank -> the metrics it reported, as given to `add` (the coordinator: JSON text)
    staged_ranks: tuple[int, ...] = ()  # ranks whose checkpoint files wait in their staging directory
    ack_ranks: tuple[int, ...] = ()  # ranks waiting for this round's commit
    tier_ranks: tuple[int, ...] = ()  # ranks whose checkpoint files wait in their node's memory tier
    in_place_ranks: tuple[int, ...] = ()  # ranks whose files already lie in the run directory (NO_UPLOAD)


@dataclass
class _Pending:
    metrics: dict = field(default_factory=dict)  # rank -> metrics (opaque here)
    dir_names: dict = field(default_factory=dict)  # rank -> checkpoint dir name
    staged: list = field(default_factory=list)  # ranks that uploaded to staging
    acks: list = field(default_factory=list)  # ranks that wait for the commit
    tier: list = field(default_factory=list)  # ranks whose files are in their node's memory tier
    in_place: list = field(default_factory=list)  # ranks that wrote into the run directory themselves


class RoundTracker:
    """Round bookkeeping for one attempt of `world_size` ranks."""

    def __init__(self, world_size: int):
        self._world_size = world_size
        self._pending: dict[int, _Pending] = {}
        self._next = 0  # the lowest round not yet completed
        self._finished: dict[int, int] = {}  # rank -> number of rounds it reported before finishing

    @property
    def next_round(self) -> int:
        """The lowest round not completed yet."""
        return self._next

    def add(self, rank: int, round_: int, metrics: object, checkpoint_dir_name: str, *, staged: bool = False,
            wants_ack: bool = False, in_tier: bool = False) -> list[CompletedRound]:
        """Record one report; returns the rounds it completed, in order. RoundConflict on disagreement.
        `metrics` is kept as it is and handed back in `CompletedRound.metrics_by_rank`.
        `staged`: its checkpoint files wait in the rank's staging directory; `in_tier`: in its node's
        memory tier; `wants_ack`: the rank waits for the round's commit (all handed back in the
        CompletedRound)."""
        pending = self._pending.setdefault(round_, _Pending())
        pending.metrics[rank] = metrics
        if wants_ack:
            pending.acks.append(rank)
        if checkpoint_dir_name:
            for other_rank, other_name in pending.dir_names.items():
                if other_name != checkpoint_dir_name:
                    raise RoundConflict(
                        f"report round {round_}: rank {other_rank} passed checkpoint_dir_name "
                        f"{other_name!r} but rank {rank} passed {checkpoint_dir_name!r}. Every rank that "
                        "reports a checkpoint in a round must use the same directory name (or leave "
                        "checkpoint_dir_name unset for the default).")
            pending.dir_names[rank] = checkpoint_dir_name
            if staged:
                pending.staged.append(rank)
            elif in_tier:
                pending.tier.append(rank)
            else:
                pending.in_place.append(rank)
        return self._release()

    def finish(self, rank: int, rounds_reported: int) -> list[CompletedRound]:
        """Rank returned from its training function after `rounds_reported` reports."""
        self._finished[rank] = rounds_reported
        return self._release()

    def _has_answered(self, rank: int, round_: int, pending: Optional[_Pending]) -> bool:
        if pending is not None and rank in pending.metrics:
            return True
        return rank in self._finished and self._finished[rank] <= round_

    def _complete(self, round_: int, pending: Optional[_Pending]) -> bool:
        """Every rank reported `round_` or finished before it. O(1) per report while no rank has
        finished. Scanning the ranks at every report made rounds quadratic in the world size whenever
        reports of the next round arrived while a late rank still held this one back (46 us per
        report at 1024 ranks, 185 us at 4096; see docs/benchmarks/scale.md)."""
        if pending is not None and len(pending.metrics) == self._world_size:
            return True
        if not self._finished:
            return False
        return all(self._has_answered(r, round_, pending) for r in range(self._world_size))

    def _release(self) -> list[CompletedRound]:
        done = []
        while True:
            pending = self._pending.get(self._next)
            if pending is None and len(self._finished) < self._world_size:
                break
            if not self._complete(self._next, pending):
                break
            if pending is None:  # every rank finished before this round: nothing more will come
                break
            names = set(pending.dir_names.values())
            done.append(CompletedRound(self._next, names.pop() if names else "", pending.metrics,
                                       tuple(sorted(pending.staged)), tuple(pending.acks),
                                       tuple(sorted(pending.tier)), tuple(sorted(pending.in_place))))
            del self._pending[self._next]
            self._next += 1
        return done
