"""The Keras 3 rewrite: keras-rs `DistributedEmbedding` + Keras 3 `compile`/`fit`, the successor
of the tfrs `TPUEmbedding` rewrite in `tf2_keras.py`, for the JAX and the TensorFlow backend
(the same code; the environment sets `KERAS_BACKEND`).

Written the way keras-rs documents it: one `TableConfig` (vocabulary, width, combiner,
initializer, optimizer) and one `FeatureConfig` per feature, the layer called on a dict of id
inputs in the format keras-rs documents for the backend (`ids`): a `tf.SparseTensor` on
TensorFlow ("sparse"), dense ids padded with 0 and 0/1 weights on JAX ("dense"; a sparse input
becomes a BCOO array whose size changes every batch, and the jitted step is compiled anew for
each). Dense ids on TensorFlow are `control-keras3-tf-dense-ids`: the lookup's gradient then
keeps repeated ids apart and Keras 3's Adagrad squares them apart. Aligned with TF1 where
keras-rs' defaults differ:

- `initializer`: TF1's truncated normal with stddev 1/sqrt(dim). keras-rs' docstring promises
  that default, its code uses `VarianceScaling(mode="fan_out")` (see `control-keras-rs-
  initializer`);
- `optimizer`: the compile optimizer's object. keras-rs defaults a table to "adam"; on CPU the
  compile optimizer trains the tables and the table's own is never used, on a SparseCore TPU
  only the table's is (see `control-keras-rs-table-optimizer`).

Keras 3 Adagrad keeps its default epsilon 1e-7 (inside the square root): it is the only value
keras-rs accepts for a table on a TPU, and with accumulators >= 0.1 it moves an update by less
than 5e-7 relative. As in `tf2_keras.py` the model concatenates `[dense, embedding]`; the name
map permutes the Dense kernel's rows.
"""
import keras
import keras_rs
import tensorflow as tf

from cases.tpu_embedding.data import DENSE_FEATURES, DIMENSION, VOCABULARY
from verify import Keras3Runner

LEARNING_RATE = 0.05
MAX_IDS = 3                         # the SparseIds width of the case's examples
TF1_INITIALIZER_STDDEV = 1 / DIMENSION ** 0.5


WEIGHTS = "sparse_feature_weights"   # the weights input of the dense id format


def make_build_model(batch_size, ids="sparse", keras_rs_defaults=()):
    """`ids`: "sparse" or "dense" (see the module docstring); `keras_rs_defaults`:
    `TableConfig` arguments ("initializer", "optimizer") the rewrite leaves to keras-rs'
    default (a control)."""
    def build_model(steps_per_execution):
        optimizer = keras.optimizers.Adagrad(learning_rate=LEARNING_RATE,
                                             initial_accumulator_value=0.1)
        table = {"initializer": keras.initializers.TruncatedNormal(
                     mean=0.0, stddev=TF1_INITIALIZER_STDDEV),
                 "optimizer": optimizer}
        for name in keras_rs_defaults:
            del table[name]
        embedding = keras_rs.layers.DistributedEmbedding({
            "sparse_feature": keras_rs.layers.FeatureConfig(
                name="sparse_feature",
                table=keras_rs.layers.TableConfig(
                    name="sparse_feature", vocabulary_size=VOCABULARY, embedding_dim=DIMENSION,
                    combiner="mean", **table),
                input_shape=(batch_size, MAX_IDS), output_shape=(batch_size, DIMENSION))})
        dense_input = keras.Input(shape=(DENSE_FEATURES,), name="dense_feature")
        id_input = keras.Input(shape=(MAX_IDS,), dtype="int32", sparse=ids == "sparse",
                               name="sparse_feature")
        inputs = {"dense_feature": dense_input, "sparse_feature": id_input}
        if ids == "dense":
            inputs[WEIGHTS] = keras.Input(shape=(MAX_IDS,), name=WEIGHTS)
            embedded = embedding({"sparse_feature": id_input},
                                 {"sparse_feature": inputs[WEIGHTS]})["sparse_feature"]
        else:
            embedded = embedding({"sparse_feature": id_input})["sparse_feature"]
        concatenated = keras.layers.Concatenate(axis=1)([dense_input, embedded])
        result = keras.layers.Dense(1)(concatenated)
        model = keras.Model(inputs=inputs, outputs=result)
        model.compile(optimizer, "mse", steps_per_execution=steps_per_execution)
        return model

    return build_model


def make_dataset_fn(ids="sparse"):
    def dataset_fn(examples, global_batch_size):
        sparse = examples.features["sparse_feature"]
        features = {"dense_feature": examples.features["dense_feature"]}
        if ids == "dense":
            features["sparse_feature"], features[WEIGHTS] = sparse.padded()
        else:
            features["sparse_feature"] = tf.SparseTensor(
                sparse.indices, sparse.values.astype("int32"), sparse.dense_shape)
        dataset = tf.data.Dataset.from_tensor_slices((features, examples.labels))
        return dataset.repeat().batch(global_batch_size, drop_remainder=True).prefetch(2)

    return dataset_fn


def runner(batch_size, ids="sparse", keras_rs_defaults=()):
    """The keras-rs side as the suite runs it, with the id format `ids`; `keras_rs_defaults`
    makes a control (see `make_build_model`)."""
    return Keras3Runner(build_model=make_build_model(batch_size, ids, tuple(keras_rs_defaults)),
                        dataset_fn=make_dataset_fn(ids),
                        weighted_ids={"sparse_feature": WEIGHTS} if ids == "dense" else {})
