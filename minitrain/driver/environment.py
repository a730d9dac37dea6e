"""What the driver process hands on to the run's processes, and how it takes a stop signal (L3): its
import path, the variables forwarded to workers, and SIGTERM handled like Ctrl-C during fit()."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
from typing import TYPE_CHECKING, Any, Iterator

import minitrain

if TYPE_CHECKING:
    from minitrain.config import RunConfig
    from minitrain.hosts.cluster import ClusterConfig

logger = logging.getLogger("minitrain")


def driver_pythonpath() -> tuple[str, ...]:
    """The driver's import path, so workers import the same minitrain and user modules."""
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(minitrain.__file__)))  # what holds minitrain/
    entries = [package_root] + [os.path.abspath(p) if p else os.getcwd() for p in sys.path]
    seen: dict[str, None] = {}
    for entry in entries:
        if os.path.isdir(entry):
            seen.setdefault(entry, None)
    return tuple(seen)


@contextlib.contextmanager
def sigterm_stops_like_ctrl_c() -> Iterator[None]:
    """SIGTERM to the driver (`kill`, a scheduler's stop, a container's shutdown) stops the run the way
    Ctrl-C does: the workers get their grace, the index and the event log are written, the run lock is
    released; a second SIGTERM kills the workers at once, as a second Ctrl-C does. Then the driver dies
    by SIGTERM, as it did before (at once, leaving the workers to notice their driver was gone), so the
    sender sees the status it expects (143, -15). Only where both signals have Python's default
    handling, on the main thread: a handler of the user's own is left alone."""
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
        yield
        return
    received: list[int] = []

    def on_sigterm(signum: int, frame: Any) -> None:
        received.append(signum)
        signal.raise_signal(signal.SIGINT)  # what Ctrl-C does, whichever handler is in place now

    # While the controller's loop runs, a SIGTERM listed in FailureConfig.preemption_signals marks the
    # run preempted instead (coordinator/preemption_signals.py replaces this handler for that time).
    on_sigterm.yields_to_preemption = True  # type: ignore[attr-defined]

    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        yield
    except KeyboardInterrupt:
        if not received:
            raise
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if received:
        logger.warning("the driver got SIGTERM: the run was stopped as by Ctrl-C; exiting by SIGTERM")
        signal.raise_signal(signal.SIGTERM)


# Driver variables every worker receives (over the authenticated channel, never an ssh command line).
_FORWARDED_PREFIXES = ("NCCL_", "GLOO_", "CUDA_", "TORCH_NCCL_", "TORCH_DISTRIBUTED_")
_NOT_FORWARDED = {"CUDA_VISIBLE_DEVICES"}  # each node decides its own


def worker_env(run_config: "RunConfig", cluster: "ClusterConfig") -> dict[str, str]:
    """The variables every worker of the run gets from the driver: NCCL/GLOO/CUDA/torch.distributed
    settings (never CUDA_VISIBLE_DEVICES), the cluster's `env_vars_to_forward`, and the run's
    `worker_runtime_env["env_vars"]`, which win."""
    env = {k: v for k, v in os.environ.items()
           if k.startswith(_FORWARDED_PREFIXES) and k not in _NOT_FORWARDED}
    env.update({name: os.environ[name] for name in cluster.env_vars_to_forward if name in os.environ})
    env.update(run_config.worker_runtime_env.get("env_vars", {}))
    return env
