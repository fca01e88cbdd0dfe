"""Run one side's layer, rebuilt from its config, on values handed in: the TensorFlow half of
a layer substitution (`verify.session.substitution` chooses the layer and the values,
`verify.explain.substitution` judges what comes out, `verify.explain.repro` writes the same
steps as a script anyone can run).

The layer object a layer replay observed (`LayerCapture.units`) is never called again: a new
layer of its class is built from its `get_config()`, called once to create its variables, given
the weights handed in (`set_weights`, in the order of its `weights`, which matches the
observed layer's) and called on the input handed in, eagerly, on the CPU. The user's objects
and the trained run are untouched (observe, never replace). A repro script does exactly this,
in a fresh process.

>>> unit_path(type("Custom", (), {"__module__": "my.layers"})())
'my.layers:Custom'
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any, Callable

import numpy as np

from verify.core.layer_capture import LAYER_INPUT
from verify.core.names import native_name

# Where a class the repro script rebuilds is found, tried in this order.
PUBLIC_MODULES = ("tf.keras.layers", "tf.compat.v1.layers")


@dataclasses.dataclass(frozen=True)
class UnitRun:
    """One rebuilt layer run: its output, and exactly what it was given (the input in the
    side's own layout, its weights in its `weights` order), its class path and config, or why
    it could not run (`why_not`, and nothing else set)."""

    output: np.ndarray | None = None
    inputs: np.ndarray | None = None
    weights: tuple[np.ndarray, ...] = ()
    path: str = ""
    config: str = ""     # JSON
    why_not: str = ""
    # with an upstream gradient: the gradient of the output (times it) with respect to the
    # input (`LAYER_INPUT`) and to each trainable variable (by native name)
    gradients: dict = dataclasses.field(default_factory=dict)


def unit_variables(layer: Any) -> tuple[str, ...]:
    """The native names of a layer's variables, in the order of its `weights`."""
    return tuple(native_name(v) for v in layer.weights)


def unit_path(layer: Any) -> str:
    """Where a repro finds the layer's class: `tf.keras.layers.Dense` for a public one, else
    `module:qualname` (a user's own layer, which the repro can import only where that code is)."""
    cls = type(layer)
    if cls.__module__.split(".")[0] in ("keras", "tf_keras", "tensorflow"):
        import tensorflow as tf

        modules = {"tf.keras.layers": tf.keras.layers, "tf.compat.v1.layers": tf.compat.v1.layers}
        for prefix in PUBLIC_MODULES:
            if getattr(modules[prefix], cls.__name__, None) is cls:
                return f"{prefix}.{cls.__name__}"
    return f"{cls.__module__}:{cls.__qualname__}"


def run_unit(layer: Any, inputs: np.ndarray, weight_of: Callable[[str], np.ndarray | None],
             nudged: bool = False, upstream: np.ndarray | None = None) -> UnitRun:
    """`layer`'s class, rebuilt from its config, run on `inputs` with the weights
    `weight_of(native name)` gives (see the module's docstring). `nudged`: inputs, weights
    and `upstream` each moved one ulp up first (the reference's own noise of this layer).
    `upstream`: the gradient arriving at its output; the run's `gradients` are then the
    layer's backward pass given it."""
    try:
        config = json.dumps(layer.get_config())
    except (TypeError, ValueError, NotImplementedError) as e:
        return UnitRun(why_not=f"its config cannot be written as JSON ({type(e).__name__})")
    weights = []
    for native in unit_variables(layer):
        value = weight_of(native)
        if value is None:
            return UnitRun(why_not=f"its variable {native!r} is not one the case's traces "
                                   f"record")
        weights.append(one_ulp_up(value) if nudged else np.asarray(value))
    inputs = one_ulp_up(inputs) if nudged else np.asarray(inputs)
    if upstream is not None and nudged:
        upstream = one_ulp_up(upstream)
    try:
        output, gradients = _rebuilt_output(layer, config, inputs, weights, upstream)
    except Exception as e:  # noqa: BLE001 - said in the pair's row, the verdict stands
        return UnitRun(why_not=f"rebuilding it from its config raised {type(e).__name__}: "
                               f"{str(e).splitlines()[0] if str(e) else ''}")
    if output is None:
        return UnitRun(why_not="its output is not one floating tensor")
    return UnitRun(output, inputs, tuple(weights), unit_path(layer), config,
                   gradients=gradients)


def _rebuilt_output(layer: Any, config: str, inputs: np.ndarray, weights: list[np.ndarray],
                    upstream: np.ndarray | None) -> tuple[np.ndarray | None, dict]:
    import tensorflow as tf

    with tf.device("/cpu:0"):
        clone = type(layer).from_config(json.loads(config))
        x = tf.constant(inputs)
        clone(x)   # creates its variables
        clone.set_weights(weights)
        with tf.GradientTape() as tape:
            tape.watch(x)
            output = clone(x)
        if not isinstance(output, tf.Tensor) or not output.dtype.is_floating:
            return None, {}
        if upstream is None:
            return output.numpy(), {}
        trainable = list(clone.trainable_weights)
        found = tape.gradient(output, [x] + trainable, output_gradients=tf.constant(
            np.asarray(upstream).reshape(output.shape), output.dtype))
    names = [LAYER_INPUT] + [native for native, v in zip(unit_variables(layer), layer.weights)
                         if v.trainable]
    return output.numpy(), {name: (np.zeros_like(np.asarray(value)) if grad is None
                                   else np.asarray(grad))
                            for name, grad, value in zip(names, found, [x] + trainable)}


def one_ulp_up(value) -> np.ndarray:
    """A floating value moved one ulp up (the reference's own noise of a unit); others as
    they are.

    >>> float(one_ulp_up(np.float32(1.0)) - 1.0) == float(np.finfo(np.float32).eps)
    True
    """
    value = np.asarray(value)
    if not np.issubdtype(value.dtype, np.floating):
        return value
    return np.nextafter(value, np.array(np.inf, value.dtype))
