"""The seed's TF2 rewrite: tfrs TPUEmbedding under a strategy scope, Keras compile/fit.

Aligned with the TF1 side where the migration guide's two halves differ: no
unseeded shuffle, and TF1's table initializer (truncated normal, stddev 1/sqrt(dim)); the
harness loads the case's initial values anyway, so only preflight can see an initializer.
The concatenation stays `[dense, embedding]`, as in the seed: the name map permutes the Dense
kernel's rows instead. Negative controls are built from these functions with one mistake each.
"""
import tensorflow as tf
import tensorflow_recommenders as tfrs

from verify import KerasRunner
from cases.tpu_embedding.data import DENSE_FEATURES, DIMENSION, VOCABULARY

LEARNING_RATE = 0.05


# TF1's embedding_column default; the seed's TF2 code uses stddev=1 (see control-initializer).
TF1_INITIALIZER_STDDEV = 1 / DIMENSION ** 0.5


def make_build_model(combiner="mean", initial_accumulator_value=0.1,
                     initializer_stddev=TF1_INITIALIZER_STDDEV, layer_learning_rate=None,
                     learning_rate=LEARNING_RATE):
    def build_model(steps_per_execution):
        optimizer = tf.keras.optimizers.legacy.Adagrad(
            learning_rate=learning_rate, initial_accumulator_value=initial_accumulator_value)
        dense_input = tf.keras.Input(shape=(DENSE_FEATURES,), dtype=tf.float32)
        sparse_input = tf.keras.Input(shape=(), dtype=tf.int32)
        embedded_input = tfrs.layers.embedding.TPUEmbedding(
            feature_config=tf.tpu.experimental.embedding.FeatureConfig(
                table=tf.tpu.experimental.embedding.TableConfig(
                    vocabulary_size=VOCABULARY, dim=DIMENSION, combiner=combiner,
                    initializer=tf.initializers.TruncatedNormal(mean=0.0,
                                                                stddev=initializer_stddev)),
                name="sparse_input"),
            optimizer=(optimizer if layer_learning_rate is None else
                       tf.tpu.experimental.embedding.Adagrad(learning_rate=layer_learning_rate))
        )(sparse_input)
        inputs = tf.keras.layers.Concatenate(axis=1)([dense_input, embedded_input])
        result = tf.keras.layers.Dense(1)(inputs)
        model = tf.keras.Model(
            inputs={"dense_feature": dense_input, "sparse_feature": sparse_input}, outputs=result)
        model.compile(optimizer, "mse", steps_per_execution=steps_per_execution)
        return model

    return build_model


def make_dataset_fn(shuffle=False):
    def dataset_fn(examples, context, global_batch_size):
        sparse = examples.features["sparse_feature"]
        dataset = tf.data.Dataset.from_tensor_slices((
            {"dense_feature": examples.features["dense_feature"],
             "sparse_feature": tf.SparseTensor(sparse.indices, sparse.values, sparse.dense_shape)},
            examples.labels))
        if shuffle:
            dataset = dataset.shuffle(10)  # the seed's unseeded shuffle
        dataset = dataset.repeat()
        dataset = dataset.batch(context.get_per_replica_batch_size(global_batch_size),
                                drop_remainder=True)
        return dataset.prefetch(2)

    return dataset_fn


def runner(shuffle=False, strategy="default", steps_per_execution=1,
           cross_device_ops="default", **mistake):
    """The TF2 side as the suite runs it; `mistake` goes to `make_build_model` (a control)."""
    return KerasRunner(build_model=make_build_model(**mistake),
                       dataset_fn=make_dataset_fn(shuffle=shuffle), strategy=strategy,
                       steps_per_execution=steps_per_execution, cross_device_ops=cross_device_ops)


def restore_training_state(model, optimizer, checkpoint):
    """How the TF2 pipeline resumes, written as its users write it: the model and its
    optimizer from one `tf.train.Checkpoint`."""
    tf.train.Checkpoint(model=model, optimizer=optimizer).restore(checkpoint).expect_partial()


def restore_then_recompile(model, optimizer, checkpoint):
    """A restore that loses the optimizer's state: the model restored (a compiled Keras model
    tracks its optimizer, so `tf.train.Checkpoint(model=model)` alone would still restore the
    slots), then compiled again with a new optimizer of the same configuration, as a pipeline
    does to change its learning rate after resuming."""
    tf.train.Checkpoint(model=model).restore(checkpoint).expect_partial()
    model.compile(type(optimizer).from_config(optimizer.get_config()), "mse",
                  steps_per_execution=int(model._steps_per_execution.numpy()))
