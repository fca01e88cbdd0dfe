"""TF2 side: tfrs `TPUEmbedding` (five `FeatureConfig`s over four `TableConfig`s, the item
table shared), built in the strategy scope, Keras compile/fit; user ids hashed into their
table in the input pipeline. Negative controls are built from the same functions with one
mistake each.
"""
import tensorflow as tf
import tensorflow_recommenders as tfrs

from cases.recsys_scale.data import DENSE_FEATURES, HIDDEN, TF2_FEATURE_ORDER, tables
from cases.recsys_scale.optimizers import (ACCUMULATOR, LEARNING_RATE, TABLE_RATES,
                                          table_rates_adagrad)
from verify import KerasRunner


def feature_configs(user_rows, table_rates=None):
    """FeatureConfig per feature; a table in `table_rates` gets an embedding-engine Adagrad
    at its own rate (what trains it on a TPU)."""
    rates = TABLE_RATES if table_rates is None else table_rates
    configs = {}
    for table in tables(user_rows):
        own = (tf.tpu.experimental.embedding.Adagrad(rates[table.name],
                                                     initial_accumulator_value=ACCUMULATOR)
               if table.name in rates else None)
        shared = tf.tpu.experimental.embedding.TableConfig(
            vocabulary_size=table.vocabulary, dim=table.dim, name=table.name,
            combiner=table.combiner, optimizer=own)
        for feature in table.features:
            configs[feature] = tf.tpu.experimental.embedding.FeatureConfig(table=shared,
                                                                           name=feature)
    return configs


def make_build_model(user_rows, table_rates=None, skipped_row=None):
    def build_model(steps_per_execution):
        optimizer = table_rates_adagrad(table_rates, skipped_row)
        dense_input = tf.keras.Input(shape=(DENSE_FEATURES,), dtype=tf.float32, name="dense")
        sparse_inputs = {f: tf.keras.Input(shape=(), dtype=tf.int32, name=f)
                         for f in TF2_FEATURE_ORDER}
        # the embedding engine's optimizers train the tables on a TPU; on CPU the compile
        # optimizer trains every variable
        embedded = tfrs.layers.embedding.TPUEmbedding(
            feature_config=feature_configs(user_rows, table_rates),
            optimizer=tf.tpu.experimental.embedding.Adagrad(
                LEARNING_RATE, initial_accumulator_value=ACCUMULATOR))(sparse_inputs)
        net = tf.keras.layers.Concatenate(axis=1)(
            [dense_input] + [embedded[f] for f in TF2_FEATURE_ORDER])
        for n, units in enumerate(HIDDEN):
            net = tf.keras.layers.Dense(units, activation="relu", name=f"dense{n}")(net)
        logits = tf.keras.layers.Dense(1, name=f"dense{len(HIDDEN)}")(net)
        model = tf.keras.Model(inputs={"dense": dense_input, **sparse_inputs}, outputs=logits)
        model.compile(optimizer, tf.keras.losses.BinaryCrossentropy(from_logits=True),
                      steps_per_execution=steps_per_execution)
        return model

    return build_model


def hash_user(user_rows, cast_first=False):
    """raw 64-bit user ids -> a row of the user table. `cast_first` is a mistake: the ids are
    cast to int32 (what the embedding takes) before the modulo, so ids beyond int32 wrap."""
    def hashed(features, labels):
        user = features["user"]
        values = (tf.cast(tf.cast(user.values, tf.int32) % user_rows, tf.int64) if cast_first
                  else user.values % user_rows)
        return {**features, "user": tf.SparseTensor(user.indices, values, user.dense_shape)}, labels

    return hashed


def make_dataset_fn(user_rows, cast_first=False):
    def dataset_fn(examples, context, global_batch_size):
        features = {}
        for name, value in examples.features.items():
            features[name] = (tf.SparseTensor(value.indices, value.values, value.dense_shape)
                              if hasattr(value, "indices") else value)
        dataset = tf.data.Dataset.from_tensor_slices((features, examples.labels)).repeat()
        dataset = dataset.batch(context.get_per_replica_batch_size(global_batch_size),
                                drop_remainder=True)
        return dataset.map(hash_user(user_rows, cast_first)).prefetch(2)

    return dataset_fn


def runner(user_rows, table_rates=None, skipped_row=None, cast_first=False, **options):
    """The TF2 side as the suite runs it; the keyword arguments after `user_rows` are the
    controls' mistakes, `options` go to `KerasRunner`."""
    return KerasRunner(build_model=make_build_model(user_rows, table_rates, skipped_row),
                       dataset_fn=make_dataset_fn(user_rows, cast_first), **options)
