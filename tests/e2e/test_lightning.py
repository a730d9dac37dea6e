"""`minitrain.lightning` with PyTorch Lightning installed (skipped, with the reason, when it is not).

In-process checks of the environment, strategies and `prepare_trainer` against a named fake session;
then one real run on 2 gloo workers with `RayFSDPStrategy(state_dict_type="sharded")`, in which
every rank writes its shard of each epoch's checkpoint, and a second run of the same name that
resumes from it through `trainer.fit(ckpt_path=...)`. (The DDP path runs in
`tests/e2e/test_examples.py` through `examples/lightning_train.py`.)
"""

from __future__ import annotations

import glob
import importlib.util
import json
import os
import tempfile

import pytest
import torch

import minitrain
from minitrain import RunConfig, ScalingConfig, _session
from minitrain.context import TrainContext
from minitrain.torch import TorchTrainer

# Checked without importing it: Lightning takes seconds to import, and collection happens in every
# pytest-xdist worker. The tests import it (and minitrain.lightning) only when they run.
pytestmark = pytest.mark.skipif(importlib.util.find_spec("lightning") is None,
                                reason="the lightning extra is not installed (pip install 'minitrain[lightning]')")


class FakeSession:
    """The smallest thing `_session` accepts: a fixed context."""

    def __init__(self, **context_fields) -> None:
        self.context = TrainContext(experiment_name="lightning", **context_fields)

    def report(self, metrics, checkpoint=None, checkpoint_dir_name=None, **options) -> None:
        raise AssertionError("not reached in these tests")

    def get_checkpoint(self):
        return None


@pytest.fixture
def rank_one_of_two():
    _session.set_current(FakeSession(world_size=2, world_rank=1, local_rank=1, local_world_size=2, node_rank=0))
    yield
    _session.set_current(None)


def _trainer(strategy, **kwargs):
    import lightning.pytorch as pl

    return pl.Trainer(strategy=strategy, accelerator="cpu", devices="auto", logger=False,
                      enable_progress_bar=False, enable_checkpointing=False, **kwargs)


def test_environment_and_strategy_follow_the_run(rank_one_of_two, monkeypatch):
    from minitrain.lightning import MinitrainDDPStrategy, RayDDPStrategy, RayLightningEnvironment, prepare_trainer

    monkeypatch.setenv("WORLD_SIZE", "2")
    environment = RayLightningEnvironment()
    assert (environment.world_size(), environment.global_rank(), environment.local_rank(),
            environment.node_rank()) == (2, 1, 1, 0)
    environment.set_world_size(8)
    environment.set_global_rank(5)
    environment.teardown()
    assert (environment.world_size(), environment.global_rank()) == (2, 1)
    assert os.environ["WORLD_SIZE"] == "2" and environment.creates_processes_externally

    trainer = prepare_trainer(_trainer(RayDDPStrategy(), plugins=[environment]))
    strategy = trainer.strategy
    assert MinitrainDDPStrategy is RayDDPStrategy
    assert strategy.root_device == torch.device("cpu")  # the run's device, whatever `devices=` says
    assert strategy.distributed_sampler_kwargs == {"num_replicas": 2, "rank": 1}
    assert (trainer.world_size, trainer.global_rank) == (2, 1)


def test_prepare_trainer_refuses_foreign_strategies_and_environments(rank_one_of_two):
    from lightning.pytorch.plugins.environments import LightningEnvironment
    from lightning.pytorch.strategies import DDPStrategy

    from minitrain.lightning import RayDDPStrategy, RayLightningEnvironment, prepare_trainer

    with pytest.raises(RuntimeError, match="must be one of RayDDPStrategy, RayFSDPStrategy"):
        prepare_trainer(_trainer(DDPStrategy(), plugins=[RayLightningEnvironment()]))
    with pytest.raises(RuntimeError, match=r"plugins=\[RayLightningEnvironment\(\)\]"):
        prepare_trainer(_trainer(RayDDPStrategy(), plugins=[LightningEnvironment()]))


