"""Capture by observation for Keras 3 models trained by their own `compile`/`fit` step, on the
JAX and the TensorFlow backends.

The Keras 3 counterpart of `verify.runners.capture.taps`. Whatever `train_step` a model runs (Keras'
own for its backend, or the user's), a step receives its batch as the last argument of
`model.train_step`, differentiates its loss with the backend's differentiation call
(`jax.value_and_grad` on JAX, `tf.GradientTape.gradient` on TensorFlow), and updates the
variables through `optimizer.apply` (called by `apply_gradients`, and by `stateless_apply` on
JAX). `Keras3Taps` wraps those calls for the duration of one `fit` with pass-through wrappers:
each calls the original with the same arguments and returns its result unchanged, and also
sends copies of the values to the host, with an op that has a side effect and no output:
`jax.debug.callback(..., ordered=True)` inside the jitted JAX step, `tf.numpy_function` inside
the TensorFlow `tf.function` (under `TPUStrategy`, inside `host_transfer`: outside
compilation, see `verify.runners.keras3.tpu`). It records

- the batch (`train_step`'s data: features, sparse ones as (example, id) pairs, and labels);
- the loss the step differentiates (the value `jax.value_and_grad` returns, or the target of
  `tape.gradient`);
- the gradients the optimizer applies, after its unscaling, accumulation and clipping (see
  `verify.runners.capture.keras3_internals.optimizer_update_tap`); sparse ones (TensorFlow's
  `IndexedSlices`) as row ids + rows, duplicates kept as the optimizer receives them;
- every variable the model keeps (trainable, and its non-trainable weights: a
  BatchNormalization's moving statistics, which its forward pass updated) and optimizer slot
  after the update. TensorFlow: read from the variables inside `apply`, after its
  assignments. JAX: the state the next step receives (`train_step(state, data)`'s trainable,
  non-trainable and optimizer variables, arguments of the jitted
  step), and after `fit` the state it hands back. Values computed inside one XLA program can
  be computed twice (a fusion for the state, another for a callback's operand) and differ by
  an ulp where one contracts a multiply-add; the step's arguments are the state itself.

The host side (`StepTaps`) assembles them into trace steps as on TF2. One replica only:
Keras 3 distribution over several devices (`keras.distribution`, `tf.distribute` with more
than one replica) is not observed.
"""
from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable, Iterator, Mapping

import numpy as np

from verify.core.inputs import RaggedIds
from verify.core.quantities import LOSS, SLOT, WEIGHT
from verify.core.trace import Trace
from verify.runners.capture.keras3_internals import optimizer_slots, optimizer_update_tap
from verify.runners.capture.taps import StepTaps


