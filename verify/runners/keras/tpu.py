"""TF2 under TPUStrategy: capture with what a TPU allows, tables read back through checkpoints.

Under `TPUStrategy` a tfrs `TPUEmbedding` layer's tables live in the TPU embedding engine. The
variables that stand for them are not trainable, are stale (refreshed only when a checkpoint
is saved: the layer's save callback retrieves them from the engine) and writing to them does
not reach the engine (restoring a checkpoint loads it). A table's gradient is applied inside
the engine through the layer's `custom_gradient` trap and never exists as a tensor. tfrs
documents a model built under a CPU strategy and one built under `TPUStrategy` as checkpoint
compatible. So a run here:

- builds the model twice with the runner's `build_model`: its **twin** under the default
  strategy (tables are ordinary variables there) and the model under the given strategy;
- loads the case's initial values into the twin and restores the twin's checkpoint into the
  model (on a TPU this loads the tables into the engine); step 0 is read back the same way;
- trains the model with its own `train_step` under the taps (`verify.runners.capture.taps`): the
  batch, the loss, the gradients the optimizer applies to the dense variables, the dense
  variables and their slots after every step, sent to the host through `host_transfer`
  (`tf.tpu.outside_compilation` on a TPU);
- every K steps (and at the last) saves the model's checkpoint and restores it into the twin
  (`TwinReadBack`): the tables and their slots are read from the twin;
- declares the table gradients not captured (`TraceMeta.not_captured`).

Nothing here needs a TPU: with the default strategy standing in for `TPUStrategy` the same
code runs on CPU (tests compare it bitwise with the ordinary capture).
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable


from verify.core.names import NameMapError, native_name
from verify.core.quantities import GRAD, SLOT, WEIGHT
from verify.core.trace import Trace
from verify.runners.capture.host_call import tables_every
from verify.runners.keras.evaluation import record_evaluation
from verify.runners.capture.mutations import gradient_transform, prepare_optimizer
from verify.core.runner import RunRequest
from verify.runners.run import checked_variables
from verify.runners.capture.step_record import StepRecorder
from verify.runners.capture.taps import StepTaps
from verify.runners.capture.tf_internals import (is_tpu_embedding_helper, keras_optimizer_slots,
                                         tfrs_embedding_parts, tfrs_table_slots)

TABLE_GRADIENT_NOT_ON_TPU = (
    "under TPUStrategy the embedding engine applies the table's gradient itself (the tfrs "
    "layer's custom-gradient trap hands it the gradient of the activations); it never exists "
    "as a tensor the host can see")


class TwinReadBack:
    """Move a model's state to and from its twin (the same model built under a CPU strategy)
    through checkpoints: `load()` restores the twin's into the model, `read()` the model's into
    the twin. Every object the receiving side has must be in the checkpoint (else it raises:
    a read-back that matched nothing would hand over stale values).

    >>> readback = TwinReadBack(model, twin, Path("/tmp/readback"))  # doctest: +SKIP
    >>> readback.read(); tables, slots = twin_tables(twin)  # doctest: +SKIP
    """

    def __init__(self, model, twin, directory: Path):
        import tensorflow as tf

        self._model = tf.train.Checkpoint(model=model)
        self._twin = tf.train.Checkpoint(model=twin)
        self._directory = Path(directory)
        self._directory.mkdir(parents=True, exist_ok=True)
        self.reads = 0

    def load(self) -> None:
        path = self._twin.write(str(self._directory / "load"))
        self._model.read(path).assert_existing_objects_matched()

    def read(self) -> None:
        path = self._model.write(str(self._directory / "read"))
        self._twin.read(path).assert_existing_objects_matched()
        self.reads += 1


def twin_tables(twin) -> tuple[dict[str, Any], dict[str, Any]]:
    """The embedding tables of every tfrs `TPUEmbedding` layer of a model built off a TPU
    (native name -> variable) and their optimizer slots (`table::slot` -> variable)."""
    import tensorflow_recommenders as tfrs

    tables, slots = {}, {}
    for layer in twin.submodules:
        if isinstance(layer, tfrs.layers.embedding.TPUEmbedding):
            tables.update({native_name(v): v for v in tfrs_embedding_parts(layer)[2].values()})
            slots.update(tfrs_table_slots(layer))
    return tables, slots


def run_under_strategy(runner, request: RunRequest, strategy) -> Trace:
    """Run a `KerasRunner`'s model under `strategy` (`TPUStrategy`, or a CPU stand-in) as a TPU
    allows: see the module docstring."""
    import tensorflow as tf

    case, trace = request.case, request.trace
    every = tables_every(request.tables_every, request.steps)
    spe = runner.steps_per_execution
    if request.capture_steps:   # tables can only be read between executions
        spe = math.gcd(spe, every)
    tf.keras.backend.clear_session()
    tf.keras.utils.set_random_seed(case.seed)
    twin = runner.build_model(spe)       # the default strategy: tables are ordinary variables
    twin_variables = checked_variables(twin.trainable_variables, request)
    tables, table_slots = twin_tables(twin)
    tf.keras.backend.clear_session()     # the model's layers get the twin's names
    tf.keras.utils.set_random_seed(case.seed)
    with strategy.scope():
        model = runner.build_model(spe)
    dense = _dense_variables(model, twin_variables, tables, request.implementation.name)
    for name, value in request.initial_values.items():
        twin_variables[name].assign(value)
    readback = TwinReadBack(model, twin, request.workdir / request.implementation.name /
                            "readback")
    readback.load()
    readback.read()
    recorder = StepRecorder(trace)
    recorder.weights(0, ((name, variable.numpy()) for name, variable in twin_variables.items()))

    def read_tables(step: int) -> None:
        readback.read()
        recorder.weights(step, ((name, variable.numpy()) for name, variable in tables.items()))
        recorder.slots(step, ((name, slot.numpy()) for name, slot in table_slots.items()))

    options = tf.distribute.InputOptions(experimental_fetch_to_device=False)
    train = tf.keras.utils.experimental.DatasetCreator(
        lambda ctx: runner.dataset_fn(case.examples, ctx, case.batch_size), input_options=options)
    if request.capture_steps:
        _fit_captured(model, train, strategy, request, dense, read_tables, every)
        for name in tables:
            recorder.not_captured(GRAD, name, TABLE_GRADIENT_NOT_ON_TPU)
            recorder.read_every(WEIGHT, name, every)
        for name in table_slots:
            recorder.read_every(SLOT, name, every)
    else:
        _fit_read_at_execution_ends(model, train, request, dense, read_tables)
        trace.meta.capture_every = spe
    record_evaluation(runner, model, case, trace, request.steps)
    trace.meta.replicas = strategy.num_replicas_in_sync
    trace.meta.details.update({"steps_per_execution": spe, "strategy": type(strategy).__name__,
                               "tables_every": every, "table_reads": readback.reads})
    return trace


def _fit_captured(model, train, strategy, request: RunRequest, dense: dict[str, Any],
                  read_tables: Callable[[int], None], every: int) -> None:
    """Train the model with its own `train_step` under the taps, which send the dense part
    every step through `host_transfer`; `read_tables(step)` every `every` steps and at the
    last."""
    from verify.runners.capture.tpu import host_transfer

    taps = StepTaps(request.trace, dense, strategy.num_replicas_in_sync,
                    lambda optimizer: keras_optimizer_slots(optimizer, dense),
                    grads_of=set(dense), host_transfer=host_transfer)
    mutation = request.implementation.mutation
    prepare_optimizer(model.optimizer, mutation)
    reads = _callback(lambda step: read_tables(step)
                      if step % every == 0 or step == request.steps else None)
    with taps.installed(strategy, model.optimizer,
                        gradient_transform(model.optimizer, mutation)):
        model.fit(train, epochs=1, steps_per_epoch=request.steps, verbose=0,
                  callbacks=[reads])
    taps.check_complete()


def _fit_read_at_execution_ends(model, train, request: RunRequest, dense: dict[str, Any],
                                read_tables: Callable[[int], None]) -> None:
    """Train uninstrumented: the dense variables and slots, and the tables through
    `read_tables`, read at the end of every execution."""
    if request.implementation.mutation is not None:
        raise ValueError("a mutation needs a captured run (capture_steps=True)")
    recorder = StepRecorder(request.trace)

    def at_boundary(step: int) -> None:
        recorder.weights(step, ((name, variable.numpy()) for name, variable in dense.items()))
        recorder.slots(step, ((name, slot.numpy()) for name, slot in
                               keras_optimizer_slots(model.optimizer, dense).items()))
        read_tables(step)

    model.fit(train, epochs=1, steps_per_epoch=request.steps, verbose=0,
              callbacks=[_callback(at_boundary)])


def _dense_variables(model, twin_variables: dict[str, Any], tables: dict[str, Any],
                     implementation: str) -> dict[str, Any]:
    """The model's trainable variables that train on the TensorCore: those the twin has,
    without the tables (trainable only off a TPU) and TensorFlow's helper weight."""
    dense, unknown = {}, []
    for variable in model.trainable_variables:
        name = native_name(variable)
        if name in tables or is_tpu_embedding_helper(name):
            continue
        if name in twin_variables:
            dense[name] = variable
        else:
            unknown.append(name)
    if unknown:
        raise NameMapError(f"{implementation}: the model built under the TPU strategy has "
                           f"variables its twin built under the default strategy has not: "
                           f"{sorted(unknown)}; the twin's are {sorted(twin_variables)}")
    return dense


def _callback(at_step):
    """A Keras callback calling `at_step(step)` at the end of every execution (every
    `steps_per_execution` steps: the only time the host can read between steps)."""
    import tensorflow as tf

    class ExecutionEnds(tf.keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            at_step(batch + 1)

    return ExecutionEnds()
