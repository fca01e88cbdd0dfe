"""Capture by observation: taps on what every TF2 training step has, never a replaced step.

A training step, whatever code runs it (Keras' own `train_step`, a `tfrs.Model`'s, a user's
custom loop under `strategy.run`), consumes a batch through `strategy.run`, differentiates a
loss with `tf.GradientTape.gradient`, and hands gradients to its optimizer's
`apply_gradients`. `StepTaps` wraps those three calls, for the duration of one run, with
pass-through wrappers: each calls the original with the same arguments and returns its result
unchanged, and in addition sends copies of the values to the host with `tf.numpy_function`
(an op with a side effect and no output, so it changes no number the step computes):

- the batch each replica receives (the arguments of `strategy.run`);
- the loss each replica differentiates (the target of its `tape.gradient` call before the
  optimizer step; the sum of them when a step accumulates gradients over several calls);
- the gradients the optimizer applies, after its own cross-replica aggregation and its
  clipping (legacy Keras optimizers: the output of `_transform_gradients`; Keras 2.11+
  optimizers: the input of `_internal_apply_gradients`);
- the trainable variables and optimizer slots after the update (after `apply_gradients`).

The host assembles them into trace steps (written by `verify.runners.capture.step_record`,
the one writer of traces): step k is the k-th optimizer step of the run; its loss is the sum of
the replicas' losses (each replica's loss is already scaled by the global batch), its batch
digest covers the replicas' batches in replica order, its gradients are the first replica's
aggregated ones. A batch or loss seen on a replica without an optimizer step
after it (evaluation) is dropped. Because the taps live inside whatever function the step runs
in, capture works inside multi-step functions (`steps_per_execution > 1`, a whole epoch in one
`tf.function`) too.
"""
from __future__ import annotations

import contextlib
import dataclasses
import threading
from typing import TYPE_CHECKING, Any, Callable, Iterator

import numpy as np

from verify.core.layer_capture import StepSeen
from verify.core.quantities import LOSS, SLOT, WEIGHT
from verify.core.trace import SparseRows, TouchedRows, Trace
from verify.runners.capture.batches import unflatten_batch
from verify.runners.capture.optimizer_taps import apply_gradients_tap, applied_gradients_tap
from verify.runners.capture.replica_taps import gradient_tap, strategy_run_tap
from verify.runners.capture.step_record import StepRecorder
from verify.runners.capture.tf_internals import optimizer_gradient_tap

if TYPE_CHECKING:
    from verify.core.layer_capture import LayerRecorder
    from verify.runners.capture.tables import TableCapture


@dataclasses.dataclass
class _Step:
    batches: dict[int, dict[str, Any]] = dataclasses.field(default_factory=dict)
    losses: dict[int, np.ndarray] = dataclasses.field(default_factory=dict)
    grads: dict[int, dict[str, Any]] = dataclasses.field(default_factory=dict)
    layers: dict[int, dict[str, Any]] = dataclasses.field(default_factory=dict)
    after: dict[str, dict[str, np.ndarray]] | None = None


