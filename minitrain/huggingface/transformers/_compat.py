"""The `transformers` names used here, with an install hint when the package is missing."""

from __future__ import annotations

try:
    from transformers import Trainer, TrainerCallback
    from transformers.trainer_utils import get_last_checkpoint
except ImportError as exc:  # pragma: no cover - depends on what is installed
    raise ImportError(
        "minitrain.huggingface.transformers needs Hugging Face transformers: "
        "pip install 'minitrain[transformers]' (or pip install transformers accelerate)."
    ) from exc

__all__ = ["Trainer", "TrainerCallback", "get_last_checkpoint"]
