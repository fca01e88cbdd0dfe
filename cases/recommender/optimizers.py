"""The four optimizers the recommender case trains with, as each side spells them.

Every entry gives the TF1 model_fn optimizer, the TF1 `EmbeddingConfigSpec` parameters (ignored
on CPU, used by the TPU embedding engine), the Keras legacy optimizer given to `compile`, the
optimizer given to the tfrs layer, and the oracle's optimizer: the same hyperparameters in each.
Hyperparameters follow TF1's defaults where Keras' differ (Adam epsilon 1e-8).
"""
import dataclasses
from typing import Any, Callable

import tensorflow as tf

from verify import oracle_math as oracle

tf1 = tf.compat.v1

SGD_LR = 0.1
ADAGRAD_LR, ADAGRAD_ACCUMULATOR = 0.1, 0.1
ADAM_LR, ADAM_EPSILON_TF1, ADAM_EPSILON_KERAS = 0.01, 1e-8, 1e-7
FTRL = dict(learning_rate=0.1, l1=1e-3, l2=1e-2, beta=0.1, initial_accumulator_value=0.1)


@dataclasses.dataclass(frozen=True)
class OptimizerRecipe:
    name: str
    tf1_optimizer: Callable[[], Any]
    tf1_tpu_parameters: Callable[[], Any]
    keras_optimizer: Callable[..., Any]
    oracle_optimizer: Callable[..., Any]
    # TF1 slot name -> the canonical (Keras) one
    tf1_slot_names: dict = dataclasses.field(default_factory=dict)


def _keras_ftrl(beta=FTRL["beta"]):
    return tf.keras.optimizers.legacy.Ftrl(
        FTRL["learning_rate"], initial_accumulator_value=FTRL["initial_accumulator_value"],
        l1_regularization_strength=FTRL["l1"], l2_regularization_strength=FTRL["l2"], beta=beta)


RECIPES = {
    "sgd": OptimizerRecipe(
        "sgd", lambda: tf1.train.GradientDescentOptimizer(SGD_LR),
        lambda: tf1.tpu.experimental.StochasticGradientDescentParameters(SGD_LR),
        lambda: tf.keras.optimizers.legacy.SGD(SGD_LR),
        lambda: oracle.SGD(SGD_LR)),
    "adagrad": OptimizerRecipe(
        "adagrad", lambda: tf1.train.AdagradOptimizer(ADAGRAD_LR, ADAGRAD_ACCUMULATOR),
        lambda: tf1.tpu.experimental.AdagradParameters(ADAGRAD_LR, ADAGRAD_ACCUMULATOR),
        lambda: tf.keras.optimizers.legacy.Adagrad(ADAGRAD_LR, ADAGRAD_ACCUMULATOR),
        lambda: oracle.Adagrad(ADAGRAD_LR, ADAGRAD_ACCUMULATOR, epsilon=0.0)),
    "adam": OptimizerRecipe(
        "adam", lambda: tf1.train.AdamOptimizer(ADAM_LR, epsilon=ADAM_EPSILON_TF1),
        lambda: tf1.tpu.experimental.AdamParameters(ADAM_LR, epsilon=ADAM_EPSILON_TF1),
        lambda epsilon=ADAM_EPSILON_TF1: tf.keras.optimizers.legacy.Adam(ADAM_LR, epsilon=epsilon),
        lambda: oracle.Adam(ADAM_LR, epsilon=ADAM_EPSILON_TF1)),
    "ftrl": OptimizerRecipe(
        "ftrl", lambda: tf1.train.FtrlOptimizer(
            FTRL["learning_rate"], initial_accumulator_value=FTRL["initial_accumulator_value"],
            l1_regularization_strength=FTRL["l1"], l2_regularization_strength=FTRL["l2"],
            beta=FTRL["beta"]),
        lambda: tf1.tpu.experimental.FtrlParameters(
            FTRL["learning_rate"], initial_accumulator_value=FTRL["initial_accumulator_value"],
            l1_regularization_strength=FTRL["l1"], l2_regularization_strength=FTRL["l2"],
            beta=FTRL["beta"]),
        _keras_ftrl,
        lambda: oracle.Ftrl(FTRL["learning_rate"], l1=FTRL["l1"], l2=FTRL["l2"],
                            beta=FTRL["beta"],
                            initial_accumulator_value=FTRL["initial_accumulator_value"]),
        tf1_slot_names={"accum": "accumulator"}),
}
