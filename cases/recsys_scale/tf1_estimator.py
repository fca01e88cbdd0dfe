"""TF1 side: TPUEstimator with `embedding_column`/`shared_embedding_columns` and an
`EmbeddingConfigSpec`, the user ids hashed into their table in the `input_fn`.

The user table trains at its own learning rate. On a TPU the spec's per-table optimization
does that; on CPU (TPUEstimator ignores the spec when `use_tpu=False`) the model_fn trains the
user table with an `AdagradOptimizer` of its own and every other variable with another, one
`train_op` grouping both, as TF1 code with per-variable-group optimizers does.
"""
import tensorflow as tf

from cases.recsys_scale.data import HIDDEN, tables
from cases.recsys_scale.optimizers import ACCUMULATOR, LEARNING_RATE, TABLE_RATES
from verify import EstimatorRunner

tf1 = tf.compat.v1


def embedding_columns(user_rows):
    """One column per sparse feature; features of a shared table get shared columns."""
    columns = []
    for table in tables(user_rows):
        ids = [tf1.feature_column.categorical_column_with_identity(f, num_buckets=table.vocabulary)
               for f in table.features]
        if len(ids) > 1:
            columns.extend(tf1.tpu.experimental.shared_embedding_columns(
                ids, dimension=table.dim, combiner=table.combiner))
        else:
            columns.append(tf1.tpu.experimental.embedding_column(
                ids[0], dimension=table.dim, combiner=table.combiner))
    return columns


def make_embedding_config_spec(user_rows):
    def embedding_config_spec():
        return tf1.estimator.tpu.experimental.EmbeddingConfigSpec(
            feature_columns=embedding_columns(user_rows),
            optimization_parameters=tf1.tpu.experimental.AdagradParameters(
                LEARNING_RATE, ACCUMULATOR))

    return embedding_config_spec


def make_input_fn(user_rows):
    def input_fn(examples, params):
        features = {}
        for name, value in examples.features.items():
            features[name] = (tf1.SparseTensor(value.indices, value.values, value.dense_shape)
                              if hasattr(value, "indices") else value)

        def hash_user(features, labels):   # raw 64-bit user ids -> a row of the user table
            user = features["user"]
            features = dict(features)
            features["user"] = tf1.SparseTensor(user.indices, user.values % user_rows,
                                                user.dense_shape)
            return features, labels

        dataset = tf1.data.Dataset.from_tensor_slices((features, examples.labels)).repeat()
        dataset = dataset.batch(params["batch_size"], drop_remainder=True)
        return dataset.map(hash_user)

    return input_fn


def make_model_fn(user_rows):
    def model_fn(features, labels, mode, params):
        embedded = tf1.keras.layers.DenseFeatures(embedding_columns(user_rows))(features)
        net = tf1.keras.layers.Concatenate(axis=1)([embedded, features["dense"]])
        for n, units in enumerate(HIDDEN):
            net = tf1.layers.Dense(units, activation=tf.nn.relu, name=f"dense{n}")(net)
        logits = tf1.layers.Dense(1, name=f"dense{len(HIDDEN)}")(net)
        loss = tf1.losses.sigmoid_cross_entropy(multi_class_labels=labels, logits=logits)
        variables = tf1.trainable_variables()
        own_rate = {table: [v for v in variables if f"/{table}_embedding/" in v.name]
                    for table in TABLE_RATES}
        grouped = {id(v) for vs in own_rate.values() for v in vs}
        rest = [v for v in variables if id(v) not in grouped]
        grads = dict(zip([id(v) for v in variables], tf1.gradients(loss, variables)))

        def optimizer(rate):
            opt = tf1.train.AdagradOptimizer(rate, ACCUMULATOR)
            return tf1.tpu.CrossShardOptimizer(opt) if params["use_tpu"] else opt

        updates = [optimizer(LEARNING_RATE).apply_gradients(
            [(grads[id(v)], v) for v in rest], global_step=tf1.train.get_global_step())]
        updates += [optimizer(TABLE_RATES[table]).apply_gradients(
            [(grads[id(v)], v) for v in vs]) for table, vs in own_rate.items()]
        return tf1.estimator.tpu.TPUEstimatorSpec(mode, loss=loss, train_op=tf.group(*updates))

    return model_fn


def runner(user_rows, **options):
    """The TF1 side as the suite runs it; `options` go to `EstimatorRunner` (how tables are
    captured)."""
    return EstimatorRunner(model_fn=make_model_fn(user_rows), input_fn=make_input_fn(user_rows),
                           embedding_config_spec=make_embedding_config_spec(user_rows),
                           **options)
