"""`minitrain.collective`: `barrier()` and `broadcast_from_rank_zero(data)` across a run's ranks.

The counterpart of `ray.train.collective`, with the same signatures plus an optional `timeout_s`.
Every rank must make the same collective calls in the same order. In local mode
(`ScalingConfig(num_workers=0)`) and with one worker they return at once (`broadcast_from_rank_zero`
returns its argument).

Timeouts: `timeout_s` (a minitrain extension), else none, as in Ray by default: the call waits,
logging every 60 s which ranks it still waits for. On timeout it
raises `CollectiveTimeoutError` (a `TimeoutError`; Ray's name `BroadcastCollectiveTimeoutError` is an
alias) naming the ranks that did not arrive. After a timeout the ranks are out of step unless the
missing ranks still make the call; usually let the error fail the run.

How it works, without an RPC of its own: over the run's torch.distributed TCPStore, which every
worker already shares, through a dedicated client connection per worker, so it works the same
under gloo and NCCL and never waits behind (or holds up) the process group's own collectives or
store traffic. The k-th collective of an attempt uses keys under `<namespace>/<k>/`: each rank sets
its arrival key and waits for every rank's; on a timeout it checks which keys are missing. For a
broadcast, rank 0 first stores the pickled data with an HMAC-SHA256 tag keyed by a secret derived from
the run's token, and the other ranks verify the tag before unpickling: the TCPStore is
unauthenticated, and nothing unauthenticated is ever unpickled. Once collective k completes, each
rank deletes its keys of collective k-1 (every rank has left it), so the store does not grow.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import threading
import time
import weakref
from datetime import timedelta
from typing import Any, Optional, TypeVar

from minitrain import _session, waits

logger = logging.getLogger("minitrain")

T = TypeVar("T")
WARN_INTERVAL_S = 60.0


class CollectiveTimeoutError(TimeoutError):
    """A collective did not complete in time. `missing_ranks` did not arrive; `operation` is
    "barrier" or "broadcast_from_rank_zero"."""

    def __init__(self, message: str, missing_ranks: tuple[int, ...] = (), operation: str = ""):
        super().__init__(message)
        self.missing_ranks = tuple(missing_ranks)
        self.operation = operation

    def __reduce__(self):
        return (type(self), (str(self), self.missing_ranks, self.operation))


BroadcastCollectiveTimeoutError = CollectiveTimeoutError  # Ray's name


class StoreGroup:
    """Barrier and broadcast among `world_size` ranks over a key-value store (a torch.distributed
    Store: `set`, `get`, `check`, `wait`, `delete_key`), as described in the module doc.

    `namespace` must be unique to the attempt (keys and tags include it); `secret` signs broadcast
    data. Not thread-safe: one thread per rank makes the calls, in the same order on every rank.
    """

    def __init__(self, store: Any, rank: int, world_size: int, namespace: str, secret: bytes,
                 warn_interval_s: float = WARN_INTERVAL_S):
        self._store = store
        self._rank = rank
        self._world_size = world_size
        self._namespace = namespace
        self._secret = secret
        self._warn_interval_s = warn_interval_s
        self._seq = 0
        self._previous: Optional[tuple[int, str]] = None

    @property
    def rank(self) -> int:
        """This process's rank in the group."""
        return self._rank

    def barrier(self, timeout_s: Optional[float] = None) -> None:
        """Return once every rank has called `barrier` (CollectiveTimeoutError after `timeout_s`)."""
        self._collective("barrier", None, timeout_s)

    def broadcast(self, data: bytes, timeout_s: Optional[float] = None) -> bytes:
        """Rank 0's `data` on every rank, once every rank has called `broadcast`. Raises
        CollectiveTimeoutError after `timeout_s`, and RuntimeError when the data's tag does not verify."""
        received = self._collective("broadcast_from_rank_zero", data, timeout_s)
        return data if self._rank == 0 else received

    # ------------------------------------------------------------------ protocol

    def _key(self, seq: int, name: str) -> str:
        return f"{self._namespace}/{seq}/{name}"

    def _collective(self, operation: str, data: Optional[bytes], timeout_s: Optional[float]) -> Optional[bytes]:
        with waits.blocked(waits.COLLECTIVE):  # the rank's telemetry: collective wait
            return self._collective_blocking(operation, data, timeout_s)

    def _collective_blocking(self, operation: str, data: Optional[bytes],
                             timeout_s: Optional[float]) -> Optional[bytes]:
        seq = self._seq
        self._seq += 1
        data_key = self._key(seq, "data")
        if operation != "barrier" and self._rank == 0:
            self._store.set(data_key, self._tag(data_key, data) + data)
        arrivals = [self._key(seq, f"{operation}/{rank}") for rank in range(self._world_size)]
        self._store.set(arrivals[self._rank], b"1")
        self._wait(operation, seq, arrivals, timeout_s)
        received = None
        if operation != "barrier" and self._rank != 0:
            received = self._verified(data_key, self._store.get(data_key))
        self._forget_previous()
        self._previous = (seq, operation)
        return received

    def _wait(self, operation: str, seq: int, keys: list[str], timeout_s: Optional[float]) -> None:
        started = time.monotonic()
        deadline = None if timeout_s is None else started + timeout_s
        while True:
            chunk = self._warn_interval_s if deadline is None else min(self._warn_interval_s,
                                                                       deadline - time.monotonic())
            try:
                self._store.wait(keys, timedelta(seconds=max(chunk, 0.001)))
                return
            except RuntimeError:  # torch's DistStoreError on timeout; a broken store fails check() below
                missing = tuple(rank for rank, key in enumerate(keys) if not self._store.check([key]))
            if not missing:
                return
            waited = time.monotonic() - started
            if deadline is not None and time.monotonic() >= deadline:
                raise CollectiveTimeoutError(
                    # The timeout as given: the time measured runs a little past it on a loaded host.
                    f"minitrain.collective.{operation}() timed out after {timeout_s:g} s on rank {self._rank}: "
                    f"rank(s) {list(missing)} did not call it (collective #{seq} of this attempt). Every rank "
                    "must call the same collectives in the same order; a missing rank is slow, stuck, or "
                    "took another branch.", missing, operation)
            logger.warning("minitrain.collective.%s(): rank %d has waited %.0f s for rank(s) %s.",
                           operation, self._rank, waited, list(missing))

    def _forget_previous(self) -> None:
        if self._previous is None:
            return
        seq, operation = self._previous
        self._store.delete_key(self._key(seq, f"{operation}/{self._rank}"))
        if operation != "barrier" and self._rank == 0:
            self._store.delete_key(self._key(seq, "data"))

    def _tag(self, key: str, data: bytes) -> bytes:
        return hmac.new(self._secret, key.encode() + b"\0" + data, hashlib.sha256).digest()

    def _verified(self, key: str, value: bytes) -> bytes:
        tag, data = value[:32], value[32:]
        if not hmac.compare_digest(tag, self._tag(key, data)):
            raise RuntimeError(f"minitrain.collective: the broadcast data under {key!r} in the TCPStore failed "
                               "authentication; something other than this run's rank 0 wrote it. Keep the "
                               "training network trusted.")
        return data


