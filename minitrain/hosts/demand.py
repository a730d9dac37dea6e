"""What a run claims on its hosts, and where it fits (pure: stdlib and the ledger's records).

`Need` is a run's demand as the ledger counts it: per worker, the GPUs (always claimed: a GPU run
holds whole GPUs, workers of a fractional share pack onto them), and CPUs and memory only when
``resources_per_worker`` names them (an unnamed CPU is not claimed, so CPU runs on one machine may
share its cores as they always could). `room` is how many workers a host holds now; `plan` places
the workers over the hosts' rooms by the run's placement strategy, as
`minitrain.coordinator.policy.ranks.assign_ranks` will place its ranks on what the run is then given.
An elastic run (`ScalingConfig(num_workers=(min, max))`) is planned at the largest size that fits now,
down to its minimum (`Need.sizes`).
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from typing import Any, Optional, Sequence

from minitrain.hosts.ledger import Claim, Snapshot

_EPS = 1e-9


@dataclass(frozen=True)
class Need:
    """A run's demand: `workers` workers of `gpus` GPUs, `cpus` CPUs and `memory_bytes` each (0: not
    claimed), placed by `strategy` (a ScalingConfig placement strategy). An elastic run takes as many
    as fit now, from `min_workers` up to `workers` (None: exactly `workers`)."""

    workers: int
    gpus: float = 0.0
    cpus: float = 0.0
    memory_bytes: int = 0
    strategy: str = "PACK"
    min_workers: Optional[int] = None

    @classmethod
    def of(cls, scaling: Any) -> "Need":
        """The demand of a `ScalingConfig`: its GPUs, and the CPUs and memory it names; for an elastic
        `num_workers=(min, max)`, max workers, of which min are enough to start."""
        named = scaling.resources_per_worker or {}
        fewest = scaling.min_workers if scaling.min_workers != scaling.max_workers else None
        return cls(scaling.max_workers, scaling.num_gpus_per_worker, float(named.get("CPU", 0.0)),
                   int(named.get("memory", 0)), scaling.placement_strategy, fewest)

    @property
    def fewest(self) -> int:
        """The fewest workers the run starts with (`workers` unless it is elastic)."""
        return self.workers if self.min_workers is None else self.min_workers

    def sizes(self) -> range:
        """The worker counts the run takes, most wanted first (`workers` down to `fewest`)."""
        return range(self.workers, self.fewest - 1, -1)

    def sized(self, workers: int) -> "Need":
        """This demand for exactly `workers` workers."""
        return dataclasses.replace(self, workers=workers, min_workers=None)

    @property
    def claims(self) -> bool:
        """False when the run holds nothing in the ledger (CPU workers that name no CPUs or memory)."""
        return self.gpus > 0 or self.cpus > 0 or self.memory_bytes > 0

    def gpus_for(self, workers: int) -> int:
        """Whole GPUs `workers` workers on one host take: worker k of a share <= 1 is on GPU
        floor(k * share); above one, each takes ceil(share)."""
        if self.gpus <= 0 or workers <= 0:
            return 0
        if self.gpus <= 1:
            return math.floor((workers - 1) * self.gpus + _EPS) + 1
        return workers * math.ceil(self.gpus - _EPS)

    def describe(self, workers: Optional[int] = None) -> str:
        """'2 GPUs, 4 CPUs' for `workers` (default: all of them)."""
        n = self.workers if workers is None else workers
        parts = []
        gpus = self.gpus_for(n)
        if gpus:
            parts.append(f"{gpus} GPU{'s' if gpus != 1 else ''}")
        if self.cpus:
            parts.append(f"{n * self.cpus:g} CPUs")
        if self.memory_bytes:
            parts.append(f"{n * self.memory_bytes / 2**30:.1f} GiB of memory")
        return ", ".join(parts) or "nothing"

    def claim_for(self, workers: int, snapshot: Snapshot) -> Optional[Claim]:
        """What `workers` workers hold on the host of `snapshot` (its lowest free GPUs), or None when
        they do not fit there now. Only the resources are filled in (the ledger fills in the rest)."""
        if room(snapshot, self, workers) < workers:
            return None
        gpus = tuple(snapshot.free_gpus()[:self.gpus_for(workers)])
        return Claim("", "", 0, 0, 0.0, gpus, workers * self.cpus, workers * self.memory_bytes)


def room(snapshot: Snapshot, need: Need, limit: int, idle: bool = False) -> int:
    """The most workers of `need` (up to `limit`) the host of `snapshot` holds now, or when every claim
    is gone (`idle`). Only what `need` asks for counts: a run that needs no memory (or no CPUs) is never
    held back by the claims on it, however many there are."""
    if idle:
        snapshot = Snapshot(snapshot.host, snapshot.totals)
    free_gpus = len(snapshot.free_gpus())
    free_cpus, free_memory = snapshot.free_cpus(), snapshot.free_memory()
    count = 0
    while count < limit:
        n = count + 1
        if need.gpus_for(n) > free_gpus or (need.cpus and n * need.cpus > free_cpus + _EPS) \
                or (need.memory_bytes and n * need.memory_bytes > free_memory):
            break
        count = n
    return count


def plan(rooms: Sequence[tuple[str, int]], need: Need) -> Optional[dict[str, int]]:
    """host -> workers, over `rooms` ((host, its room), in the cluster's order), by `need.strategy`;
    None when they do not fit. PACK fills each host in order; SPREAD deals one per host in turn;
    STRICT_PACK takes the first host that holds them all; STRICT_SPREAD one worker on each of as many
    hosts."""
    workers, strategy = need.workers, need.strategy
    if strategy == "STRICT_PACK":
        host = next((name for name, free in rooms if free >= workers), None)
        return None if host is None else {host: workers}
    counts = {name: 0 for name, _ in rooms}
    left = workers
    if strategy == "PACK":
        for name, free in rooms:
            counts[name] = min(free, left)
            left -= counts[name]
    else:
        cap = {name: (min(free, 1) if strategy == "STRICT_SPREAD" else free) for name, free in rooms}
        progress = True
        while left and progress:
            progress = False
            for name, _ in rooms:
                if left and counts[name] < cap[name]:
                    counts[name] += 1
                    left -= 1
                    progress = True
    if left:
        return None
    return {name: count for name, count in counts.items() if count}


def holders(snapshot: Snapshot, need: Need) -> list[str]:
    """Who holds what `need` waits for on this host: 'run X (alice, pid 1, since 12:03): 2 GPUs (0,1)' per
    claim, and the GPUs busy with processes outside any claim."""
    found = []
    for claim in snapshot.claims:
        if (need.gpus and claim.gpus) or (need.cpus and claim.cpus) or (need.memory_bytes and claim.memory_bytes):
            found.append(f"{claim.who()}: {claim.holds()}")
    if need.gpus:
        for index, pids in sorted(snapshot.foreign_busy().items()):
            taken = "taken" if snapshot.foreign_taken else "reported only"
            found.append(f"GPU {index} busy with pid {', '.join(map(str, pids))} outside minitrain ({taken})")
    return found


def waiting_text(need: Need, snapshots: Sequence[Snapshot], since: float, locked_by: Sequence[str] = ()) -> str:
    """'waiting for 2 GPUs on gpu1 since 12:03: held by run X (alice, pid 1, since 11:40): 2 GPUs (0,1)'.
    `locked_by`: who holds a host's ledger lock so long that the run could not claim there
    (`minitrain.hosts.ledger.LedgerBusyError`'s text: 'pid 4242 (bob), which holds the ledger's lock ...')."""
    names = ",".join(s.host for s in snapshots)
    who = [f"{s.host + ': ' if len(snapshots) > 1 else ''}{h}" for s in snapshots for h in holders(s, need)]
    who += list(locked_by)
    problems = [p for s in snapshots for p in s.problems]
    wanted = need.describe(need.fewest) + (f" (at least {need.fewest} workers)" if need.min_workers is not None else "")
    text = (f"waiting for {wanted} on {names} since {time.strftime('%H:%M', time.localtime(since))}: "
            + ("held by " + "; ".join(who) if who else "held by no claim minitrain trusts"))
    return text + (f" (refused ledger entries: {len(problems)}; see the log)" if problems else "")


def host_table(snapshots: Sequence[Snapshot], slots: dict) -> str:
    """What each host has and what its ledger holds now, as an aligned table."""
    rows = [("host", "gpus", "cpus", "memory", "slots", "held now")]
    for s in snapshots:
        held = "; ".join(f"{c.who()}: {c.holds()}" for c in s.claims) or "-"
        rows.append((s.host, str(len(s.totals.gpus)), f"{s.totals.cpus:g}", f"{s.totals.memory_bytes / 2**30:.1f}GiB",
                     str(slots.get(s.host) or "-"), held))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows)
