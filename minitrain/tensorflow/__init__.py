"""`minitrain.tensorflow`: Ray Train's `ray.train.tensorflow` without Ray (multi-worker TensorFlow).

Port a Ray Train TensorFlow script by changing its imports:

    from minitrain.tensorflow import TensorflowTrainer, prepare_dataset_shard
    from minitrain.tensorflow.keras import ReportCheckpointCallback

    def train_func(config):
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        with strategy.scope():
            model = build_and_compile_model()
        dataset = minitrain.get_dataset_shard("train").to_tf("x", "y", batch_size=32)
        model.fit(dataset, epochs=3, callbacks=[ReportCheckpointCallback()])

Each attempt sets `TF_CONFIG` in every worker from that attempt's ranks and addresses
(`minitrain.worker.tensorflow_backend`), so the strategy spans every worker. `model.fit` under the
strategy with several workers needs Keras 2, as Ray's examples use it (`pip install tf-keras`, and
`TF_USE_LEGACY_KERAS=1` in the workers' environment): Keras 3's `Model.fit` fails there
(keras-team/keras#20585); with Keras 3, train in a custom loop (`strategy.run`). Names load lazily:
`TensorflowTrainer`, `TensorflowConfig` and `TensorflowCheckpoint` do not import tensorflow (the
driver may build a trainer without it); `prepare_dataset_shard` and `minitrain.tensorflow.keras` do.
Install with `pip install 'minitrain[tensorflow]'`.
"""

from __future__ import annotations

from minitrain._lazy import lazy_exports

_LAZY = {
    "TensorflowTrainer": "minitrain.tensorflow.trainer",
    "TensorflowConfig": "minitrain.tensorflow.config",
    "TensorflowCheckpoint": "minitrain.tensorflow.checkpoint",
    "prepare_dataset_shard": "minitrain.tensorflow.train_loop_utils",
}

__all__ = sorted(_LAZY)


__getattr__, __dir__ = lazy_exports("minitrain.tensorflow", _LAZY, __all__, submodules=("keras",))
