"""`minitrain.lightning`: run PyTorch Lightning inside minitrain, as `ray.train.lightning` does for Ray.

Port a Ray Train Lightning script by changing its imports:

    from minitrain.lightning import (RayDDPStrategy, RayLightningEnvironment,
                                     RayTrainReportCallback, prepare_trainer)

    def train_func(config):
        trainer = pl.Trainer(devices="auto", accelerator="auto", strategy=RayDDPStrategy(),
                             plugins=[RayLightningEnvironment()], callbacks=[RayTrainReportCallback()],
                             enable_checkpointing=False)
        trainer = prepare_trainer(trainer)
        trainer.fit(model, datamodule=data)

Each Ray name has a minitrain alias (`MinitrainDDPStrategy`, `MinitrainFSDPStrategy`,
`MinitrainDeepSpeedStrategy`, `MinitrainLightningEnvironment`, `MinitrainTrainReportCallback`).
Importing this package imports Lightning (`lightning.pytorch`, else `pytorch_lightning`); without
it the import raises `ImportError` naming the extra to install: `pip install 'minitrain[lightning]'`.
"""

from minitrain.lightning.callback import MinitrainTrainReportCallback, RayTrainReportCallback
from minitrain.lightning.environment import MinitrainLightningEnvironment, RayLightningEnvironment
from minitrain.lightning.prepare import prepare_trainer
from minitrain.lightning.strategies import (
    MinitrainDDPStrategy,
    MinitrainDeepSpeedStrategy,
    MinitrainFSDPStrategy,
    RayDDPStrategy,
    RayDeepSpeedStrategy,
    RayFSDPStrategy,
)

__all__ = [
    "RayDDPStrategy",
    "RayFSDPStrategy",
    "RayDeepSpeedStrategy",
    "RayLightningEnvironment",
    "RayTrainReportCallback",
    "prepare_trainer",
    "MinitrainDDPStrategy",
    "MinitrainFSDPStrategy",
    "MinitrainDeepSpeedStrategy",
    "MinitrainLightningEnvironment",
    "MinitrainTrainReportCallback",
]
