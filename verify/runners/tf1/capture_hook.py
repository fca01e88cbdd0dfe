"""The `SessionRunHook` that captures every step of a CPU Estimator run (`EstimatorRunner`
with `capture="hook"`): it fetches the batch, the loss and the gradients in the same
`session.run` as the train op, then reads the variables and optimizer slots after the update
(tables by the rows their gradient touched, when the table capture says so). The variables are
every one the model keeps, trainable or not (`verify.runners.capture.host_call.model_variables`:
a BatchNormalization's moving mean and variance too; not the global step, not the optimizer's
own variables).

`hook_class()` builds the hook class on first use, so importing this module needs no TF."""
from __future__ import annotations

import functools

import numpy as np

from verify.core.names import native_name
from verify.core.quantities import LOSS, SLOT, WEIGHT
from verify.core.runner import RunRequest
from verify.core.trace import SparseRows, TouchedRows
from verify.runners.capture.host_call import model_variables, slot_variables
from verify.runners.capture.step_record import StepRecorder
from verify.runners.capture.tables import TableCapture, distinct_ids


class StepCapture:
    """What the capture hook does at each point of the Estimator's session (the methods of a
    `tf.compat.v1.train.SessionRunHook`; `hook_class()` makes them one)."""

    def __init__(self, trace, features, labels, loss, calls, request: RunRequest,
                 tables: TableCapture = TableCapture(), layers: dict | None = None):
        self.trace, self.request, self.step = trace, request, 0
        self.recorder = StepRecorder(trace)
        self.fetches = {"features": features, "labels": labels, LOSS: loss,
                        "grads": {native_name(v): g for _, gv in calls for g, v in gv
                                  if g is not None}}
        # every variable the model keeps, trainable or not (moving statistics), read after
        # each step; the global step and the optimizers' own variables stay out
        self.variables = model_variables(calls)
        self.slots = slot_variables(calls)
        self.tables = tables
        # tables: the variables whose gradient is sparse, read by touched rows
        self.table_names = {n for n, g in self.fetches["grads"].items()
                            if hasattr(g, "indices")} if tables.touched else set()
        self.rows_of: dict[str, tuple] = {}
        # a layer replay: the layers' tensors (verify.runners.capture.layer_taps.GraphSink),
        # fetched at the step `request.layers` asks for
        self.layers = layers

    def _build_row_reads(self):
        """Per table: an ids placeholder and the gathers of its rows and its slots' rows."""
        import tensorflow as tf

        tf1 = tf.compat.v1
        for name in sorted(self.table_names):
            ids = tf1.placeholder(tf.int64, [None], name="parity_touched_ids")
            reads = {(WEIGHT, name): tf.gather(self.variables[name], ids)}
            reads.update({(SLOT, key): tf.gather(slot, ids)
                          for key, slot in self.slots.items()
                          if key.partition("::")[0] == name})
            self.rows_of[name] = (ids, reads)

    def _record_after(self, session, step, grads):
        """Variables and slots after the step: tables by their touched rows, except where
        they are read whole."""
        steps, recorder = self.request.steps, self.recorder
        whole = {q: self.tables.whole(step, steps, q) for q in (WEIGHT, SLOT)}
        fetch = {"w": {n: v for n, v in self.variables.items()
                       if n not in self.table_names or whole[WEIGHT]},
                 "s": {n: v for n, v in self.slots.items()
                       if n.partition("::")[0] not in self.table_names or whole[SLOT]}}
        feed, rows = {}, {}
        for name, (ids_in, reads) in self.rows_of.items():
            ids = distinct_ids(grads[name].indices)
            feed[ids_in] = ids
            for (quantity, key), read in reads.items():
                if not whole[quantity]:
                    rows[(quantity, key)] = (ids, read)
        got = session.run({"whole": fetch, "rows": {k: r for k, (_, r) in rows.items()}},
                          feed_dict=feed)
        recorder.weights(step, got["whole"]["w"])
        recorder.slots(step, got["whole"]["s"])
        for (quantity, key), value in got["rows"].items():
            shape = tuple(self.variables[key.partition("::")[0]].shape)
            recorder.value(step, quantity, key,
                           TouchedRows(rows[(quantity, key)][0], value, shape))

    def begin(self):
        impl = self.request.implementation
        impl.names.check_against({n: tuple(v.shape) for n, v in self.variables.items()},
                                 self.request.case.canonical_shapes(), impl.name)
        if not self.fetches["grads"]:
            raise RuntimeError(
                f"{impl.name}: the model_fn built no optimizer.apply_gradients/minimize call "
                f"of a tf.compat.v1.train.Optimizer, so there are no gradients to capture.")
        self._build_row_reads()

    def after_create_session(self, session, coord):
        self.recorder.weights(0, session.run(self.variables))

    def before_run(self, run_context):
        import tensorflow as tf

        self.step += 1
        fetches = self.fetches
        if self.layers and self.step == self.request.layers.step:
            fetches = {**fetches, "layers": self.layers}
        return tf.compat.v1.train.SessionRunArgs(fetches)

    def after_run(self, run_context, run_values):
        step, got, recorder = self.step, run_values.results, self.recorder
        features = got["features"]   # a bare tensor is named 'features', as elsewhere
        batch = dict(features) if isinstance(features, dict) else {"features": features}
        batch["label"] = got["labels"]
        recorder.batch(step, batch)
        recorder.loss(step, got[LOSS])
        recorder.grads(step, ((name, _to_value(grad, self.variables[name]))
                               for name, grad in got["grads"].items()))
        self._record_after(run_context.session, step, got["grads"])
        if "layers" in got:
            self.request.layers.take(step, {0: got["layers"]})


@functools.cache
def hook_class():
    """The capture hook class (`StepCapture` as a `SessionRunHook`); built on first use so
    importing this module needs no TF."""
    import tensorflow as tf

    class StepCaptureHook(StepCapture, tf.compat.v1.train.SessionRunHook):
        pass

    return StepCaptureHook


def _to_value(grad, variable):
    if hasattr(grad, "indices"):  # IndexedSlicesValue
        shape = tuple(grad.dense_shape) if grad.dense_shape is not None else tuple(variable.shape)
        return SparseRows(np.asarray(grad.indices), np.asarray(grad.values), shape)
    return np.asarray(grad)
