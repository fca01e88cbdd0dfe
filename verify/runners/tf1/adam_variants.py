"""Adam as TF1 computes it, rounded as Keras rounds it: the known legitimate differences between
the stacks, shipped so a case declares them as noise variants instead of copying them.

- `PowAdamOptimizer`: TF1's `AdamOptimizer` with its bias correction's `beta^t` computed as
  `pow(beta, t)` from the global step, as Keras does, instead of float32 running products
  (`beta^t = beta^(t-1) * beta`): the same formula, up to 1.7e-5 apart in the step size of the
  first steps.
- `with_pow_adam(model_fn)`: the same `model_fn` with every `tf.compat.v1.train.AdamOptimizer`
  it creates made a `PowAdamOptimizer`: a noise variant of a TF1 reference without editing it.
- `keras_betas(beta_1, beta_2)`: the betas as their float32 values, which make Keras 2.11+ and
  Keras 3 compute `1 - beta_2` as TF1 and legacy Keras do (0.00099998713, not 0.001).

A case declares the variant as noise of its TF1 reference (`Case(noise_variants=...)`)::

    from verify.runners.tf1.adam_variants import with_pow_adam
    Implementation("tf1-pow-bias-correction",
                   EstimatorRunner(model_fn=with_pow_adam(model_fn), input_fn=input_fn), NAMES)
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

tf1 = tf.compat.v1
_ADAM = tf1.train.AdamOptimizer   # the class TF1 ships, whatever a model_fn's call sees


class PowAdamOptimizer(_ADAM):
    """TF1's Adam with its bias correction's beta powers computed as `pow(beta, t)` from the
    global step, as Keras computes them, instead of float32 running products `beta^t =
    beta^(t-1) * beta`: the same formula, rounded another way (up to 1.7e-5 relative in the
    first steps' learning rate, where `1 - beta_2^t` is small)."""

    def _get_beta_accumulators(self):
        step = tf.cast(tf1.train.get_global_step(), tf.float32) + 1.0
        return (tf.pow(tf.cast(self._beta1_t, tf.float32), step),
                tf.pow(tf.cast(self._beta2_t, tf.float32), step))

    def _finish(self, update_ops, name_scope):
        return tf.group(*update_ops, name=name_scope)   # no running products to advance


def with_pow_adam(model_fn):
    """`model_fn` with the `tf.compat.v1.train.AdamOptimizer` it creates replaced by a
    `PowAdamOptimizer` of the same arguments, while it builds its graph. A model_fn that
    imported the class by name before (`from ... import AdamOptimizer`) is not reached: pass it
    a `PowAdamOptimizer` yourself.

    >>> callable(with_pow_adam(lambda features, labels, mode, params: None))
    True
    """
    def model_fn_with_pow_adam(features, labels, mode, params):
        tf1.train.AdamOptimizer = PowAdamOptimizer
        try:
            return model_fn(features, labels, mode, params)
        finally:
            tf1.train.AdamOptimizer = _ADAM

    return model_fn_with_pow_adam


def keras_betas(beta_1: float = 0.9, beta_2: float = 0.999) -> dict[str, float]:
    """Keyword arguments giving a Keras Adam the betas' float32 values, so it computes
    `1 - beta_2` as TF1 does.

    >>> keras_betas()["beta_2"] == float(np.float32(0.999))
    True
    """
    return {"beta_1": float(np.float32(beta_1)), "beta_2": float(np.float32(beta_2))}
