"""Read a TF1 (Estimator / TPUEstimator) checkpoint into canonical names.

Which checkpoint key holds what is read from the pipeline's own graph: the implementation's
`model_fn` is built once in TRAIN mode (nothing runs), and its optimizer says which slot
variable belongs to which variable (`get_slot`). A CPU-trained checkpoint holds
`<var>/Adagrad` (Adagrad), `<var>/Adam` and `<var>/Adam_1` (m and v, plus the non-slot
`beta1_power` and `beta2_power`), `<var>/Ftrl` and `<var>/Ftrl_1` (accum and linear), and
`global_step`. On a TPU the embedding engine keeps the tables' slots under the names TPUEstimator
gives them (tensorflow_estimator `_tpu_estimator_embedding._get_slot_variable_names`): the same
for Adagrad and FTRL, `<table>/Adam/m` and `<table>/Adam/v` for Adam; a slot missing under the
graph's name is looked up under those. Tables partitioned over TPU hosts read back whole.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from verify.checkpoint.mapping import STEP, CanonicalState, ConversionError, Entry, Side
from verify.core.case import Case, Implementation
from verify.core.names import native_name

# TF1 optimizer class -> its slot name -> where TPUEstimator's embedding engine keeps that slot
# of a table (`{}` is the table's variable name); slots missing here are named as on CPU.
TPU_TABLE_SLOTS = {"AdamOptimizer": {"m": "{}/Adam/m", "v": "{}/Adam/v"}}

# TF1 keeps Adam's beta**(step+1) as a float32 product: each step multiplies by float32(beta)
# (0.9 is stored 2.2e-8 low) and rounds (<= 6e-8), so it drifts from the float64 power by up to
# ~8e-8 relative per step (simulated: 2.3e-7 after 20 steps, 1.3e-4 after 10,000 for 0.999).
# Within POWER_RTOL + (step+1) * POWER_DRIFT it is the same step count; at 20 steps one step
# off (a relative 1 - beta, 1e-3 for 0.999) is about 10x outside. Powers below POWER_FLOOR (float32
# underflows there) are compared as "tiny" only.
POWER_RTOL, POWER_DRIFT, POWER_FLOOR = 1e-4, 1e-7, 1e-30


@dataclasses.dataclass(frozen=True)
class TF1Graph:
    """What a TF1 model_fn builds for training: every global variable and its shape, which of
    them are trained, the slot variables of each (variable, slot), the optimizer, the global
    step and the non-slot variables the step count determines (name -> base)."""

    variables: dict[str, tuple[int, ...]]
    trainable: tuple[str, ...]
    slots: dict[tuple[str, str], str]
    optimizer: str
    global_step: str
    step_determined: dict[str, float]


def tf1_graph(case: Case, runner) -> TF1Graph:
    """Build `runner.model_fn` in TRAIN mode on the case's training input (CPU parameters)."""
    import tensorflow as tf

    from verify.runners.capture.tf_internals import (recording_tf1_apply_gradients,
                                             tf1_step_determined_state)

    tf1 = tf.compat.v1
    with tf.Graph().as_default():
        params = {"batch_size": case.batch_size, "use_tpu": False}
        features, labels = tf1.data.make_one_shot_iterator(
            runner.input_fn(case.examples, params)).get_next()
        global_step = tf1.train.get_or_create_global_step()
        with recording_tf1_apply_gradients() as calls:
            runner.model_fn(features, labels, tf.estimator.ModeKeys.TRAIN, params)
        variables = {native_name(v): tuple(v.shape.as_list()) for v in tf1.global_variables()}
        trainable = tuple(native_name(v) for v in tf1.trainable_variables())
        slots, step_determined, optimizers = {}, {}, []
        for optimizer, grads_and_vars in calls:
            optimizers.append(type(optimizer).__name__)
            step_determined.update(tf1_step_determined_state(optimizer))
            for _, var in grads_and_vars:
                for slot in optimizer.get_slot_names():
                    slot_var = optimizer.get_slot(var, slot)
                    if slot_var is not None:
                        slots[(native_name(var), slot)] = native_name(slot_var)
    return TF1Graph(variables, trainable, slots, ", ".join(dict.fromkeys(optimizers)) or "none",
                    native_name(global_step), step_determined)


