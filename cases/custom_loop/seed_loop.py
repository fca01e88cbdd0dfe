"""The pieces of the seed's custom training loop (TF tutorial "Custom training with
tf.distribute.Strategy"), and the mistaken variants the negative controls use.

`verify.LoopRunner` assembles them into the seed's `train_step`, `test_step`,
`distributed_train_step` and `distributed_test_step`. TensorFlow is imported inside the
functions, so importing the case stays cheap.

One deliberate difference from the seed: the training set is shuffled with a seed
(`shuffle(len, seed=...)`); the seed's unseeded shuffle gives every run other batches, and
no two runs could be compared.
"""
from __future__ import annotations

import numpy as np

from verify import Examples


def create_model():
    """The seed's `create_model()`, verbatim."""
    import tensorflow as tf

    return tf.keras.Sequential([
        tf.keras.layers.Conv2D(32, 3, activation="relu"),
        tf.keras.layers.MaxPooling2D(),
        tf.keras.layers.Conv2D(64, 3, activation="relu"),
        tf.keras.layers.MaxPooling2D(),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(64, activation="relu"),
        tf.keras.layers.Dense(10)])


def create_optimizer():
    """`tf.keras.optimizers.Adam()`: on TF 2.15 the new (non-legacy) Keras optimizer."""
    import tensorflow as tf

    return tf.keras.optimizers.Adam()


def create_loss_object():
    """The seed's `loss_object`: per-example losses, reduced by the loop itself."""
    import tensorflow as tf

    return tf.keras.losses.SparseCategoricalCrossentropy(
        from_logits=True, reduction=tf.keras.losses.Reduction.NONE)


def compute_average_loss(per_example_loss, global_batch_size: int, replicas: int):
    """The seed's `compute_loss`: sum of the per-example losses / the GLOBAL batch size."""
    import tensorflow as tf

    return tf.nn.compute_average_loss(per_example_loss, global_batch_size=global_batch_size)


def dataset_fn(examples: Examples, global_batch_size: int, training: bool, seed: int):
    """The seed's input pipeline: images scaled to [0, 1] with a channel axis, global batches."""
    import tensorflow as tf

    images = examples.features["image"][..., None] / np.float32(255)
    dataset = tf.data.Dataset.from_tensor_slices((images, examples.labels))
    if training:
        dataset = dataset.shuffle(len(examples), seed=seed)
    return dataset.batch(global_batch_size)


# ---- mistakes, one per negative control ----

def reduce_mean_loss(per_example_loss, global_batch_size: int, replicas: int):
    """`tf.reduce_mean`: divides by the batch this replica holds, not by the global batch."""
    import tensorflow as tf

    return tf.reduce_mean(per_example_loss)


def per_replica_average_loss(per_example_loss, global_batch_size: int, replicas: int):
    """`compute_average_loss` given the per-replica batch size (BATCH_SIZE_PER_REPLICA)."""
    import tensorflow as tf

    return tf.nn.compute_average_loss(per_example_loss,
                                      global_batch_size=global_batch_size // replicas)


def create_sum_over_batch_size_loss_object():
    """A Keras loss that reduces itself with SUM_OVER_BATCH_SIZE (what `reduction='auto'` means
    in a custom loop); TF refuses it inside `strategy.run`."""
    import tensorflow as tf

    return tf.keras.losses.SparseCategoricalCrossentropy(
        from_logits=True, reduction=tf.keras.losses.Reduction.SUM_OVER_BATCH_SIZE)


def already_reduced_loss(loss, global_batch_size: int, replicas: int):
    """The loss object's own reduction, used as is."""
    return loss
