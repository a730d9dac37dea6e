"""JAX's multi-process runtime for one worker: `jax.distributed` with its coordination service on rank 0 (L2).

Each attempt, rank 0 reserves a free port on the address its TCPStore listens on (the address the other
hosts reach it by), publishes `address:port` under one key of the attempt's store, and every rank calls
`jax.distributed.initialize` with it, the attempt's world size and its own rank, so `jax.process_index()`
is the rank; rank 0's call starts JAX's coordination service there, bound to that address only. As for
XGBoost's tracker, the service lives in rank 0's worker, not in the driver: the coordinator never imports
jax, and the service lives exactly as long as its attempt. The port stays reserved until the service has
bound it: the reserving socket is bound with SO_REUSEPORT and never listens, and the service's gRPC server
binds with SO_REUSEPORT too (Linux shares such a port only within one user), so no other user's process
can take the port in between and no connection is ever queued on the reserving socket.

Before initialising, unless the worker's environment names them already: a worker without GPUs runs JAX
on CPU (`jax_platforms="cpu"`: with a CUDA build of JAX on a GPU host, every CPU worker would otherwise
grab every GPU); the processes' CPU collectives run over gloo (`jax_cpu_collectives_implementation`);
and JAX's preemption service is off (`jax_enable_preemption_service`), because it installs a SIGTERM
handler that swallows minitrain's stop of the worker (minitrain's own preemption handling,
FailureConfig.preemption_signals, covers it). A worker with GPUs passes their indices (into its
CUDA_VISIBLE_DEVICES, which TorchTrainer's placement sets) as `local_device_ids`: one process drives
exactly its GPU(s).

With gloo, JAX's CPU collectives listen on the address the host's name resolves to, which across hosts is
often loopback (Debian's 127.0.1.1, or containers sharing one name): the peers then cannot connect. So
the backend registers JAX's CPU backend with gloo bound as torch's gloo is: to GLOO_SOCKET_IFNAME's
interface (minitrain sets it to the interface that reaches the other hosts, unless the user did), else to
the address this host reaches rank 0's store from (`bind_cpu_collectives`; JAX has no public setting
for it, so this uses JAX's backend registration, and a JAX without it keeps its own choice, with a
warning).

Teardown (success only) calls `jax.distributed.shutdown()`, whose barrier every rank reaches (rank 0
after its release). A rank that fails skips it: JAX's own exit hook would run the same shutdown, whose
barrier waits for peers that are being stopped (observed: until they are killed). So an exit hook of
ours, run before JAX's, detaches JAX's distributed state on that path; the process exits right after.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import socket
from dataclasses import dataclass, field
from typing import Any, ContextManager, Optional

from minitrain.worker.backend import StoreLink
from minitrain.worker.lightgbm_backend import routable_address

logger = logging.getLogger("minitrain")

COORDINATOR_KEY = "minitrain/jax/coordinator"  # rank 0's "address:port" of JAX's coordination service

# The JAX settings the backend chooses, each unless the worker's environment sets it (JAX reads these
# variables at import): name -> (environment variable, value).
_PREEMPTION = ("jax_enable_preemption_service", "JAX_ENABLE_PREEMPTION_SERVICE", False)
_COLLECTIVES = ("jax_cpu_collectives_implementation", "JAX_CPU_COLLECTIVES_IMPLEMENTATION", "gloo")
_CPU_ONLY = ("jax_platforms", "JAX_PLATFORMS", "cpu")

_detached: list = []  # JAX objects of a failed rank, kept alive: destroying them would run their shutdown


def host_port(address: str, port: int) -> str:
    """`address:port` as gRPC parses it (an IPv6 address in brackets)."""
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


def reserve_port(address: str) -> socket.socket:
    """A TCP socket bound, with SO_REUSEPORT and without listening, to a port of `address` the kernel
    picks (module doc: why it keeps the port for the coordination service). The caller closes it."""
    family, kind, proto, _, sockaddr = socket.getaddrinfo(address, 0, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(sockaddr)
    except BaseException:
        sock.close()
        raise
    return sock


def jax_settings(environ: Any, has_gpus: bool) -> dict[str, Any]:
    """The JAX config values the backend sets for a worker with `environ` (those its environment does
    not name), with or without GPUs."""
    chosen = [_PREEMPTION, _COLLECTIVES] + ([] if has_gpus else [_CPU_ONLY])
    return {name: value for name, variable, value in chosen if variable not in environ}


def bind_cpu_collectives(address: Optional[str], interface: Optional[str]) -> bool:
    """Make JAX's CPU backend, when first created, use gloo collectives listening on the network
    `interface` or, without one, on `address` (module doc). Call after `jax.distributed.initialize` and
    before any computation. False when this JAX lacks the internals it uses (JAX's default stands)."""
    try:
        from jax._src import distributed, xla_bridge
        from jax._src.lib import _jax

        make_collectives, make_cpu_client = _jax.make_gloo_tcp_collectives, xla_bridge.make_cpu_client
        register = xla_bridge.register_backend_factory
    except (ImportError, AttributeError):
        return False

    def cpu_client() -> Any:
        collectives = make_collectives(distributed_client=distributed.global_state.client,
                                       hostname=None if interface else address, interface=interface)
        return make_cpu_client(collectives=collectives)

    register("cpu", cpu_client, priority=0, fail_quietly=False)
    return True


def detach_distributed_state() -> None:
    """Make JAX's exit hook find no distributed client or service to shut down (a failed rank: module
    doc). The objects are kept referenced: their destructors would shut down as well."""
    try:  # JAX's private state: a JAX without it keeps its exit hook's shutdown
        from jax._src import distributed
    except ImportError:
        return
    state = getattr(distributed, "global_state", None)
    for name in ("preemption_sync_manager", "client", "service"):
        if getattr(state, name, None) is not None:
            _detached.append(getattr(state, name))
            setattr(state, name, None)


@dataclass
class JaxBackend:
    """`jax.distributed` for one worker (module doc); `timeout_s` bounds the rendezvous, the
    initialisation and the shutdown barrier."""

    name: str = "jax"
    timeout_s: float = 1800.0
    _torn_down: bool = field(default=False, repr=False)

    def setup(self, link: StoreLink) -> None:
        """Rank 0 reserves and publishes the coordinator's address; every rank initialises
        `jax.distributed` with it. Raises RuntimeError when GPUs were placed but JAX sees none."""
        import jax

        worker = link.assignment.worker
        for name, value in jax_settings(os.environ, bool(worker.gpu_ids)).items():
            jax.config.update(name, value)
        atexit.register(self._detach_unless_torn_down)  # before initialize: a failed one is detached too
        seconds = max(1, int(self.timeout_s))
        reserved = None
        try:
            if worker.rank == 0:
                reserved = reserve_port(link.assignment.store_address)
                link.store.set(COORDINATOR_KEY, host_port(link.assignment.store_address, reserved.getsockname()[1]))
            coordinator = link.store.get(COORDINATOR_KEY).decode()
            # All four of address, count, id and devices given, and detection off: JAX's Slurm/MPI
            # detection must not override minitrain's ranks (a run under srun has SLURM_* set).
            jax.distributed.initialize(
                coordinator_address=coordinator, num_processes=worker.world_size, process_id=worker.rank,
                local_device_ids=list(worker.gpu_ids) or None, cluster_detection_method="deactivate",
                initialization_timeout=seconds, coordinator_bind_address=coordinator,
                shutdown_timeout_seconds=seconds)
        finally:
            if reserved is not None:
                reserved.close()
        if jax.config.jax_cpu_collectives_implementation == "gloo":
            interface = (os.environ.get("GLOO_SOCKET_IFNAME") or "").split(",")[0] or None
            if not bind_cpu_collectives(routable_address(link.address, link.port), interface):
                logger.warning("this JAX (%s) has no backend registration minitrain knows: its gloo collectives "
                               "listen on the address the host's name resolves to, which other hosts may not "
                               "reach", jax.__version__)
        if worker.gpu_ids:
            platforms = sorted({device.platform for device in jax.local_devices()})
            if not {"gpu", "cuda"} & set(platforms):
                raise RuntimeError(
                    f"ScalingConfig(use_gpu=True) gave this worker GPU(s) {list(worker.gpu_ids)}, but JAX sees only "
                    f"{', '.join(platforms)} devices: install JAX's CUDA build on every host (pip install "
                    "'jax[cuda12]'), or train on CPUs with use_gpu=False.")

    def training(self) -> ContextManager[None]:
        """Nothing around the training function: `jax.distributed` is already up."""
        return contextlib.nullcontext()

    def teardown(self) -> None:
        """`jax.distributed.shutdown()`: a barrier of every rank (all of them are done)."""
        import jax

        try:
            jax.distributed.shutdown()
        except Exception as exc:  # noqa: BLE001 - the run succeeded; the process exits next anyway
            logger.warning("jax.distributed.shutdown() failed after training (%s: %s); the worker exits anyway",
                           type(exc).__name__, exc)
            detach_distributed_state()
        self._torn_down = True

    def _detach_unless_torn_down(self) -> None:
        if not self._torn_down:
            detach_distributed_state()
