"""Applying a `Mutation` (verify.core.case) to a TF2 training run, through its optimizer.

Hyperparameter mutations change the optimizer object before training; gradient mutations
transform the gradients the optimizer is about to apply (after its aggregation and clipping),
through the same optimizer tap that captures them (`verify.runners.capture.taps`). Nothing else of the
user's code is touched. TensorFlow is imported inside the functions.
"""
from __future__ import annotations

from typing import Any, Callable

from verify.core.case import Mutation

GradientsAndVariables = list  # [(gradient, variable), ...]


def prepare_optimizer(optimizer, mutation: Mutation | None) -> None:
    """Apply a hyperparameter mutation to a Keras optimizer before it trains."""
    if mutation is None or mutation.kind not in ("learning_rate", "epsilon"):
        return
    if mutation.kind == "learning_rate":
        current = optimizer.learning_rate
        value = float(current.numpy() if hasattr(current, "numpy") else current)
        optimizer.learning_rate = value * mutation.value
        return
    epsilon = getattr(optimizer, "epsilon", None)
    if epsilon is None:
        raise ValueError(f"{type(optimizer).__name__} has no epsilon to mutate")
    optimizer.epsilon = float(epsilon) * mutation.value


def gradient_transform(optimizer, mutation: Mutation | None
                       ) -> Callable[[GradientsAndVariables], GradientsAndVariables] | None:
    """An in-graph transform of the applied gradients for a gradient mutation, else None."""
    if mutation is None or mutation.kind not in ("clip_global_norm", "drop_step",
                                                 "nudge_gradients"):
        return None
    import tensorflow as tf

    def transform(grads_and_vars: GradientsAndVariables) -> GradientsAndVariables:
        pairs = [(g, v) for g, v in grads_and_vars]
        step = tf.cast(optimizer.iterations, tf.int32) + 1   # the step being applied
        if mutation.kind == "clip_global_norm":
            present = [g for g, _ in pairs if g is not None]
            clipped, _ = tf.clip_by_global_norm(present, mutation.value)
            it = iter(clipped)
            return [(next(it) if g is not None else None, v) for g, v in pairs]
        out = []
        for index, (g, v) in enumerate(pairs):
            if g is None:
                out.append((g, v))
                continue
            values = g.values if isinstance(g, tf.IndexedSlices) else g
            if mutation.kind == "drop_step":
                values = values * tf.cast(tf.not_equal(step, mutation.step), values.dtype)
            else:
                values = _nudged(values, tf.stack([step, tf.constant(index, tf.int32)]))
            out.append((tf.IndexedSlices(values, g.indices, g.dense_shape)
                        if isinstance(g, tf.IndexedSlices) else values, v))
        return out

    return transform


def tf1_gradient_transform(mutation: Mutation | None):
    """The TF1 (graph-mode `model_fn`) counterpart: only `nudge_gradients` (calibration of a
    TF1 reference); the step is read from the global step."""
    if mutation is None:
        return None
    if mutation.kind != "nudge_gradients":
        raise NotImplementedError(f"TF1 runners apply only nudge_gradients mutations (for "
                                  f"calibration), not {mutation.kind}")
    import tensorflow as tf

    def transform(grads_and_vars: GradientsAndVariables) -> GradientsAndVariables:
        step = tf.cast(tf.compat.v1.train.get_or_create_global_step(), tf.int32) + 1
        out = []
        for index, (g, v) in enumerate(grads_and_vars):
            if g is None:
                out.append((g, v))
                continue
            seed = tf.stack([step, tf.constant(index, tf.int32)])
            if isinstance(g, tf.IndexedSlices):
                g = tf.IndexedSlices(_nudged(g.values, seed), g.indices, g.dense_shape)
            else:
                g = _nudged(g, seed)
            out.append((g, v))
        return out

    return transform


def _nudged(values, seed) -> Any:
    """Each element moved by about one float32 ulp, up or down (a seeded random sign)."""
    import tensorflow as tf

    sign = tf.where(tf.random.stateless_uniform(tf.shape(values), seed=seed) < 0.5, -1.0, 1.0)
    return values * (1.0 + tf.cast(sign, values.dtype) * 2.0 ** -23)


def nudge_array(values, seed: tuple[int, int]):
    """The numpy counterpart of the gradient nudge, for numpy runners (the oracle).

    >>> import numpy as np
    >>> g = np.array([1.0, -2.0])
    >>> bool(np.all(np.abs(nudge_array(g, (1, 0)) - g) == np.abs(g) * 2.0 ** -23))
    True
    """
    import numpy as np

    rng = np.random.default_rng(seed)
    sign = np.where(rng.random(np.shape(values)) < 0.5, -1.0, 1.0)
    return values * (1.0 + sign * 2.0 ** -23)
