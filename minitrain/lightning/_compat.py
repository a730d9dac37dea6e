"""The Lightning package in use: `lightning.pytorch`, else the older standalone `pytorch_lightning`.

Ray Train makes the same choice, so a ported script keeps working with whichever it had installed.
"""

from __future__ import annotations

try:
    import lightning.pytorch as pl
    from lightning.pytorch.plugins.environments import LightningEnvironment
    from lightning.pytorch.strategies import DDPStrategy, DeepSpeedStrategy, FSDPStrategy
except ImportError:  # pragma: no cover - depends on what is installed
    try:
        import pytorch_lightning as pl
        from pytorch_lightning.plugins.environments import LightningEnvironment
        from pytorch_lightning.strategies import DDPStrategy, DeepSpeedStrategy, FSDPStrategy
    except ImportError as exc:
        raise ImportError(
            "minitrain.lightning needs PyTorch Lightning >= 2.0: pip install 'minitrain[lightning]' "
            "(or pip install lightning)."
        ) from exc

__all__ = ["pl", "LightningEnvironment", "DDPStrategy", "FSDPStrategy", "DeepSpeedStrategy"]
