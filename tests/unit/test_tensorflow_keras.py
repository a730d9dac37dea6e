"""minitrain.tensorflow's in-process parts with real TensorFlow and Keras: `DataIterator.to_tf`,
`prepare_dataset_shard`, `TensorflowCheckpoint`, and `ReportCheckpointCallback` in `Model.fit` (local mode).
The multi-worker run is tests/e2e/test_tensorflow.py. Importing TensorFlow takes about 4 s."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow", reason="minitrain.tensorflow's tests need tensorflow "
                                              "(pip install 'minitrain[tensorflow]' or tensorflow-cpu)")

import minitrain  # noqa: E402
from minitrain import ScalingConfig  # noqa: E402
from minitrain.data.iterator import DataIterator  # noqa: E402
from minitrain.tensorflow import TensorflowCheckpoint, TensorflowTrainer, prepare_dataset_shard  # noqa: E402
from minitrain.tensorflow.keras import ReportCheckpointCallback  # noqa: E402
from minitrain.worker.tensorflow_backend import KERAS3_MULTI_WORKER_NOTE, TensorflowBackend  # noqa: E402


def _rows(n: int = 10):
    return minitrain.data.from_items([{"x": np.array([i, -i], dtype="float32"), "y": float(i), "w": i % 2,
                                       "name": f"r{i}"} for i in range(n)])


def test_to_tf_gives_each_rank_its_rows_as_typed_batches_and_a_new_pass_per_iteration():
    shards = [DataIterator(_rows(), world_size=2, rank=rank, name="train").to_tf("x", "y", batch_size=2)
              for rank in (0, 1)]
    spec = shards[0].element_spec
    assert spec == (tf.TensorSpec((None, 2), tf.float32, name="x"), tf.TensorSpec((None,), tf.float64, name="y"))
    ys = [sorted(float(v) for _, y in shard for v in y.numpy()) for shard in shards]
    assert sorted(ys[0] + ys[1]) == [float(i) for i in range(10)] and len(ys[0]) == 5  # disjoint halves
    assert sorted(float(v) for _, y in shards[0] for v in y.numpy()) == ys[0]  # iterated again: the next epoch
    options = shards[0].options().experimental_distribute.auto_shard_policy
    assert options == tf.data.experimental.AutoShardPolicy.OFF


def test_to_tf_with_lists_of_columns_additional_columns_and_given_type_specs():
    iterator = DataIterator(_rows(4), name="train")
    dataset = iterator.to_tf(["x", "name"], "y", additional_columns="w", batch_size=4,
                             label_type_spec=tf.TensorSpec((None,), tf.float32, name="label"))
    features, labels, weights = next(iter(dataset))
    assert set(features) == {"x", "name"} and features["name"].dtype == tf.string
    assert labels.dtype == tf.float32 and weights.numpy().tolist() == [0, 1, 0, 1]


def test_to_tf_refuses_unknown_columns_and_misshapen_type_specs():
    iterator = DataIterator(_rows(4), name="train")
    with pytest.raises(ValueError, match=r"'z' in `label_columns`.*Valid column names are: \['name', 'w', 'x', 'y'\]"):
        iterator.to_tf("x", "z")
    with pytest.raises(ValueError, match=r"to_tf\(feature_columns=\[\]\)"):
        iterator.to_tf([], "y")
    with pytest.raises(ValueError, match=r"to_tf\(feature_type_spec=.*for the single column 'x' give a tf.TypeSpec"):
        iterator.to_tf("x", "y", feature_type_spec={"x": tf.TensorSpec((None, 2), tf.float32)})
    with pytest.raises(ValueError, match="batch_size"):
        iterator.to_tf("x", "y", batch_size=0)
    rows = DataIterator(minitrain.data.from_items([1, 2, 3]), name="plain")  # from_items wraps them as "item"
    assert rows.to_tf("item", "item").element_spec[0].shape.as_list() == [None]


def test_prepare_dataset_shard_turns_auto_sharding_off():
    prepared = prepare_dataset_shard(tf.data.Dataset.range(4).batch(2))
    assert prepared.options().experimental_distribute.auto_shard_policy == tf.data.experimental.AutoShardPolicy.OFF
    assert [b.numpy().tolist() for b in prepared] == [[0, 1], [2, 3]]
    with pytest.raises(TypeError, match="give a tf.data.Dataset"):
        prepare_dataset_shard([1, 2])


def _model():
    model = tf.keras.Sequential([tf.keras.Input((2,)), tf.keras.layers.Dense(1)])
    model.compile(optimizer=tf.keras.optimizers.SGD(0.01), loss="mse")
    return model


def test_a_checkpoint_from_a_model_loads_the_same_model(tmp_path):
    model = _model()
    checkpoint = TensorflowCheckpoint.from_model(model)
    try:
        loaded = checkpoint.get_model()
        assert all(np.array_equal(a, b) for a, b in zip(model.get_weights(), loaded.get_weights()))
        assert checkpoint.get_metadata() == {"_model_filename": "model.keras"}
    finally:
        shutil.rmtree(checkpoint.path)  # from_model's directory belongs to its caller
    with pytest.raises(ValueError, match="not made by TensorflowCheckpoint.from_model"):
        TensorflowCheckpoint.from_directory(str(tmp_path)).get_model()
    with pytest.raises(ValueError, match="preprocessor"):
        TensorflowCheckpoint.from_model(model, preprocessor=object())


def test_the_callback_in_model_fit_reports_the_chosen_logs_with_a_checkpoint_each_epoch():
    def train(config):
        shard = minitrain.get_dataset_shard("train")
        model = _model()
        model.fit(shard.to_tf("x", "y", batch_size=5), epochs=3, verbose=0,
                  callbacks=[ReportCheckpointCallback(metrics={"train_loss": "loss"})])

    result = TensorflowTrainer(train, datasets={"train": _rows()}, scaling_config=ScalingConfig(num_workers=0)).fit()
    assert set(result.metrics) == {"train_loss"} and isinstance(result.metrics["train_loss"], float)
    assert result.checkpoint is not None


def test_the_callback_refuses_unknown_events_metric_forms_and_missing_logs():
    with pytest.raises(ValueError, match=r"Invalid trigger time selected: \['epoch'\].*epoch_end"):
        ReportCheckpointCallback(checkpoint_on="epoch")
    with pytest.raises(TypeError, match="metrics"):
        ReportCheckpointCallback(metrics=3)
    with pytest.raises(KeyError, match=r"names \['acc'\].*\['loss'\]"):
        ReportCheckpointCallback(metrics=["acc"])._reported_metrics({"loss": 1.0})
    plain = ReportCheckpointCallback()._reported_metrics({"loss": tf.constant(2.5), "n": np.int64(3)})
    assert plain == {"loss": 2.5, "n": 3} and type(plain["n"]) is int


def test_the_older_ray_air_import_path_is_the_same_callback():
    from minitrain.air.integrations.keras import ReportCheckpointCallback as Older

    assert Older is ReportCheckpointCallback and issubclass(Older, tf.keras.callbacks.Callback)


def test_keras3_fit_under_the_strategy_gets_a_note_naming_the_fix():
    backend = TensorflowBackend()
    backend._world_size = 2
    keras_error = ValueError("Attempt to convert a value (PerReplica:{0: ...}) with an unsupported type")
    with pytest.raises(ValueError) as raised:
        with backend.training():
            raise keras_error
    assert KERAS3_MULTI_WORKER_NOTE in getattr(raised.value, "__notes__", [])
    with pytest.raises(ValueError) as other:
        with backend.training():
            raise ValueError("something else")
    assert not getattr(other.value, "__notes__", [])
