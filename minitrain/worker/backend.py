"""The backend seam: what differs between torch, XGBoost and LightGBM inside a worker (L2).

Every attempt's workers share one rendezvous, whatever they train: rank 0 opens a TCPStore on a port
the kernel picks and the others join it (`minitrain.worker.distributed.open_store`); `minitrain.collective`
runs over it. A `Backend` brings up the library's own collective layer on top of that store, names
what the training function runs inside, and tears it down:

- `TorchBackend`: torch.distributed's default process group (`TorchTrainer`).
- `minitrain.worker.xgboost_backend.XGBoostBackend`: rank 0 starts XGBoost's RabitTracker and every
  rank runs the training function inside XGBoost's communicator (`XGBoostTrainer`).
- `minitrain.worker.lightgbm_backend.LightGBMBackend`: every rank picks a free port on its routable
  address; the machines list is agreed through the store (`LightGBMTrainer`).
- `minitrain.worker.tensorflow_backend.TensorflowBackend`: every rank picks a free port on its routable
  address; the ranks' addresses are agreed through the store and set as `TF_CONFIG` (`TensorflowTrainer`).
- `minitrain.worker.jax_backend.JaxBackend`: rank 0 publishes the address of JAX's coordination
  service through the store and every rank calls `jax.distributed.initialize` with it (`JaxTrainer`).

The trainer (in the driver) builds the backend object and ships it to the workers pickled inside the
run's payload (`records.RunPayload.backend`); the driver reads only `name` and `timeout_s`, which
travel in every worker's `Assignment` (`backend`, `dist_timeout_s`). Nothing here imports torch,
xgboost or lightgbm at module level, so the driver can build backends without importing them.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, ContextManager, Protocol

from minitrain.commands import Assignment


@dataclass(frozen=True)
class StoreLink:
    """What a backend's `setup` gets: this rank's assignment and the attempt's TCPStore (a torch
    `Store`: `set`, `get` (blocks until the key is set, up to the store's timeout), `add`), whose
    keys every rank of the attempt sees, at `address:port`."""

    assignment: Assignment
    store: Any
    address: str
    port: int


class Backend(Protocol):
    """One training library's collective layer in a worker; one object per worker process.

    `name`: the layer as the coordinator and logs name it (`Assignment.backend`: "gloo", "nccl",
    "xgboost", ...). `timeout_s`: how long the rendezvous and the layer's bring-up may wait for a
    peer. `setup` runs in the DIST_INIT phase (a raise fails the rank there), `training()` wraps the
    call of the training function, and `teardown` runs once the attempt is over for this rank (after
    rank 0's release), on success only: a failed worker exits at once.
    """

    name: str
    timeout_s: float

    def setup(self, link: StoreLink) -> None: ...

    def training(self) -> ContextManager[None]: ...

    def teardown(self) -> None: ...


@dataclass(frozen=True)
class TorchBackend:
    """torch.distributed's default process group over the attempt's store, with `name` as its
    backend ("gloo", "nccl" or "mpi"; `TorchConfig.resolved_backend`) and `timeout_s` as its timeout."""

    name: str = "gloo"
    timeout_s: float = 1800.0

    def setup(self, link: StoreLink) -> None:
        """Initialise the process group (the assignment carries this backend's name and timeout)."""
        from minitrain.worker import distributed

        distributed.init_process_group(link.assignment, link.store)

    def training(self) -> ContextManager[None]:
        """Nothing around the training function: the process group is already up."""
        return contextlib.nullcontext()

    def teardown(self) -> None:
        """Nothing: no destroy_process_group(). The process exits with os._exit right after, and tearing
        the group down can abort a rank whose peer (rank 0 hosts the TCPStore) has already exited."""
