"""Taps on every Keras layer and loss call of a training step: the graph side of a layer replay
(`verify.core.layer_capture` is the host side, `verify.session.layer_replay` runs it).

For the duration of `observing_layers`, `Layer.__call__` (Keras 2's, including TF1's
`tf.compat.v1.layers` and feature-column layers, which run on Keras' v1 base layer) and
`Loss.__call__` are wrapped. Each wrapper calls the original with the same arguments and
returns its result; in addition, for a layer that holds trainable variables, its input (when it
is one floating tensor) and each floating tensor of its output pass through an identity whose
gradient is the identity, and both the value and the incoming gradient are sent to the host.
An output of several tensors (a tfrs `TPUEmbedding`'s dict by feature) is sent per tensor,
named by its path; a feature-column layer's concatenated output also per feature (the tensors
it concatenates, which its call collects in `cols_to_output_tensors` when given that dict).
For a Keras loss, the per-example losses its `call` returns (before its reduction) are observed
the same way, and for TF1's `tf.compat.v1.losses` functions the per-element losses they hand
`compute_weighted_loss`. A layer without variables is not sent; its output is remembered, so the layer
that consumes it can say what feeds it (a concatenation, a pooling).

What the values are sent through is the caller's: `StepTaps._emit` inside a TF2 step (a
`tf.numpy_function` with no output, as every tap), or `GraphSink` in a TF1 graph (the tensors
kept, for the Estimator's capture hook to fetch in the step's `session.run`). Nothing else
of the step changes: the identities change no value, only the graph holds more ops.
"""
from __future__ import annotations

import contextlib
import threading
from typing import Any, Callable, Iterator

from verify.core.layer_capture import GRAD, LayerCall, LayerRecorder
from verify.core.names import native_name
from verify.runners.capture.tf_internals import (feature_column_key, is_feature_column_layer,
                                                 keras_layer_classes, keras_loss_class,
                                                 keras_model_class, keras_symbolic_tensor_class,
                                                 tf1_losses_module)

Send = Callable[[dict[str, Any]], Any]


class GraphSink:
    """Where a TF1 graph's observed tensors go: kept by name, fetched by the capture hook.

    >>> sink = GraphSink()
    >>> sink({"0:output": "a tensor"}); sink.tensors
    {'0:output': 'a tensor'}
    """

    def __init__(self):
        self.tensors: dict[str, Any] = {}

    def __call__(self, values: dict[str, Any]) -> None:
        self.tensors.update(values)


class _TraceState:
    """What the wrappers share while functions are traced: call indices per traced graph and
    thread (each replica traces the step in its own thread, and every trace numbers the same
    calls alike), and the outputs of variable-free layers (kept alive, looked up by id)."""

    def __init__(self, recorder: LayerRecorder):
        self.recorder = recorder
        self._counters: dict[tuple[int, int], int] = {}
        self._produced: dict[int, tuple[Any, str]] = {}
        self._lock = threading.Lock()

    def next_index(self) -> int:
        import tensorflow as tf

        key = (id(tf.compat.v1.get_default_graph()), threading.get_ident())
        with self._lock:
            index = self._counters.get(key, 0)
            self._counters[key] = index + 1
        return index

    def produced(self, layer, outputs) -> None:
        import tensorflow as tf

        name = f"{type(layer).__name__} {layer.name}"
        for tensor in tf.nest.flatten(outputs):
            self._produced[id(tensor)] = (tensor, name)
        self.recorder.not_compared(name, "no variables; its output is no observed layer's "
                                         "input")

    def producer_of(self, inputs) -> str:
        found = self._produced.get(id(inputs))
        return "" if found is None or found[0] is not inputs else found[1]


@contextlib.contextmanager
def observing_layers(recorder: LayerRecorder, send: Send) -> Iterator[None]:
    """Observe every Keras layer and loss call traced or run in the block (see the module's
    docstring); the wrapped methods are restored afterwards."""
    state = _TraceState(recorder)
    loss_class, tf1_losses = keras_loss_class(), tf1_losses_module()
    originals = {cls: cls.__dict__["__call__"] for cls in keras_layer_classes()}
    original_loss = loss_class.__dict__["__call__"]
    original_weighted = tf1_losses.compute_weighted_loss
    for cls, original in originals.items():
        cls.__call__ = _layer_call_tap(original, state, send)
    loss_class.__call__ = _loss_call_tap(original_loss, state, send)
    tf1_losses.compute_weighted_loss = _weighted_loss_tap(original_weighted, state, send)
    try:
        yield
    finally:
        for cls, original in originals.items():
            cls.__call__ = original
        loss_class.__call__ = original_loss
        tf1_losses.compute_weighted_loss = original_weighted


