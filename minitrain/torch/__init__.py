"""`minitrain.torch`: the counterpart of `ray.train.torch`.

`TorchTrainer` and `TorchConfig` start and configure a run; `get_device`, `get_devices`,
`prepare_model`, `prepare_data_loader` and `enable_reproducibility` are used inside the training
function; `accelerate`, `backward` and `prepare_optimizer` were removed in Ray Train v2 and raise
`DeprecationWarning` here too.

`minitrain.torch.checkpoint_dirs` helps report checkpoint directories that several ranks write into
(FSDP, DeepSpeed, Lightning, Hugging Face): `owns_directory(path)` names the one rank that uploads each.

Every name is loaded on first use, so `import minitrain.torch` does not import torch: the driver, the
coordinator and the launcher import this package for `TorchTrainer` without paying for torch (or
creating a CUDA context); torch loads only when a torch utility is touched.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from minitrain._lazy import lazy_exports

__all__ = [
    "TorchTrainer",
    "TorchConfig",
    "get_device",
    "get_devices",
    "prepare_model",
    "prepare_data_loader",
    "enable_reproducibility",
    "accelerate",
    "backward",
    "prepare_optimizer",
]

_UTILS = "minitrain.torch.train_loop_utils"
# public name -> module that defines it
_LAZY = {
    "TorchTrainer": "minitrain.driver.trainer",
    "TorchConfig": "minitrain.config",
    "get_device": _UTILS,
    "get_devices": _UTILS,
    "prepare_model": _UTILS,
    "prepare_data_loader": _UTILS,
    "enable_reproducibility": _UTILS,
    "accelerate": _UTILS,
    "backward": _UTILS,
    "prepare_optimizer": _UTILS,
}

if TYPE_CHECKING:  # for type checkers and IDEs only; never executed
    from minitrain.config import TorchConfig
    from minitrain.torch.train_loop_utils import (
        accelerate,
        backward,
        enable_reproducibility,
        get_device,
        get_devices,
        prepare_data_loader,
        prepare_model,
        prepare_optimizer,
    )
    from minitrain.driver.trainer import TorchTrainer


__getattr__, __dir__ = lazy_exports("minitrain.torch", _LAZY, __all__)
