"""TF1 side: TPUEstimator with `tpu.experimental.embedding_column`,
`tpu.experimental.shared_embedding_columns` (the item table serves two features) and an
`EmbeddingConfigSpec`, a three-layer MLP and a sigmoid cross-entropy click loss.

On CPU the spec's optimization parameters are ignored and every variable, tables included, is
trained by the model_fn's optimizer (TPUEstimator ignores the EmbeddingConfigSpec when use_tpu=False); the spec is built anyway so the
pipeline is the one that runs on a TPU.
"""
import tensorflow as tf

from cases.recommender.data import HIDDEN, TABLES
from cases.recommender.optimizers import RECIPES
from verify import EstimatorRunner
from verify.runners.tf1.adam_variants import PowAdamOptimizer

tf1 = tf.compat.v1


def embedding_columns():
    """One column per sparse feature; features of a shared table get shared columns."""
    columns = []
    for table in TABLES:
        ids = [tf1.feature_column.categorical_column_with_identity(f, num_buckets=table.vocabulary)
               for f in table.features]
        if len(ids) > 1:
            columns.extend(tf1.tpu.experimental.shared_embedding_columns(
                ids, dimension=table.dim, combiner=table.combiner))
        else:
            columns.append(tf1.tpu.experimental.embedding_column(
                ids[0], dimension=table.dim, combiner=table.combiner))
    return columns


def make_embedding_config_spec(optimizer: str):
    def embedding_config_spec():
        return tf1.estimator.tpu.experimental.EmbeddingConfigSpec(
            feature_columns=embedding_columns(),
            optimization_parameters=RECIPES[optimizer].tf1_tpu_parameters())

    return embedding_config_spec


def input_fn(examples, params):
    features = {}
    for name, value in examples.features.items():
        features[name] = (tf1.SparseTensor(value.indices, value.values, value.dense_shape)
                          if hasattr(value, "indices") else value)
    dataset = tf1.data.Dataset.from_tensor_slices((features, examples.labels))
    return dataset.repeat().batch(params["batch_size"], drop_remainder=True)


def make_model_fn(optimizer: str, dense_first: bool = False, pow_bias_correction: bool = False):
    def model_fn(features, labels, mode, params):
        embedded = tf1.keras.layers.DenseFeatures(embedding_columns())(features)
        blocks = [features["dense"], embedded] if dense_first else [embedded, features["dense"]]
        net = tf1.keras.layers.Concatenate(axis=1)(blocks)
        for n, units in enumerate(HIDDEN):
            net = tf1.layers.Dense(units, activation=tf.nn.relu, name=f"dense{n}")(net)
        logits = tf1.layers.Dense(1, name=f"dense{len(HIDDEN)}")(net)
        loss = tf1.losses.sigmoid_cross_entropy(multi_class_labels=labels, logits=logits)
        opt = RECIPES[optimizer].tf1_optimizer()
        if pow_bias_correction:
            opt = PowAdamOptimizer(opt._lr, opt._beta1, opt._beta2, opt._epsilon)
        if params["use_tpu"]:
            opt = tf1.tpu.CrossShardOptimizer(opt)
        train_op = opt.minimize(loss, global_step=tf1.train.get_global_step())
        return tf1.estimator.tpu.TPUEstimatorSpec(mode, loss=loss, train_op=train_op)

    return model_fn



def runner(optimizer: str, dense_first: bool = False, pow_bias_correction: bool = False):
    """The TF1 side as the suite runs it; `dense_first`: the first layer's inputs concatenated
    dense features first (the same model with its kernel rows in another order: calibration's
    other summation order, see `cases.recommender.make_case`); `pow_bias_correction`: Adam's
    bias correction rounded as Keras rounds it (`PowAdamOptimizer`)."""
    return EstimatorRunner(model_fn=make_model_fn(optimizer, dense_first, pow_bias_correction),
                           input_fn=input_fn,
                           embedding_config_spec=make_embedding_config_spec(optimizer))
