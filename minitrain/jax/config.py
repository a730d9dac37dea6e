"""`JaxConfig`: how a JaxTrainer's workers bring up `jax.distributed` (stdlib only)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from minitrain.config._validate import _fail, _number, _suggests_fields

TPU_FIX = ("minitrain runs on CPU and GPU hosts and has no TPU support: remove use_tpu and train on CPUs, or on "
           "GPUs with ScalingConfig(use_gpu=True).")


@_suggests_fields
@dataclass(frozen=True, kw_only=True, slots=True)
class JaxConfig:
    """JAX's multi-process set-up, as Ray's `JaxConfig`.

    `use_tpu`: False, the only value (minitrain has no TPU support; True raises `ConfigError`).
    `use_gpu`: whether the workers' JAX runs on their GPUs; it must agree with
    `ScalingConfig.use_gpu`, which places the GPUs (`JaxTrainer` builds `JaxConfig(use_gpu=
    scaling_config.use_gpu)` when `jax_config` is None, as Ray does). `timeout_s` (a minitrain
    extension): how long the rendezvous and `jax.distributed.initialize` wait for a peer, and a
    finished worker's `jax.distributed.shutdown()` for the others, in seconds (default 1800,
    TorchConfig's).
    """

    use_tpu: bool = False
    use_gpu: bool = False
    timeout_s: float = 1800

    def __post_init__(self) -> None:
        for flag in ("use_tpu", "use_gpu"):
            if not isinstance(getattr(self, flag), bool):
                raise _fail("JaxConfig", flag, "True or False", getattr(self, flag), "Pass a bool.")
        if self.use_tpu:
            raise _fail("JaxConfig", "use_tpu", "False", True, TPU_FIX)
        object.__setattr__(self, "timeout_s", _number(
            self.timeout_s, "JaxConfig", "timeout_s", above=0,
            fix="Use the seconds a worker may wait for its peers (default 1800)."))

    def to_dict(self) -> dict[str, Any]:
        """The fields as a new plain dict."""
        return {"use_tpu": self.use_tpu, "use_gpu": self.use_gpu, "timeout_s": self.timeout_s}
