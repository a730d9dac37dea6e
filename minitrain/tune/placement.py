"""Where each trial runs: the sweep's own count of the hosts' free slots, CPUs and GPUs (L3, pure).

This counts the sweep's trials only. What every run on a host holds, other users' and other sweeps'
included, is the host's resource ledger (`minitrain.hosts.ledger`), which each trial's `fit()` claims in
(and waits on) like any run.

The tuner places a trial on concrete hosts before starting it, reserves what it takes until the trial
ends, and hands the trial process only those hosts (its `fit()` cannot place ranks elsewhere). Without
this, two trials that each fit the cluster's total would both let their own `fit()` pack ranks onto
the first host.

A trial asks for a `Demand`: `workers` bundles of `cpus` and `gpus` each, placed by a Ray placement
strategy, as `minitrain.coordinator.policy.ranks.assign_ranks` places ranks:

- PACK: all workers on one host when one has room (the host with the least room left that still holds
  them, so big holes stay open for big trials), else over as few hosts as possible;
- SPREAD: one worker per host in turn, over the hosts with room (cluster order);
- STRICT_PACK: one host or not at all; STRICT_SPREAD: a different host for every worker.

GPUs are tracked one by one, as the trial's `fit()` will use them: a worker of `gpus` <= 1 takes a
share of the GPU `floor(local_rank * gpus)` of those its host hands the trial, a worker of `gpus` > 1
takes `ceil(gpus)` whole GPUs. On this machine the trial is given exactly those GPUs
(CUDA_VISIBLE_DEVICES, which its local agents inherit). A remote agent cannot be told which GPUs to
use (its fit() numbers them from 0), so a remote host's GPUs serve one trial at a time.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import Optional, Sequence

STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")
_EPS = 1e-9


@dataclass(frozen=True)
class Demand:
    """What one trial reserves: `workers` bundles of `cpus` CPUs and `gpus` GPUs each, placed by
    `strategy` (one of STRATEGIES). `restricts_slots`: the trial is handed each host with `slots` equal
    to the workers placed there (a TorchTrainer, or a ScalingConfig given to `with_resources`); a
    resources dict is one bundle that leaves the host's own slots as they are."""

    workers: int
    cpus: float
    gpus: float
    strategy: str = "PACK"
    restricts_slots: bool = True

    def __post_init__(self):
        if self.workers < 1 or self.cpus < 0 or self.gpus < 0 or self.strategy not in STRATEGIES:
            raise ValueError(f"bad Demand {self!r}")

    def describe(self) -> str:
        """'2 worker(s) x (1 CPU, 0.5 GPU), PACK'."""
        return f"{self.workers} worker(s) x ({self.cpus:g} CPU, {self.gpus:g} GPU), {self.strategy}"

    def totals(self) -> dict:
        """{'CPU': all CPUs, 'GPU': all GPUs} of the trial."""
        return {"CPU": self.cpus * self.workers, "GPU": self.gpus * self.workers}


@dataclass(frozen=True)
class HostRoom:
    """One host as the tuner counts it: its CPUs, its GPUs, its `slots` (the most workers; None: no
    cap) and whether it is this machine (its GPUs can be handed out one by one)."""

    name: str
    cpus: float
    gpus: int
    slots: Optional[int] = None
    local: bool = False


@dataclass(frozen=True)
class Placement:
    """Where one trial runs: host name -> workers there, and host name -> the GPU indices (positions in
    the host's GPUs) it holds, each with the share it holds. Hosts in the cluster's order."""

    workers: dict
    gpus: dict = field(default_factory=dict)  # host -> ((gpu index, share), ...)
    cpus: dict = field(default_factory=dict)  # host -> CPUs held

    def hosts(self) -> list:
        """The host names, in the cluster's order."""
        return list(self.workers)

    def local_gpu_indices(self, local_hosts: Sequence[str]) -> Optional[tuple]:
        """The GPU indices this trial holds on this machine, in the order its fit() numbers them, or
        None when it holds none here."""
        indices = [index for host in self.workers if host in local_hosts for index, _ in self.gpus.get(host, ())]
        return tuple(indices) if indices else None


