"""TF2 side: tfrs `TPUEmbedding` with one `FeatureConfig` per sparse feature (the item
`TableConfig` object is shared by two of them), built in the strategy scope, Keras compile/fit.

The rewrite concatenates `[dense, item_history, candidate_item, categories, query_terms]`, the
order a model author writes; TF1's DenseFeatures sorts columns by name, so the first Dense
kernel's rows are permuted by the name map. Negative controls are built from `make_build_model`
with one mistake each.
"""
import numpy as np
import tensorflow as tf
import tensorflow_recommenders as tfrs

from cases.recommender.data import (DENSE_FEATURES, HIDDEN, TABLE_OF, TABLES,
                                    TF2_FEATURE_ORDER)
from cases.recommender.optimizers import FTRL, RECIPES
from verify import Examples, KerasRunner, SparseIds

BATCH_SIZE = 8   # the case's (cases.recommender.BATCH_SIZE)

def feature_configs(combiners=None, split_tables=()):
    """FeatureConfig per feature. `combiners` overrides a table's combiner; a table named in
    `split_tables` gets one TableConfig per feature instead of one shared object."""
    combiners = combiners or {}
    configs = {}
    for table in TABLES:
        def table_config(name):
            return tf.tpu.experimental.embedding.TableConfig(
                vocabulary_size=table.vocabulary, dim=table.dim, name=name,
                combiner=combiners.get(table.name, table.combiner))

        shared = table_config(table.name)
        for n, feature in enumerate(table.features):
            config = table_config(f"{table.name}_{feature}") if (
                table.name in split_tables and n > 0) else shared
            configs[feature] = tf.tpu.experimental.embedding.FeatureConfig(table=config,
                                                                           name=feature)
    return configs


def make_build_model(optimizer="adagrad", keras_optimizer=None, layer_optimizer=None,
                     combiners=None, split_tables=(), ragged_ids=False):
    """`keras_optimizer()` builds the compile optimizer (default: the recipe's);
    `layer_optimizer(compile_optimizer)` the tfrs layer's (default: the same object);
    `ragged_ids`: the sparse features are declared as ragged int32 inputs."""
    recipe = RECIPES[optimizer]

    def build_model(steps_per_execution):
        compile_optimizer = (keras_optimizer or recipe.keras_optimizer)()
        embedding_optimizer = (layer_optimizer(compile_optimizer) if layer_optimizer
                               else compile_optimizer)
        dense_input = tf.keras.Input(shape=(DENSE_FEATURES,), dtype=tf.float32, name="dense")
        sparse_inputs = {f: tf.keras.Input(shape=(None,) if ragged_ids else (), dtype=tf.int32,
                                           ragged=ragged_ids, name=f)
                         for f in TF2_FEATURE_ORDER}
        embedded = tfrs.layers.embedding.TPUEmbedding(
            feature_config=feature_configs(combiners, split_tables),
            optimizer=embedding_optimizer)(sparse_inputs)
        net = tf.keras.layers.Concatenate(axis=1)(
            [dense_input] + [embedded[f] for f in TF2_FEATURE_ORDER])
        for n, units in enumerate(HIDDEN):
            net = tf.keras.layers.Dense(units, activation="relu", name=f"dense{n}")(net)
        logits = tf.keras.layers.Dense(1, name=f"dense{len(HIDDEN)}")(net)
        model = tf.keras.Model(inputs={"dense": dense_input, **sparse_inputs}, outputs=logits)
        model.compile(compile_optimizer, tf.keras.losses.BinaryCrossentropy(from_logits=True),
                      steps_per_execution=steps_per_execution)
        return model

    return build_model


def dataset_fn(examples, context, global_batch_size, layout="sparse"):
    """The batches as TF1's input_fn lays them out (ids as int64 SparseTensors, labels of
    shape (batch, 1)); `layout="ragged"`: the same examples as a rewrite may lay them out,
    ids as int32 RaggedTensors and labels of shape (batch,)."""
    features = {}
    for name, value in examples.features.items():
        features[name] = (tf.SparseTensor(value.indices, value.values, value.dense_shape)
                          if hasattr(value, "indices") else value)
    dataset = tf.data.Dataset.from_tensor_slices((features, examples.labels)).repeat()
    dataset = dataset.batch(context.get_per_replica_batch_size(global_batch_size),
                            drop_remainder=True)
    if layout == "ragged":
        dataset = dataset.map(lambda features, labels: (
            {name: tf.cast(tf.RaggedTensor.from_sparse(value), tf.int32)
             if isinstance(value, tf.SparseTensor) else value for name, value in features.items()},
            labels[:, 0]))
    return dataset.prefetch(2)


