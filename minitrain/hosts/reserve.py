"""A run's hold on its hosts' ledgers: claim what it needs, or wait until it can (L1, the driver's side).

`reserve` is called by `fit()` before any agent starts. For a run that claims nothing (CPU workers
that name no CPUs or memory), with ``MINITRAIN_LEDGER_DIR=off`` in the driver, or inside a Slurm
allocation (the scheduler owns the nodes), it returns at once and touches no ledger. Otherwise:

1. each host's ledger is opened: this machine's in this process (the driver holds the claim), a
   remote host's through a holder started over SSH (`minitrain.hosts.hold`);
2. a run that cannot fit even when every host is idle fails at once (`ConfigError` with the table of
   what each host has and holds);
3. the workers are placed on what is free now (`demand.plan`; an elastic run at the largest size
   that fits, down to its minimum) and each host claims its part,
   atomically in its ledger; when a host's claim fails (another run was faster), what was claimed is
   given back, so no run holds part of a cluster while waiting for the rest;
4. while the run does not fit, `on_wait` is told who holds what it waits for, and the ledgers are
   looked at again every `poll_s` (0.1 s locally): a release is seen within a poll. Past `timeout_s`
   (None: never; 0: at the first look) `ResourcesBusyError` is raised. A host whose ledger lock another
   process holds (`LedgerBusyError`: a claim waits for it `LOCK_WAIT_S` at most, less when less of
   `timeout_s` is left) counts as busy, and the waiting line names that process: the limit holds
   whatever another user does with the lock.

The `Reservation` says what the run got: a cluster of only the hosts it placed workers on, each with
``slots`` = its workers there, and per host the CUDA_VISIBLE_DEVICES its agent gets (the claimed GPUs,
as `minitrain.hosts.gpus` names them), so the controller's rank placement lands exactly on the claim.
`Reservation.release()` gives every claim back (a run that dies drops them with its processes).
Waiting runs are not queued: whichever looks first after a release wins.
"""

from __future__ import annotations

import dataclasses
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Optional, Union

from minitrain import knobs
from minitrain.errors import ConfigError, LaunchError
from minitrain.hosts.cluster import ClusterConfig, HostSpec
from minitrain.hosts.demand import Need, host_table, plan, room, waiting_text
from minitrain.hosts.gpus import PCI_ORDER
from minitrain.hosts.hold import RemoteHost, this_host_ledger, this_host_totals
from minitrain.hosts.ledger import LOCK_WAIT_S, Claim, HeldClaim, LedgerBusyError, Snapshot

POLL_S = 0.1
REMOTE_POLL_S = 0.5
TOTALS_EVERY_S = 2.0
_MAX_PARALLEL = 32
_LEAST_LOCK_WAIT_S = 0.05  # a claim's wait for the lock even at the limit: a run holds it for milliseconds


class ResourcesBusyError(LaunchError):
    """The run waited its `MINITRAIN_RESOURCE_WAIT_S` and its hosts were still busy; the message says
    who holds what it waits for."""


class LocalHost:
    """This machine's ledger, the claim held by this process."""

    def __init__(self, host: HostSpec):
        self.spec = host
        self._ledger = this_host_ledger(host.name)
        self._totals = this_host_totals()
        self._looked = time.monotonic()
        self._held: Optional[HeldClaim] = None

    def snapshot(self) -> Snapshot:
        if time.monotonic() - self._looked > TOTALS_EVERY_S:  # GPUs' busy processes change; NVML costs ms
            self._totals, self._looked = this_host_totals(), time.monotonic()
        return self._ledger.snapshot(self._totals)

    def claim(self, workers: int, need: Need, run: str, lock_wait_s: float = LOCK_WAIT_S) -> Optional[Claim]:
        self.release()
        self._held = self._ledger.claim(self._totals, run, lambda snap: need.claim_for(workers, snap),
                                        lock_wait_s=lock_wait_s)
        return None if self._held is None else self._held.claim

    def release(self) -> None:
        if self._held is not None:
            self._held.release()
            self._held = None

    def close(self) -> None:
        self.release()


Host = Union[LocalHost, RemoteHost]


