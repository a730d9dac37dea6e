"""`TorchConfig`: how workers set up `torch.distributed` (L0: stdlib only; torch is never imported here)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from minitrain.config._validate import _choice, _fail, _number, _suggests_fields


_BACKENDS = ("gloo", "nccl", "mpi")


@_suggests_fields
@dataclass(frozen=True, kw_only=True, slots=True)
class TorchConfig:
    """How workers set up `torch.distributed`.

    `backend=None` means "nccl" with GPUs, else "gloo": ask `resolved_backend(use_gpu)`. Unlike Ray,
    which overwrites `backend` inside `TorchTrainer`, minitrain never changes the config.
    `init_method` is "env" or "tcp", accepted for Ray compatibility: both rendezvous through the
    TCPStore that rank 0 opens on a port the kernel picks (what `env://` and `tcp://` do inside torch,
    without a port chosen in advance that another process could take), and both set MASTER_ADDR and
    MASTER_PORT to it, because DeepSpeed, Lightning and Accelerate read them (Ray leaves them unset
    with "tcp"). `timeout_s` becomes the process-group timeout in seconds.
    """

    backend: Optional[str] = None
    init_method: str = "env"
    timeout_s: float = 1800

    def __post_init__(self) -> None:
        if self.backend is not None and self.backend not in _BACKENDS:
            raise _fail("TorchConfig", "backend", "None or one of 'gloo', 'nccl', 'mpi'", self.backend,
                        "Use None to pick 'nccl' with GPUs and 'gloo' without, or name one of these.")
        _choice(self.init_method, "TorchConfig", "init_method", ("env", "tcp"))
        object.__setattr__(self, "timeout_s", _number(
            self.timeout_s, "TorchConfig", "timeout_s", above=0,
            fix="Use the seconds a collective may wait before the process group times out (default 1800)."))

    def resolved_backend(self, use_gpu: bool) -> str:
        """The backend to use: `backend` if set, else "nccl" when `use_gpu` and "gloo" otherwise."""
        if self.backend is not None:
            return self.backend
        return "nccl" if use_gpu else "gloo"

    def to_dict(self) -> dict[str, Any]:
        """The fields as a new plain dict (as Ray's `TorchConfig.to_dict`)."""
        return {"backend": self.backend, "init_method": self.init_method, "timeout_s": self.timeout_s}
