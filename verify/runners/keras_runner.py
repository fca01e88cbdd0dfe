"""TF2 side: build a Keras model inside a strategy scope, train it with `compile`/`fit`,
capture every step.

Capturing: the model's `train_step` is replaced by one that does what Keras' own does (forward
pass, `compute_loss`, `tape.gradient`, `optimizer.apply_gradients` with the optimizer's own
cross-replica aggregation, `compute_metrics`), and in addition all-reduces a copy of the
gradients for the trace. Loss, gradients and the consumed batch leave
the step as extra outputs (gathered over replicas by `distribute_reduction_method="concat"`); a
callback reads weights and optimizer slots after every step. Per-step capture needs
`steps_per_execution=1`; the uninstrumented run keeps the implementation's own value and is
captured only at execution boundaries.
"""
from __future__ import annotations

import dataclasses
import functools
import types
from typing import Any, Callable

import numpy as np

from verify.core.case import Examples, SparseIds
from verify.runners.protocol import RunRequest
from verify.core.names import native_name
from verify.runners.run import load_initial_values
from verify.core.trace import SparseRows, Trace, digest_batch
from verify.runners.tf_internals import (compiled_user_loss, serialized_dataset_graph,
                                         tfrs_embedding_parts, validate_target_and_loss)


@dataclasses.dataclass(frozen=True)
class KerasRunner:
    """A TF2 Keras implementation trained with `compile`/`fit`.

    `build_model(steps_per_execution)` is called inside `strategy.scope()` and returns the
    compiled model (pass `steps_per_execution` on to `compile`).
    `dataset_fn(examples, input_context, global_batch_size)` returns the per-replica dataset,
    as a `tf.keras.utils.experimental.DatasetCreator` function does (batch with
    `input_context.get_per_replica_batch_size(global_batch_size)`; repeat for training).
    `strategy` is "default" or "mirrored" (replicas from the implementation); under `--tpu`
    every KerasRunner runs under `TPUStrategy`.

    >>> KerasRunner(build_model=build, dataset_fn=dataset, steps_per_execution=10)  # doctest: +SKIP
    """

    build_model: Callable[[int], Any]
    dataset_fn: Callable[[Examples, Any, int], Any]
    strategy: str = "default"
    steps_per_execution: int = 1
    eval_steps: int = 1
    # MirroredStrategy only: "default" (TF's choice) or "reduction_to_one_device"; see
    # `verify.runners.devices.mirrored_strategy` for when the default fails.
    cross_device_ops: str = "default"

    def describe(self) -> dict[str, Any]:
        out = {"api": "tf.keras Model.compile/fit", "strategy": self.strategy,
               "steps_per_execution": self.steps_per_execution}
        if self.strategy == "mirrored":
            out["cross_device_ops"] = self.cross_device_ops
        return out

    def run(self, request: RunRequest) -> Trace:
        import tensorflow as tf

        impl, case = request.implementation, request.case
        strategy = self._strategy(request)
        tf.keras.backend.clear_session()          # stable layer names: dense, not dense_3
        tf.keras.utils.set_random_seed(case.seed)
        spe = 1 if request.capture_steps else self.steps_per_execution
        with strategy.scope():
            model = self.build_model(spe)
        trace = request.trace
        variables = load_initial_values(model.trainable_variables, request, trace)

        options = tf.distribute.InputOptions(experimental_fetch_to_device=False)
        train = tf.keras.utils.experimental.DatasetCreator(
            lambda ctx: self.dataset_fn(case.examples, ctx, case.batch_size), input_options=options)
        callback = _capture_callback_class()(trace, variables, model, request,
                                             strategy.num_replicas_in_sync)
        if request.capture_steps:
            model.train_step = types.MethodType(_capturing_train_step, model)
            model.distribute_reduction_method = "concat"
        model.fit(train, epochs=1, steps_per_epoch=request.steps, verbose=0, callbacks=[callback])
        if request.capture_steps:
            del model.train_step
            model.distribute_reduction_method = None
        else:
            trace.meta.capture_every = spe
        if case.eval_examples is not None:
            evaluation = tf.keras.utils.experimental.DatasetCreator(
                lambda ctx: self.dataset_fn(case.eval_examples, ctx, case.batch_size),
                input_options=options)
            result = model.evaluate(evaluation, steps=self.eval_steps, return_dict=True, verbose=0)
            trace.record(request.steps, "metric", "eval/loss", np.float32(result["loss"]))
        trace.meta.replicas = strategy.num_replicas_in_sync
        trace.meta.details.update({"steps_per_execution": spe,
                                   "strategy": type(strategy).__name__})
        return trace

    def declared_config(self, case, implementation) -> dict[str, Any]:
        """The static configuration (see `verify.runners.static_config`), read from the built model and
        dataset under the default strategy, without training."""
        import tensorflow as tf
        import tensorflow_recommenders as tfrs

        from verify.runners.static_config import describe_dataset, describe_initializer, describe_optimizer

        tf.keras.backend.clear_session()
        tf.random.set_seed(None)   # an unseeded shuffle must look unseeded
        model = self.build_model(self.steps_per_execution)
        config: dict[str, Any] = {
            "loop/steps_per_call": f"steps_per_execution={self.steps_per_execution}"}
        config.update(describe_optimizer(model.optimizer, "optimizer/model"))
        loss = compiled_user_loss(model)
        if isinstance(loss, str) or loss is None:
            config["loss/reduction"] = "sum_over_batch_size"
        else:
            reduction = str(getattr(loss, "reduction", "auto"))
            config["loss/reduction"] = "sum_over_batch_size" if reduction == "auto" else reduction
        dataset = self.dataset_fn(case.examples, tf.distribute.InputContext(
            num_replicas_in_sync=implementation.replicas), case.batch_size)
        config.update(describe_dataset(serialized_dataset_graph(dataset).numpy(),
                                       replicas=implementation.replicas))
        for layer in model.submodules:
            if not isinstance(layer, tfrs.layers.embedding.TPUEmbedding):
                continue
            layer_optimizer = {}
            optimizer, features, tables = tfrs_embedding_parts(layer)
            if optimizer is not None:
                layer_optimizer = describe_optimizer(optimizer, "optimizer/embedding")
                config.update(layer_optimizer)
            for table_config, var in tables.items():
                found = implementation.names.canonical_of(native_name(var))
                table = found[0] if found else f"?{native_name(var)}"
                config[f"table/{table}/vocabulary_size"] = table_config.vocabulary_size
                config[f"table/{table}/dim"] = table_config.dim
                config[f"table/{table}/combiner"] = table_config.combiner
                config[f"table/{table}/initializer"] = describe_initializer(
                    table_config.initializer)
                config[f"table/{table}/features"] = sum(f.table is table_config for f in features)
                if table_config.optimizer is not None:   # only where it overrides the layer's
                    own = describe_optimizer(table_config.optimizer, "optimizer/embedding")
                    if own != layer_optimizer:
                        config.update({k.replace("optimizer/embedding", f"optimizer/embedding/{table}"): v
                                       for k, v in own.items()})
        tf.keras.backend.clear_session()
        return config

    def _strategy(self, request: RunRequest):
        import tensorflow as tf

        from verify.runners import devices

        if request.device == "tpu":
            if request.capture_steps:
                raise NotImplementedError(
                    "per-step capture under TPUStrategy is not implemented yet (the embedding "
                    "tables live in the TPU embedding engine, outside trainable_variables). Run "
                    "without --tpu for the CPU parity check.")
            return tf.distribute.TPUStrategy(devices.resolve_tpu(request.tpu_name))
        return devices.strategy_for(self.strategy, request.implementation.replicas,
                                    request.implementation.name, self.cross_device_ops)