def mistaken_examples(examples, mistake):
    """The examples as a faulty input pipeline feeds them. "ids": the first example of the
    first batch with two or more item_history ids loses its last one, and the first with two
    or more categories gets another category for its first; "shuffled": every run of BATCH_SIZE
    examples in reverse order (each batch the same examples, shuffled)."""
    features = dict(examples.features)
    if mistake == "shuffled":
        order = np.arange(len(examples)).reshape(-1, BATCH_SIZE)[:, ::-1].ravel()
        features = {name: _reordered(value, order) for name, value in features.items()}
        return Examples(features, examples.labels[order])
    lists = {name: _ids_per_example(features[name]) for name in ("item_history", "categories")}
    dropped = next(i for i, ids in enumerate(lists["item_history"]) if len(ids) >= 2)
    lists["item_history"][dropped] = lists["item_history"][dropped][:-1]
    changed = next(i for i, ids in enumerate(lists["categories"]) if len(ids) >= 2)
    ids = lists["categories"][changed]
    ids[0] = next(c for c in range(TABLE_OF["categories"].vocabulary) if c not in ids)
    for name, per_example in lists.items():
        features[name] = SparseIds.from_lists(per_example, width=features[name].dense_shape[1])
    return Examples(features, examples.labels)


def _ids_per_example(ids: SparseIds) -> list[list[int]]:
    out = [[] for _ in range(len(ids))]
    for (row, _), value in zip(ids.indices.tolist(), ids.values.tolist()):
        out[row].append(value)
    return out


def _reordered(value, order):
    if isinstance(value, SparseIds):
        lists = _ids_per_example(value)
        return SparseIds.from_lists([lists[i] for i in order], width=value.dense_shape[1])
    return value[order]


class ClickModel(tfrs.Model):
    """The same rewrite written the way TensorFlow Recommenders' tutorials write models: a
    `tfrs.Model` subclass whose `compute_loss(inputs, training)` gives the loss, trained by
    tfrs' own `train_step` (the loss plus regularization losses, `tape.gradient`,
    `optimizer.apply_gradients`)."""

    def __init__(self, embedding_optimizer):
        super().__init__()
        self.embedding = tfrs.layers.embedding.TPUEmbedding(
            feature_config=feature_configs(), optimizer=embedding_optimizer)
        self.hidden = [tf.keras.layers.Dense(units, activation="relu", name=f"dense{n}")
                       for n, units in enumerate(HIDDEN)]
        self.logit = tf.keras.layers.Dense(1, name=f"dense{len(HIDDEN)}")
        self.task = tfrs.tasks.Ranking(
            loss=tf.keras.losses.BinaryCrossentropy(from_logits=True))

    def call(self, features):
        embedded = self.embedding({f: features[f] for f in TF2_FEATURE_ORDER})
        net = tf.concat([features["dense"]] + [embedded[f] for f in TF2_FEATURE_ORDER], axis=1)
        for layer in self.hidden:
            net = layer(net)
        return self.logit(net)

    def compute_loss(self, inputs, training=False):
        features, labels = inputs
        return self.task(labels=tf.reshape(labels, (-1, 1)), predictions=self(features))


def make_build_tfrs_model(optimizer="adagrad"):
    """`build_model` for the `tfrs.Model` version, compiled as tfrs tutorials do (optimizer
    only); the layer and compile share one optimizer object."""
    recipe = RECIPES[optimizer]

    def build_model(steps_per_execution):
        compile_optimizer = recipe.keras_optimizer()
        model = ClickModel(compile_optimizer)
        model.compile(compile_optimizer, steps_per_execution=steps_per_execution)
        # build the variables (tfrs.Model builds on first call) so initial values can load
        model({"dense": tf.zeros((1, DENSE_FEATURES)),
               **{f: tf.SparseTensor(tf.zeros((0, 2), tf.int64), tf.zeros((0,), tf.int32),
                                     (1, 1)) for f in TF2_FEATURE_ORDER}})
        return model

    return build_model


def tpu_ftrl_with_beta(_compile_optimizer):
    """The tfrs layer's own FTRL with TF1's beta (a control gives the compile optimizer none)."""
    return tf.tpu.experimental.embedding.FTRL(
        FTRL["learning_rate"], l1_regularization_strength=FTRL["l1"],
        l2_regularization_strength=FTRL["l2"], beta=FTRL["beta"],
        initial_accumulator_value=FTRL["initial_accumulator_value"])


LAYER_OPTIMIZERS = {"tpu_ftrl_with_beta": tpu_ftrl_with_beta}


def runner(optimizer, layer_optimizer=None, inputs="sparse", **mistake):
    """The Keras-model side as the suite runs it; `mistake` goes to `make_build_model`, and
    `layer_optimizer` names one of `LAYER_OPTIMIZERS` for the tfrs layer. `inputs`: "sparse"
    (TF1's layout), "ragged" (another layout of the same examples, `dataset_fn`), or an input
    pipeline's mistake ("ids", "shuffled": `mistaken_examples`)."""
    if layer_optimizer is not None:
        mistake["layer_optimizer"] = LAYER_OPTIMIZERS[layer_optimizer]
    if inputs in ("sparse", "ragged"):
        def batches(examples, context, global_batch_size):
            return dataset_fn(examples, context, global_batch_size, layout=inputs)
    else:
        def batches(examples, context, global_batch_size):
            return dataset_fn(mistaken_examples(examples, inputs), context, global_batch_size)
    return KerasRunner(build_model=make_build_model(optimizer, ragged_ids=inputs == "ragged",
                                                    **mistake), dataset_fn=batches)


def tfrs_model_runner(optimizer):
    """The `tfrs.Model` subclass side as the suite runs it."""
    return KerasRunner(build_model=make_build_tfrs_model(optimizer), dataset_fn=dataset_fn)
