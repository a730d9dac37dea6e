"""Ray Train's "save and load checkpoints" example, ported to minitrain by changing imports only.

The Ray original (docs: Train > User guides > Saving and loading checkpoints) began with

    import ray.train.torch
    from ray import train
    from ray.train import Checkpoint, ScalingConfig, RunConfig
    from ray.train.torch import TorchTrainer

Below the imports is Ray's code with two small changes: the toy data comes from `torch.randn` (so
NumPy is not needed), and `model.module` is used only when the model is DDP-wrapped (so the script
also runs with one worker). `main()` runs `fit()` twice: the second, with the same run name, resumes
from the last checkpoint of the first and trains only the remaining epochs.

    python examples/ray_port_checkpointing.py --storage-path /tmp/minitrain_results
"""

import argparse
import os
import tempfile

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import minitrain.torch
import minitrain as train
from minitrain import Checkpoint, RunConfig, ScalingConfig
from minitrain.torch import TorchTrainer


def train_func(config):
    n = 100
    # create a toy dataset
    # data   : X - dim = (n, 4)
    # target : Y - dim = (n, 1)
    generator = torch.Generator().manual_seed(0)
    X = torch.randn(n, 4, generator=generator)
    Y = torch.randn(n, 1, generator=generator)
    # toy neural network : 1-layer
    # wrap the model in DDP
    model = train.torch.prepare_model(nn.Linear(4, 1))
    criterion = nn.MSELoss()

    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    start_epoch = 0
    checkpoint = train.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as checkpoint_dir:
            model_state_dict = torch.load(os.path.join(checkpoint_dir, "model.pt"))
            model.module.load_state_dict(model_state_dict) if isinstance(
                model, DistributedDataParallel) else model.load_state_dict(model_state_dict)
            optimizer.load_state_dict(torch.load(os.path.join(checkpoint_dir, "optimizer.pt")))
            start_epoch = torch.load(os.path.join(checkpoint_dir, "extra_state.pt"))["epoch"] + 1

    for epoch in range(start_epoch, config["num_epochs"]):
        y = model.forward(X)
        # compute loss
        loss = criterion(y, Y)
        # back-propagate loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        metrics = {"loss": loss.item(), "epoch": epoch, "start_epoch": start_epoch}

        with tempfile.TemporaryDirectory() as temp_checkpoint_dir:
            checkpoint = None
            should_checkpoint = epoch % config.get("checkpoint_freq", 1) == 0
            # In standard DDP training, where the model is the same across all ranks,
            # only the global rank 0 worker needs to save and report the checkpoint
            if train.get_context().get_world_rank() == 0 and should_checkpoint:
                state = model.module.state_dict() if isinstance(model, DistributedDataParallel) else model.state_dict()
                torch.save(state, os.path.join(temp_checkpoint_dir, "model.pt"))
                torch.save(optimizer.state_dict(), os.path.join(temp_checkpoint_dir, "optimizer.pt"))
                torch.save({"epoch": epoch}, os.path.join(temp_checkpoint_dir, "extra_state.pt"))
                checkpoint = Checkpoint.from_directory(temp_checkpoint_dir)

            train.report(metrics, checkpoint=checkpoint)


def main() -> int:
    """Train 3 epochs, then resume the same run to 5 epochs."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--storage-path", default="~/minitrain_results")
    parser.add_argument("--name", default="ray_port_checkpointing")
    args = parser.parse_args()
    run_config = RunConfig(name=args.name, storage_path=os.path.expanduser(args.storage_path))
    for num_epochs in (3, 5):
        trainer = TorchTrainer(train_func, train_loop_config={"num_epochs": num_epochs},
                               scaling_config=ScalingConfig(num_workers=2), run_config=run_config)
        result = trainer.fit()
        print(f"num_epochs={num_epochs}: metrics {result.metrics}, checkpoint {result.checkpoint.path}")
    return 0 if result.metrics["start_epoch"] == 3 and result.metrics["epoch"] == 4 else 1


if __name__ == "__main__":
    raise SystemExit(main())
