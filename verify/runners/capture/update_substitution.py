"""Apply one side's optimizer, rebuilt from its declared config, to values handed in: the
TensorFlow half of an optimizer-update substitution (`verify.session.update_substitution`
chooses the values, `verify.explain.substitution` judges, `verify.explain.repro` writes the
same steps as a script).

A trace does not hold the optimizer object, only its declared configuration (the kind and the
hyperparameters preflight reads: `optimizer/model/kind`, `learning_rate`, `beta_1`, ...).
`UPDATE_CLASSES` lists, per kind, the classes that can be meant (the TF1 optimizer, Keras'
current and legacy ones); a side's class is the first one whose update, applied to that side's
own step-1 gradient and initial weights, comes closest to that side's own weights after step
1, within the bound a substitution uses (`identify`: the side's own numbers name its class,
never the pair's drift; a class that computes alike on those numbers may be named for another). Variables
are fresh `tf.Variable`s on the CPU; the update runs eagerly, once (step 1: every slot starts
as the optimizer creates it).

>>> constructor_arguments("adam", {"learning_rate": 0.1, "beta_1": 0.9, "epsilon": 1e-07},
...                       "tf.compat.v1.train.AdamOptimizer")
{'learning_rate': 0.1, 'beta1': 0.9, 'epsilon': 1e-07}
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from verify.runners.capture.substitution import one_ulp_up

UPDATE_CLASSES = {
    "sgd": ("tf.keras.optimizers.SGD", "tf.keras.optimizers.legacy.SGD",
            "tf.compat.v1.train.GradientDescentOptimizer"),
    "adam": ("tf.keras.optimizers.Adam", "tf.keras.optimizers.legacy.Adam",
             "tf.compat.v1.train.AdamOptimizer"),
    "adagrad": ("tf.keras.optimizers.Adagrad", "tf.keras.optimizers.legacy.Adagrad",
                "tf.compat.v1.train.AdagradOptimizer"),
}
HYPERPARAMETERS = ("learning_rate", "beta_1", "beta_2", "epsilon", "initial_accumulator_value")
TF1_NAMES = {"beta_1": "beta1", "beta_2": "beta2"}


def constructor_arguments(kind: str, declared: Mapping[str, Any], path: str) -> dict[str, Any]:
    """The keyword arguments `path`'s constructor takes for the declared hyperparameters
    (numbers only: an epsilon declared as absent is not passed)."""
    tf1 = path.startswith("tf.compat.v1.")
    arguments = {}
    for name in HYPERPARAMETERS:
        value = declared.get(name)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if name in ("beta_1", "beta_2", "epsilon") and kind != "adam" and tf1:
            continue
        if name == "initial_accumulator_value" and kind != "adagrad":
            continue
        if name == "epsilon" and kind == "sgd":
            continue
        arguments[TF1_NAMES.get(name, name) if tf1 else name] = float(value)
    return arguments


def apply_update(path: str, arguments: Mapping[str, Any], weights: Mapping[str, np.ndarray],
                 gradients: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The weights after one step of `path(**arguments)` applied to `gradients`."""
    import tensorflow as tf

    found = tf
    for part in path.split(".")[1:]:
        found = getattr(found, part)
    with tf.device("/cpu:0"):
        optimizer = found(**arguments)
        variables = {name: tf.Variable(np.asarray(value), name=name.replace("/", "_"))
                     for name, value in weights.items()}
        optimizer.apply_gradients([(tf.constant(np.asarray(gradients[name])), variables[name])
                                   for name in weights])
        return {name: variable.numpy() for name, variable in variables.items()}


def identify(kind: str, declared: Mapping[str, Any], weights: Mapping[str, np.ndarray],
             gradients: Mapping[str, np.ndarray], after: Mapping[str, np.ndarray],
             multiple: float) -> tuple[str, str]:
    """The class of `kind` whose update of `weights` by `gradients` comes closest to `after`,
    among those within `multiple` x their own one-ulp floor of it (the update of weights and
    gradients moved one ulp), and ''; or '' and why none is."""
    fits, tried = [], []
    for order, path in enumerate(UPDATE_CLASSES.get(kind, ())):
        arguments = constructor_arguments(kind, declared, path)
        try:
            updated = apply_update(path, arguments, weights, gradients)
            nudged = apply_update(path, arguments, nudged_values(weights), nudged_values(gradients))
        except Exception as e:  # noqa: BLE001 - the next class may fit
            tried.append(f"{path} raised {type(e).__name__}")
            continue
        off, floor = _worst(updated, after), _worst(nudged, updated)
        if off == 0.0:   # to the bit: no later class can come closer
            return path, ""
        if off <= multiple * floor:
            fits.append((off, order, path))
        tried.append(f"{path} is off by {off:.3g} ({multiple:g} x its floor: "
                     f"{multiple * floor:.3g})")
    if fits:
        return min(fits)[2], ""
    if not tried:
        return "", f"an optimizer of kind {kind!r} is not rebuilt (only {sorted(UPDATE_CLASSES)})"
    return "", ("no class of its declared kind reproduces its own step-1 update ("
                + "; ".join(tried) + ")")


def _worst(a: Mapping[str, np.ndarray], b: Mapping[str, np.ndarray]) -> float:
    return max((float(np.max(np.abs(np.float64(a[n]) - b[n]), initial=0.0)) for n in b),
               default=0.0)


def nudged_values(values: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Each floating value moved one ulp up."""
    return {name: one_ulp_up(v) if np.issubdtype(np.asarray(v).dtype, np.floating) else v
            for name, v in values.items()}
