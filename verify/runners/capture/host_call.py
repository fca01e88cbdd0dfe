"""TF1 capture with only what a TPU lets the host see: `host_call`, the input pipeline and
checkpoints.

On a TPU, `TPUEstimator` runs `iterations_per_loop` train steps inside one `session.run`, so a
`SessionRunHook` sees only the end of each loop. Three things reach the host every step or at
a checkpoint, and this module captures through them only:

- `TPUEstimatorSpec.host_call` (every step): the loss, the gradients the optimizer applies
  (after `CrossShardOptimizer`'s cross-replica sum), the dense features and the labels of the
  batch, and the variables and optimizer slots after the update (read after the train op).
  On a TPU the tensors travel through the outfeed, concatenated over replicas along their
  first axis, and the host runs the function on them; with `use_tpu=False`,
  `TPUEstimatorSpec.as_estimator_spec()` calls the same function on CPU
  (`_OutfeedHostCall.create_cpu_hostcall`) and fetches it with the train op every
  `session.run`. So the capture is the same code on both.
- the input pipeline (every step): sparse and embedding features. On a TPU they never reach
  the model_fn (TPUEstimator sends them to the embedding engine and passes the activations in
  their place), so they are digested as the dataset hands each per-core batch to the infeed,
  by an op with a side effect and no output (the elements pass through unchanged).
- checkpoints (every K steps and the last): the embedding tables and their slots, which on a
  TPU live in the embedding engine; TPUEstimator copies them into host variables at the end
  of every training loop (its retrieve ops) and the checkpoint saves those. Step 0 (the
  values as loaded) comes from the first checkpoint, for every variable.

On a TPU a table's gradient is applied inside the engine and never exists as a tensor: the
trace says so (`TraceMeta.not_captured`), and the comparison lists those rows as not captured.
"""
from __future__ import annotations

import math
import threading
from typing import Any, Callable, Mapping

import numpy as np

from verify.core.names import NameMapError, native_name
from verify.core.quantities import GRAD, INPUT, LOSS, SLOT, WEIGHT
from verify.core.trace import SparseRows, Trace
from verify.core.runner import RunRequest
from verify.runners.capture.batches import unflatten_batch
from verify.runners.capture.step_record import StepRecorder, variable_quantity
from verify.runners.capture.tf_internals import is_tpu_embedding_helper, tpu_embedding_slot_names

# What the trace says about table gradients captured through host_call on a TPU.
TABLE_GRADIENT_NOT_ON_TPU = (
    "on a TPU the embedding engine applies the table's gradient itself (TPUEstimator sends it "
    "only the gradient of the activations); it never exists as a tensor the host can see")
DEFAULT_TABLE_READS = 100   # default K: about this many table reads per run at most


def tables_every(requested: int | None, steps: int) -> int:
    """K, the step interval of table reads: `requested`, or every step for runs of up to
    `DEFAULT_TABLE_READS` steps and about `DEFAULT_TABLE_READS` reads for longer ones.

    >>> tables_every(None, 20), tables_every(None, 1000), tables_every(5, 20)
    (1, 10, 5)
    """
    if requested is not None:
        if requested < 1:
            raise ValueError(f"tables must be read every K >= 1 steps, got {requested}")
        return requested
    return max(1, math.ceil(steps / DEFAULT_TABLE_READS))


def spec_tables(spec, shapes: Mapping[str, tuple]) -> dict[str, list]:
    """The embedding tables an `EmbeddingConfigSpec` declares: native variable name -> the
    feature columns it serves, found among `shapes` (native name -> shape) by the column's
    embedding variable name and table size."""
    tables: dict[str, list] = {}
    for column in spec.feature_columns if spec is not None else ():
        rows, dim = column.get_embedding_table_size()
        name = next((n for n, shape in shapes.items() if column.get_embedding_var_name() in n
                     and tuple(shape) == (rows, dim)), None)
        if name is not None:
            tables.setdefault(name, []).append(column)
    return tables


def embedding_feature_keys(spec) -> set[str]:
    """The features an `EmbeddingConfigSpec`'s columns read (on a TPU they go to the engine)."""
    return {column.categorical_column.key for column in
            (spec.feature_columns if spec is not None else ())}


