"""The training session inside a worker: what `minitrain.report()` and friends talk to."""

from __future__ import annotations

import time
from typing import Any, Optional

from minitrain.context import TrainContext
from minitrain.metrics import encode_metrics
from minitrain.rpc._gen import minitrain_pb2 as pb
from minitrain.worker.client import WorkerClient


class WorkerSession:
    """Implements `minitrain._session.Session` for one rank of one attempt.

    `report()` without a checkpoint validates and queues the metrics and returns: it never waits for
    other ranks or for the network. Reports are delivered in call order and flushed before the
    worker's outcome is sent.
    """

    def __init__(self, client: WorkerClient, context: TrainContext):
        self.context = context
        self._client = client
        self._round = 0

    def report(self, metrics: dict, checkpoint: Any = None, checkpoint_dir_name: Optional[str] = None,
               **options: Any) -> None:
        """Queue one report of this rank (see `minitrain.report`)."""
        if checkpoint is not None:
            raise NotImplementedError(
                "minitrain.report(checkpoint=...) is not available yet: checkpoint upload and commit "
                "are the next milestone. Report metrics only for now.")
        text = encode_metrics(metrics)
        client = self._client
        client.put(pb.WorkerMessage(
            run_id=client.run_id, attempt=client.attempt, rank=client.rank,
            report=pb.Report(round=self._round, metrics_json=text, reported_at=time.time()),
        ))
        self._round += 1

    def get_checkpoint(self) -> Any:
        """The checkpoint to resume from: None until checkpoints can be committed."""
        return None
