"""The Keras 3 rewrite of the recommender: keras-rs `DistributedEmbedding` (four
`FeatureConfig`s over three `TableConfig`s, the item table shared) + Keras 3 `compile`/`fit`,
for the JAX and the TensorFlow backend (the same code; the environment sets `KERAS_BACKEND`).

The successor of `tf2_keras.py`. Ids come in the format keras-rs documents for the backend
(`ids`): `tf.SparseTensor`s on TensorFlow ("sparse"), dense ids padded with 0 and 0/1 weights
on JAX ("dense"; see `cases.tpu_embedding.keras_rs`). Aligned with TF1 where Keras 3 and
keras-rs defaults differ:

- each table's initializer is TF1's truncated normal with stddev 1/sqrt(dim) (keras-rs'
  code default is `VarianceScaling(mode="fan_out")`, not the docstring's);
- each table's optimizer is the compile optimizer's object (keras-rs' default is "adam");
- Adam's epsilon is TF1's 1e-8 (Keras 3's default 1e-7 is `control-keras3-adam-epsilon`);
- Adam's beta_1 and beta_2 are given as the float32 numbers TF1 computes with
  (`TF1_ADAM_BETAS`). TF1 rounds beta to float32 before it takes `1 - beta`; Keras 3 takes
  `1 - beta_2` of the Python float (1e-3, not float32's 9.9998713e-4) for `v` but `beta_2 ** t`
  of the float32 for the bias correction, so its bias-corrected `v` is 1.3e-5 relative off
  TF1's and the oracle's. Written plainly (`Adam(0.01, epsilon=1e-8)`) the rewrite drifts to
  1.1e-6 from tf1 and 1.2e-6 from the oracle in 20 steps, 0.58 and 0.78 of the weight
  tolerance and growing; with these betas 2.4e-7 and 4.8e-7, as the tfrs rewrite;
- Adagrad keeps Keras 3's default epsilon 1e-7 inside the square root: the only value
  keras-rs accepts for a table on a TPU; with accumulators >= 0.1 it moves an update by
  < 5e-7 relative.

One more alignment, on the TensorFlow backend: the compile optimizer sums the gradient rows
of a repeated id before its update (`summing_repeated_rows`), as TF1 and legacy Keras do.
Keras 3 applies the pieces of a `tf.IndexedSlices` gradient one by one, so Adagrad's
accumulator (Adam's `v`, FTRL's accumulator) adds the squares of the pieces of a row looked
up twice in a batch instead of the square of their sum. Here every item looked up by both the
history and the candidate is such a row (`control-keras3-tf-repeated-rows` runs without it).
On JAX gradients are dense and it changes nothing.

Keras 3 names Adam's slots `momentum` and `velocity` (`m` and `v` canonically), Adagrad's and
FTRL's `accumulator` and `linear`, as the legacy optimizers do.
"""
import keras
import keras_rs
import numpy as np
import tensorflow as tf

from cases.recommender.data import (DENSE_FEATURES, HIDDEN, IDS_PER_EXAMPLE, TABLES,
                                    TF2_FEATURE_ORDER)
from cases.recommender.optimizers import (ADAGRAD_ACCUMULATOR, ADAGRAD_LR, ADAM_EPSILON_TF1,
                                          ADAM_LR, FTRL, SGD_LR)
from verify import Keras3Runner


# beta_1, beta_2 as float32 numbers (see the module docstring): 0.89999998, 0.99900001
TF1_ADAM_BETAS = {"beta_1": float(np.float32(0.9)), "beta_2": float(np.float32(0.999))}


class SummingRepeatedRows:
    """Mixed into a Keras 3 optimizer class: sum the rows of a sparse gradient that share an
    id before the update, as TF1's `Optimizer._deduplicate_indexed_slices` does (`tf.unique`
    + `tf.math.unsorted_segment_sum`). Dense gradients pass unchanged."""

    def apply(self, grads, trainable_variables=None):
        return super().apply([summed_rows(g) for g in grads], trainable_variables)


def summed_rows(gradient):
    if type(gradient).__name__ != "IndexedSlices":
        return gradient
    ids, positions = tf.unique(gradient.indices)
    rows = tf.math.unsorted_segment_sum(gradient.values, positions, tf.shape(ids)[0])
    return tf.IndexedSlices(rows, ids, gradient.dense_shape)


def summing_repeated_rows(optimizer_class):
    """`optimizer_class` with `SummingRepeatedRows` mixed in, under the same class name."""
    return type(optimizer_class.__name__, (SummingRepeatedRows, optimizer_class), {})


