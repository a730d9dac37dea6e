"""A Hugging Face `transformers.Trainer` under minitrain, written as a ported Ray Train script.

    pip install 'minitrain[transformers]'
    python examples/huggingface_train.py --num-workers 2 --epochs 3
    python examples/huggingface_train.py --smoke-test --storage-path /tmp/runs   # seconds, for CI

A small GPT-2 is built from a `GPT2Config` (random weights, nothing downloaded) and learns synthetic
"counting" sequences (each token is the previous one plus a per-sequence step, modulo the
vocabulary). The Ray original imports `RayTrainReportCallback` and `prepare_trainer` from
`ray.train.huggingface.transformers`; here they come from `minitrain.huggingface.transformers`.
The Trainer runs data-parallel over the process group minitrain set up, saves a checkpoint every
epoch, and the callback reports it with the logged metrics. Running the script again with the same
`--storage-path` and `--name` resumes through `trainer.train(resume_from_checkpoint=...)`.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import torch
from torch.utils.data import Dataset

import minitrain
from minitrain import RunConfig, ScalingConfig
from minitrain.huggingface.transformers import RayTrainReportCallback, prepare_trainer
from minitrain.torch import TorchTrainer


class CountingSequences(Dataset):
    """`size` sequences of `length` tokens: start + step * i (mod vocab), fixed by `seed`."""

    def __init__(self, size: int, length: int, vocab: int, seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        start = torch.randint(0, vocab, (size, 1), generator=generator)
        step = torch.randint(1, 4, (size, 1), generator=generator)
        self.tokens = (start + step * torch.arange(length)) % vocab

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, index: int) -> dict:
        return {"input_ids": self.tokens[index], "labels": self.tokens[index]}


def train_func(config: dict) -> None:
    """Runs on every worker: a Trainer with the report callback, resumed when a checkpoint exists."""
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    torch.manual_seed(0)
    model_config = GPT2Config(vocab_size=config["vocab"], n_positions=config["length"], n_embd=config["width"],
                              n_layer=config["layers"], n_head=4, bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel(model_config)
    # Each rank has its own scratch output directory: rank 0 writes the model, optimizer and trainer
    # state there, every rank its RNG state; RayTrainReportCallback merges them into one checkpoint.
    with tempfile.TemporaryDirectory(prefix="minitrain-hf-") as output_dir:
        args = TrainingArguments(
            output_dir=output_dir, num_train_epochs=config["epochs"],
            per_device_train_batch_size=config["batch_size"], per_device_eval_batch_size=config["batch_size"],
            learning_rate=config["lr"], eval_strategy="epoch", save_strategy="epoch", logging_strategy="epoch",
            save_total_limit=1, report_to=[], disable_tqdm=True, use_cpu=not config["use_gpu"],
        )
        trainer = Trainer(
            model=model, args=args,
            train_dataset=CountingSequences(config["samples"], config["length"], config["vocab"], seed=1),
            eval_dataset=CountingSequences(config["samples"] // 4, config["length"], config["vocab"], seed=2),
        )
        trainer.add_callback(RayTrainReportCallback())
        trainer = prepare_trainer(trainer)

        checkpoint = minitrain.get_checkpoint()
        if checkpoint:
            with checkpoint.as_directory() as directory:
                trainer.train(resume_from_checkpoint=os.path.join(directory, RayTrainReportCallback.CHECKPOINT_NAME))
        else:
            trainer.train()


def main(argv: list[str] | None = None) -> int:
    """Train (resuming a run of the same name); return 1 when the eval loss is not below chance."""
    parser = argparse.ArgumentParser(description="Hugging Face Trainer under minitrain.")
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--use-gpu", action="store_true")
    parser.add_argument("--epochs", type=int, default=None, help="epochs in total (default 3; 2 with --smoke-test)")
    parser.add_argument("--storage-path", default="~/minitrain_results")
    parser.add_argument("--name", default="huggingface_example")
    parser.add_argument("--smoke-test", action="store_true", help="tiny sizes, 2 epochs: seconds on CPU")
    args = parser.parse_args(argv)
    config = {"use_gpu": args.use_gpu, "epochs": 3, "lr": 1e-3, "batch_size": 16, "samples": 2048,
              "length": 32, "vocab": 64, "width": 64, "layers": 2}
    if args.smoke_test:
        config.update(epochs=2, samples=256, length=16, width=32, layers=1)
    if args.epochs is not None:
        config["epochs"] = args.epochs

    result = TorchTrainer(
        train_func, train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=args.num_workers, use_gpu=args.use_gpu),
        run_config=RunConfig(name=args.name, storage_path=os.path.expanduser(args.storage_path)),
    ).fit()
    metrics = result.metrics
    print(f"result.metrics: {metrics}")
    if metrics is None:
        print(f"nothing left to train: the run already finished {config['epochs']} epochs")
        return 0
    print(f"latest checkpoint: {result.checkpoint.path}: {sorted(os.listdir(result.checkpoint.path))}")
    chance = torch.log(torch.tensor(float(config["vocab"]))).item()  # the loss of a uniform guess
    if not metrics["eval_loss"] < chance:
        print(f"FAILED: eval_loss {metrics['eval_loss']:.3f} is not below chance ({chance:.3f})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
