"""TensorflowTrainer end to end with real TensorFlow on 2 CPU workers: a Keras model trained under
MultiWorkerMirroredStrategy (the workers form one cluster from the TF_CONFIG each attempt sets), checkpointed
by ReportCheckpointCallback, and resumed from its checkpoint after a worker is killed.

Each worker imports TensorFlow (about 4 s of CPU alone, twice that with two workers on two busy cores), so the
guarantees share one run. The training loop is a custom one (`strategy.run`) driven through Keras'
`CallbackList`: Keras 3's own `Model.fit` fails under this strategy with more than one worker
(keras-team/keras#20585; docs/trainers/tensorflow.md), and Keras 2 (`tf-keras`) is not installable here.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import signal

import numpy as np
import pytest

import minitrain
from minitrain import FailureConfig, RunConfig, ScalingConfig
from minitrain.tensorflow import TensorflowTrainer

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(
    importlib.util.find_spec("tensorflow") is None,
    reason="TensorflowTrainer's tests need tensorflow (pip install 'minitrain[tensorflow]' or tensorflow-cpu)")]

ROWS, BATCH, EPOCHS = 64, 8, 5  # 32 rows per rank: 4 steps an epoch
TRUE_WEIGHTS = np.array([1.5, -2.0, 0.5])


def _dataset():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(ROWS, 3))
    return minitrain.data.from_items([{"x": row.astype("float32"), "y": np.float32(row @ TRUE_WEIGHTS)} for row in x])


def train_keras(config: dict) -> dict:
    """Ray's pattern with a custom loop: build (or load) the model in the strategy's scope, feed it
    `to_tf` batches, report and checkpoint every epoch through ReportCheckpointCallback."""
    import tensorflow as tf

    from minitrain.tensorflow import TensorflowCheckpoint, prepare_dataset_shard
    from minitrain.tensorflow.keras import ReportCheckpointCallback

    rank = minitrain.get_context().get_world_rank()
    world = minitrain.get_context().get_world_size()
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    checkpoint = minitrain.get_checkpoint()
    with strategy.scope():
        if checkpoint is not None:  # the model, its optimizer and its step count, as saved
            model = TensorflowCheckpoint(checkpoint.path, filesystem=checkpoint.filesystem).get_model()
        else:
            model = tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(1)])
            model.compile(optimizer=tf.keras.optimizers.SGD(0.05), loss="mse")
    steps_per_epoch = ROWS // world // BATCH
    done = int(model.optimizer.iterations.numpy()) // steps_per_epoch
    dataset = prepare_dataset_shard(minitrain.get_dataset_shard("train").to_tf("x", "y", batch_size=BATCH))

    @tf.function
    def step(x, y):
        def replica_step(x, y):
            with tf.GradientTape() as tape:
                errors = tf.square(model(x, training=True)[:, 0] - y)
                loss = tf.nn.compute_average_loss(errors, global_batch_size=BATCH * world)
            gradients = tape.gradient(loss, model.trainable_variables)
            model.optimizer.apply_gradients(zip(gradients, model.trainable_variables))
            return loss
        return strategy.reduce("SUM", strategy.run(replica_step, args=(x, y)), axis=None)

    callbacks = tf.keras.callbacks.CallbackList([ReportCheckpointCallback()], model=model)
    for epoch in range(done, EPOCHS):
        if epoch == config["kill_at"] and rank == 1 and not os.path.exists(config["marker"]):
            open(config["marker"], "w").close()
            os.kill(os.getpid(), signal.SIGKILL)  # the first attempt only: the marker stays
        losses = [float(step(x, y)) for x, y in dataset]
        callbacks.on_epoch_end(epoch, {"loss": sum(losses) / len(losses), "epoch": epoch})
    weights = np.concatenate([w.ravel() for w in model.get_weights()]).astype(np.float64)
    np.save(os.path.join(config["out"], f"weights_rank{rank}.npy"), weights)
    return {"resumed_from": done, "replicas": strategy.num_replicas_in_sync,
            "tf_config": json.loads(os.environ["TF_CONFIG"])}


def test_keras_trains_across_two_workers_checkpoints_and_resumes_after_a_kill(tmp_path):
    marker = tmp_path / "killed"
    trainer = TensorflowTrainer(
        train_keras, train_loop_config={"kill_at": 3, "marker": str(marker), "out": str(tmp_path)},
        datasets={"train": _dataset()}, scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name="keras", storage_path=str(tmp_path / "runs"),
                             failure_config=FailureConfig(max_failures=1),
                             worker_runtime_env={"env_vars": {"TF_CPP_MIN_LOG_LEVEL": "2"}}))  # TF's C++ INFO
    result = trainer.fit()

    # One cluster of both workers: TensorFlow's worker r is rank r, each with its own port.
    assert result.return_value["replicas"] == 2
    cluster = result.return_value["tf_config"]
    assert cluster["task"] == {"type": "worker", "index": 0} and len(set(cluster["cluster"]["worker"])) == 2
    # Rank 1 was killed at the start of epoch 3; the next attempt resumed from the latest committed
    # checkpoint (epoch 2's, or epoch 1's when rank 1's last report was still in flight) and ran to the end.
    assert marker.exists() and (pathlib.Path(result.path) / "logs" / "attempt_1").is_dir()
    assert result.return_value["resumed_from"] in (2, 3), result.return_value
    assert result.metrics["epoch"] == EPOCHS - 1
    losses = result.metrics_dataframe["loss"].tolist()
    assert losses[-1] < losses[0] / 10, losses  # the loss falls
    # The replicas agree: the all-reduced steps kept both workers' weights identical.
    rank0, rank1 = (np.load(tmp_path / f"weights_rank{r}.npy") for r in (0, 1))
    assert np.array_equal(rank0, rank1), (rank0, rank1)
    # The checkpoint is rank 0's saved model, as TensorflowCheckpoint.from_model writes it (the resumed
    # attempt loaded one with TensorflowCheckpoint.get_model).
    assert result.checkpoint.get_metadata() == {"_model_filename": "model.keras"}
    with result.checkpoint.as_directory() as directory:
        assert sorted(os.listdir(directory)) == [".metadata.json", "model.keras"]