def checkpoint_prefix(path: str | Path) -> str:
    """The checkpoint a path names: a directory's latest (its 'checkpoint' file), or a prefix
    (`.../model.ckpt-20`, whose `.index` file exists)."""
    import tensorflow as tf

    path = Path(path)
    if path.is_dir():
        prefix = tf.train.latest_checkpoint(str(path))
        if prefix is None:
            raise FileNotFoundError(f"{path} holds no checkpoint (no 'checkpoint' file naming "
                                    f"one); pass the directory of a trained model or a prefix "
                                    f"such as {path}/model.ckpt-20")
        return prefix
    if not Path(f"{path}.index").is_file():
        raise FileNotFoundError(f"{path} is neither a directory holding a checkpoint nor a "
                                f"checkpoint prefix ({path}.index does not exist)")
    return str(path)


def _unreadable(prefix: str, what: str, error: Exception) -> ConversionError:
    first = (str(error).strip().splitlines() or [""])[0][:300]
    return ConversionError(f"{prefix}: cannot read {what} ({type(error).__name__}: {first}); the "
                           f"checkpoint is damaged or cut short: copy it again whole (its .index "
                           f"and every .data shard)")


class _CheckpointReads:
    """One checkpoint's keys (name -> shape) and what was read of it: the values in canonical
    names, the keys used, and what did not fit on the way (keys missing, shapes wrong)."""

    def __init__(self, prefix: str):
        import tensorflow as tf

        self.prefix = prefix
        try:
            self.reader = tf.train.load_checkpoint(prefix)
            self.stored = {name: tuple(shape)
                           for name, shape in self.reader.get_variable_to_shape_map().items()}
        except Exception as e:  # noqa: BLE001 - TensorFlow's reader raises several kinds
            raise _unreadable(prefix, "its index", e) from None
        self.values: dict[str, np.ndarray] = {}
        self.missing: list[str] = []
        self.wrong_shape: list[str] = []
        self.used: set[str] = set()

    def read(self, key: str) -> np.ndarray:
        try:
            return self.reader.get_tensor(key)
        except Exception as e:  # noqa: BLE001 - a cut-short shard raises IndexError, ...
            raise _unreadable(self.prefix, key, e) from None

    def take(self, canonical, keys, shape, transform):
        """Read the first of `keys` the checkpoint has into `canonical` (native `shape`)."""
        key = next((k for k in keys if k in self.stored), None)
        if key is None:
            self.missing.append(f"{canonical} ({' or '.join(keys)})")
            return
        self.used.add(key)
        if self.stored[key] != tuple(shape):
            self.wrong_shape.append(f"{key} {self.stored[key]} where the model_fn builds "
                                    f"{tuple(shape)}")
            return
        self.values[canonical] = np.asarray(transform.to_canonical(self.read(key)))