class Keras3Taps(StepTaps):
    """Taps on a Keras 3 model's training step (see the module docstring); `backend` is
    `keras.backend.backend()` ("jax" or "tensorflow"), `variables` the model's variables by
    path (`verify.runners.keras3.runner.load_initial_values`).

    >>> with Keras3Taps(trace, variables, "jax").installed(model) as taps:  # doctest: +SKIP
    ...     model.fit(dataset, steps_per_epoch=20)
    """

    BACKENDS = ("jax", "tensorflow")

    def __init__(self, trace: Trace, variables: dict[str, Any], backend: str,
                 weighted_ids: Mapping[str, str] | None = None,
                 host_transfer: Callable | None = None):
        if backend not in self.BACKENDS:
            raise NotImplementedError(f"capture on the Keras 3 {backend!r} backend is not "
                                      f"implemented; it observes {self.BACKENDS}")
        super().__init__(trace, variables, replicas=1,
                         slots=lambda optimizer: optimizer_slots(optimizer, variables),
                         host_transfer=host_transfer)
        self.backend = backend
        self.weighted_ids = dict(weighted_ids or {})
        self._last_sent: dict[int, Any] = {}   # TF graph -> the last tap op sent in it
        self._step_parts: list | None = None     # JAX: what the step being traced sends
        self._states_seen = 0                     # JAX: step states received on the host

    @contextlib.contextmanager
    def installed(self, model) -> Iterator["Keras3Taps"]:
        """Install the taps on `model.train_step`, the backend's differentiation call and
        `model.optimizer` for the duration of the block; everything is restored afterwards."""
        optimizer = model.optimizer
        original_step, original_apply = model.train_step, optimizer.apply

        def train_step(*args, **kwargs):
            if self.backend == "jax":   # (state, data): the state after the previous step
                self._step_parts = []
                trainable, non_trainable, optimizer_state, _ = args[0]
                self._send(self._on_state_arrays, self._named_state(
                    model, trainable, non_trainable, optimizer_state))
            self._send(self._on_batch_arrays, self._flat_batch(args[-1]))
            result = original_step(*args, **kwargs)
            if self.backend == "jax":
                parts, self._step_parts = self._step_parts, None
                self._jax_callback(parts)
            return result

        def on_update(grads, variables):
            sent = {}
            for g, v in zip(grads, variables):
                if g is None or v.path not in self.variables:   # (keras-rs' gradient trap)
                    continue
                if type(g).__name__ == "IndexedSlices":
                    sent[f"{v.path}::ids"], sent[f"{v.path}::rows"] = g.indices, g.values
                else:
                    sent[v.path] = g
            self._send(self._on_grads_arrays, sent)

        def apply(grads, trainable_variables=None):
            result = original_apply(grads, trainable_variables)
            from keras import ops

            values = {f"{WEIGHT}/{n}": ops.convert_to_tensor(v)
                      for n, v in self.variables.items()}
            values.update({f"{SLOT}/{n}": ops.convert_to_tensor(s)
                           for n, s in self.slots(optimizer).items()})
            self._send(self._on_after_arrays, values)
            return result

        object.__setattr__(model, "train_step", train_step)
        if self.backend == "tensorflow":
            object.__setattr__(optimizer, "apply", apply)
        try:
            with self._loss_tap(), optimizer_update_tap(optimizer, on_update):
                yield self
            if self.backend == "jax":
                import jax

                jax.effects_barrier()   # every callback of the run has reached the host
                from keras import ops

                self._on_state_arrays(0, self._named_state(   # the state fit hands back
                    model, [ops.convert_to_numpy(v) for v in model.trainable_variables],
                    [ops.convert_to_numpy(v) for v in model.non_trainable_variables],
                    [ops.convert_to_numpy(v) for v in optimizer.variables]))
        finally:
            model.__dict__.pop("train_step", None)
            optimizer.__dict__.pop("apply", None)

    def _on_batch_arrays(self, replica, values) -> None:
        """A batch as the host receives it; dense ids with 0/1 weights (keras-rs' dense input
        format, `weighted_ids`: ids feature -> weights feature) become each example's ids at
        the positions whose weight is 1, as a sparse feature's are. Other weights stay
        features of their own, so a weighted lookup never digests like an unweighted one."""
        values = dict(values)
        for ids_name, weights_name in self.weighted_ids.items():
            if ids_name not in values or weights_name not in values:
                continue
            weights = np.asarray(values[weights_name])
            if not np.isin(weights, (0.0, 1.0)).all():
                continue
            values[ids_name] = RaggedIds.from_mask(values[ids_name], weights)
            del values[weights_name]
        super()._on_batch_arrays(replica, values)

    def _named_state(self, model, trainable, non_trainable, optimizer_state) -> dict[str, Any]:
        """A JAX step's state as `weight/<path>` and `slot/<path::slot>` values: the state
        lists follow `model.trainable_variables`, `model.non_trainable_variables` (moving
        statistics, and seed states, which are no weights and not among `self.variables`)
        and `model.optimizer.variables`."""
        values = {}
        for kept, state in ((model.trainable_variables, trainable),
                            (model.non_trainable_variables, non_trainable)):
            values.update({f"{WEIGHT}/{v.path}": value for v, value in zip(kept, state)
                           if v.path in self.variables})
        index = {id(v): n for n, v in enumerate(model.optimizer.variables)}
        for name, slot in self.slots(model.optimizer).items():
            values[f"{SLOT}/{name}"] = optimizer_state[index[id(slot)]]
        return values

    def _on_state_arrays(self, replica, values) -> None:
        """The state a JAX step starts from is the state after the step before it (the first
        one is the initial state, recorded as step 0 when it was loaded)."""
        self._states_seen += 1
        if self._states_seen > 1:
            self._on_after_arrays(replica, values)

    @contextlib.contextmanager
    def _loss_tap(self) -> Iterator[None]:
        if self.backend == "jax":
            import jax

            original = jax.value_and_grad

            def value_and_grad(fun, *args, **kwargs):
                has_aux = kwargs.get("has_aux", args[1] if len(args) > 1 else False)
                differentiated = original(fun, *args, **kwargs)

                @functools.wraps(differentiated)
                def tapped(*a, **k):
                    value, grads = differentiated(*a, **k)
                    self._send_loss(value[0] if has_aux else value)
                    return value, grads
                return tapped

            jax.value_and_grad = value_and_grad
            try:
                yield
            finally:
                jax.value_and_grad = original
        else:
            import tensorflow as tf

            original = tf.GradientTape.gradient

            def gradient(tape, target, sources, *rest, **kw):
                self._send_loss(target)
                return original(tape, target, sources, *rest, **kw)

            tf.GradientTape.gradient = gradient
            try:
                yield
            finally:
                tf.GradientTape.gradient = original

    def _send_loss(self, loss) -> None:
        shape, dtype = getattr(loss, "shape", None), str(getattr(loss, "dtype", ""))
        if shape is not None and len(shape) == 0 and "float" in dtype:
            from keras import ops

            self._send(self._on_loss_arrays, {LOSS: ops.cast(loss, "float32")})

    def _send(self, callback: Callable[[int, dict], None], values: dict[str, Any]) -> None:
        """Send `values` (name -> tensor) to `callback(0, {name: array})` on the host, from
        inside the step, as an op with a side effect and no output, in program order. On JAX
        what one `train_step` sends leaves in one ordered callback at its end (one host call
        per step); on TensorFlow each is a `tf.numpy_function`, chained by control
        dependencies."""
        if self.backend == "jax":
            if self._step_parts is not None:
                self._step_parts.append((callback, values))
            else:
                self._jax_callback([(callback, values)])
            return
        names = list(values)
        import tensorflow as tf

        def host(*arrays):
            callback(0, dict(zip(names, arrays)))
            return np.int32(0)

        graph = id(tf.compat.v1.get_default_graph())
        before = self._last_sent.get(graph)

        def send():
            with tf.control_dependencies([before] if before is not None and
                                         not tf.executing_eagerly() else []):
                return tf.numpy_function(host, [values[n] for n in names], tf.int32,
                                         stateful=True, name="parity_tap")

        # under TPUStrategy through `host_transfer` (outside compilation): a TPU program runs
        # no Python; its one replica is replica 0
        self._last_sent[graph] = (self.host_transfer(send) if self.host_transfer is not None
                                  else send())

    @staticmethod
    def _jax_callback(parts: list[tuple[Callable[[int, dict], None], dict[str, Any]]]) -> None:
        """One ordered `jax.debug.callback` that hands each part's values to its callback, in
        order. Operands go flat: a callback operand of rank > 1 constrains its layout, and XLA
        answers with other fusions of the step (seen: Adagrad's `acc + g*g` one ulp off where
        a [7,1] kernel gradient was sent as it is); a flat one is a bitcast."""
        import jax.numpy as jnp
        from jax import debug

        layout = [(callback, [(n, tuple(np.shape(v))) for n, v in values.items()])
                  for callback, values in parts]
        operands = [jnp.ravel(v) for _, values in parts for v in values.values()]

        def host(*arrays):
            arrays = iter(arrays)
            for callback, names in layout:
                callback(0, {n: np.asarray(next(arrays)).reshape(shape) for n, shape in names})

        debug.callback(host, *operands, ordered=True)

    def _flat_batch(self, data) -> dict[str, Any]:
        """A step's data `(features, labels[, sample_weights])` as name -> tensor; sparse
        features (tf.SparseTensor, jax BCOO) as `name::indices`, `name::values`, `name::shape`."""
        parts = list(data) if isinstance(data, (tuple, list)) else [data]
        features = parts[0]
        named = dict(features) if isinstance(features, dict) else {"features": features}
        if len(parts) > 1 and parts[1] is not None:
            named["label"] = parts[1]
        flat = {}
        for name, value in named.items():
            kind = type(value).__name__
            if kind == "SparseTensor":
                flat[f"{name}::indices"], flat[f"{name}::values"] = value.indices, value.values
                flat[f"{name}::shape"] = value.dense_shape
            elif kind == "RaggedTensor":
                from verify.runners.capture.batches import ragged_parts

                flat[f"{name}::ragged"], flat[f"{name}::row_splits"] = ragged_parts(value)
            elif kind == "BCOO":
                flat[f"{name}::indices"], flat[f"{name}::values"] = value.indices, value.data
                flat[f"{name}::shape"] = np.asarray(value.shape, np.int64)
            elif hasattr(value, "dtype"):
                flat[name] = value
        return flat

