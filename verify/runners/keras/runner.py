"""TF2 side: build a Keras model inside a strategy scope, train it with `compile`/`fit`,
capture every step.

The model trains with its own `train_step` (Keras' default, a `tfrs.Model`'s, or the user's)
and its own `steps_per_execution`; `verify.runners.capture.taps` observes every step (its batch, the
loss it differentiates, the gradients its optimizer applies and the variables after it)
without replacing anything. The uninstrumented run (`capture_steps=False`) is read only at
execution boundaries. A resumed run (`RunRequest.restore_from`) restores a
`tf.train.Checkpoint(model=..., optimizer=...)` instead of assigning initial values (or runs
the implementation's own restore code, `RunRequest.restore_with`); the optimizer's slots and
step are restored when its first step creates them, as in a TF2 pipeline.
"""
from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import Any, Callable, ClassVar

from verify.core.case import Examples
from verify.core.runner import RunRequest
from verify.core.names import native_name
from verify.runners.run import (checked_variables, kept_variables, load_initial_values,
                                variable_shapes)
from verify.core.trace import Trace
from verify.runners.capture.mutations import gradient_transform, prepare_optimizer
from verify.runners.keras.evaluation import record_evaluation
from verify.runners.capture.step_record import StepRecorder
from verify.runners.capture.taps import StepTaps, read_snapshot
from verify.runners.capture.tables import TableCapture
from verify.runners.capture.tf_internals import (compiled_user_loss, keras_optimizer_slots,
                                         serialized_dataset_graph, tfrs_embedding_parts)


@dataclasses.dataclass(frozen=True)
class KerasRunner:
    """A TF2 Keras implementation trained with `compile`/`fit` (a tfrs `TPUEmbedding` model,
    a `tfrs.Model`, any `tf.keras.Model` with its own `train_step`). Under `--tpu` every
    KerasRunner runs under `TPUStrategy`, its tables read back through checkpoints
    (`verify.runners.keras.tpu`).

    ```python
    KerasRunner(build_model=build_model, dataset_fn=dataset_fn, steps_per_execution=10)
    ```
    """

    # mutations through its optimizer tap (verify.runners.capture.mutations); resume restores
    # RunRequest.restore_from (verify.checkpoint.resume), also with the pipeline's own code
    capabilities: ClassVar[frozenset[str]] = frozenset(
        {"tpu", "mutations", "nudges", "resume", "own_restore", "write_checkpoint",
         "keras_checkpoint_target", "layer_replay"})

    build_model: Callable[[int], Any]
    """`build_model(steps_per_execution)` -> the compiled model; called inside
    `strategy.scope()` (pass `steps_per_execution` on to `compile`)."""
    dataset_fn: Callable[[Examples, Any, int], Any]
    """`dataset_fn(examples, input_context, global_batch_size)` -> the per-replica
    `tf.data.Dataset` of `(features, labels)`, as a `DatasetCreator` function: batch with
    `input_context.get_per_replica_batch_size(global_batch_size)`; repeat for training."""
    strategy: str = "default"
    """"default" or "mirrored" (`MirroredStrategy` over `Implementation.replicas` devices)."""
    steps_per_execution: int = 1
    """Passed to `build_model`; every step is captured whatever it is."""
    eval_steps: int = 1
    """Batches of `Case.eval_examples` evaluated through `dataset_fn`."""
    cross_device_ops: str = "default"
    """MirroredStrategy only: "default" (TF's choice) or "reduction_to_one_device"; see
    `verify.runners.capture.devices.mirrored_strategy` for when the default fails."""
    capture_tables: str = "whole"
    """Tables whole every step ("whole") or by the rows each step touched ("touched_rows",
    whole every `tables_every` steps): see `verify.runners.capture.tables`."""
    tables_every: int | None = None
    """With "touched_rows": read whole tables every this many steps."""

    def __post_init__(self):
        TableCapture(self.capture_tables, self.tables_every)   # checks both

    def describe(self) -> dict[str, Any]:
        out = {"api": "tf.keras Model.compile/fit", "strategy": self.strategy,
               "steps_per_execution": self.steps_per_execution,
               **TableCapture(self.capture_tables, self.tables_every).describe()}
        if self.strategy == "mirrored":
            out["cross_device_ops"] = self.cross_device_ops
        return out

    def run(self, request: RunRequest) -> Trace:
        import tensorflow as tf

        if request.device == "tpu":   # tables in the embedding engine: verify.runners.keras.tpu
            from verify.runners.capture import tpu
            from verify.runners.keras import tpu as keras_tpu

            return keras_tpu.run_under_strategy(self, request, tpu.tpu_strategy(request.tpu_name))
        case = request.case
        strategy = self._strategy(request)
        tf.keras.backend.clear_session()          # stable layer names: dense, not dense_3
        tf.keras.utils.set_random_seed(case.seed)
        spe = self.steps_per_execution
        with strategy.scope():
            model = self.build_model(spe)
        trace = request.trace
        variables, restored = _starting_values(model, request)

        options = tf.distribute.InputOptions(experimental_fetch_to_device=False)
        train = tf.keras.utils.experimental.DatasetCreator(
            lambda ctx: self.dataset_fn(case.examples, ctx, case.batch_size), input_options=options)

        def evaluate(step):
            record_evaluation(self, model, case, trace, step)

        if request.restore_from is not None:
            evaluate(0)    # the restored model, before it trains
        if request.capture_steps:
            self._fit_captured(model, train, strategy, request, variables)
        else:
            if request.implementation.mutation is not None:
                raise ValueError("a mutation needs a captured run (capture_steps=True)")
            boundaries = _boundary_callback_class()(trace, variables, model)
            model.fit(train, epochs=1, steps_per_epoch=request.steps, verbose=0,
                      callbacks=[boundaries])
            trace.meta.capture_every = spe
        if restored is not None:   # the suite's own restore (an implementation's is observed)
            # the optimizer's slots and step exist now (its first step created them, restoring
            # them from the checkpoint): every value of the checkpoint must have found its place
            restored.assert_consumed()
        evaluate(request.steps)
        if request.checkpoint_dir is not None:
            tf.train.Checkpoint(model=model, optimizer=model.optimizer).save(
                str(Path(request.checkpoint_dir) / "ckpt"))
        trace.meta.replicas = strategy.num_replicas_in_sync
        trace.meta.details.update({"steps_per_execution": spe,
                                   "strategy": type(strategy).__name__})
        return trace

    def _fit_captured(self, model, train, strategy, request: RunRequest,
                      variables: dict[str, Any]) -> None:
        """Train under the taps: the model's own train_step runs; the taps observe its batch,
        loss, the gradients its optimizer applies and the variables after every step, also
        inside a multi-step function (steps_per_execution > 1)."""
        tables = TableCapture(self.capture_tables, self.tables_every)
        taps = StepTaps(request.trace, variables, strategy.num_replicas_in_sync,
                        lambda optimizer: keras_optimizer_slots(optimizer, variables),
                        touched_rows=tables if tables.touched else None, steps=request.steps,
                        layers=request.layers)
        mutation = request.implementation.mutation
        prepare_optimizer(model.optimizer, mutation)
        with taps.installed(strategy, model.optimizer,
                            gradient_transform(model.optimizer, mutation)):
            model.fit(train, epochs=1, steps_per_epoch=request.steps, verbose=0)
        taps.check_complete()

    def native_variables(self, case, implementation) -> dict[str, tuple]:
        """The model's variables, trainable or not (native name -> (shape, dtype)) in creation order,
        built under the default strategy without training (`python -m verify names`)."""
        import tensorflow as tf

        tf.keras.backend.clear_session()
        found = variable_shapes(kept_variables(self.build_model(self.steps_per_execution)))
        tf.keras.backend.clear_session()
        return found

    def declared_config(self, case, implementation) -> dict[str, Any]:
        """The static configuration (see `verify.runners.capture.static_config`), read from the built model and
        dataset under the default strategy, without training."""
        import tensorflow as tf
        import tensorflow_recommenders as tfrs

        from verify.runners.capture.static_config import describe_dataset, describe_initializer, describe_optimizer

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
        from verify.runners.capture import devices

        return devices.strategy_for(self.strategy, request.implementation.replicas,
                                    request.implementation.name, self.cross_device_ops)