def _layer_call_tap(original: Callable, state: _TraceState, send: Send) -> Callable:
    import tensorflow as tf

    model_class = keras_model_class()

    @tf.autograph.experimental.do_not_convert
    def __call__(layer, *args, **kwargs):
        if isinstance(layer, model_class) or not _concrete(args, kwargs):
            return original(layer, *args, **kwargs)
        # A layer not built yet creates its variables inside the call: its input goes through
        # the gradient identity first, sent only once the call shows the layer holds variables.
        index = state.next_index()
        inputs = args[0] if args else kwargs.get("inputs")
        producer = state.producer_of(inputs)   # "Concatenate concatenate", or ""
        holds_variables = []
        if _floating(inputs):
            tapped = _tapped(inputs, f"{index}:input", send, when=holds_variables)
            if args:
                args = (tapped,) + args[1:]
            else:
                kwargs = {**kwargs, "inputs": tapped}
        columns = None
        if is_feature_column_layer(layer) and kwargs.get("cols_to_output_tensors") is None:
            columns = kwargs["cols_to_output_tensors"] = {}   # filled by the layer's call
        outputs = original(layer, *args, **kwargs)
        variables = tuple(native_name(v) for v in layer.trainable_weights)
        if not variables:
            state.produced(layer, outputs)
            return outputs
        holds_variables.append(True)
        parts = tuple(feature_column_key(c) for c in columns) if columns and \
            len(columns) > 1 else ()
        state.recorder.describe(index, LayerCall(type(layer).__name__, layer.name, variables,
                                                 producer.split(" ")[0], parts=parts),
                                unit=layer)
        if producer:
            state.recorder.observed_as_input(producer)
        if _floating(inputs):
            send({f"{index}:input": inputs})
        if columns and len(columns) > 1:   # one tensor per feature, concatenated by the layer
            send({f"{index}:output#{feature_column_key(column)}": tensor
                  for column, tensor in columns.items() if _floating(tensor)})
        flat = tf.nest.flatten(outputs)
        paths = _paths(outputs, len(flat))
        tapped_outputs = [_tapped(t, f"{index}:output" + (f"#{path}" if len(flat) > 1 else ""),
                                  send) if _floating(t) else t
                          for path, t in zip(paths, flat)]
        return tf.nest.pack_sequence_as(outputs, tapped_outputs)

    return __call__


def _loss_call_tap(original: Callable, state: _TraceState, send: Send) -> Callable:
    """`Loss.__call__` observing what the loss's own `call` returns (the per-example losses,
    before the reduction), by handing `__call__` a wrapped `call` for this one call."""
    import tensorflow as tf

    @tf.autograph.experimental.do_not_convert
    def __call__(loss, y_true, y_pred, sample_weight=None):
        if not _concrete((y_pred,), {}) or "call" in loss.__dict__:
            return original(loss, y_true, y_pred, sample_weight)
        index = state.next_index()
        state.recorder.describe(index, LayerCall(type(loss).__name__, loss.name, (), loss=True))
        own_call = loss.call

        @tf.autograph.experimental.do_not_convert
        def observed_call(*args, **kwargs):
            per_example = own_call(*args, **kwargs)
            if _floating(per_example):
                return _tapped(per_example, f"{index}:per-example loss", send)
            return per_example

        loss.call = observed_call
        try:
            return original(loss, y_true, y_pred, sample_weight)
        finally:
            del loss.call

    return __call__


def _weighted_loss_tap(original: Callable, state: _TraceState, send: Send) -> Callable:
    """TF1's `tf.compat.v1.losses.*` functions (`mean_squared_error`, ...) all reduce their
    per-element losses with `compute_weighted_loss`: its `losses` argument is observed."""
    import tensorflow as tf

    @tf.autograph.experimental.do_not_convert
    def compute_weighted_loss(losses, *args, **kwargs):
        if _floating(losses):
            index = state.next_index()
            state.recorder.describe(index, LayerCall("tf.compat.v1.losses", "", (), loss=True))
            losses = _tapped(losses, f"{index}:per-example loss", send)
        return original(losses, *args, **kwargs)

    return compute_weighted_loss


def _tapped(tensor, name: str, send: Send, when: list | None = None):
    """`tensor` through an identity whose gradient is the identity; the value is sent as
    `name`, the gradient flowing back through it as `name + ":grad"`. With `when` (a list the
    caller appends to once it knows), nothing is sent forward here and the gradient only if
    `when` holds something by the time the gradient is built."""
    import tensorflow as tf

    @tf.custom_gradient
    def observed(value):
        def gradient(upstream):
            if when is None or when:
                send({name + GRAD: upstream})
            return upstream
        return tf.identity(value), gradient

    if when is None:
        send({name: tensor})
    return observed(tensor)


def _paths(outputs, count: int) -> list[str]:
    """Names for an output's flattened tensors: a flat dict's keys (`tf.nest` flattens a dict
    in sorted key order: a tfrs layer's features), else their positions."""
    if isinstance(outputs, dict) and len(outputs) == count:
        return [str(key) for key in sorted(outputs)]
    return [str(n) for n in range(count)]


def _concrete(args, kwargs) -> bool:
    """Whether a call runs on real tensors (eager, or inside a traced function or a TF1 graph),
    not on the symbolic `KerasTensor`s a functional model is built from."""
    import tensorflow as tf

    symbolic = keras_symbolic_tensor_class()
    flat = tf.nest.flatten((args, kwargs))
    if any(isinstance(t, symbolic) for t in flat):
        return False
    return any(isinstance(t, (tf.Tensor, tf.SparseTensor, tf.RaggedTensor)) for t in flat)


def _floating(value) -> bool:
    import tensorflow as tf

    return isinstance(value, tf.Tensor) and value.dtype.is_floating
