"""Write a canonical training state as the checkpoint a TF2 Keras model restores.

The target model is built by the implementation's own `build_model` (default strategy), its
optimizer's step counter, hyperparameter variables and slots are created as its first step
would create them, the canonical values are assigned through the implementation's name map
(transforms applied backwards), and `tf.train.Checkpoint(model=model, optimizer=optimizer)`
saves it. The object graph is then exactly the model's: restoring it with
`tf.train.Checkpoint(model=model, optimizer=model.optimizer).restore(path)` and training one
step leaves nothing unmatched (`assert_consumed()`). Hyperparameter variables (learning rate,
decay) are written with the values the TF2 code builds (a TF1 checkpoint holds none).

With tfrs 0.7.3 and a Keras optimizer given to its `TPUEmbedding` layer, the tables' slots
are that Keras optimizer's slots on CPU and under `TPUStrategy` alike (tfrs
`_get_slot_variable_creation_fn` creates them with `optimizer.add_slot`), so this layout is
the one the tfrs docs call checkpoint-compatible across strategies. A layer given a
`tf.tpu.experimental.embedding` optimizer keeps the tables' slots in the layer instead: that
layout is not written.
"""
from __future__ import annotations

import dataclasses
import fnmatch
from pathlib import Path
from typing import Any

import numpy as np

from verify.checkpoint.mapping import STEP, CanonicalState, ConversionError, Entry, Side
from verify.core.case import Case, Implementation
from verify.core.names import NameMapError, native_name

CHECKPOINT_PREFIX = "ckpt"   # tf.train.Checkpoint.save appends "-1"


@dataclasses.dataclass
class KerasTarget:
    """A built target model and where each canonical name goes in it."""

    side: Side
    model: Any
    variables: dict[str, Any]          # canonical -> model variable
    slots: dict[str, Any]              # canonical slot name -> slot variable
    transforms: dict[str, Any]         # canonical (variable or slot) -> transform


def keras_target(case: Case, implementation: Implementation, runner) -> KerasTarget:
    """Build the implementation's model and list what its checkpoint holds (`Side`); names the
    model has that its name map does not cover are the side's problems."""
    import tensorflow as tf

    from verify.runners.capture.tf_internals import create_keras_optimizer_state, keras_optimizer_slots

    tf.keras.backend.clear_session()
    tf.keras.utils.set_random_seed(case.seed)
    model = runner.build_model(runner.steps_per_execution)
    optimizer = model.optimizer
    by_native = {native_name(v): v for v in model.trainable_variables}
    problems = []
    try:
        implementation.names.check_against({n: tuple(v.shape) for n, v in by_native.items()},
                                           case.canonical_shapes(), implementation.name)
    except NameMapError as e:
        problems.append(str(e))
    create_keras_optimizer_state(optimizer, list(by_native.values()))
    entries, variables, slots, transforms = {}, {}, {}, {}
    for native, variable in by_native.items():
        found = implementation.names.canonical_of(native)
        if found is None:
            continue   # listed by check_against
        canonical, transform = found
        shape = tuple(np.shape(transform.to_canonical(np.zeros(variable.shape))))
        entries[canonical] = Entry(canonical, native, shape)
        variables[canonical], transforms[canonical] = variable, transform
    kinds = set()
    for key, slot in keras_optimizer_slots(optimizer, by_native).items():
        native, _, kind = key.partition("::")
        found = implementation.names.canonical_of(native)
        if found is None:
            continue
        kind = implementation.slot_names.get(kind, kind)
        kinds.add(kind)
        name = f"{found[0]}/{kind}"
        entries[name] = Entry(name, f"{type(optimizer).__name__} slot {kind!r} of {native}",
                              entries[found[0]].shape)
        slots[name], transforms[name] = slot, found[1]
    entries[STEP] = Entry(STEP, f"{type(optimizer).__name__}.iterations", ())
    side = Side(implementation.name, entries, tuple(sorted(kinds)), problems,
                detail=f"Keras model, {type(optimizer).__name__}")
    return KerasTarget(side, model, variables, slots, transforms)


def write_keras_checkpoint(target: KerasTarget, state: CanonicalState, directory: Path, *,
                           leave_at_initial: tuple[str, ...] = ()) -> dict[str, list[str]]:
    """Assign `state` to the target model and save its checkpoint into `directory` (which
    must not exist yet). Slots whose canonical name matches a `leave_at_initial` pattern keep
    the value the optimizer creates them with, and `STEP` leaves the step count at 0 (
    deliberate mistakes, for negative controls). Returns what was carried and what was left."""
    import tensorflow as tf

    leavable = [*target.slots, STEP]
    left = sorted(n for n in leavable if any(fnmatch.fnmatchcase(n, p) for p in leave_at_initial))
    unmatched = [p for p in leave_at_initial
                 if not any(fnmatch.fnmatchcase(n, p) for n in leavable)]
    if unmatched:
        raise ConversionError(f"leave_at_initial patterns {unmatched} match no slot of "
                              f"{target.side.name} (its slots: {sorted(target.slots)}) nor "
                              f"{STEP}")
    for canonical, variable in {**target.variables, **target.slots}.items():
        if canonical in left:
            continue
        value = target.transforms[canonical].to_native(state.values[canonical])
        variable.assign(np.asarray(value, variable.dtype.as_numpy_dtype))
    if STEP not in left:
        target.model.optimizer.iterations.assign(state.step)
    checkpoint = tf.train.Checkpoint(model=target.model, optimizer=target.model.optimizer)
    directory.mkdir(parents=True)
    checkpoint.save(str(directory / CHECKPOINT_PREFIX))
    carried = sorted(n for n in [*target.variables, *leavable] if n not in left)
    return {"carried": carried, "left_at_initial": left}