def read_tf1_checkpoint(case: Case, implementation: Implementation,
                        path: str | Path) -> tuple[Side, CanonicalState]:
    """The TF1 checkpoint at `path` (a model_dir or a prefix) in canonical names, and what the
    implementation's model holds (`Side`), with everything that does not map as its problems:
    checkpoint keys nothing maps to, keys the model needs that the checkpoint lacks, values of
    another shape, step-determined state that disagrees with the global step."""
    prefix = checkpoint_prefix(path)
    reads = _CheckpointReads(prefix)
    graph = tf1_graph(case, implementation.runner)
    entries, unnamed, slot_kinds = _read_variables(graph, implementation, reads)
    entries[STEP] = Entry(STEP, graph.global_step, ())
    step = 0
    if graph.global_step in reads.stored:
        reads.used.add(graph.global_step)
        step = int(reads.read(graph.global_step))
    else:
        reads.missing.append(f"{STEP} ({graph.global_step})")
    problems = _step_determined_problems(graph, reads, step)
    unmapped = sorted(set(reads.stored) - reads.used)
    if unnamed:
        problems.append(f"variables of its model_fn that no canonical name maps to "
                        f"({len(unnamed)}): {', '.join(sorted(unnamed))}; add them to the name "
                        f"map of {implementation.name}")
    if reads.missing:
        problems.append(f"missing from the checkpoint ({len(reads.missing)}): "
                        f"{', '.join(reads.missing)}")
    if unmapped:
        problems.append(f"in the checkpoint, mapped to nothing ({len(unmapped)}): "
                        + ", ".join(f"{k} {reads.stored[k]}" for k in unmapped))
    if reads.wrong_shape:
        problems.append(f"shapes that do not fit its model ({len(reads.wrong_shape)}): "
                        + "; ".join(reads.wrong_shape))
    side = Side(implementation.name, entries, tuple(sorted(slot_kinds)), problems,
                detail=f"TF1 checkpoint {prefix}, {graph.optimizer}")
    return side, CanonicalState(reads.values, step, source=prefix)


def _read_variables(graph: TF1Graph, implementation: Implementation,
                    reads: _CheckpointReads) -> tuple[dict[str, Entry], list[str], set[str]]:
    """Every variable the model_fn trains and its slots, in canonical names (`Entry`), read
    from the checkpoint (a table's slot also under the name a TPU gives it); with the
    variables no canonical name maps to and the slot kinds found."""
    names = implementation.names
    entries: dict[str, Entry] = {}
    unnamed: list[str] = []
    tpu_slots = TPU_TABLE_SLOTS.get(graph.optimizer, {})
    slot_kinds = set()
    for var in graph.trainable:
        found = names.canonical_of(var)
        if found is None:
            unnamed.append(var)
            continue
        canonical, transform = found
        try:
            shape = np.shape(transform.to_canonical(np.zeros(graph.variables[var])))
        except ValueError as e:
            reads.wrong_shape.append(f"{var}: {e}")
            continue
        entries[canonical] = Entry(canonical, var, tuple(shape))
        reads.take(canonical, [var], graph.variables[var], transform)
        for (owner, slot), slot_var in sorted(graph.slots.items()):
            if owner != var:
                continue
            kind = implementation.slot_names.get(slot, slot)
            slot_kinds.add(kind)
            name = f"{canonical}/{kind}"
            entries[name] = Entry(name, slot_var, tuple(shape))
            keys = [slot_var] + ([tpu_slots[slot].format(var)] if slot in tpu_slots else [])
            reads.take(name, keys, graph.variables[var], transform)
    return entries, unnamed, slot_kinds


def _step_determined_problems(graph: TF1Graph, reads: _CheckpointReads, step: int) -> list[str]:
    """The non-slot variables the step count determines (TF1 Adam's beta powers) that
    disagree with the global step `step`; those the checkpoint lacks are added to the missing
    keys."""
    problems = []
    for name, base in sorted(graph.step_determined.items()):
        if name not in reads.stored:
            reads.missing.append(f"{name} (= {base:g}**(step+1) in {graph.optimizer})")
            continue
        reads.used.add(name)
        value, expected = float(reads.read(name)), base ** (step + 1)
        allowed = (POWER_RTOL + (step + 1) * POWER_DRIFT) * expected
        if (abs(value - expected) > allowed if expected >= POWER_FLOOR
                else abs(value) >= POWER_FLOOR):
            problems.append(f"{name} is {value:.7g}, but {graph.global_step} {step} means "
                            f"{base:g}**{step + 1} = {expected:.7g}: the step count and "
                            f"{graph.optimizer}'s bias correction disagree, so the target "
                            f"cannot resume with the same update")
    return problems