@dataclass
class Reservation:
    """What a run holds: `cluster` (its hosts, slots = workers there), `agent_env` (host -> the
    environment its agent adds: CUDA_VISIBLE_DEVICES), `claims` (host -> Claim) and how long it waited."""

    cluster: ClusterConfig
    agent_env: dict = field(default_factory=dict)
    claims: dict = field(default_factory=dict)
    waited_s: float = 0.0
    _hosts: list = field(default_factory=list, repr=False)

    def release(self) -> None:
        """Give every claim back and end the remote holders. Idempotent."""
        hosts, self._hosts = self._hosts, []
        for host in hosts:
            try:
                host.close()
            except Exception:  # noqa: BLE001 - a claim dies with its holder anyway
                pass

    def __enter__(self) -> "Reservation":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def _open(cluster: ClusterConfig, pythonpath: tuple[str, ...]) -> list[Host]:
    """Every host's ledger, in the cluster's order; the remote holders are started in parallel (each is an
    ssh connection and a Python start-up). When one fails, the others are closed and its error raised."""
    def start(spec: HostSpec) -> Host:
        return LocalHost(spec) if spec.local else RemoteHost(spec, cluster, pythonpath)

    with ThreadPoolExecutor(max_workers=min(_MAX_PARALLEL, len(cluster.hosts)),
                            thread_name_prefix="minitrain-ledger-open") as pool:
        futures = [pool.submit(start, spec) for spec in cluster.hosts]
    hosts, error = [], None
    for future in futures:
        try:
            hosts.append(future.result())
        except BaseException as exc:  # noqa: BLE001 - raised below, once every holder is closed
            error = error or exc
    if error is not None:
        for host in hosts:
            host.close()
        raise error
    return hosts


def _rooms(snapshots: list[Snapshot], hosts: list[Host], need: Need, idle: bool = False) -> list[tuple[str, int]]:
    rooms = []
    for snapshot, host in zip(snapshots, hosts):
        limit = need.workers if host.spec.slots is None else min(need.workers, host.spec.slots)
        rooms.append((host.spec.name, room(snapshot, need, limit, idle=idle)))
    return rooms


def _largest_plan(snapshots: list[Snapshot], hosts: list[Host], need: Need) -> tuple[Optional[dict], Need]:
    """(host -> workers, the demand at that size) for the most workers of `need` that fit now (an
    elastic run: from its maximum down to its minimum), or (None, need) when not even the fewest fit."""
    for workers in need.sizes():
        sized = need.sized(workers)
        counts = plan(_rooms(snapshots, hosts, sized), sized)
        if counts is not None:
            return counts, sized
    return None, need


def _never_fits(snapshots: list[Snapshot], hosts: list[Host], need: Need, run: str) -> ConfigError:
    slots = {h.spec.name: h.spec.slots for h in hosts}
    return ConfigError(
        f"run {run!r} needs {need.fewest} worker(s) of {need.describe(1)} each ({need.strategy}), which the hosts "
        f"cannot hold even when no other run holds anything. Lower ScalingConfig.num_workers or "
        f"resources_per_worker, or add hosts (or slots).\n{host_table(snapshots, slots)}")


def _try_claim(hosts: list[Host], counts: dict, need: Need, run: str,
               lock_wait_s: float = LOCK_WAIT_S) -> Optional[dict]:
    """Claim each host's part; all of them (host -> Claim) or none (what was claimed is given back). A host
    whose ledger lock stays held raises LedgerBusyError, also after giving back what was claimed."""
    claims: dict = {}
    for host in hosts:
        workers = counts.get(host.spec.name)
        if not workers:
            continue
        try:
            claim = host.claim(workers, need, run, lock_wait_s=lock_wait_s)
        except LedgerBusyError:
            for other in hosts:
                if other.spec.name in claims:
                    other.release()
            raise
        if claim is None:
            for other in hosts:
                if other.spec.name in claims:
                    other.release()
            return None
        claims[host.spec.name] = claim
    return claims


