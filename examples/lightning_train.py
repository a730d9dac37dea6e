"""PyTorch Lightning under minitrain, written as a ported Ray Train Lightning script.

    pip install 'minitrain[lightning]'
    python examples/lightning_train.py --num-workers 2 --epochs 4
    python examples/lightning_train.py --strategy fsdp        # sharded model and checkpoints
    python examples/lightning_train.py --strategy deepspeed   # ZeRO stage 2 (pip install deepspeed)
    python examples/lightning_train.py --smoke-test --storage-path /tmp/runs   # seconds, for CI

The Ray original imports `RayDDPStrategy`, `RayFSDPStrategy`, `RayLightningEnvironment`,
`RayTrainReportCallback` and `prepare_trainer` from `ray.train.lightning`; here they come from
`minitrain.lightning`, and nothing else changes. `RayTrainReportCallback` reports the logged
metrics and a Lightning checkpoint at the end of every epoch; running the script again with the same
`--storage-path` and `--name` resumes from the latest one through `trainer.fit(ckpt_path=...)`.
The data is synthetic (nothing is downloaded).
"""

from __future__ import annotations

import argparse
import os
import sys

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import minitrain
from minitrain import RunConfig, ScalingConfig
from minitrain.lightning import (
    RayDDPStrategy,
    RayDeepSpeedStrategy,
    RayFSDPStrategy,
    RayLightningEnvironment,
    RayTrainReportCallback,
    prepare_trainer,
)
from minitrain.torch import TorchTrainer


class Regressor(pl.LightningModule):
    """A small MLP regressor that logs `train_loss` and `val_loss` (averaged over ranks)."""

    def __init__(self, num_features: int, hidden: int, lr: float) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(num_features, hidden), nn.ReLU(), nn.Linear(hidden, 1))
        self.val_history: list[float] = []  # val_loss of each epoch run in this process

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss, on_step=False, on_epoch=True, sync_dist=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self.net(x), y), sync_dist=True)

    def on_validation_epoch_end(self):
        if not self.trainer.sanity_checking:
            self.val_history.append(self.trainer.callback_metrics["val_loss"].item())

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)


def make_dataset(num_samples: int, num_features: int, seed: int) -> TensorDataset:
    """A noisy linear regression, identical on every worker for a given seed."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(num_samples, num_features, generator=generator)
    y = x @ torch.randn(num_features, 1, generator=torch.Generator().manual_seed(0))
    return TensorDataset(x, y + 0.1 * torch.randn(num_samples, 1, generator=generator))


def train_func(config: dict) -> list[float]:
    """Runs on every worker: a Lightning Trainer set up for minitrain, resumed when a checkpoint exists.
    Returns the validation loss of each epoch it ran (rank 0's is `Result.return_value`)."""
    pl.seed_everything(0, verbose=False)
    model = Regressor(config["features"], config["hidden"], config["lr"])
    # Lightning adds a DistributedSampler itself, sharding over the whole run (the strategy says how).
    train_loader = DataLoader(make_dataset(config["samples"], config["features"], seed=1),
                              batch_size=config["batch_size"], shuffle=True)
    val_loader = DataLoader(make_dataset(config["samples"] // 4, config["features"], seed=2),
                            batch_size=config["batch_size"])
    strategy = {"fsdp": lambda: RayFSDPStrategy(state_dict_type="sharded"),
                # Every rank writes its ZeRO shard into the checkpoint RayTrainReportCallback reports.
                "deepspeed": lambda: RayDeepSpeedStrategy(stage=2),
                "ddp": RayDDPStrategy}[config["strategy"]]()
    trainer = pl.Trainer(
        max_epochs=config["epochs"], devices="auto", accelerator="auto", strategy=strategy,
        plugins=[RayLightningEnvironment()], callbacks=[RayTrainReportCallback()],
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False, logger=False,
    )
    trainer = prepare_trainer(trainer)

    checkpoint = minitrain.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as directory:
            ckpt_path = os.path.join(directory, RayTrainReportCallback.CHECKPOINT_NAME)
            trainer.fit(model, train_loader, val_loader, ckpt_path=ckpt_path)
    else:
        trainer.fit(model, train_loader, val_loader)
    return model.val_history


def main(argv: list[str] | None = None) -> int:
    """Train (resuming a run of the same name); return 1 when val_loss did not drop in this call."""
    parser = argparse.ArgumentParser(description="PyTorch Lightning training under minitrain.")
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--use-gpu", action="store_true")
    parser.add_argument("--strategy", choices=("ddp", "fsdp", "deepspeed"), default="ddp")
    parser.add_argument("--epochs", type=int, default=None, help="epochs in total (default 4; 2 with --smoke-test)")
    parser.add_argument("--storage-path", default="~/minitrain_results")
    parser.add_argument("--name", default="lightning_example")
    parser.add_argument("--smoke-test", action="store_true", help="tiny sizes, 2 epochs: seconds on CPU")
    args = parser.parse_args(argv)
    config = {"strategy": args.strategy, "epochs": 4, "lr": 1e-2, "batch_size": 64, "samples": 8192,
              "features": 32, "hidden": 128}
    if args.smoke_test:
        config.update(epochs=2, samples=512, features=8, hidden=16)
    if args.epochs is not None:
        config["epochs"] = args.epochs

    result = TorchTrainer(
        train_func, train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=args.num_workers, use_gpu=args.use_gpu),
        run_config=RunConfig(name=args.name, storage_path=os.path.expanduser(args.storage_path)),
    ).fit()
    print(f"result.metrics: {result.metrics}")
    print(f"latest checkpoint: {result.checkpoint.path if result.checkpoint else None}")
    val_losses = result.return_value
    print(f"val_loss per epoch in this call: {val_losses}")
    if len(val_losses) > 1 and not val_losses[-1] < val_losses[0]:
        print("FAILED: val_loss did not drop", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