class StepTaps:
    """Host side of the taps: turns what the taps send into trace steps as they complete.

    `variables` are the trainable variables by native name (their order is the order values
    are sent in); `slots(optimizer)` returns `var::slot` -> slot variable; `replicas` is the
    number of replicas in sync. `variables_every=k` records
    gradients, weights and slots only every k-th step (inputs and losses every step).
    `grads_of` names the variables whose gradients are recorded (None: every one the optimizer
    applies). `host_transfer(fn)` builds the ops that send values to the host
    (`verify.runners.capture.tpu.host_transfer` under TPUStrategy; None: in place).
    `touched_rows` (a `verify.runners.capture.tables.TableCapture` in "touched_rows" mode, with
    `steps`, the run's step count) sends, for every variable whose applied gradient is sparse (a
    table), only the rows that gradient names and the same rows of its slots (`TouchedRows`),
    and the tables whole at the steps the capture names: decided in the step's own function
    (the optimizer's step counter), so it holds inside multi-step functions and on every
    replica count.
    """

    def __init__(self, trace: Trace, variables: dict[str, Any], replicas: int,
                 slots: Callable[[Any], dict[str, Any]], shapes: dict[str, tuple] | None = None,
                 variables_every: int | None = None, grads_of: set[str] | None = None,
                 host_transfer: Callable | None = None,
                 touched_rows: "TableCapture | None" = None,
                 steps: int | None = None, first_replica: int = 0,
                 on_replicas: Callable[[int, dict, dict], None] | None = None,
                 layers: "LayerRecorder | None" = None):
        self.trace, self.variables, self.replicas = trace, variables, replicas
        self.recorder = StepRecorder(trace)
        self.slots, self.variables_every = slots, variables_every
        self.grads_of, self.host_transfer = grads_of, host_transfer
        # One process of a multi-worker run sees only its own replicas: `replicas` of them,
        # numbered (in sync) from `first_replica`, which also sends the values after the update.
        # `on_replicas(step, losses, batches)` gets each completed step's losses and batches by
        # replica, for a host that assembles the whole step from every worker's share.
        self.first_replica, self.on_replicas = first_replica, on_replicas
        self.shapes = shapes or {n: tuple(v.shape) for n, v in variables.items()}
        self._lock = threading.Lock()
        self._pending_batch: dict[int, dict[str, Any]] = {}
        self._pending_loss: dict[int, np.ndarray] = {}
        self._grad_count: dict[int, int] = {}
        self._after_count = 0
        self._steps: dict[int, _Step] = {}
        self._emitted: dict[tuple, list] = {}   # (graph, thread) -> ops sent, not yet followed
        self.recorded = 0
        if touched_rows is not None and (not touched_rows.touched or steps is None):
            raise ValueError("touched_rows is a TableCapture in 'touched_rows' mode, with the "
                             "run's steps")
        self.touched_rows, self.steps = touched_rows, steps
        # (thread -> table -> ids of the gradient being applied: replicas trace in threads)
        self._applied_ids: dict[int, dict[str, Any]] = {}
        self._whole: dict[int, dict[str, dict[str, np.ndarray]]] = {}   # step -> tables
        self._whole_seen: set[tuple[int, str]] = set()   # (step, quantity) sent whole
        self._by_rows: set[str] = set()   # the quantities sent by touched rows
        self._first_iteration = 0
        # A layer replay (`verify.session.layer_replay`): every layer's values, handed to
        # `layers` at the step it asks for; sent before the replica's gradients, like its batch
        # and loss.
        self.layers = layers
        self._pending_layers: dict[int, dict[str, Any]] = {}

    # ---- host callbacks (called from numpy_function ops) ----
    def _on_batch(self, replica: int, batch: dict[str, Any]) -> None:
        with self._lock:
            self._pending_batch[replica] = batch

    def _on_loss(self, replica: int, loss: np.ndarray) -> None:
        with self._lock:   # several gradient calls before one optimizer step: their sum
            before = self._pending_loss.get(replica)
            loss = np.float32(loss)
            self._pending_loss[replica] = loss if before is None else np.float32(before + loss)

    def _on_grads(self, replica: int, grads: dict[str, Any]) -> None:
        with self._lock:
            step = self._grad_count[replica] = self._grad_count.get(replica, 0) + 1
            record = self._steps.setdefault(step, _Step())
            record.grads[replica] = grads
            if replica in self._pending_batch:
                record.batches[replica] = self._pending_batch.pop(replica)
            if replica in self._pending_loss:
                record.losses[replica] = self._pending_loss.pop(replica)
            if replica in self._pending_layers:
                record.layers[replica] = self._pending_layers.pop(replica)
            self._complete(step)

    def _on_after(self, weights: dict[str, np.ndarray], slots: dict[str, np.ndarray]) -> None:
        with self._lock:
            self._after_count += 1
            step = self._after_count
            self._steps.setdefault(step, _Step()).after = {WEIGHT: weights, SLOT: slots}
            self._complete(step)

    def _on_whole(self, step: int, tables: dict[str, dict[str, np.ndarray]]) -> None:
        with self._lock:
            self._whole_seen.update((step, quantity) for quantity in tables)
            if step in self._steps or step > self.recorded:   # its step is recorded later
                self._whole.setdefault(step, {}).update(tables)
            else:
                self._record_whole(step, tables)

    def _record_whole(self, step: int, tables: dict[str, dict[str, np.ndarray]]) -> None:
        for quantity, values in tables.items():   # in place of the rows the step touched
            self.recorder.values(step, quantity, values)

    def _complete(self, step: int) -> None:
        record = self._steps[step]
        if record.after is None or len(record.grads) < self.replicas:
            return
        del self._steps[step]
        recorder = self.recorder
        if self.on_replicas is not None:
            self.on_replicas(step, record.losses, record.batches)
        recorder.replica_step(step, record.losses, record.batches, self.replicas)
        if self.layers is not None:
            self.layers.take(step, record.layers)
            if self.layers.stop_after_step and self.layers.values is not None:
                raise StepSeen(f"layer replay: step {step} observed; the run stops here")
        self.recorded = max(self.recorded, step)
        if self.variables_every and step % self.variables_every:
            return
        first = record.grads[min(record.grads)]
        recorder.grads(step, (   # IndexedSlices come as (ids, rows)
            (name, SparseRows(np.asarray(grad[0]), np.asarray(grad[1]), self.shapes[name])
             if isinstance(grad, tuple) else grad) for name, grad in first.items()))
        for quantity, values in record.after.items():
            recorder.values(step, quantity, values)
        self._record_whole(step, self._whole.pop(step, {}))

    def check_complete(self) -> None:
        """Raise when a step was only partly seen (a tap that did not fire on every replica),
        or when fewer steps than asked for ran (the input ran out)."""
        if self.steps and self.recorded < self.steps and not self._steps:
            raise RuntimeError(
                f"the input ran out after {self.recorded} step(s) of the {self.steps} asked "
                f"for: the training dataset yields too few batches (make it repeat, e.g. "
                f"`dataset.repeat()` before batching, or run fewer steps with --steps)")
        if self._whole:
            raise RuntimeError(f"capture received whole tables for step {min(self._whole)}, "
                               f"which it never saw complete")
        if self.touched_rows is not None:   # the whole tables the comparison relies on
            missing = [(step, quantity) for step in range(1, self.recorded + 1)
                       for quantity in sorted(self._by_rows)
                       if self.touched_rows.whole(step, self.steps, quantity)
                       and (step, quantity) not in self._whole_seen]
            if missing:
                step, quantity = missing[0]
                raise RuntimeError(
                    f"capture by touched rows sent no whole {quantity} tables at step {step} "
                    f"(of {len(missing)} whole captures missing): the step function did not "
                    f"reach the taps' whole-table send there")
        if self._steps:
            step = min(self._steps)
            record = self._steps[step]
            raise RuntimeError(
                f"capture saw step {step} only partly: gradients from replicas "
                f"{sorted(record.grads)} of {self.replicas}, variables after the update: "
                f"{'yes' if record.after is not None else 'no'}. The step did not go through "
                f"optimizer.apply_gradients on every replica.")

    # ---- graph side ----
    @contextlib.contextmanager
    def installed(self, strategy, optimizer, transform=None) -> Iterator["StepTaps"]:
        """Install the taps on `strategy.run`, `tf.GradientTape.gradient` and `optimizer` for
        the duration of the block; everything is restored afterwards. `transform` (a
        mutation, `verify.runners.capture.mutations`) changes the gradients before they are applied
        and recorded. The taps themselves are in `verify.runners.capture.replica_taps` (batch,
        loss) and `verify.runners.capture.optimizer_taps` (gradients, values after the update)."""
        import tensorflow as tf

        original_run = strategy.run
        original_gradient = tf.GradientTape.gradient
        original_apply = optimizer.apply_gradients
        if self.touched_rows is not None:   # steps are numbered from here on
            self._first_iteration = int(optimizer.iterations.numpy())
        strategy.run = strategy_run_tap(self, original_run)
        tf.GradientTape.gradient = gradient_tap(self, original_gradient)
        optimizer.apply_gradients = apply_gradients_tap(self, optimizer, original_apply)
        try:
            with optimizer_gradient_tap(optimizer, applied_gradients_tap(self, transform)), \
                    self._observing_layers():
                yield self
        finally:
            strategy.__dict__.pop("run", None)
            tf.GradientTape.gradient = original_gradient
            optimizer.__dict__.pop("apply_gradients", None)

    def _observing_layers(self):
        """The layer taps of a replay, sending through `_emit` (nothing without a replay)."""
        if self.layers is None:
            return contextlib.nullcontext()
        from verify.runners.capture.layer_taps import observing_layers

        return observing_layers(self.layers,
                                lambda values: self._emit(self._on_layer_arrays, values))

    def _emit(self, callback, values: dict[str, Any], after_pending: bool = False,
              replica: int | None = None, sequenced: bool = True):
        """Send `values` (name -> tensor) to `callback(replica, {name: array})` on the host,
        as an op with a side effect; returns the op. Batches and losses a replica sends wait
        to be followed by its gradients: the gradients' op runs after every op this replica
        sent before in the same function (ops with side effects and no data between them would
        otherwise run in any order). `replica` names the sender where the replica context does
        not (values sent from cross-replica context). `sequenced=False` keeps no order with the
        other values sent (values sent from inside a branch, ordered by the caller).
        A variable among `values` is read here, in the step's own computation (on a TPU,
        before the value moves to the host), where the caller is: after an update the caller
        has waited for, the read follows it."""
        import tensorflow as tf

        names = list(values)
        tensors = [tf.convert_to_tensor(values[n]) for n in names]
        if replica is None:
            context = tf.distribute.get_replica_context()
            replica = context.replica_id_in_sync_group if context is not None else 0
        before, pending = [], None
        if sequenced:
            key = (id(tf.compat.v1.get_default_graph()), threading.get_ident())
            pending = self._emitted.setdefault(key, [])
            before = list(pending) if after_pending else []

        def host(replica_id, *arrays):
            callback(int(replica_id), dict(zip(names, arrays)))
            return np.int32(0)

        def send():
            with tf.control_dependencies(before):
                return tf.numpy_function(host, [tf.cast(replica, tf.int32), *tensors],
                                         tf.int32, stateful=True, name="parity_tap")

        done = self.host_transfer(send) if self.host_transfer is not None else send()
        if pending is not None:
            if after_pending:
                pending.clear()
            else:
                pending.append(done)
        return done

    # numpy_function entry points: (replica, names..., arrays...) -> records
    def _on_batch_arrays(self, replica, values):
        self._on_batch(replica, unflatten_batch(values))

    def _on_layer_arrays(self, replica, values):
        with self._lock:
            self._pending_layers.setdefault(replica, {}).update(values)

    def _on_loss_arrays(self, replica, values):
        self._on_loss(replica, values[LOSS])

    def _on_grads_arrays(self, replica, values):
        grads = {}
        for key, value in values.items():
            name, _, part = key.partition("::")
            if part == "ids":
                grads[name] = (value, values[f"{name}::rows"])
            elif part != "rows":
                grads[name] = value
        self._on_grads(replica, grads)

    def _on_whole_arrays(self, replica, values):
        if replica != self.first_replica:   # (as _on_after_arrays)
            return
        tables: dict[str, dict[str, np.ndarray]] = {}
        for key, value in values.items():
            if key != "step":
                quantity, _, name = key.partition("/")
                tables.setdefault(quantity, {})[name] = value
        self._on_whole(int(values["step"]), tables)

    def _on_after_arrays(self, replica, values):
        # One replica's values count: TPUStrategy's replica id is not static, so every
        # replica sends; a multi-worker process's first replica is `first_replica`.
        if replica != self.first_replica:
            return
        weights = {k[len(f"{WEIGHT}/"):]: v for k, v in values.items()
                   if k.startswith(f"{WEIGHT}/")}
        slots = {k[len(f"{SLOT}/"):]: v for k, v in values.items() if k.startswith(f"{SLOT}/")}
        # tables by their touched rows (`touched_rows`): their distinct ids come in the order
        # `tf.unique` found them; sorted here, with their rows
        touched = {}
        for key, ids in values.items():
            if key.startswith("rows/") and key.endswith("::ids"):
                order = np.argsort(ids, kind="stable")
                touched[key[len("rows/"):-len("::ids")]] = (np.asarray(ids)[order], order)
        for key, rows in values.items():
            kind, _, name = key.partition("/")
            if kind == "rows" and not name.endswith("::ids"):
                ids, order = touched[name]
                weights[name] = TouchedRows(ids, np.asarray(rows)[order], self.shapes[name])
                self._by_rows.add(WEIGHT)
            elif kind == "slotrows":
                self._by_rows.add(SLOT)
                owner = name.partition("::")[0]
                ids, order = touched[owner]
                slots[name] = TouchedRows(ids, np.asarray(rows)[order], self.shapes[owner])
        self._on_after(weights, slots)


def read_snapshot(variable) -> np.ndarray:
    """A variable's value now, as a read-only array that later updates do not change, without
    the copy `.numpy()` adds to TensorFlow's own read (a 256 MB table: 0.18 s instead of 0.44 s
    here). The array shares the buffer of the tensor read, which TensorFlow never updates in
    place while it is shared (a variable's update copies it first, or reads copied it)."""
    return np.asarray(variable.read_value())
