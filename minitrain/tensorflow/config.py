"""`TensorflowConfig`: how a TensorflowTrainer's workers find each other (stdlib only)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from minitrain.config._validate import _number


@dataclass(frozen=True, kw_only=True, slots=True)
class TensorflowConfig:
    """TensorFlow's multi-worker set-up, as Ray's `TensorflowConfig` (which has no fields): every
    attempt sets `TF_CONFIG` in each worker for `tf.distribute.MultiWorkerMirroredStrategy`
    (`minitrain.worker.tensorflow_backend`).

    `timeout_s` (a minitrain extension): how long the attempt's rendezvous and the exchange of the
    workers' addresses wait for a peer, in seconds (default 1800, TorchConfig's). TensorFlow's own
    collectives are not bounded by it: pass `tf.distribute.experimental.CommunicationOptions(
    timeout_seconds=...)` to the strategy for that.
    """

    timeout_s: float = 1800

    def __post_init__(self) -> None:
        object.__setattr__(self, "timeout_s", _number(
            self.timeout_s, "TensorflowConfig", "timeout_s", above=0,
            fix="Use the seconds a worker may wait for its peers (default 1800)."))

    def to_dict(self) -> dict[str, Any]:
        """The fields as a new plain dict."""
        return {"timeout_s": self.timeout_s}
