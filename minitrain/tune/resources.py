"""What a trial reserves and which hosts it is given (L3): the cluster side of `minitrain.tune.placement`.

`trial_demand` reads a trainable's ScalingConfig (or `with_resources` amounts); `ClusterRoom` counts
every host minitrain knows (minitrain.init, MINITRAIN_HOSTS / MINITRAIN_HOSTFILE, else this machine),
reserves a placement per trial and turns it into what the trial process is handed: a `ClusterConfig`
of only its hosts (each with `slots` = its workers there) and, on this machine, CUDA_VISIBLE_DEVICES
naming only its GPUs. The trial process makes that cluster its process-wide one, so its `fit()` can
place ranks nowhere else.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any, Mapping, Optional

from minitrain.driver.trainer import DataParallelTrainer
from minitrain.hosts import hostinfo
from minitrain.hosts.cluster import ClusterConfig, HostSpec
from minitrain.tune.placement import Demand, HostRoom, Placement, Pool
from minitrain.tune.tune_config import _WithResources


def trial_demand(trainable: Any) -> Demand:
    """What each trial of `trainable` reserves: a TorchTrainer's (or a `with_resources` ScalingConfig's)
    workers, resources per worker and placement strategy; a `with_resources` dict as one bundle; else
    1 CPU (Ray's default for a function)."""
    scaling = trainable.scaling_config if isinstance(trainable, DataParallelTrainer) else \
        trainable.scaling_config if isinstance(trainable, _WithResources) else None
    if scaling is not None:
        cpus, gpus = scaling.num_cpus_per_worker, scaling.num_gpus_per_worker
        return Demand(max(1, scaling.max_workers), cpus if (cpus or gpus) else 1.0, gpus,
                      scaling.placement_strategy)
    if isinstance(trainable, _WithResources):
        return Demand(1, trainable.resources.get("CPU", 0.0), trainable.resources.get("GPU", 0.0),
                      restricts_slots=False)
    return Demand(1, 1.0, 0.0, restricts_slots=False)


def host_rooms(cluster: ClusterConfig, environ: Mapping[str, str] = os.environ) -> list[HostRoom]:
    """The tuner's count of each host: CPUs are its `slots` when given, else this machine's CPU count
    (a remote host's CPUs are not known before its agent starts); GPUs are this machine's GPUs for the
    first local host (another local name is the same machine: no GPUs counted twice), and a remote
    host's `slots` (a GPU host's slots are its GPUs)."""
    rooms, local_gpus = [], len(hostinfo.gpu_ids(environ))
    for host in cluster.hosts:
        cpus = float(host.slots or hostinfo.cpu_count())
        if host.local:
            gpus, local_gpus = local_gpus, 0
        else:
            gpus = host.slots or 0
        rooms.append(HostRoom(host.name, cpus, gpus, host.slots, bool(host.local)))
    return rooms


@dataclass(frozen=True)
class Reservation:
    """One trial's hold on the cluster: where it runs, the cluster its fit() is given, and the
    environment entries its process gets (CUDA_VISIBLE_DEVICES when it holds GPUs of this machine)."""

    placement: Placement
    cluster: ClusterConfig
    env: dict

    def describe(self) -> str:
        """'gpu1:4,gpu2:4' (host:workers)."""
        return ",".join(f"{name}:{count}" for name, count in self.placement.workers.items())

    def host_list(self) -> str:
        """The trial's hosts as a MINITRAIN_HOSTS value ('gpu1:4,[fe80::1]:2', slots as in `cluster`)."""
        items = []
        for host in self.cluster.hosts:
            name = f"[{host.name}]" if ":" in host.name and host.slots is not None else host.name
            items.append(name if host.slots is None else f"{name}:{host.slots}")
        return ",".join(items)


class ClusterRoom:
    """The free room of `cluster`'s hosts, one reservation per running trial."""

    def __init__(self, cluster: ClusterConfig, environ: Mapping[str, str] = os.environ):
        self.cluster = cluster
        self.pool = Pool(host_rooms(cluster, environ))
        self._local_hosts = [host.name for host in cluster.hosts if host.local]
        self._visible = _visible_gpu_entries(environ)

    def never_fits(self, demand: Demand) -> Optional[str]:
        """Why no trial of `demand` can run on these hosts even when idle; None when it can."""
        return self.pool.never_fits(demand)

    def reserve(self, demand: Demand) -> Optional[Reservation]:
        """Reserve room for one trial; None (nothing held) when it does not fit now."""
        placement = self.pool.place(demand)
        if placement is None:
            return None
        by_name = {host.name: host for host in self.cluster.hosts}
        hosts = tuple(HostSpec(name, workers if demand.restricts_slots else by_name[name].slots,
                               local=by_name[name].local) for name, workers in placement.workers.items())
        env = {}
        local_gpus = placement.local_gpu_indices(self._local_hosts)
        if local_gpus is not None:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(self._visible[i] for i in local_gpus)
        return Reservation(placement, dataclasses.replace(self.cluster, hosts=hosts), env)

    def release(self, reservation: Reservation) -> None:
        """Give a finished trial's room back."""
        self.pool.release(reservation.placement)


def _visible_gpu_entries(environ: Mapping[str, str]) -> list[str]:
    """This machine's GPUs as CUDA_VISIBLE_DEVICES entries, by the positions `hostinfo.gpu_ids` counts."""
    ids = hostinfo.gpu_ids(environ)
    value = environ.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return [str(i) for i in ids]
    return [entry.strip() for entry in value.split(",")][:len(ids)]
