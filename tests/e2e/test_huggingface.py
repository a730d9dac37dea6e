"""`minitrain.huggingface.transformers` with transformers installed (skipped, with the reason, when not).

In-process checks of `prepare_trainer`; then one real run on 2 gloo workers: a tiny GPT-2 built from
its config (nothing downloaded), an iterable of ready-made batches as the training data (served
through `prepare_trainer`), an output directory shared by both ranks, and a checkpoint every 3 steps
reported by `RayTrainReportCallback`; a second run of the same name resumes from the last one.
"""

from __future__ import annotations

import importlib.util
import json
import os

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset

import minitrain
from minitrain import RunConfig, ScalingConfig
from minitrain.torch import TorchTrainer

# Checked without importing it: transformers takes seconds to import, and collection happens in
# every pytest-xdist worker. The tests import it (and minitrain.huggingface) only when they run.
pytestmark = pytest.mark.skipif(importlib.util.find_spec("transformers") is None,
                                reason="the transformers extra is not installed (pip install "
                                "'minitrain[transformers]')")

VOCAB, LENGTH = 32, 8


class Batches:
    """Ready-made batches, yielded afresh on every iteration (like `iter_torch_batches`)."""

    def __init__(self, tokens: torch.Tensor, batch_size: int) -> None:
        self.tokens, self.batch_size = tokens, batch_size

    def __iter__(self):
        for start in range(0, len(self.tokens), self.batch_size):
            chunk = self.tokens[start:start + self.batch_size]
            yield {"input_ids": chunk, "labels": chunk}


class Examples(Dataset):
    def __init__(self, tokens: torch.Tensor) -> None:
        self.tokens = tokens

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, index: int) -> dict:
        return {"input_ids": self.tokens[index], "labels": self.tokens[index]}


def _tokens(rows: int, seed: int) -> torch.Tensor:
    return torch.randint(0, VOCAB, (rows, LENGTH), generator=torch.Generator().manual_seed(seed))


def test_prepare_trainer_serves_batch_iterables_unchanged_and_leaves_datasets_alone():
    import transformers

    from minitrain.huggingface.transformers import (
        MinitrainTrainReportCallback,
        RayTrainReportCallback,
        prepare_trainer,
    )
    from minitrain.huggingface.transformers import prepare as prepare_module

    trainer = object.__new__(transformers.Trainer)  # prepare_trainer needs no initialised Trainer
    batches = Batches(_tokens(6, seed=0), batch_size=4)
    trainer.train_dataset = batches
    trainer.eval_dataset = {"held_out": batches, "examples": Examples(_tokens(4, seed=1))}

    assert prepare_trainer(trainer) is trainer and prepare_trainer(trainer) is trainer
    assert isinstance(trainer, transformers.Trainer) and type(trainer).__name__ == "Trainer"
    for loader in (trainer.get_train_dataloader(), trainer.get_eval_dataloader("held_out"),
                   trainer.get_eval_dataloader(batches)):
        assert isinstance(loader, DataLoader) and isinstance(loader.dataset, IterableDataset)
        served = list(loader)
        assert [b["input_ids"].shape[0] for b in served] == [4, 2]
        assert torch.equal(served[0]["input_ids"], next(iter(batches))["input_ids"])

    is_batches = prepare_module._is_batch_iterable
    assert is_batches(batches) and is_batches(iter([{"x": 1}]))
    assert not any(is_batches(d) for d in (None, Examples(_tokens(2, 0)), [{"x": 1}], {"a": 1}, "text"))
    assert MinitrainTrainReportCallback is RayTrainReportCallback


# ------------------------------------------------------------------------------------ real run


def train_gpt2(config: dict):
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    from minitrain.huggingface.transformers import RayTrainReportCallback, prepare_trainer

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_positions=LENGTH, n_embd=16, n_layer=1, n_head=2,
                                       bos_token_id=0, eos_token_id=0))
    rank = minitrain.get_context().get_world_rank()
    args = TrainingArguments(
        output_dir=config["output_dir"],  # the same directory for both ranks
        max_steps=config["max_steps"], save_steps=3, eval_strategy="steps", eval_steps=3, logging_steps=3,
        per_device_eval_batch_size=8, learning_rate=1e-3, report_to=[], disable_tqdm=True, use_cpu=True)
    trainer = Trainer(model=model, args=args, train_dataset=Batches(_tokens(32, seed=10 + rank), batch_size=8),
                      eval_dataset=Examples(_tokens(16, seed=3)))
    trainer.add_callback(RayTrainReportCallback())
    trainer = prepare_trainer(trainer)
    resume = None
    if (checkpoint := minitrain.get_checkpoint()) is not None:
        resume = os.path.join(checkpoint.path, RayTrainReportCallback.CHECKPOINT_NAME)
    trainer.train(resume_from_checkpoint=resume)
    with open(os.path.join(config["out"], f"rank{rank}_steps{config['max_steps']}.json"), "w") as handle:
        json.dump({"step": trainer.state.global_step, "world_size": trainer.args.world_size}, handle)


def _fit(tmp_path, max_steps: int):
    config = {"max_steps": max_steps, "output_dir": str(tmp_path / "hf_output"), "out": str(tmp_path)}
    return TorchTrainer(train_gpt2, train_loop_config=config, scaling_config=ScalingConfig(num_workers=2),
                        run_config=RunConfig(name="hf", storage_path=str(tmp_path / "runs"))).fit()


@pytest.mark.e2e
def test_trainer_reports_each_save_and_resumes(tmp_path):
    first = _fit(tmp_path, max_steps=6)

    assert first.metrics["step"] == 6 and {"loss", "eval_loss", "learning_rate"} <= set(first.metrics)
    assert [os.path.basename(c.path) for c, _ in first.best_checkpoints] == ["checkpoint_000000",
                                                                            "checkpoint_000001"]
    saved = os.path.join(first.checkpoint.path, "checkpoint")  # RayTrainReportCallback.CHECKPOINT_NAME
    files = set(os.listdir(saved))
    assert {"model.safetensors", "optimizer.pt", "trainer_state.json", "rng_state_0.pth", "rng_state_1.pth"} <= files
    assert json.load(open(os.path.join(saved, "trainer_state.json")))["global_step"] == 6
    for rank in range(2):
        assert json.loads((tmp_path / f"rank{rank}_steps6.json").read_text()) == {"step": 6, "world_size": 2}

    second = _fit(tmp_path, max_steps=9)

    assert second.metrics["step"] == 9
    assert json.loads((tmp_path / "rank1_steps9.json").read_text())["step"] == 9
    resaved = os.path.join(second.checkpoint.path, "checkpoint")
    assert json.load(open(os.path.join(resaved, "trainer_state.json")))["global_step"] == 9
