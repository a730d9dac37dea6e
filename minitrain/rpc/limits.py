"""File-descriptor budget of the coordinator and agents (L1): what a connection flood cannot take.

Every connection costs the coordinator one file descriptor. With the common soft limit of 1024, 1100
idle connections from any local user once took every descriptor of a driver, and the run died
(blamed on node loss). Three things keep that from happening:

- `raise_fd_limit()` raises the soft RLIMIT_NOFILE to the hard limit, once per process (the driver
  when its coordinator starts, every agent at start; workers inherit their agent's).
- `max_incoming_connections()` caps the connections gRPC accepts (`grpc.max_allowed_incoming_
  connections`; gRPC closes any beyond at once) below what the limit leaves after a reserve for
  files, so connections alone can never exhaust descriptors.
- `minitrain.rpc.channel.SERVER_OPTIONS` closes a connection that has not finished its handshake
  (TLS and the HTTP/2 preface) within a few seconds, and one that holds no call for a few seconds,
  so an idle connection holds its place briefly; authenticated peers always hold their stream open,
  and their clients retry a refused connection (`wait_for_ready`).
"""

from __future__ import annotations

import logging
import resource
import threading

logger = logging.getLogger("minitrain")

# Descriptors kept for everything that is not a connection (the interpreter, logs, checkpoints).
FD_RESERVE = 64
# The least cap: a tiny limit still admits a small run.
MIN_CONNECTIONS = 16

_raised = False
_raised_lock = threading.Lock()


def raise_fd_limit() -> tuple[int, int]:
    """Raise this process's soft RLIMIT_NOFILE to its hard limit (the first call only; logged at
    debug). Returns the (soft, hard) limits now in force. A limit that cannot be raised is kept."""
    global _raised
    with _raised_lock:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if _raised or soft == hard:
            _raised = True
            return soft, hard
        _raised = True
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError) as exc:  # e.g. an unlimited hard limit the kernel refuses
            logger.debug("could not raise the file-descriptor limit from %d to %d: %s", soft, hard, exc)
            return soft, hard
        logger.debug("raised the file-descriptor limit from %d to %d", soft, hard)
        return hard, hard


def max_incoming_connections(soft_limit: int | None = None) -> int:
    """How many connections the coordinator accepts at once: half of the descriptors left after
    FD_RESERVE (each worker also costs the driver a log file), at least MIN_CONNECTIONS.

    `soft_limit` defaults to this process's current soft RLIMIT_NOFILE (unlimited counts as 2**20).
    """
    if soft_limit is None:
        soft_limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft_limit == resource.RLIM_INFINITY or soft_limit < 0:
        soft_limit = 1 << 20
    return max(MIN_CONNECTIONS, (soft_limit - FD_RESERVE) // 2)