def _starting_values(model, request: RunRequest) -> tuple[dict[str, Any], Any]:
    """The model's variables (`kept_variables`) by native name, set to where the run starts (step 0 of
    the trace): the initial values, or (resumed) the checkpoint of `restore_from`, restored by
    the suite or by the implementation's own `restore_with`. With the suite's restore status
    (None when it did not restore)."""
    trace = request.trace
    restored = None
    if request.restore_from is not None:   # resume: weights, slots and step from there
        variables = checked_variables(kept_variables(model), request)
        if request.restore_with is None:
            restored = _restore(model, Path(request.restore_from))
        else:   # the implementation's own restore code, observed as it is
            request.restore_with(model, model.optimizer,
                                 _checkpoint_prefix(Path(request.restore_from)))
        StepRecorder(trace).weights(0, ((name, read_snapshot(variable))
                                        for name, variable in variables.items()))
    else:
        variables = load_initial_values(kept_variables(model), request, trace)
    return variables, restored


def _checkpoint_prefix(directory: Path) -> str:
    """The latest checkpoint's prefix in `directory` (what `tf.train.latest_checkpoint`
    names)."""
    import tensorflow as tf

    prefix = tf.train.latest_checkpoint(str(directory))
    if prefix is None:
        raise FileNotFoundError(f"no checkpoint to resume from in {directory} (its 'checkpoint' "
                                f"file names none)")
    return prefix


def _restore(model, directory: Path):
    """Restore the latest `tf.train.Checkpoint(model=..., optimizer=...)` in `directory` into
    `model` and its optimizer, as a TF2 pipeline resumes; slots the optimizer has not created
    yet are restored when it creates them. Returns the restore status."""
    import tensorflow as tf

    return tf.train.Checkpoint(model=model, optimizer=model.optimizer).restore(
        _checkpoint_prefix(directory))


@functools.cache
def _boundary_callback_class():
    """A callback that reads the variables and slots at the end of every execution (every
    `steps_per_execution` steps): what an uninstrumented run shows."""
    import tensorflow as tf

    class ExecutionBoundaries(tf.keras.callbacks.Callback):
        def __init__(self, trace: Trace, variables, model):
            super().__init__()
            self.recorder, self.variables, self._model = StepRecorder(trace), variables, model

        def on_train_batch_end(self, batch, logs=None):
            step = batch + 1
            self.recorder.weights(step, ((name, read_snapshot(v))
                                          for name, v in self.variables.items()))
            slots = keras_optimizer_slots(self._model.optimizer, self.variables)
            self.recorder.slots(step, ((name, read_snapshot(slot)) for name, slot in slots.items()))

    return ExecutionBoundaries

