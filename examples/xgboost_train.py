"""Data-parallel XGBoost under minitrain: Ray Train's XGBoostTrainer script, ported by changing imports.

    pip install 'minitrain[xgboost]'
    python examples/xgboost_train.py --num-workers 2 --rounds 50
    python examples/xgboost_train.py --smoke-test --storage-path /tmp/runs   # seconds, for CI

The data is a synthetic binary classification table (fixed seed; nothing is downloaded), split into
train and validation datasets that minitrain shards across the workers. Every worker runs the function
inside XGBoost's communicator (rank 0 starts the tracker for each attempt), so `xgboost.train` trains
one model over all shards. `RayTrainReportCallback` reports each round's validation metrics and rank 0
checkpoints `model.ubj` every `--checkpoint-every` rounds and at the end. Running it again with the
same `--storage-path` and `--name` resumes boosting from the latest checkpoint with the rounds left.
Exits 1 when the model is no better than guessing.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import pandas as pd
import xgboost

import minitrain
from minitrain import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
from minitrain.xgboost import RayTrainReportCallback, XGBoostTrainer


def make_frame(rows: int, seed: int) -> pd.DataFrame:
    """A seeded classification table: 8 features, a non-linear boundary, some label noise."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, 8))
    score = x[:, 0] + 0.5 * x[:, 1] ** 2 - x[:, 2] * x[:, 3] + 0.3 * rng.normal(size=rows)
    frame = pd.DataFrame(x, columns=[f"f{i}" for i in range(8)])
    frame["y"] = (score > 0.5).astype(int)
    return frame


def train_fn_per_worker(config: dict) -> None:
    """Runs on every worker: its shards to DMatrix, resume from the checkpoint, boost the rounds left."""
    train_df = minitrain.get_dataset_shard("train").materialize().to_pandas()
    valid_df = minitrain.get_dataset_shard("validation").materialize().to_pandas()
    dtrain = xgboost.DMatrix(train_df.drop("y", axis=1), label=train_df["y"])
    dvalid = xgboost.DMatrix(valid_df.drop("y", axis=1), label=valid_df["y"])

    booster = None
    checkpoint = minitrain.get_checkpoint()  # set when resuming (a restart, or a re-run of the same name)
    if checkpoint:
        booster = RayTrainReportCallback.get_model(checkpoint)
    rounds_left = config["rounds"] - (booster.num_boosted_rounds() if booster is not None else 0)

    params = {"objective": "binary:logistic", "eval_metric": ["logloss", "error"], "tree_method": "hist",
              "max_depth": config["max_depth"], "eta": config["eta"]}
    xgboost.train(params, dtrain, num_boost_round=max(rounds_left, 0), xgb_model=booster,
                  evals=[(dvalid, "validation")],
                  callbacks=[RayTrainReportCallback(frequency=config["checkpoint_every"])])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=None, help="boosting rounds in all (default 50; 8 with --smoke-test)")
    parser.add_argument("--rows", type=int, default=20000)
    parser.add_argument("--eta", type=float, default=0.3)
    parser.add_argument("--max-depth", type=int, default=6)
    parser.add_argument("--checkpoint-every", type=int, default=10)
    parser.add_argument("--storage-path", default=None)
    parser.add_argument("--name", default="xgboost_example")
    parser.add_argument("--smoke-test", action="store_true", help="tiny sizes, for CI")
    args = parser.parse_args()
    if args.smoke_test:
        args.rows, args.checkpoint_every = 2000, 4
    if args.rounds is None:
        args.rounds = 8 if args.smoke_test else 50

    trainer = XGBoostTrainer(
        train_fn_per_worker,
        train_loop_config={"rounds": args.rounds, "eta": args.eta, "max_depth": args.max_depth,
                           "checkpoint_every": args.checkpoint_every},
        datasets={"train": minitrain.data.from_pandas(make_frame(args.rows, seed=0)),
                  "validation": minitrain.data.from_pandas(make_frame(args.rows // 4, seed=1))},
        scaling_config=ScalingConfig(num_workers=args.num_workers),
        run_config=RunConfig(name=args.name, storage_path=args.storage_path,
                             checkpoint_config=CheckpointConfig(num_to_keep=2),
                             failure_config=FailureConfig(max_failures=2)),
    )
    result = trainer.fit()
    booster = RayTrainReportCallback.get_model(result.checkpoint)
    print(f"metrics: {result.metrics}")  # the latest round's (a re-run with no rounds left reports none)
    print(f"model: {booster.num_boosted_rounds()} rounds, checkpoint {result.checkpoint.path}")
    return 0 if result.metrics.get("validation-error", 0.0) < 0.4 else 1


if __name__ == "__main__":
    sys.exit(main())
