"""`prepare_dataset_shard`: a `tf.data.Dataset` of one rank's shard, ready for a distribution strategy (L3)."""

from __future__ import annotations

from typing import Any


def prepare_dataset_shard(tf_dataset_shard: Any) -> Any:
    """`tf_dataset_shard` (a `tf.data.Dataset` over this rank's shard, e.g. built from
    `minitrain.get_dataset_shard(name)`) with TensorFlow's auto-sharding turned off (the rows are
    already this rank's: sharding again would drop the other ranks' share of them) and prefetching
    on, autotuned; as Ray's. TypeError for anything but a `tf.data.Dataset`."""
    import tensorflow as tf

    if not isinstance(tf_dataset_shard, tf.data.Dataset):
        raise TypeError(f"prepare_dataset_shard({type(tf_dataset_shard).__name__}): give a tf.data.Dataset, "
                        "e.g. minitrain.get_dataset_shard('train').to_tf('x', 'y', batch_size=32).")
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return tf_dataset_shard.with_options(options).prefetch(tf.data.AUTOTUNE)