def test_report_callback_needs_a_training_function():
    from minitrain.lightning import RayTrainReportCallback

    _session.set_current(None)
    with pytest.raises(RuntimeError, match="cannot be used outside"):
        RayTrainReportCallback()


# ------------------------------------------------------------------------------------ real runs


def train_fsdp(config: dict):
    import lightning.pytorch as pl
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    from minitrain.lightning import RayFSDPStrategy, RayLightningEnvironment, RayTrainReportCallback, prepare_trainer

    class _Regressor(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = nn.functional.mse_loss(self.net(x), y)
            self.log("train_loss", loss, on_step=False, on_epoch=True, sync_dist=True)
            return loss

        def validation_step(self, batch, batch_idx):
            x, y = batch
            self.log("val_loss", nn.functional.mse_loss(self.net(x), y), sync_dist=True)

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=0.01)  # (a stateless SGD trips FSDP1 restore)

    pl.seed_everything(0, verbose=False)
    x = torch.randn(64, 4)
    data = TensorDataset(x, x.sum(1, keepdim=True))
    callback = RayTrainReportCallback()
    trainer = prepare_trainer(pl.Trainer(
        max_epochs=config["epochs"], accelerator="cpu", devices="auto",
        strategy=RayFSDPStrategy(state_dict_type="sharded"), plugins=[RayLightningEnvironment()],
        callbacks=[callback], enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, logger=False))
    ckpt_path = None
    if (checkpoint := minitrain.get_checkpoint()) is not None:
        ckpt_path = os.path.join(checkpoint.path, RayTrainReportCallback.CHECKPOINT_NAME)
    trainer.fit(_Regressor(), DataLoader(data, batch_size=8, shuffle=True), DataLoader(data, batch_size=16),
                ckpt_path=ckpt_path)
    rank = trainer.global_rank
    # Rank 0 chose the callback's temporary directory (named after its pid); it must be gone.
    leftovers = glob.glob(os.path.join(tempfile.gettempdir(), f"minitrain-lightning-rank0-{os.getpid()}-*"))
    record = {"steps": trainer.global_step, "sampler": len(trainer.train_dataloader.sampler),
              "leftovers": leftovers if rank == 0 else []}
    with open(os.path.join(config["out"], f"run{int(ckpt_path is not None)}_rank{rank}.json"), "w") as handle:
        json.dump(record, handle)


def _fit(tmp_path, epochs: int):
    return TorchTrainer(train_fsdp, train_loop_config={"epochs": epochs, "out": str(tmp_path)},
                        scaling_config=ScalingConfig(num_workers=2),
                        run_config=RunConfig(name="lightning", storage_path=str(tmp_path / "runs"))).fit()


@pytest.mark.e2e
def test_fsdp_sharded_checkpoint_every_epoch_and_resume(tmp_path):
    first = _fit(tmp_path, epochs=2)

    assert set(first.metrics) == {"train_loss", "val_loss", "epoch", "step"}
    assert (first.metrics["epoch"], first.metrics["step"]) == (1, 8)  # 64 rows / 2 ranks / batches of 8
    sharded = os.path.join(first.checkpoint.path, "checkpoint.ckpt")  # RayTrainReportCallback.CHECKPOINT_NAME
    assert sorted(os.listdir(sharded)) == [".metadata", "__0_0.distcp", "__1_0.distcp", "meta.pt"]
    assert [os.path.basename(c.path) for c, _ in first.best_checkpoints] == ["checkpoint_000000",
                                                                            "checkpoint_000001"]
    for rank in range(2):
        record = json.loads((tmp_path / f"run0_rank{rank}.json").read_text())
        assert record["sampler"] == 32 and record["leftovers"] == []  # temporary files removed

    second = _fit(tmp_path, epochs=3)

    assert (second.metrics["epoch"], second.metrics["step"]) == (2, 12)  # one more epoch after the resume
    for rank in range(2):
        assert json.loads((tmp_path / f"run1_rank{rank}.json").read_text())["steps"] == 12
