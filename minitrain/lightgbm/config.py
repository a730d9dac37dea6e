"""`LightGBMConfig` and `get_network_params()`: LightGBM's network for a LightGBMTrainer's workers (L3)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from minitrain.config._validate import _number
from minitrain.worker import lightgbm_backend

logger = logging.getLogger("minitrain")


@dataclass(frozen=True, kw_only=True, slots=True)
class LightGBMConfig:
    """LightGBM's data-parallel network, as Ray's `LightGBMConfig` (which has no fields). `timeout_s`
    (a minitrain extension): how long the rendezvous waits for a peer, in seconds (default 1800).
    LightGBM's own network waits are its parameter `time_out` (minutes), set in your params."""

    timeout_s: float = 1800

    def __post_init__(self) -> None:
        object.__setattr__(self, "timeout_s", _number(
            self.timeout_s, "LightGBMConfig", "timeout_s", above=0,
            fix="Use the seconds a worker may wait for its peers (default 1800)."))

    def to_dict(self) -> dict[str, Any]:
        """The fields as a new plain dict."""
        return {"timeout_s": self.timeout_s}


def get_network_params() -> dict:
    """This worker's LightGBM network parameters, to merge into the params of `lightgbm.train`:
    `num_machines`, `local_listen_port` and `machines` (every rank's "address:port", in rank order), and
    (unlike Ray's) `tree_learner="data"` and `pre_partition=True`, so that `lightgbm.train` trains one
    data-parallel model over the ranks' disjoint shards; put your own `tree_learner` ("voting",
    "feature") after `**get_network_params()` to choose another parallel learner.
    Outside a LightGBMTrainer's worker (local mode, a plain script) it logs a warning and returns {},
    as Ray's does: LightGBM then trains on this process's data alone."""
    params = lightgbm_backend.network_params()
    if params is None:
        logger.warning("minitrain.lightgbm.get_network_params() was called outside the training function of a "
                       "LightGBMTrainer with workers, so there is no worker group to connect: it returns {} and "
                       "LightGBM trains on this process's data alone.")
        return {}
    return params