def keras3_optimizer(optimizer: str, sum_repeated_rows=True, **overrides):
    """The recommender's optimizer as Keras 3 spells it, TF1's hyperparameters, summing
    repeated rows (see the module docstring); `overrides` replace some (a control)."""
    def make(optimizer_class, *args, **kwargs):
        if sum_repeated_rows:
            optimizer_class = summing_repeated_rows(optimizer_class)
        return optimizer_class(*args, **kwargs)

    if optimizer == "sgd":
        return make(keras.optimizers.SGD, SGD_LR, **overrides)
    if optimizer == "adagrad":
        return make(keras.optimizers.Adagrad, ADAGRAD_LR,
                    initial_accumulator_value=ADAGRAD_ACCUMULATOR, **overrides)
    if optimizer == "adam":
        return make(keras.optimizers.Adam, ADAM_LR,
                    **{"epsilon": ADAM_EPSILON_TF1, **TF1_ADAM_BETAS, **overrides})
    if optimizer == "ftrl":
        return make(keras.optimizers.Ftrl, FTRL["learning_rate"],
                    initial_accumulator_value=FTRL["initial_accumulator_value"],
                    l1_regularization_strength=FTRL["l1"],
                    l2_regularization_strength=FTRL["l2"], beta=FTRL["beta"], **overrides)
    raise ValueError(f"unknown optimizer {optimizer!r}")


def feature_configs(batch_size: int, table_optimizer) -> dict:
    """One FeatureConfig per sparse feature; the two item features share one TableConfig."""
    configs = {}
    for table in TABLES:
        shared = keras_rs.layers.TableConfig(
            name=table.name, vocabulary_size=table.vocabulary, embedding_dim=table.dim,
            combiner=table.combiner, optimizer=table_optimizer,
            initializer=keras.initializers.TruncatedNormal(mean=0.0, stddev=1 / table.dim ** 0.5))
        for feature in table.features:
            width = IDS_PER_EXAMPLE[feature][1]
            configs[feature] = keras_rs.layers.FeatureConfig(
                name=feature, table=shared, input_shape=(batch_size, width),
                output_shape=(batch_size, table.dim))
    return configs


def weights_of(feature: str) -> str:
    """The weights input of a feature in the dense id format."""
    return f"{feature}_weights"


def make_build_model(optimizer: str, batch_size: int, ids="sparse", epsilon=None,
                     sum_repeated_rows=True):
    """`ids`: "sparse" or "dense" (see the module docstring); `epsilon`: the optimizer's
    epsilon where a control leaves Keras 3's default in place ("default") instead of TF1's;
    `sum_repeated_rows=False`: the plain Keras 3 optimizer (a control)."""
    def build_model(steps_per_execution):
        overrides = {}
        if epsilon == "default":
            overrides["epsilon"] = keras.optimizers.Adam().epsilon
        compile_optimizer = keras3_optimizer(optimizer, sum_repeated_rows, **overrides)
        dense_input = keras.Input(shape=(DENSE_FEATURES,), name="dense")
        id_inputs = {f: keras.Input(shape=(IDS_PER_EXAMPLE[f][1],), dtype="int32",
                                    sparse=ids == "sparse", name=f) for f in TF2_FEATURE_ORDER}
        weight_inputs = {f: keras.Input(shape=(IDS_PER_EXAMPLE[f][1],), name=weights_of(f))
                         for f in TF2_FEATURE_ORDER} if ids == "dense" else None
        embedded = keras_rs.layers.DistributedEmbedding(
            feature_configs(batch_size, compile_optimizer))(id_inputs, weight_inputs)
        net = keras.layers.Concatenate(axis=1)(
            [dense_input] + [embedded[f] for f in TF2_FEATURE_ORDER])
        for n, units in enumerate(HIDDEN):
            net = keras.layers.Dense(units, activation="relu", name=f"dense{n}")(net)
        logits = keras.layers.Dense(1, name=f"dense{len(HIDDEN)}")(net)
        inputs = {"dense": dense_input, **id_inputs}
        if weight_inputs:
            inputs.update({weights_of(f): w for f, w in weight_inputs.items()})
        model = keras.Model(inputs=inputs, outputs=logits)
        model.compile(compile_optimizer, keras.losses.BinaryCrossentropy(from_logits=True),
                      steps_per_execution=steps_per_execution)
        return model

    return build_model


def make_dataset_fn(ids="sparse"):
    def dataset_fn(examples, global_batch_size):
        features = {}
        for name, value in examples.features.items():
            if not hasattr(value, "indices"):
                features[name] = value
            elif ids == "dense":
                features[name], features[weights_of(name)] = value.padded()
            else:
                features[name] = tf.SparseTensor(value.indices, value.values.astype("int32"),
                                                 value.dense_shape)
        dataset = tf.data.Dataset.from_tensor_slices((features, examples.labels)).repeat()
        return dataset.batch(global_batch_size, drop_remainder=True).prefetch(2)

    return dataset_fn


def runner(optimizer: str, batch_size: int, ids="sparse", epsilon=None,
           sum_repeated_rows=True):
    """The keras-rs side as the suite runs it, with the id format `ids`; `epsilon="default"`
    and `sum_repeated_rows=False` make controls."""
    return Keras3Runner(
        build_model=make_build_model(optimizer, batch_size, ids, epsilon, sum_repeated_rows),
        dataset_fn=make_dataset_fn(ids),
        weighted_ids={f: weights_of(f) for f in TF2_FEATURE_ORDER} if ids == "dense" else {})