def optimizer_slots(optimizer, variables: dict[str, Any]) -> dict[str, Any]:
    """`var::slot` -> slot variable for a legacy Keras optimizer (slots exist after a step)."""
    out = {}
    if not hasattr(optimizer, "get_slot_names"):
        return out
    for name, var in variables.items():
        for slot in optimizer.get_slot_names():
            try:
                out[f"{name}::{slot}"] = optimizer.get_slot(var, slot)
            except KeyError:
                pass
    return out


def _capturing_train_step(self, data):
    """Keras' default train_step, with the gradients aggregated explicitly and exported."""
    import tensorflow as tf
    x, y, sample_weight = tf.keras.utils.unpack_x_y_sample_weight(data)
    with tf.GradientTape() as tape:
        y_pred = self(x, training=True)
        loss = self.compute_loss(x, y, y_pred, sample_weight)
    validate_target_and_loss(self, y, loss)
    variables = self.trainable_variables
    grads = tape.gradient(loss, variables)
    pairs = [(g, v) for g, v in zip(grads, variables) if g is not None]
    # The update goes through the optimizer's own aggregation, exactly as `minimize` does, so
    # capturing cannot hide a failure of the shipped path; the copy exported for the trace is
    # all-reduced separately.
    self.optimizer.apply_gradients(pairs)
    context = tf.distribute.get_replica_context()
    summed = context.all_reduce(tf.distribute.ReduceOp.SUM, [g for g, _ in pairs])
    outputs = dict(self.compute_metrics(x, y, y_pred, sample_weight))
    outputs["capture/loss"] = tf.expand_dims(context.all_reduce(tf.distribute.ReduceOp.SUM, loss), 0)
    for g, (_, v) in zip(summed, pairs):
        name = native_name(v)
        if isinstance(g, tf.IndexedSlices):
            outputs[f"capture/grad_ids/{name}"] = g.indices
            outputs[f"capture/grad_rows/{name}"] = g.values
        else:
            outputs[f"capture/grad/{name}"] = tf.expand_dims(g, 0)
    per_replica_batch = tf.shape(tf.nest.flatten(y)[0], out_type=tf.int64)[0]
    batch = dict(x) if isinstance(x, dict) else {"x": x}
    batch["label"] = y
    for name, value in batch.items():
        if isinstance(value, tf.SparseTensor):
            offset = tf.cast(context.replica_id_in_sync_group, tf.int64) * per_replica_batch
            rows = value.indices[:, :1] + offset
            outputs[f"capture/sparse_indices/{name}"] = tf.concat([rows, value.indices[:, 1:]], 1)
            outputs[f"capture/sparse_values/{name}"] = value.values
            outputs[f"capture/sparse_shape/{name}"] = tf.expand_dims(value.dense_shape, 0)
        else:
            outputs[f"capture/input/{name}"] = value
    return outputs


