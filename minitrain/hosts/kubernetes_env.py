"""What a Kubernetes training job tells a pod, read from the environment alone (L1; no Kubernetes API).

Two contracts are recognised, TrainJob's first (its variables are the more specific):

- Kubeflow Trainer v2 TrainJob (JobSet): ``PET_NNODES`` (pods), ``PET_NODE_RANK`` (this pod's index),
  ``PET_MASTER_ADDR`` (pod 0's headless-service name, e.g. ``<job>-node-0-0.<job>``), ``PET_MASTER_PORT``,
  and ``PET_NPROC_PER_NODE`` when it is a number (the most workers placed on a pod);
- Kubeflow PyTorchJob v1: ``WORLD_SIZE`` (pods, not GPUs), ``RANK`` (0 for the master, 1.. for the
  workers), ``MASTER_ADDR`` (the master's service, ``<job>-master-0``), ``MASTER_PORT``.

`pod_from_environment` returns None when neither set is complete (``MASTER_ADDR`` alone, as a
torchrun-style script sets it, is no pod). Pod 0 runs the driver and the coordinator, listening on the
master port; every other pod runs an agent that joins it (`minitrain.agent.join`). The run's id and
name come from the job's name, taken from the master address's first label without its
``-master-0``/``-node-0-0`` suffix, so every pod, and every pod after a recreate, agrees on them.
"""

from __future__ import annotations

import ipaddress
import os
import re
from dataclasses import dataclass
from typing import Mapping, Optional

from minitrain.errors import ConfigError

TRAINJOB_VARS = ("PET_NNODES", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT")
PYTORCHJOB_VARS = ("WORLD_SIZE", "RANK", "MASTER_ADDR", "MASTER_PORT")
_JOB_SUFFIX = re.compile(r"-(master-0|node-0-0|worker-0|master|node-0)$")
_NODE_ID = "pod-{rank}"  # the node id (host name in the run) of pod `rank`


@dataclass(frozen=True)
class KubernetesPod:
    """This pod's place in its job: `pods` in all, this one's `rank`, where pod 0 listens
    (`master_host`, `master_port`), which contract set them (`flavor`) and the job's name."""

    flavor: str  # "TrainJob" or "PyTorchJob"
    pods: int
    rank: int
    master_host: str
    master_port: int
    job_name: str
    slots: Optional[int] = None  # TrainJob's PET_NPROC_PER_NODE when it is a number: the workers a pod takes

    @property
    def node_id(self) -> str:
        """This pod's node id in the run."""
        return node_id(self.rank)

    @property
    def address(self) -> str:
        """HOST:PORT the joiners dial."""
        host = f"[{self.master_host}]" if ":" in self.master_host else self.master_host
        return f"{host}:{self.master_port}"


def node_id(rank: int) -> str:
    """The node id of pod `rank` ("pod-0" is the driver's)."""
    return _NODE_ID.format(rank=rank)


def pod_from_environment(environ: Optional[Mapping[str, str]] = None) -> Optional[KubernetesPod]:
    """This pod's `KubernetesPod`, or None when the environment holds neither contract completely.
    A contract whose variables are all set but malformed is a ConfigError naming the variable."""
    environ = os.environ if environ is None else environ
    for flavor, names in (("TrainJob", TRAINJOB_VARS), ("PyTorchJob", PYTORCHJOB_VARS)):
        if all(environ.get(name, "").strip() for name in names):
            return _parse(flavor, names, environ)
    return None


def _count(environ: Mapping[str, str], name: str, low: int) -> int:
    text = environ[name].strip()
    if not text.isdigit() or int(text) < low:
        raise ConfigError(f"{name}={text!r} must be an integer >= {low} (set by the Kubernetes training "
                          f"operator); check the job's manifest.")
    return int(text)


def _parse(flavor: str, names: tuple[str, ...], environ: Mapping[str, str]) -> KubernetesPod:
    pods_var, rank_var, addr_var, port_var = names
    pods = _count(environ, pods_var, 1)
    rank = _count(environ, rank_var, 0)
    if rank >= pods:
        raise ConfigError(f"{rank_var}={rank} is not below {pods_var}={pods}; in a {flavor} the pods are "
                          f"numbered 0..{pods - 1}. Check the job's manifest (replicas).")
    port = _count(environ, port_var, 1)
    if port > 65535:
        raise ConfigError(f"{port_var}={port} is not a port (1..65535).")
    host = environ[addr_var].strip().strip("[]")
    try:
        ipaddress.ip_address(host)
        job = "job-" + re.sub(r"[^0-9A-Za-z]", "-", host)  # no name to take: the address stands for it
    except ValueError:
        label = host.split(".", 1)[0]
        job = _JOB_SUFFIX.sub("", label) or label
    per_node = environ.get("PET_NPROC_PER_NODE", "").strip() if flavor == "TrainJob" else ""
    slots = int(per_node) if per_node.isdigit() and int(per_node) > 0 else None  # "auto", "gpu": resources decide
    return KubernetesPod(flavor, pods, rank, host, port, job, slots)
