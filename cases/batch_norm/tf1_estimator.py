"""The TF1 original of the batch_norm case: the same classifier as a `TPUEstimator` model_fn.

`tf.compat.v1.layers.batch_normalization` with momentum 0.997 between two dense layers; its
moving mean and variance are updated by the ops it puts into the `UPDATE_OPS` collection, which
the model_fn runs before the train op, as TF1 models must. The variable names are the ones the
Keras model of the loop has (`dense`, `batch_normalization`, `dense_1`), so one name map serves
both.
"""
from __future__ import annotations

import tensorflow as tf

from verify import EstimatorRunner

tf1 = tf.compat.v1
LEARNING_RATE = 0.1


def input_fn(examples, params):
    """The examples in order, batched, the features as one tensor (as the loop's dataset
    yields them, unshuffled too)."""
    dataset = tf1.data.Dataset.from_tensor_slices((examples.features["x"], examples.labels))
    return dataset.repeat().batch(params["batch_size"], drop_remainder=True)


def make_model_fn(momentum: float, classes: int, hidden: int):
    """The model_fn with BatchNormalization's `momentum`."""

    def model_fn(features, labels, mode, params):
        training = mode == tf.estimator.ModeKeys.TRAIN
        hidden_units = tf1.layers.dense(features, hidden)
        normalized = tf1.layers.batch_normalization(hidden_units, momentum=momentum,
                                                    training=training)
        logits = tf1.layers.dense(tf.nn.relu(normalized), classes)
        loss = tf1.losses.sparse_softmax_cross_entropy(labels=labels, logits=logits)
        optimizer = tf1.train.GradientDescentOptimizer(LEARNING_RATE)
        if params["use_tpu"]:
            optimizer = tf1.tpu.CrossShardOptimizer(optimizer)
        # the moving statistics' updates run with every training step
        with tf.control_dependencies(tf1.get_collection(tf1.GraphKeys.UPDATE_OPS)):
            train_op = optimizer.minimize(loss, global_step=tf1.train.get_global_step())
        return tf1.estimator.tpu.TPUEstimatorSpec(mode, loss=loss, train_op=train_op)

    return model_fn


def runner(momentum: float, classes: int, hidden: int, **options):
    """The TF1 side as the case runs it (named lazily: `tf1_estimator:runner`)."""
    return EstimatorRunner(model_fn=make_model_fn(momentum, classes, hidden), input_fn=input_fn,
                           **options)
