"""`XGBoostConfig`: how an XGBoostTrainer's workers set up XGBoost's collective layer (stdlib only)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from minitrain.config._validate import _choice, _number


@dataclass(frozen=True, kw_only=True, slots=True)
class XGBoostConfig:
    """XGBoost's collective communication, as Ray's `XGBoostConfig`.

    `xgboost_communicator`: "rabit", the only one (Ray's default and only value). `timeout_s` (a
    minitrain extension): how long the rendezvous, the tracker and XGBoost's collectives wait for a
    peer, in seconds (default 1800, TorchConfig's).
    """

    xgboost_communicator: str = "rabit"
    timeout_s: float = 1800

    def __post_init__(self) -> None:
        _choice(self.xgboost_communicator, "XGBoostConfig", "xgboost_communicator", ("rabit",))
        object.__setattr__(self, "timeout_s", _number(
            self.timeout_s, "XGBoostConfig", "timeout_s", above=0,
            fix="Use the seconds a worker may wait for its peers (default 1800)."))

    def to_dict(self) -> dict[str, Any]:
        """The fields as a new plain dict (as Ray's `XGBoostConfig.to_dict`)."""
        return {"xgboost_communicator": self.xgboost_communicator, "timeout_s": self.timeout_s}
