"""The seed's TF1 pipeline: TPUEstimator + tpu.experimental.embedding_column + EmbeddingConfigSpec.

Only two changes from the seed: the input comes from the case's examples, and the optimizer is
wrapped in `CrossShardOptimizer` only on a TPU (on CPU its CrossReplicaSum has no kernel).
"""
import tensorflow as tf

from verify import EstimatorRunner
from cases.tpu_embedding.data import DIMENSION, VOCABULARY

tf1 = tf.compat.v1
LEARNING_RATE = 0.05


def embedding_column():
    ids = tf1.feature_column.categorical_column_with_identity(key="sparse_feature",
                                                             num_buckets=VOCABULARY)
    return tf1.tpu.experimental.embedding_column(ids, dimension=DIMENSION)


def embedding_config_spec():
    return tf1.estimator.tpu.experimental.EmbeddingConfigSpec(
        feature_columns=(embedding_column(),),
        optimization_parameters=tf1.tpu.experimental.AdagradParameters(LEARNING_RATE))


def input_fn(examples, params):
    sparse = examples.features["sparse_feature"]
    dataset = tf1.data.Dataset.from_tensor_slices((
        {"dense_feature": examples.features["dense_feature"],
         "sparse_feature": tf1.SparseTensor(sparse.indices, sparse.values, sparse.dense_shape)},
        examples.labels))
    dataset = dataset.repeat()
    return dataset.batch(params["batch_size"], drop_remainder=True)


def model_fn(features, labels, mode, params):
    embedding_features = tf1.keras.layers.DenseFeatures(embedding_column())(features)
    concatenated_features = tf1.keras.layers.Concatenate(axis=1)(
        [embedding_features, features["dense_feature"]])
    logits = tf1.layers.Dense(1)(concatenated_features)
    loss = tf1.losses.mean_squared_error(labels=labels, predictions=logits)
    optimizer = tf1.train.AdagradOptimizer(LEARNING_RATE)
    if params["use_tpu"]:
        optimizer = tf1.tpu.CrossShardOptimizer(optimizer)
    train_op = optimizer.minimize(loss, global_step=tf1.train.get_global_step())
    return tf1.estimator.tpu.TPUEstimatorSpec(mode, loss=loss, train_op=train_op)


def runner():
    """The TF1 side as the suite runs it (named lazily by the case: `tf1_estimator:runner`)."""
    return EstimatorRunner(model_fn=model_fn, input_fn=input_fn,
                           embedding_config_spec=embedding_config_spec, iterations_per_loop=10)