@functools.cache
def _capture_callback_class():
    import tensorflow as tf

    class StepCapture(tf.keras.callbacks.Callback):
        """Turn each step's outputs and the variables after it into trace records."""

        def __init__(self, trace: Trace, variables, model, request: RunRequest, replicas: int):
            super().__init__()
            self.trace, self.variables = trace, variables
            self.replicas, self._model = replicas, model

        def on_train_batch_end(self, batch, logs=None):
            step, trace, logs = batch + 1, self.trace, logs or {}
            if "capture/loss" in logs:
                self._record_step_outputs(step, logs)
            for name, v in self.variables.items():
                trace.record(step, "weight", name, v.numpy())
            for name, slot in optimizer_slots(self._model.optimizer, self.variables).items():
                trace.record(step, "slot", name, slot.numpy())

        def _record_step_outputs(self, step, logs):
            trace, n = self.trace, self.replicas
            trace.record(step, "loss", "loss", np.float32(np.asarray(logs["capture/loss"])[0]))
            batch = {}
            for key, value in logs.items():
                kind, _, name = key.partition("/")[2].partition("/")
                if kind == "grad":
                    trace.record(step, "grad", name, np.asarray(value)[0])
                elif kind == "grad_ids":
                    ids, rows = np.asarray(value), np.asarray(logs[f"capture/grad_rows/{name}"])
                    k = len(ids) // n  # every replica holds the same all-reduced rows
                    trace.record(step, "grad", name, SparseRows(
                        ids[:k], rows[:k], tuple(self.variables[name].shape)))
                elif kind == "input":
                    batch[name] = np.asarray(value)
                elif kind == "sparse_indices":
                    shapes = np.asarray(logs[f"capture/sparse_shape/{name}"])
                    batch[name] = SparseIds(
                        np.asarray(value), np.asarray(logs[f"capture/sparse_values/{name}"]),
                        (int(shapes[:, 0].sum()), int(shapes[:, 1].max())))
            for name, d in digest_batch(batch).items():
                trace.record(step, "input", name, d)

    return StepCapture
