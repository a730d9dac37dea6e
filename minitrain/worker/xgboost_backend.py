"""XGBoost's collective layer for one worker: the RabitTracker on rank 0, the communicator on every rank (L2).

Where the tracker runs: in rank 0's worker, not in the driver. The driver (the coordinator) must start
without importing xgboost, as it does without torch (fast start, one supervisor for every trainer), and
rank 0 already hosts the attempt's TCPStore that every rank joins. So rank 0 starts the tracker on
the address its store listens on (its node's address the other hosts reach), publishes the tracker's
address under one key of the store, and every rank reads it there, the way torch's own rendezvous
finds the store. A new attempt has a new rank 0, store and tracker; a tracker never outlives its
attempt, since rank 0 exits only once every rank is done (its release). The tracker sorts workers by
a task id made of the zero-padded world rank, so XGBoost's ranks are minitrain's ranks.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
from dataclasses import dataclass, field
from typing import Any, ContextManager, Iterator, Optional

from minitrain.worker.backend import StoreLink

logger = logging.getLogger("minitrain")

TRACKER_KEY = "minitrain/xgboost/tracker"  # rank 0's tracker address, as JSON, in the attempt's store
TRACKER_JOIN_S = 5.0  # teardown: how long rank 0 waits for the tracker to see every worker's shutdown


def task_id(rank: int) -> str:
    """The XGBoost task id of `rank`: ordered as the ranks are, so the tracker (sortby="task") gives
    XGBoost rank r to minitrain rank r."""
    return f"[minitrain-rank={rank:08d}]"


@dataclass
class XGBoostBackend:
    """XGBoost's RabitTracker and communicator (`communicator`: "rabit", the only one XGBoost has)."""

    name: str = "xgboost"
    timeout_s: float = 1800.0
    communicator: str = "rabit"
    _args: Optional[dict] = field(default=None, repr=False)
    _tracker: Any = field(default=None, repr=False)
    _waiter: Optional[threading.Thread] = field(default=None, repr=False)

    def setup(self, link: StoreLink) -> None:
        """Rank 0 starts the tracker and publishes its address; every rank learns it from the store."""
        worker = link.assignment.worker
        if worker.rank == 0:
            from xgboost.tracker import RabitTracker

            self._tracker = RabitTracker(n_workers=worker.world_size, host_ip=link.assignment.store_address,
                                         sortby="task", timeout=max(1, int(self.timeout_s)))
            self._tracker.start()
            # worker_args() answers only while wait_for() runs; it returns once every worker shut down.
            self._waiter = threading.Thread(target=self._tracker.wait_for, name="xgboost-tracker", daemon=True)
            self._waiter.start()
            link.store.set(TRACKER_KEY, json.dumps(self._tracker.worker_args()))
        tracker_args = json.loads(link.store.get(TRACKER_KEY))
        self._args = {"dmlc_communicator": self.communicator, **tracker_args,
                      "dmlc_task_id": task_id(worker.rank), "dmlc_timeout": max(1, int(self.timeout_s))}

    def communicator_args(self) -> dict:
        """The keyword arguments of `xgboost.collective.init` for this rank (after `setup`)."""
        if self._args is None:
            raise RuntimeError("the XGBoost backend is not set up yet")
        return dict(self._args)

    def training(self) -> ContextManager[None]:
        """XGBoost's communicator around the training function, so `xgboost.train` is data-parallel."""
        return _communicator(self.communicator_args())

    def teardown(self) -> None:
        """Rank 0: wait a little for the tracker's thread (every worker has shut its communicator down)."""
        if self._waiter is not None:
            self._waiter.join(TRACKER_JOIN_S)
            if self._waiter.is_alive():
                logger.warning("XGBoost's tracker did not finish within %.0f s; the worker exits anyway",
                               TRACKER_JOIN_S)


@contextlib.contextmanager
def _communicator(args: dict) -> Iterator[None]:
    """XGBoost's `CommunicatorContext(**args)` (which also finds NCCL for `device="cuda"`), entered
    before the function and exited when it returns. Not when it raises: a failed rank's peers may be
    inside a collective, finalising could wait on them, and the failure must reach the coordinator now
    (the process exits right after; the attempt is torn down anyway)."""
    from xgboost.collective import CommunicatorContext

    context = CommunicatorContext(**args)
    context.__enter__()
    yield
    context.__exit__(None, None, None)