class _HostState:
    """A host's free room (mutable; copied to try a placement)."""

    def __init__(self, room: HostRoom):
        self.room = room
        self.cpus = float(room.cpus)
        self.slots = math.inf if room.slots is None else room.slots
        self.gpu_used = [0.0] * room.gpus

    def gpus_for(self, workers: int, gpus: float) -> Optional[list]:
        """The GPUs (index, share) that `workers` workers of `gpus` each would take, or None."""
        if gpus <= 0:
            return []
        if not self.room.local and any(u > _EPS for u in self.gpu_used):
            return None  # a remote agent's fit() numbers GPUs from 0: one trial at a time there
        if gpus <= 1:
            needs = [0.0] * (math.floor((workers - 1) * gpus + _EPS) + 1)
            for rank in range(workers):  # as assign_ranks: worker k on the trial's GPU floor(k * gpus)
                needs[math.floor(rank * gpus + _EPS)] += gpus
        else:
            needs = [1.0] * (workers * math.ceil(gpus - _EPS))
        taken: list = []
        for need in needs:
            free = [(1.0 - used, index) for index, used in enumerate(self.gpu_used)
                    if index not in {i for i, _ in taken} and 1.0 - used + _EPS >= need]
            if not free:
                return None
            taken.append((min(free)[1], need))  # best fit: the fullest GPU that still holds it
        return taken

    def fits(self, workers: int, demand: Demand) -> bool:
        return workers <= self.slots and workers * demand.cpus <= self.cpus + _EPS and \
            self.gpus_for(workers, demand.gpus) is not None

    def most(self, demand: Demand, limit: int) -> int:
        """The most workers of `demand` (up to `limit`) this host holds now."""
        count = 0
        while count < limit and self.fits(count + 1, demand):
            count += 1
        return count

    def take(self, workers: int, demand: Demand) -> list:
        taken = self.gpus_for(workers, demand.gpus)
        for index, share in taken:
            self.gpu_used[index] += share
        self.cpus -= workers * demand.cpus
        self.slots -= workers
        return taken


class Pool:
    """The hosts' free room. `place` finds and reserves a placement for a demand (None: not now),
    `release` gives it back, `never_fits` says why a demand cannot run even on idle hosts."""

    def __init__(self, hosts: Sequence[HostRoom]):
        self.hosts = list(hosts)
        self._state = {host.name: _HostState(host) for host in self.hosts}

    def place(self, demand: Demand) -> Optional[Placement]:
        """Reserve room for `demand` and return where; None (and nothing reserved) when it does not fit
        now."""
        counts = _counts(self.hosts, self._state, demand)
        if counts is None:
            return None
        trial_gpus, trial_cpus = {}, {}
        for name, workers in counts.items():
            trial_gpus[name] = tuple(self._state[name].take(workers, demand))
            trial_cpus[name] = workers * demand.cpus
        return Placement(counts, trial_gpus, trial_cpus)

    def release(self, placement: Placement) -> None:
        """Give back what `placement` held."""
        for name, workers in placement.workers.items():
            state = self._state[name]
            state.slots += workers
            state.cpus += placement.cpus.get(name, 0.0)
            for index, share in placement.gpus.get(name, ()):
                state.gpu_used[index] = max(0.0, state.gpu_used[index] - share)

    def never_fits(self, demand: Demand) -> Optional[str]:
        """Why `demand` cannot be placed even when every host is idle (None when it can)."""
        if Pool(self.hosts).place(demand) is not None:
            return None
        table = "; ".join(f"{h.name}: {h.cpus:g} CPU, {h.gpus} GPU, slots {h.slots or '-'}" for h in self.hosts)
        return (f"the trial needs {demand.describe()}, which no placement on the hosts minitrain knows holds even "
                f"when they are idle ({table}). Lower the trial's num_workers or resources per worker, choose a "
                f"looser placement_strategy, or add hosts (minitrain.init(hosts=...) or MINITRAIN_HOSTS).")


def _counts(hosts: list, state: dict, demand: Demand) -> Optional[dict]:
    """host name -> workers for `demand` on the hosts' free room now (cluster order), or None."""
    counts = {host.name: 0 for host in hosts}
    workers, strategy = demand.workers, demand.strategy
    if strategy in ("PACK", "STRICT_PACK"):
        whole = [h for h in hosts if state[h.name].fits(workers, demand)]
        if whole:  # the tightest host that holds them all keeps big holes for big trials
            best = min(whole, key=lambda h: (_free_gpus(state[h.name]), state[h.name].cpus, state[h.name].slots))
            return {best.name: workers}
        if strategy == "STRICT_PACK":
            return None
        scratch = copy.deepcopy(state)
        left = workers
        # Fewest hosts: take the roomiest first.
        for host in sorted(hosts, key=lambda h: -scratch[h.name].most(demand, workers)):
            take = scratch[host.name].most(demand, left)
            if take:
                scratch[host.name].take(take, demand)
                counts[host.name] = take
                left -= take
            if not left:
                break
        if left:
            return None
    else:  # SPREAD, STRICT_SPREAD: a worker per host in turn (fits() counts a host's workers together)
        per_host = 1 if strategy == "STRICT_SPREAD" else workers
        left = workers
        progress = True
        while left and progress:
            progress = False
            for host in hosts:
                count = counts[host.name]
                if left and count < per_host and state[host.name].fits(count + 1, demand):
                    counts[host.name] = count + 1
                    left -= 1
                    progress = True
        if left:
            return None
    return {name: count for name, count in counts.items() if count}


def _free_gpus(state: _HostState) -> float:
    return sum(1.0 - used for used in state.gpu_used)