# ---------------------------------------------------------------------------------- public functions

_groups: "weakref.WeakKeyDictionary[Any, StoreGroup]" = weakref.WeakKeyDictionary()
_groups_lock = threading.Lock()


def _timeout(timeout_s: Optional[float]) -> Optional[float]:
    if timeout_s is None:
        return None
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not timeout_s > 0:
        raise ValueError(f"timeout_s={timeout_s!r} must be a positive number of seconds, or None to wait "
                         "without limit.")
    return float(timeout_s)


def _group(function_name: str) -> Optional[StoreGroup]:
    """This rank's group, or None when the call is trivial (local mode, one worker)."""
    session = _session.current(function_name)
    context = session.context
    channel = getattr(session, "collective_channel", None)
    if context.get_world_size() <= 1 or channel is None:
        return None
    with _groups_lock:
        group = _groups.get(session)
        if group is None:
            store, namespace, secret = channel()
            group = StoreGroup(store, context.get_world_rank(), context.get_world_size(), namespace, secret)
            _groups[session] = group
        return group


def barrier(*, timeout_s: Optional[float] = None) -> None:
    """Wait until every rank of the run has called `barrier()`.

    `timeout_s` (a minitrain extension; default: no limit): raise `CollectiveTimeoutError` naming the
    ranks that have not arrived. Trivial in local mode and with one
    worker. Call it only inside the training function (RuntimeError elsewhere).
    """
    timeout = _timeout(timeout_s)
    group = _group("collective.barrier")
    if group is not None:
        group.barrier(timeout)


def broadcast_from_rank_zero(data: T, *, timeout_s: Optional[float] = None) -> T:
    """Rank 0's `data` on every rank (every rank must call it; the others' `data` is ignored).

    `data` must pickle (cloudpickle); it travels through the run's TCPStore, authenticated. Timeouts as
    for `barrier`. Returns `data` itself in local mode and with one worker.
    """
    import cloudpickle

    timeout = _timeout(timeout_s)
    group = _group("collective.broadcast_from_rank_zero")
    if group is None:
        return data
    payload = b""
    if group.rank == 0:
        try:
            payload = cloudpickle.dumps(data)
        except Exception as exc:
            raise TypeError(f"broadcast_from_rank_zero(data=...) cannot pickle {type(data).__name__} "
                            f"({type(exc).__name__}: {exc}); broadcast plain values.") from exc
    received = group.broadcast(payload, timeout)
    return data if group.rank == 0 else cloudpickle.loads(received)
