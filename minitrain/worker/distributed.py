"""The attempt's rendezvous store, and torch.distributed's bring-up over it, for one worker.

Rendezvous cannot collide on ports: rank 0 opens a TCPStore on port 0 (the kernel picks a free
port), tells the coordinator, and the coordinator passes address:port to the other ranks. No fixed
port exists anywhere. The store listens only on the address used for the rendezvous (torch's own
listener would take every interface): rank 0 binds that socket itself and hands it to the store.
Note: torch's TCPStore and the collectives' traffic are unauthenticated and unencrypted; keep
training traffic on a trusted network (the same holds for torchrun).
"""

from __future__ import annotations

import os
import socket
from datetime import timedelta

from minitrain.commands import Assignment
from minitrain.worker.transport.client import WorkerClient


def set_rank_environment(assignment: Assignment) -> None:
    """RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE and NODE_RANK, as torchrun and Ray set them."""
    worker = assignment.worker
    os.environ.update({
        "RANK": str(worker.rank),
        "LOCAL_RANK": str(worker.local_rank),
        "WORLD_SIZE": str(worker.world_size),
        "LOCAL_WORLD_SIZE": str(worker.local_world_size),
        "NODE_RANK": str(worker.node_rank),
        "GROUP_RANK": str(worker.node_rank),
    })


def listening_socket(host: str) -> int:
    """A TCP socket listening on `host` (an IPv4 or IPv6 address or a name) at a free port, as a
    bare file descriptor for `TCPStore(master_listen_fd=...)`, which takes it over (and closes it)."""
    family, kind, proto, _, address = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.bind(address)
        sock.listen(socket.SOMAXCONN)
    except BaseException:
        sock.close()
        raise
    return sock.detach()


def open_store(assignment: Assignment, client: WorkerClient):
    """Open (rank 0) or join the attempt's TCPStore, the rendezvous every backend shares.

    Rank 0's store listens on `assignment.store_address` only (`listening_socket`) and tells the
    coordinator its port; the other ranks wait for it (`WorkerClient.wait_rendezvous`). Sets
    MASTER_ADDR/MASTER_PORT to the store's address for code that reads them (with RANK, LOCAL_RANK
    and WORLD_SIZE from `set_rank_environment`, these are what `deepspeed.initialize`, Lightning and
    Accelerate require). This holds for both `TorchConfig.init_method` values. Returns the store (kept
    referenced by the caller for the life of the process).
    """
    import torch.distributed as dist

    timeout = timedelta(seconds=assignment.dist_timeout_s)
    worker = assignment.worker
    world_size = worker.world_size
    if worker.rank == 0:
        store = dist.TCPStore(assignment.store_address, 0, world_size, is_master=True,
                              timeout=timeout, wait_for_workers=False,
                              master_listen_fd=listening_socket(assignment.store_address))
        address, port = assignment.store_address, store.port
        client.send_store_ready(address, port)
    else:
        rendezvous = client.wait_rendezvous(assignment.dist_timeout_s)
        address, port = rendezvous.address, rendezvous.port
        store = dist.TCPStore(address, port, world_size, is_master=False, timeout=timeout)
    os.environ["MASTER_ADDR"] = address
    os.environ["MASTER_PORT"] = str(port)
    return store


def init_process_group(assignment: Assignment, store) -> None:
    """Initialise torch.distributed's default process group over `store` (from `open_store`), with
    `assignment.backend` ("gloo", "nccl" or "mpi") and the assignment's timeout; DeepSpeed, Lightning
    and Accelerate find the group initialised and join it."""
    import torch
    import torch.distributed as dist

    timeout = timedelta(seconds=assignment.dist_timeout_s)
    worker = assignment.worker
    backend = assignment.backend
    if backend == "nccl":
        if "TORCH_NCCL_BLOCKING_WAIT" not in os.environ:
            os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
        if worker.gpu_ids:
            torch.cuda.set_device(worker.gpu_ids[0])
    if worker.gpu_ids:
        os.environ.setdefault("ACCELERATE_TORCH_DEVICE", f"cuda:{worker.gpu_ids[0]}")
    else:
        os.environ.setdefault("ACCELERATE_TORCH_DEVICE", "cpu")
    dist.init_process_group(backend, store=store, rank=worker.rank, world_size=worker.world_size,
                            timeout=timeout)
    wait_for_every_rank(store, worker.world_size, PROCESS_GROUP_UP_KEY, timeout)


PROCESS_GROUP_UP_KEY = "minitrain/process_group_up"


def wait_for_every_rank(store, world_size: int, key: str, timeout: timedelta) -> None:
    """Return once all `world_size` ranks have called this with `key` on `store` (one `add` and one
    `wait` each), or raise torch's store timeout error after `timeout`.

    Why after init_process_group: gloo builds its full mesh pair by pair, so one rank can return from
    init_process_group while a peer is still connecting; if that rank then fails at once (a training
    function that raises right after its first report()), the peer's connect fails ("Connection closed
    by peer") and it dies in set-up too, taking with it the round the failed rank's report() returned.
    No rank starts the training function before every rank's group is up. (torch has the same barrier
    behind TORCH_DIST_INIT_BARRIER=1, but that switch is read for every later `new_group()` of the user's
    code too, so it is not set here.)
    """
    arrived = store.add(key, 1)
    if arrived == world_size:
        store.set(f"{key}/all", b"1")
    store.wait([f"{key}/all"], timeout)
