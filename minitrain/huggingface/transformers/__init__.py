"""`minitrain.huggingface.transformers`: run a `transformers.Trainer` inside minitrain.

Port a Ray Train script by changing its imports:

    from minitrain.huggingface.transformers import RayTrainReportCallback, prepare_trainer

    def train_func(config):
        trainer = transformers.Trainer(model=model, args=args, train_dataset=train, eval_dataset=test)
        trainer.add_callback(RayTrainReportCallback())
        trainer = prepare_trainer(trainer)
        trainer.train()

The Trainer finds the process group initialised and the torchrun-style environment (`RANK`,
`LOCAL_RANK`, `WORLD_SIZE`, `MASTER_ADDR`, ...) set, and trains data-parallel over it.
`MinitrainTrainReportCallback` is an alias of `RayTrainReportCallback`. Importing this package
imports `transformers`; without it the import raises `ImportError` naming the extra to install:
`pip install 'minitrain[transformers]'`.
"""

from minitrain.huggingface.transformers.callback import MinitrainTrainReportCallback, RayTrainReportCallback
from minitrain.huggingface.transformers.prepare import prepare_trainer

__all__ = ["RayTrainReportCallback", "prepare_trainer", "MinitrainTrainReportCallback"]
