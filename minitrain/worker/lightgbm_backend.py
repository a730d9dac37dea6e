"""LightGBM's network for one worker: every rank's address and free port, agreed through the store (L2).

LightGBM connects its machines itself (`machines`, `local_listen_port`, `num_machines`: its network
parameters); what it needs is that every rank passes the same machines list, with an address the
other hosts reach and a port free on each host. Each attempt, every rank finds the address it reaches
rank 0's store from (the interface its hosts route over: 127.0.0.1 when all ranks are local), binds a
port there (the kernel picks a free one), writes `address:port` under its rank's key of the attempt's
store and reads every other rank's. It keeps its socket bound until every rank has published, so two
ranks of one host never get the same port, and closes it just before training: LightGBM binds the port
itself in `lightgbm.train`, so a process outside the run could still take it in between (as with Ray).
`minitrain.lightgbm.get_network_params()` returns what this rank agreed on, and `DATA_PARALLEL`.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from dataclasses import dataclass
from typing import ContextManager, Optional

from minitrain.worker.backend import StoreLink

_KEY = "minitrain/lightgbm/machine/{rank}"  # each rank's "address:port" in the attempt's store

# Beyond Ray's three network parameters: without these LightGBM's default "serial" learner trains one model
# per rank on that rank's shard alone (rank 0's is checkpointed), and LightGBM would take each rank's shard
# for the whole data set; minitrain's shards are disjoint partitions of it.
DATA_PARALLEL = {"tree_learner": "data", "pre_partition": True}

_params_lock = threading.Lock()
_network_params: Optional[dict] = None  # this process's, once its backend is set up


def network_params() -> Optional[dict]:
    """A copy of this worker's LightGBM network parameters (`num_machines`, `local_listen_port`,
    `machines`, and `DATA_PARALLEL`'s), or None outside a LightGBMTrainer's worker."""
    with _params_lock:
        return dict(_network_params) if _network_params is not None else None


def _set_network_params(params: Optional[dict]) -> None:
    global _network_params
    with _params_lock:
        _network_params = params


def routable_address(peer_address: str, peer_port: int) -> str:
    """This host's address on the route to `peer_address` (a UDP connect sends nothing; the kernel
    picks the source address it would use)."""
    family, kind, proto, _, address = socket.getaddrinfo(peer_address, peer_port, type=socket.SOCK_DGRAM)[0]
    with socket.socket(family, kind, proto) as probe:
        probe.connect(address)
        return probe.getsockname()[0]


def machines_list(entries: list[str]) -> str:
    """LightGBM's `machines` parameter: "host:port" entries in rank order, comma-separated (an IPv6
    address is written bare, as LightGBM parses it up to the last colon)."""
    return ",".join(entries)


@dataclass
class LightGBMBackend:
    """LightGBM's network parameters, agreed per attempt (module doc)."""

    name: str = "lightgbm"
    timeout_s: float = 1800.0

    def setup(self, link: StoreLink) -> None:
        """Publish this rank's address and free port; read every rank's; set the network parameters."""
        worker = link.assignment.worker
        address = routable_address(link.address, link.port)
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as held:
            held.bind((address, 0))
            port = held.getsockname()[1]
            link.store.set(_KEY.format(rank=worker.rank), f"{address}:{port}")
            entries = [link.store.get(_KEY.format(rank=rank)).decode() for rank in range(worker.world_size)]
        _set_network_params({"num_machines": worker.world_size, "local_listen_port": port,
                             "machines": machines_list(entries), **DATA_PARALLEL})

    def training(self) -> ContextManager[None]:
        """Nothing around the function: it passes `get_network_params()` to `lightgbm.train` itself."""
        return contextlib.nullcontext()

    def teardown(self) -> None:
        """Forget the parameters (LightGBM closes its sockets when `train` returns)."""
        _set_network_params(None)
