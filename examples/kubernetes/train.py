"""DDP training on every pod of a Kubeflow PyTorchJob or TrainJob (see README.md and docs/kubernetes.md).

Every pod runs `python -m minitrain.launch examples/kubernetes/train.py`: on pod 0 this script is the
driver; on the other pods minitrain.launch starts an agent that joins it and this script is not run.
STORAGE must be shared by the pods (a PersistentVolume, or s3://...) so that a recreated job resumes.
"""

import os

import minitrain
from minitrain import Checkpoint, CheckpointConfig, RunConfig, ScalingConfig
from minitrain.torch import TorchTrainer, prepare_model


def train_func(config):
    import tempfile

    import torch

    model = prepare_model(torch.nn.Linear(16, 1))
    bare = getattr(model, "module", model)  # DDP wraps it when there are several workers
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    start = 0
    checkpoint = minitrain.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as directory:
            state = torch.load(os.path.join(directory, "state.pt"))
        bare.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = state["epoch"] + 1
    for epoch in range(start, config["epochs"]):
        x = torch.randn(64, 16)
        loss = ((model(x) - x.sum(dim=1, keepdim=True)) ** 2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        with tempfile.TemporaryDirectory() as directory:
            if minitrain.get_context().get_world_rank() == 0:
                torch.save({"model": bare.state_dict(), "optimizer": optimizer.state_dict(),
                            "epoch": epoch}, os.path.join(directory, "state.pt"))
            minitrain.report({"epoch": epoch, "loss": loss.item()},
                             checkpoint=Checkpoint.from_directory(directory))


if __name__ == "__main__":
    pods = int(os.environ.get("PET_NNODES") or os.environ.get("WORLD_SIZE") or 1)
    trainer = TorchTrainer(
        train_func,
        train_loop_config={"epochs": int(os.environ.get("EPOCHS", "20"))},
        scaling_config=ScalingConfig(num_workers=pods, placement_strategy="STRICT_SPREAD"),
        # A fixed name: the resume key when the job's pods are recreated.
        run_config=RunConfig(name=os.environ.get("RUN_NAME", "kubernetes-example"),
                             storage_path=os.environ.get("STORAGE", "/shared/runs"),
                             checkpoint_config=CheckpointConfig(num_to_keep=2)),
    )
    result = trainer.fit()
    print("final metrics:", result.metrics)
