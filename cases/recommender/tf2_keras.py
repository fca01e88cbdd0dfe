"""TF2 side: tfrs `TPUEmbedding` with one `FeatureConfig` per sparse feature (the item
`TableConfig` object is shared by two of them), built in the strategy scope, Keras compile/fit.

The rewrite concatenates `[dense, item_history, candidate_item, categories, query_terms]`, the
order a model author writes; TF1's DenseFeatures sorts columns by name, so the first Dense
kernel's rows are permuted by the name map. Negative controls are built from `make_build_model`
with one mistake each.
"""
import tensorflow as tf
import tensorflow_recommenders as tfrs

from cases.recommender.data import DENSE_FEATURES, HIDDEN, TABLES
from cases.recommender.optimizers import RECIPES

TF2_FEATURE_ORDER = ("item_history", "candidate_item", "categories", "query_terms")


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
                     combiners=None, split_tables=()):
    """`keras_optimizer()` builds the compile optimizer (default: the recipe's);
    `layer_optimizer(compile_optimizer)` the tfrs layer's (default: the same object)."""
    recipe = RECIPES[optimizer]

    def build_model(steps_per_execution):
        compile_optimizer = (keras_optimizer or recipe.keras_optimizer)()
        embedding_optimizer = (layer_optimizer(compile_optimizer) if layer_optimizer
                               else compile_optimizer)
        dense_input = tf.keras.Input(shape=(DENSE_FEATURES,), dtype=tf.float32, name="dense")
        sparse_inputs = {f: tf.keras.Input(shape=(), dtype=tf.int32, name=f)
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


def dataset_fn(examples, context, global_batch_size):
    features = {}
    for name, value in examples.features.items():
        features[name] = (tf.SparseTensor(value.indices, value.values, value.dense_shape)
                          if hasattr(value, "indices") else value)
    dataset = tf.data.Dataset.from_tensor_slices((features, examples.labels)).repeat()
    dataset = dataset.batch(context.get_per_replica_batch_size(global_batch_size),
                            drop_remainder=True)
    return dataset.prefetch(2)
