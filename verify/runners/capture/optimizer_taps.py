"""The taps on the optimizer (see `verify.runners.capture.taps`): the gradients it applies,
after its own cross-replica aggregation and its clipping (the callback of
`tf_internals.optimizer_gradient_tap`), and the trainable variables and slots after the update
(a pass-through wrapper of `apply_gradients`). With a `touched_rows` table capture, tables are
sent by the rows their gradient names, and whole at the steps the capture names."""
from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Callable

from verify.core.names import native_name
from verify.core.quantities import SLOT, WEIGHT

if TYPE_CHECKING:
    from verify.runners.capture.taps import StepTaps


def applied_gradients_tap(taps: "StepTaps", transform=None) -> Callable:
    """The gradient tap's callback: sends the gradients the optimizer applies (sparse ones as
    ids and rows) to the host and returns them to be applied, changed by `transform` (a
    mutation) when one is given."""
    import tensorflow as tf

    def on_applied_gradients(grads_and_vars, replica=None):
        if transform is not None:
            if replica is not None:
                raise NotImplementedError(
                    "this optimizer applies the summed gradients in cross-replica context "
                    "(Keras 3 under a strategy): the suite cannot change them there, so it "
                    "runs no mutant of it")
            grads_and_vars = transform(grads_and_vars)
        grads = {}
        for g, v in grads_and_vars:
            if g is None:
                continue
            name = native_name(v)
            if taps.grads_of is not None and name not in taps.grads_of:
                continue
            if isinstance(g, tf.IndexedSlices):
                grads[f"{name}::ids"], grads[f"{name}::rows"] = g.indices, g.values
                taps._applied_ids.setdefault(threading.get_ident(), {})[name] = g.indices
            else:
                grads[name] = g
        taps._emit(taps._on_grads_arrays, grads, after_pending=True, replica=replica)
        return grads_and_vars

    return on_applied_gradients


def apply_gradients_tap(taps: "StepTaps", optimizer, original_apply: Callable) -> Callable:
    """`optimizer.apply_gradients` that runs the original, then (on the replica that reports
    them) sends the variables and slots after the update to the host."""
    import tensorflow as tf

    def apply_gradients(grads_and_vars, *a, **k):
        taps._applied_ids[threading.get_ident()] = {}
        result = original_apply(grads_and_vars, *a, **k)
        context = tf.distribute.get_replica_context()
        replica = tf.get_static_value(context.replica_id_in_sync_group) if context else 0
        if replica in (taps.first_replica, None):
            deps = [result] if isinstance(result, (tf.Operation, tf.Tensor)) or \
                hasattr(result, "op") else []
            with tf.control_dependencies(deps):
                if taps.touched_rows is not None:
                    deps = send_whole_tables(taps, optimizer)
            with tf.control_dependencies(deps):
                if taps.touched_rows is not None:
                    values = touched_values(taps, optimizer)
                else:
                    # variables as they are: `_emit` reads them, with no op besides the read
                    values = {f"{WEIGHT}/{n}": v for n, v in taps.variables.items()}
                    values.update({f"{SLOT}/{n}": s for n, s in taps.slots(optimizer).items()})
                taps._emit(taps._on_after_arrays, values)
        return result

    return apply_gradients


def touched_values(taps: "StepTaps", optimizer) -> dict[str, Any]:
    """What is sent after an update with `touched_rows`: tables (variables whose applied
    gradient was sparse) by the distinct ids of that gradient (in the order `tf.unique` finds
    them; the host sorts them, `StepTaps._on_after_arrays`), with the same rows of their
    slots; every other variable and slot whole. (Sorting in the graph took 13 ops per table
    in every trace: `tf.sort` is a top-k of the negated ids.)"""
    import tensorflow as tf

    applied = taps._applied_ids.get(threading.get_ident(), {})
    ids = {n: tf.unique(tf.reshape(tf.cast(i, tf.int64), [-1]))[0]
           for n, i in applied.items() if n in taps.variables}
    values = {}
    for name, variable in taps.variables.items():
        if name in ids:
            values[f"rows/{name}::ids"] = ids[name]
            values[f"rows/{name}"] = tf.gather(variable, ids[name])
        else:
            values[f"{WEIGHT}/{name}"] = variable
    for name, slot in taps.slots(optimizer).items():
        owner = name.partition("::")[0]
        if owner in ids:
            values[f"slotrows/{name}"] = tf.gather(slot, ids[owner])
        else:
            values[f"{SLOT}/{name}"] = slot
    return values


def send_whole_tables(taps: "StepTaps", optimizer) -> list:
    """After an update with `touched_rows`: the tables (variables whose applied gradient
    was sparse) and their slots whole, at the steps the table capture names; ops to wait
    for before the touched rows are sent."""
    import tensorflow as tf

    applied = taps._applied_ids.get(threading.get_ident(), {})
    tables = {n: v for n, v in taps.variables.items() if n in applied}
    slots = {n: s for n, s in taps.slots(optimizer).items()
             if n.partition("::")[0] in tables}
    if not tables:
        return []
    step = tf.cast(optimizer.iterations, tf.int64) - taps._first_iteration
    done = []
    for quantity, values in ((WEIGHT, tables), (SLOT, slots)):
        if not values:
            continue
        whole = taps.touched_rows.whole_at(step, taps.steps, quantity)

        def send(quantity=quantity, values=values):
            taps._emit(taps._on_whole_arrays,
                       {"step": step, **{f"{quantity}/{n}": v for n, v in values.items()}},
                       sequenced=False)
            return tf.constant(0)

        done.append(tf.cond(whole, send, lambda: tf.constant(0)))
    return done
