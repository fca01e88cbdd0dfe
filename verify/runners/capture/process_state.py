"""Every run starts from the process state a fresh process has.

A user's code may change state that outlives its run in the process: a Keras mixed-precision
policy (`set_global_policy("mixed_bfloat16")`, which `clear_session()` does not undo),
`floatx`, the global seed and random generator, `tf.config` switches (XLA JIT, grappler
options, op determinism, soft placement, TF32, functions run eagerly), eager execution itself.
Every implementation of every case runs in the same few processes, so one run's leftovers
would otherwise train the next run's numbers.

`fresh_state()` reads these switches once per process, at its first run, right after
TensorFlow is imported; `starting_fresh()` puts every switch back to that reading before
each run and says which ones the previous run had left changed. Each switch is read and
written through TensorFlow's or Keras' own getters and setters where they exist (the private
ones are in `verify.runners.capture.tf_internals` and `verify.runners.capture.keras3_internals`).

A distributed run leaves one more thing: TensorFlow's collective executor keeps every
collective group and instance key it has seen, with their shapes and group sizes, and every
`MirroredStrategy` numbers its collectives from the same keys, so the next run of another
model (or another replica count) would join the last run's collectives and fail ("Shape
mismatch in the collective instance 100"). `starting_fresh()` gives each run collective keys
no earlier run took (`tf_internals.fresh_collective_keys`), as a fresh process would
(measured 2026-11-27: 19 us per run, where starting a fresh process for each run costs
7.0 s of CPU, 4.5x a small 2-replica loop run's 1.5 s). The
strategy a run set for the whole process (`tf.distribute.experimental_set_strategy`) is
unset. The logical CPU devices are configured once per process and no run can change them
(`verify.runners.capture.devices`). A `MultiWorkerMirroredStrategy` run starts its own worker
processes.

Not reset (a fresh process does not have a defined value for them either): numpy's and
Python's global random generators, which a fresh process seeds from the operating system.
The fresh state is read at the process's first run: state a case module set when it was
imported before that run is part of it; anything set later is reset before each run.

>>> switch = Switch("demo", read=lambda: 1, write=lambda value: None)
>>> switch.name
'demo'
"""
from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import sys
from typing import Any, Callable, Mapping

from verify.runners.capture import keras3_internals, tf_internals


@dataclasses.dataclass(frozen=True)
class Switch:
    """One piece of process-wide state: how to read it and how to set it back."""

    name: str
    read: Callable[[], Any]
    write: Callable[[Any], None]


def switches() -> list[Switch]:
    """The process-wide switches of the TensorFlow and Keras modules loaded in this process.
    Keras modules are only read when already imported (a Keras 3 environment has no legacy
    Keras, and the suite's own has no Keras 3)."""
    import tensorflow as tf

    found = [
        Switch("tf.random global seed", tf_internals.global_seed, tf_internals.set_global_seed),
        Switch("tf.random global generator", tf_internals.global_generator,
               tf_internals.set_global_generator),
        Switch("tf.config op determinism", tf_internals.op_determinism,
               tf_internals.set_op_determinism),
        Switch("tf.config.optimizer jit", tf.config.optimizer.get_jit,
               tf.config.optimizer.set_jit),
        Switch("tf.config.optimizer experimental options", tf_internals.grappler_options,
               tf_internals.set_grappler_options),
        Switch("tf.config soft device placement", tf.config.get_soft_device_placement,
               tf.config.set_soft_device_placement),
        Switch("tf.config functions run eagerly", tf.config.functions_run_eagerly,
               tf.config.run_functions_eagerly),
        Switch("tf.config TF32 execution",
               tf.config.experimental.tensor_float_32_execution_enabled,
               tf.config.experimental.enable_tensor_float_32_execution),
        Switch("eager execution", tf_internals.eager_by_default,
               tf_internals.set_eager_by_default),
        Switch("tf.distribute global strategy", _global_strategy,
               tf.distribute.experimental_set_strategy),
    ]
    for module_name in ("keras", "tf_keras"):
        keras = sys.modules.get(module_name)
        if keras is None:
            continue
        if str(getattr(keras, "__version__", "3")).startswith("2."):
            found += _legacy_keras_switches(module_name, keras)
        else:
            found += _keras3_switches(keras)
    jax = sys.modules.get("jax")
    if jax is not None:   # Keras 3 on JAX: JAX's own process-wide numerics
        for option in ("jax_enable_x64", "jax_default_matmul_precision"):
            found.append(Switch(f"jax.config {option}",
                                lambda option=option: getattr(jax.config, option),
                                lambda value, option=option: jax.config.update(option, value)))
    return found


def _global_strategy():
    """The strategy `tf.distribute.experimental_set_strategy` left in scope for the whole
    process (None: the default strategy, as in a fresh process)."""
    import tensorflow as tf

    return tf.distribute.get_strategy() if tf.distribute.has_strategy() else None


def _legacy_keras_switches(label: str, keras) -> list[Switch]:
    backend = keras.backend
    return [
        Switch(f"{label} mixed-precision global policy",
               lambda: tf_internals.keras_global_policy(keras),
               keras.mixed_precision.set_global_policy),
        Switch(f"{label} floatx", backend.floatx, backend.set_floatx),
        Switch(f"{label} epsilon", backend.epsilon, backend.set_epsilon),
        Switch(f"{label} image data format", backend.image_data_format,
               backend.set_image_data_format),
    ]


def _keras3_switches(keras) -> list[Switch]:
    config = keras.config
    return [
        Switch("keras dtype policy", keras3_internals.global_dtype_policy,
               keras3_internals.set_global_dtype_policy),
        Switch("keras floatx", config.floatx, config.set_floatx),
        Switch("keras epsilon", config.epsilon, config.set_epsilon),
        Switch("keras image data format", config.image_data_format,
               config.set_image_data_format),
    ]


_FRESH: dict[str, Any] | None = None


# Modules with process-wide numerics a run may import and change: imported (where installed)
# before the fresh state is read, so that a run which imports one first cannot have its own
# leftovers taken for the module's fresh values.
STATEFUL_MODULES = ("keras", "tf_keras", "jax")


def fresh_state() -> Mapping[str, Any]:
    """The switches as this process had them at its first run (read once, after importing
    every installed module of `STATEFUL_MODULES`)."""
    global _FRESH
    if _FRESH is None:
        for name in STATEFUL_MODULES:
            if name not in sys.modules and importlib.util.find_spec(name) is not None:
                try:
                    importlib.import_module(name)
                except Exception:  # noqa: BLE001 - not importable here: no state to keep
                    pass
        _FRESH = {s.name: s.read() for s in switches()}
    return _FRESH


def starting_fresh() -> list[str]:
    """Put every switch back to the process's fresh state; return the names of those that
    were not there (what the previous run left changed). Imports TensorFlow, so that the
    fresh state is read before any run's code has run."""
    fresh = fresh_state()
    changed = []
    for switch in switches():
        if switch.name not in fresh:   # a module not installed at the first run: none to reset
            fresh[switch.name] = switch.read()   # type: ignore[index]
            continue
        if not _same(switch.read(), fresh[switch.name]):
            switch.write(fresh[switch.name])
            changed.append(switch.name)
    tf_internals.fresh_collective_keys()   # keys no earlier run's collectives took
    return changed


def _same(a: Any, b: Any) -> bool:
    """Switch values compare by identity first (a generator, a policy object), then by value."""
    if a is b:
        return True
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - values that cannot compare are different
        return False
