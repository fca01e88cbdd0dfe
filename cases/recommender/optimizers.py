"""The four optimizers the recommender case trains with, as each side spells them.

Every entry gives the TF1 model_fn optimizer, the TF1 `EmbeddingConfigSpec` parameters (ignored
on CPU, used by the TPU embedding engine), the Keras legacy optimizer given to `compile`, the
optimizer given to the tfrs layer, and the oracle's optimizer: the same hyperparameters in each.
Hyperparameters follow TF1's defaults where Keras' differ (Adam epsilon 1e-8).
TensorFlow is imported only when an optimizer is built, so the case imports in every
environment (the oracle's recipe is plain numpy).
"""
import dataclasses
from typing import Any, Callable

from verify import oracle_math as oracle

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


def _tf1():
    import tensorflow as tf

    return tf.compat.v1


def _legacy():
    """The Keras optimizers tfrs' TPUEmbedding accepts (`tf.keras.optimizers.legacy`)."""
    import tensorflow as tf

    return tf.keras.optimizers.legacy


def _keras_ftrl(beta=FTRL["beta"]):
    return _legacy().Ftrl(
        FTRL["learning_rate"], initial_accumulator_value=FTRL["initial_accumulator_value"],
        l1_regularization_strength=FTRL["l1"], l2_regularization_strength=FTRL["l2"], beta=beta)


RECIPES = {
    "sgd": OptimizerRecipe(
        "sgd", lambda: _tf1().train.GradientDescentOptimizer(SGD_LR),
        lambda: _tf1().tpu.experimental.StochasticGradientDescentParameters(SGD_LR),
        lambda: _legacy().SGD(SGD_LR),
        lambda: oracle.SGD(SGD_LR)),
    "adagrad": OptimizerRecipe(
        "adagrad", lambda: _tf1().train.AdagradOptimizer(ADAGRAD_LR, ADAGRAD_ACCUMULATOR),
        lambda: _tf1().tpu.experimental.AdagradParameters(ADAGRAD_LR, ADAGRAD_ACCUMULATOR),
        lambda: _legacy().Adagrad(ADAGRAD_LR, ADAGRAD_ACCUMULATOR),
        lambda: oracle.Adagrad(ADAGRAD_LR, ADAGRAD_ACCUMULATOR, epsilon=0.0)),
    "adam": OptimizerRecipe(
        "adam", lambda: _tf1().train.AdamOptimizer(ADAM_LR, epsilon=ADAM_EPSILON_TF1),
        lambda: _tf1().tpu.experimental.AdamParameters(ADAM_LR, epsilon=ADAM_EPSILON_TF1),
        lambda epsilon=ADAM_EPSILON_TF1: _legacy().Adam(ADAM_LR, epsilon=epsilon),
        lambda: oracle.Adam(ADAM_LR, epsilon=ADAM_EPSILON_TF1)),
    "ftrl": OptimizerRecipe(
        "ftrl", lambda: _tf1().train.FtrlOptimizer(
            FTRL["learning_rate"], initial_accumulator_value=FTRL["initial_accumulator_value"],
            l1_regularization_strength=FTRL["l1"], l2_regularization_strength=FTRL["l2"],
            beta=FTRL["beta"]),
        lambda: _tf1().tpu.experimental.FtrlParameters(
            FTRL["learning_rate"], initial_accumulator_value=FTRL["initial_accumulator_value"],
            l1_regularization_strength=FTRL["l1"], l2_regularization_strength=FTRL["l2"],
            beta=FTRL["beta"]),
        _keras_ftrl,
        lambda: oracle.Ftrl(FTRL["learning_rate"], l1=FTRL["l1"], l2=FTRL["l2"],
                            beta=FTRL["beta"],
                            initial_accumulator_value=FTRL["initial_accumulator_value"]),
        tf1_slot_names={"accum": "accumulator"}),
}