class HostCallCapture:
    """The host side of the capture: `host_call`, the input tap and the checkpoint reads of
    one TF1 run, recorded into `trace` (native names) as they arrive.

    `steps` is the run's length, `every` K (table reads), `on_tpu` whether the tables train in
    a TPU's embedding engine (their gradients are then declared not captured and no table
    gradient is sent, whatever the graph holds).

    `EstimatorRunner` builds one per run, puts `host_call(...)` into the model_fn's
    `TPUEstimatorSpec`, maps the train `input_fn` through `input_tap` and hands
    `checkpoint_listener` to `train(saving_listeners=...)`:

    >>> capture = HostCallCapture(Trace("tf1"), steps=20, every=5, on_tpu=True)  # doctest: +SKIP
    """

    def __init__(self, trace: Trace, *, steps: int, every: int, on_tpu: bool):
        self.trace, self.steps, self.every, self.on_tpu = trace, steps, every, on_tpu
        self.recorder = StepRecorder(trace)
        self._lock = threading.Lock()
        self._host_calls = 0
        self._elements = 0
        self._pending: dict[int, dict[int, dict]] = {}
        self.sparse_shapes: dict[str, tuple] = {}       # variable -> shape, sparse gradients
        self.checkpoint_names: dict[str, str] = {}     # checkpoint name -> trace tensor
        self.step0_names: dict[str, str] = {}
        self._names: list[str] = []                    # the host_call tensors, in order

    # ---- graph side (called from the model_fn) ----
    def host_call(self, features, labels, loss, calls, train_op, spec, request: RunRequest,
                  user_host_call=None) -> tuple[Callable, dict[str, Any]]:
        """The (function, tensors) to put into `TPUEstimatorSpec.host_call`, chained with the
        model_fn's own `host_call` if it has one."""
        import tensorflow as tf

        tf1 = tf.compat.v1
        grads = {}   # the last apply_gradients of a variable: CrossShardOptimizer's inner one
        for _, grads_and_vars in calls:
            for g, v in grads_and_vars:
                if g is not None:
                    grads[native_name(v)] = (g, v)
        if not grads:
            raise RuntimeError(
                f"{request.implementation.name}: the model_fn built no optimizer.apply_gradients/"
                f"minimize call of a tf.compat.v1.train.Optimizer, so there are no gradients to "
                f"capture.")
        trainable = {native_name(v): v for v in tf1.trainable_variables()
                     if not is_tpu_embedding_helper(native_name(v))}
        mapped = set(request.initial_values)
        # a variable the model keeps but does not train (moving statistics) is mapped too; it
        # is read from the checkpoints like a table. On a TPU the engine's tables and slots
        # are such variables of the graph, so only the trainable ones are checked there.
        kept = set(trainable) | (set() if self.on_tpu else set(model_variables(calls)))
        unmapped = sorted(kept - mapped)
        if unmapped:
            raise NameMapError(f"name map of {request.implementation.name} does not fit its "
                               f"model: variables of {request.implementation.name} that no "
                               f"canonical name maps to: {unmapped}")
        tables = spec_tables(spec, {n: tuple(v.shape) for n, v in trainable.items()})
        engine = spec.optimization_parameters if spec is not None else None
        table_names = set(tables) | {n for n in mapped if n not in trainable}
        self._plan_checkpoints(request, table_names, calls, engine)
        skip_features = embedding_feature_keys(spec)

        tensors: dict[str, Any] = {LOSS: tf.reshape(tf.cast(loss, tf.float32), [1])}
        named = features if isinstance(features, dict) else {"features": features}
        for name, value in named.items():
            if name not in skip_features and isinstance(value, tf.Tensor):
                tensors[f"{INPUT}/{name}"] = value
        tensors[f"{INPUT}/label"] = labels
        for name, (g, v) in grads.items():
            if name not in mapped or (self.on_tpu and name in table_names):
                continue
            if isinstance(g, tf.IndexedSlices):
                self.sparse_shapes[name] = tuple(v.shape)
                tensors[f"{GRAD}/{name}::ids"] = tf.expand_dims(g.indices, 0)
                tensors[f"{GRAD}/{name}::rows"] = tf.expand_dims(g.values, 0)
            else:
                tensors[f"{GRAD}/{name}"] = tf.expand_dims(g, 0)
        with tf.control_dependencies([train_op]):   # the values after the update
            for name, v in trainable.items():
                if name not in table_names:
                    tensors[f"{WEIGHT}/{name}"] = tf.expand_dims(v.read_value(), 0)
            for key, slot in slot_variables(calls).items():
                if key.partition("::")[0] in trainable and \
                        key.partition("::")[0] not in table_names:
                    tensors[f"{SLOT}/{key}"] = tf.expand_dims(tf.identity(slot), 0)
        self._declare_table_reads(table_names)
        return self._chained(tensors, user_host_call)

    def _declare_table_reads(self, table_names: set[str]) -> None:
        """Say in the trace what of the tables it holds: read from checkpoints every K steps,
        and on a TPU their gradients not captured."""
        if self.on_tpu:
            for name in sorted(table_names):
                self.recorder.not_captured(GRAD, name, TABLE_GRADIENT_NOT_ON_TPU)
        for name, key in self.checkpoint_names.items():
            self.recorder.read_every(variable_quantity(key), key, self.every)

    def _plan_checkpoints(self, request: RunRequest, table_names: set[str], calls,
                          engine) -> None:
        """Which checkpoint names hold each table and its slots: the model_fn optimizer's
        slot variables where it trains the table (CPU), else the names TPUEstimator gives the
        engine's slots (a TPU)."""
        slots = slot_variables(calls)
        self.checkpoint_names = {name: name for name in sorted(table_names)}
        for table in sorted(table_names):
            own = {key: var for key, var in slots.items() if key.partition("::")[0] == table}
            if own:
                self.checkpoint_names.update({var.op.name: key for key, var in own.items()})
            elif engine is not None:
                self.checkpoint_names.update({name: f"{table}::{slot}" for name, slot in
                                              tpu_embedding_slot_names(table, engine).items()})
        self.step0_names = {name: name for name in request.initial_values}

    def _chained(self, tensors: dict[str, Any], user_host_call):
        """One host function for ours and the model_fn's own host_call (a spec holds one)."""
        import tensorflow as tf

        names = sorted(tensors)
        user_fn, user_args = user_host_call or (None, ())
        user_names = (sorted(user_args) if isinstance(user_args, dict)
                      else [f"#{i}" for i in range(len(user_args))])
        user_tensors = (user_args if isinstance(user_args, dict)
                        else {f"#{i}": t for i, t in enumerate(user_args)})
        everything = {**{f"parity/{n}": tensors[n] for n in names},
                      **{f"user/{n}": user_tensors[n] for n in user_names}}

        def host_fn(**arrays):
            done = tf.numpy_function(self._on_host_call_arrays,
                                     [arrays[f"parity/{n}"] for n in names], tf.int32,
                                     stateful=True, name="parity_host_call")
            outputs = [done]
            if user_fn is not None:
                own = {n: arrays[f"user/{n}"] for n in user_names}
                result = (user_fn(**own) if isinstance(user_args, dict)
                          else user_fn(*[own[n] for n in user_names]))
                outputs += list(result) if isinstance(result, (list, tuple)) else \
                    ([result] if result is not None else [])
            return outputs

        self._names = names
        return host_fn, everything

    # ---- host side ----
    def _on_host_call_arrays(self, *arrays) -> np.int32:
        with self._lock:
            self._host_calls += 1
            self._record_step(self._host_calls, dict(zip(self._names, arrays)))
        return np.int32(0)

    def _record_step(self, step: int, values: dict[str, np.ndarray]) -> None:
        recorder = self.recorder
        recorder.batch(step, {k[len(f"{INPUT}/"):]: v for k, v in values.items()
                              if k.startswith(f"{INPUT}/")})
        recorder.loss(step, np.mean(values[LOSS], dtype=np.float32))
        for key, value in values.items():
            kind, _, name = key.partition("/")
            if kind == GRAD and not name.endswith("::rows"):
                if name.endswith("::ids"):
                    var = name[:-len("::ids")]
                    recorder.value(step, GRAD, var, SparseRows(
                        np.asarray(value[0]), np.asarray(values[f"{GRAD}/{var}::rows"][0]),
                        self.sparse_shapes[var]))
                else:
                    recorder.value(step, GRAD, name, value[0])
            elif kind in (WEIGHT, SLOT):
                recorder.value(step, kind, name, value[0])

    def input_tap(self, dataset, per_step: int, skip: set[str] | None = None):
        """`dataset` with a pass-through tap digesting its sparse and embedding features:
        element i is replica `i % per_step`'s batch of step `i // per_step + 1` (the infeed
        takes per-core batches in replica order; one per step on CPU)."""
        import tensorflow as tf

        def tap(*element):
            features = element[0] if isinstance(element[0], dict) else {}
            flat = {}
            for name, value in features.items():
                if isinstance(value, tf.SparseTensor):
                    flat[f"{name}::indices"], flat[f"{name}::values"] = value.indices, value.values
                    flat[f"{name}::shape"] = value.dense_shape
                elif skip and name in skip:
                    flat[name] = value
            if flat:
                names = sorted(flat)
                tf.numpy_function(lambda *arrays: self._on_element(per_step, names, arrays),
                                  [flat[n] for n in names], tf.int32, stateful=True,
                                  name="parity_input_tap")
            return element if len(element) > 1 else element[0]

        return dataset.map(tap)

    def _on_element(self, per_step: int, names: list[str], arrays) -> np.int32:
        batch = unflatten_batch(dict(zip(names, arrays)))
        with self._lock:
            index = self._elements
            self._elements += 1
            step, replica = index // per_step + 1, index % per_step
            if step > self.steps:
                return np.int32(0)   # prefetched beyond the run: never trained on
            parts = self._pending.setdefault(step, {})
            parts[replica] = batch
            if len(parts) == per_step:
                del self._pending[step]
                self.recorder.replica_batches(step, parts, per_step)
        return np.int32(0)

    def checkpoint_listener(self, model_dir: str, request: RunRequest):
        """A `CheckpointSaverListener` recording, after each save, the tables and their slots
        (and at step 0 every mapped variable) from the checkpoint just written."""
        import tensorflow as tf

        capture = self

        class TableCheckpoints(tf.compat.v1.train.CheckpointSaverListener):
            def after_save(self, session, global_step_value):
                capture._read_checkpoint(tf.train.load_checkpoint(model_dir),
                                         int(global_step_value), request)

        return TableCheckpoints()

    def _read_checkpoint(self, reader, step: int, request: RunRequest) -> None:
        shapes = reader.get_variable_to_shape_map()
        names = self.step0_names if step == 0 else self.checkpoint_names
        if step == 0:
            implementation = request.implementation
            implementation.names.check_against(
                {n: tuple(shapes[n]) for n in names if n in shapes},
                request.case.canonical_shapes(), implementation.name)
        missing = sorted(n for n in names if n not in shapes)
        if missing:
            raise RuntimeError(f"{request.implementation.name}: the checkpoint of step {step} "
                               f"holds no {missing}; it holds {sorted(shapes)}")
        for name, key in names.items():
            self.recorder.value(step, variable_quantity(key), key, reader.get_tensor(name))

    def check_complete(self) -> None:
        """Raise when a step's batch was only partly seen (a replica's batch never tapped)."""
        if self._pending:
            step = min(self._pending)
            raise RuntimeError(f"the input tap saw step {step} only partly: batches of "
                               f"replicas {sorted(self._pending[step])}")


def model_variables(calls) -> dict[str, Any]:
    """Every variable a TF1 model keeps, by native name in creation order, while its graph is
    the default one: the global variables, trainable or not (a BatchNormalization's moving
    mean and variance), but the global step, what the optimizers of `calls` (recorded
    `apply_gradients` calls) own (their slots and other variables: Adam's `beta1_power` and
    `beta2_power`) and the helpers TensorFlow adds for the TPU embedding engine."""
    import tensorflow as tf

    tf1 = tf.compat.v1
    step = tf1.train.get_global_step()
    owned = {native_name(v) for optimizer, _ in calls for v in optimizer.variables()}
    if step is not None:
        owned.add(native_name(step))
    return {name: v for v in tf1.global_variables()
            if (name := native_name(v)) not in owned and not is_tpu_embedding_helper(name)}


def slot_variables(calls) -> dict[str, Any]:
    """`var::slot` -> slot variable, for every variable an optimizer updated."""
    out = {}
    for optimizer, grads_and_vars in calls:
        for _, var in grads_and_vars:
            for slot in optimizer.get_slot_names():
                slot_var = optimizer.get_slot(var, slot)
                if slot_var is not None:
                    out[f"{native_name(var)}::{slot}"] = slot_var
    return out