def reserve(cluster: ClusterConfig, need: Need, run: str, *, timeout_s: Optional[float] = None,
            on_wait: Callable[[str], None] = lambda text: None, pythonpath: tuple[str, ...] = (),
            poll_s: Optional[float] = None, clock: Callable[[], float] = time.monotonic) -> Reservation:
    """Claim `need` on `cluster`'s hosts for run `run`, waiting as the module doc says."""
    # MINITRAIN_LEDGER_DIR=off, or the hosts are a Slurm allocation's: a scheduler decides. (Slurm gives
    # each job its own GPUs and renumbers them from 0 in the job's cgroup, so two jobs sharing a node
    # would wait on each other's "GPU 0" in a ledger they share.) Joined hosts are pods or steps that
    # their own scheduler placed, and cannot be reached to read a ledger.
    if not need.claims or knobs.LEDGER_DIR.get() is None or cluster.launcher in ("srun", "join"):
        return Reservation(cluster)
    hosts = _open(cluster, pythonpath)
    try:
        poll_s = poll_s if poll_s is not None else (POLL_S if cluster.all_local else REMOTE_POLL_S)
        started, since = clock(), time.time()
        first = True
        while True:
            snapshots = [host.snapshot() for host in hosts]
            if first and plan(_rooms(snapshots, hosts, need.sized(need.fewest), idle=True),
                              need.sized(need.fewest)) is None:
                raise _never_fits(snapshots, hosts, need, run)
            first = False
            counts, sized = _largest_plan(snapshots, hosts, need)
            claims, locked_by = None, []
            if counts is not None:
                left = None if timeout_s is None else timeout_s - (clock() - started)
                lock_wait_s = LOCK_WAIT_S if left is None else min(LOCK_WAIT_S, max(left, _LEAST_LOCK_WAIT_S))
                try:
                    claims = _try_claim(hosts, counts, sized, run, lock_wait_s)
                except LedgerBusyError as exc:
                    locked_by.append(str(exc))
            if claims is not None:
                return _reservation(cluster, hosts, snapshots, counts, claims, clock() - started)
            text = waiting_text(need, snapshots, since, locked_by)
            waited = clock() - started
            if timeout_s is not None and waited >= timeout_s:
                raise ResourcesBusyError(f"run {run!r} gave up after {waited:.0f} s (MINITRAIN_RESOURCE_WAIT_S="
                                         f"{timeout_s:g}): {text}. Unset MINITRAIN_RESOURCE_WAIT_S to wait as long "
                                         f"as it takes.")
            on_wait(text)
            time.sleep(poll_s)
    except BaseException:
        for host in hosts:
            host.close()
        raise


def _reservation(cluster: ClusterConfig, hosts: list[Host], snapshots: list[Snapshot], counts: dict, claims: dict,
                 waited_s: float) -> Reservation:
    gpus_of = {s.host: {gpu.index: gpu for gpu in s.totals.gpus} for s in snapshots}
    kept = []
    agent_env = {}
    for spec in cluster.hosts:
        claim = claims.get(spec.name)
        if claim is None:
            continue
        kept.append(HostSpec(spec.name, counts[spec.name], local=spec.local))
        if claim.gpus:  # as the host names them (minitrain.hosts.gpus)
            gpus = [gpus_of[spec.name][i] for i in claim.gpus]
            entries = [gpu.visible_entry for gpu in gpus]
            agent_env[spec.name] = {"CUDA_VISIBLE_DEVICES": ",".join(entries)}
            if all(gpu.uuid and entry.isdigit() for gpu, entry in zip(gpus, entries)):  # NVML's indices
                agent_env[spec.name].update(PCI_ORDER)
    for host in hosts:  # hosts without workers hold nothing: their holders go now
        if host.spec.name not in claims:
            host.close()
    restricted = dataclasses.replace(cluster, hosts=tuple(kept))
    return Reservation(restricted, agent_env, claims, waited_s,
                       [h for h in hosts if h.spec.name in claims])


def ledger_report(cluster: ClusterConfig, pythonpath: tuple[str, ...] = ()) -> str:
    """What each host of `cluster` has and what its ledger holds now, for people (``--status``): per
    host its totals, then one line per claim, per GPU busy outside minitrain, per refused entry. A
    host that cannot be asked says why instead."""
    lines = []
    for spec in cluster.hosts:
        try:
            host = LocalHost(spec) if spec.local else RemoteHost(spec, cluster, pythonpath)
            try:
                snapshot = host.snapshot()
            finally:
                host.close()
        except (LaunchError, OSError) as exc:
            lines.append(f"{spec.name}: cannot read its ledger: {exc}")
            continue
        totals = snapshot.totals
        lines.append(f"{spec.name}: {len(totals.gpus)} GPUs, {totals.cpus:g} CPUs, "
                     f"{totals.memory_bytes / 2**30:.1f} GiB; free now: {len(snapshot.free_gpus())} GPUs "
                     f"({','.join(map(str, snapshot.free_gpus())) or '-'}), {snapshot.free_cpus():g} CPUs")
        for claim in snapshot.claims:
            lines.append(f"  {claim.who()}: {claim.holds()}")
        for index, pids in sorted(snapshot.foreign_busy().items()):
            lines.append(f"  GPU {index} busy with pid {', '.join(map(str, pids))} outside minitrain")
        lines.extend(f"  refused: {problem}" for problem in snapshot.problems)
        if not snapshot.claims and not snapshot.foreign_busy():
            lines.append("  nothing held")
    return "\n".join(lines)
