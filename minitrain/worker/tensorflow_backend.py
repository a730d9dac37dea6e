"""TensorFlow's cluster for one worker: `TF_CONFIG` from every rank's address and free port, agreed through the store (L2).

`tf.distribute.MultiWorkerMirroredStrategy` reads `TF_CONFIG` when it is built: the cluster's workers
("host:port", one per rank, in rank order) and this process's task (`{"type": "worker", "index": rank}`,
worker 0 being TensorFlow's chief). Each worker then serves its own gRPC endpoint on its port and the
collectives run between them. So each attempt, every rank finds the address it reaches rank 0's store
from (the interface its hosts route over: 127.0.0.1 when all ranks are local), binds a port there (the
kernel picks a free one), writes "host:port" under its rank's key of the attempt's store and reads
every rank's, so all ranks hold the same cluster before the training function starts. It keeps its
socket bound until every rank has published, so two ranks of one host never get the same port, and
closes it just before training: TensorFlow binds the port itself when the strategy is built, so a
process outside the run could still take it in between (as with Ray, whose workers pick the port the
same way). Teardown removes `TF_CONFIG`. Nothing here imports tensorflow.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
from dataclasses import dataclass, field
from typing import Iterator

from minitrain.worker.backend import StoreLink
from minitrain.worker.lightgbm_backend import routable_address

TF_CONFIG = "TF_CONFIG"  # the variable TensorFlow's cluster resolver reads
_KEY = "minitrain/tensorflow/worker/{rank}"  # each rank's "host:port" in the attempt's store
_MAX_ENTRY = 300  # bytes: the longest "host:port" a peer may publish (a DNS name is at most 253)

# Added to the error of a training function that ran Keras 3's Model.fit under MultiWorkerMirroredStrategy.
KERAS3_MULTI_WORKER_NOTE = (
    "minitrain: Keras 3's Model.fit/evaluate fail under tf.distribute.MultiWorkerMirroredStrategy with more than "
    "one worker ('Attempt to convert a value (PerReplica...)'; keras-team/keras#20585). Use Keras 2 as Ray's "
    "TensorFlow examples do (pip install tf-keras; RunConfig(worker_runtime_env={'env_vars': "
    "{'TF_USE_LEGACY_KERAS': '1'}})), or a custom training loop with strategy.run (docs/trainers/tensorflow.md).")


def endpoint(address: str, port: int) -> str:
    """`address:port` as TF_CONFIG names a worker (an IPv6 address in brackets, as gRPC parses it)."""
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


def check_endpoint(entry: str, rank: int) -> str:
    """`entry` (what rank `rank` published in the store) if it is a bounded "host:port" with a port in
    1..65535; RuntimeError naming the rank and the value otherwise."""
    host, _, port = entry.rpartition(":")
    if (len(entry) > _MAX_ENTRY or not host or not port.isdigit() or not 0 < int(port) < 65536
            or any(ch.isspace() or ch in ",\"'\\" for ch in entry)):
        raise RuntimeError(f"rank {rank} published {entry[:_MAX_ENTRY]!r} as its TensorFlow worker address in the "
                           "attempt's store; expected 'host:port'. Something other than this run's workers "
                           "wrote the store's key.")
    return entry


def tf_config(workers: list[str], rank: int) -> dict:
    """The TF_CONFIG of rank `rank` in a cluster of `workers` ("host:port" in rank order)."""
    if not workers:
        raise ValueError("tf_config needs at least one worker address")
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < len(workers):
        raise ValueError(f"tf_config(rank={rank!r}): the rank must be an int in 0..{len(workers) - 1}, one per "
                         "worker address")
    return {"cluster": {"worker": list(workers)}, "task": {"type": "worker", "index": rank}}


@dataclass
class TensorflowBackend:
    """TF_CONFIG for MultiWorkerMirroredStrategy, agreed per attempt (module doc)."""

    name: str = "tensorflow"
    timeout_s: float = 1800.0
    _world_size: int = field(default=1, repr=False)  # this attempt's, once set up

    def setup(self, link: StoreLink) -> None:
        """Publish this rank's address and free port; read every rank's; set TF_CONFIG."""
        worker = link.assignment.worker
        address = routable_address(link.address, link.port)
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as held:
            held.bind((address, 0))
            link.store.set(_KEY.format(rank=worker.rank), endpoint(address, held.getsockname()[1]))
            workers = [check_endpoint(link.store.get(_KEY.format(rank=rank)).decode(errors="replace"), rank)
                       for rank in range(worker.world_size)]
        os.environ[TF_CONFIG] = json.dumps(tf_config(workers, worker.rank))
        self._world_size = worker.world_size

    def training(self) -> contextlib.AbstractContextManager[None]:
        """Nothing is set up around the function (the strategy it builds reads TF_CONFIG); a known Keras 3
        failure under the strategy gets a note naming the fix."""
        return _noting_keras3_failure(self._world_size)

    def teardown(self) -> None:
        """Remove TF_CONFIG (TensorFlow's servers stop when the process exits, right after)."""
        os.environ.pop(TF_CONFIG, None)


def is_keras3_multi_worker_failure(exc: BaseException, world_size: int) -> bool:
    """True for the error Keras 3's Model.fit/evaluate raise under MultiWorkerMirroredStrategy with more
    than one worker: a ValueError about converting a `PerReplica` value, with Keras 3 loaded."""
    keras = sys.modules.get("keras")
    version = str(getattr(keras, "__version__", ""))
    return (world_size > 1 and isinstance(exc, ValueError) and "PerReplica" in str(exc)
            and version.startswith("3.") and os.environ.get("TF_USE_LEGACY_KERAS", "") not in ("1", "true", "True"))


@contextlib.contextmanager
def _noting_keras3_failure(world_size: int) -> Iterator[None]:
    try:
        yield
    except ValueError as exc:
        if is_keras3_multi_worker_failure(exc, world_size):
            if hasattr(exc, "add_note"):  # Python >= 3.11: the note travels in the error's traceback
                exc.add_note(KERAS3_MULTI_WORKER_NOTE)
            else:
                sys.stderr.write(KERAS3_MULTI_WORKER_NOTE + "\n")
        raise
