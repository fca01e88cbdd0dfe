"""Keras 3 side: build a Keras 3 model, train it with its own `compile`/`fit` step on the JAX or
the TensorFlow backend, capture every step.

The backend is the process's (`KERAS_BACKEND`, set by the environment the implementation runs
in, see `pyproject.toml`). The model trains with its own `train_step` (Keras' default for the
backend, or the user's) and its own `steps_per_execution`; `verify.runners.keras3.taps`
observes every step (its batch, the loss it differentiates, the gradients its optimizer
applies, the variables and slots after the update: the trainable variables and the model's
non-trainable weights, a BatchNormalization's moving statistics) without replacing anything. The
uninstrumented run (`capture_steps=False`) reads variables and slots after every execution.

`declared_config` reads what the pipeline declares in the keys of
`verify.runners.capture.static_config`, keras-rs `DistributedEmbedding` tables included: each table's
vocabulary, dim, combiner, initializer and the optimizer keras-rs would hand to the TPU
embedding engine for it (`optimizer/embedding/*`; on CPU the compile optimizer trains the
tables instead, so only preflight can compare it).
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Mapping

from verify.core.case import Examples
from verify.core.names import NameMap
from verify.core.trace import Trace
from verify.core.runner import RunRequest
from verify.runners.capture.host_call import tables_every
from verify.runners.capture.step_record import StepRecorder
from verify.runners.capture.keras3_internals import (all_layers, distributed_embedding_tables,
                                                     is_distributed_embedding, is_gradient_trap,
                                                     optimizer_slots, sync_jax_state,
                                                     table_placement, tpu_table_optimizer)

if TYPE_CHECKING:
    from verify.runners.keras3.tpu import EngineTables


@dataclasses.dataclass(frozen=True)
class Keras3Runner:
    """A Keras 3 implementation trained with `compile`/`fit`.

    `build_model(steps_per_execution)` returns the compiled model, its variables built (pass
    `steps_per_execution` on to `compile`). `dataset_fn(examples, global_batch_size)` returns
    what `fit` reads: a `tf.data.Dataset` (repeated for training; both backends read it) whose
    elements are `(features, labels)`. `weighted_ids` names, for sparse features fed as dense
    ids + 0/1 weights (keras-rs' input format on JAX), the weights feature of each ids
    feature, so that the batch digests as the sparse feature it is. One replica, on CPU or,
    with `--tpu`, on one TPU core (`verify.runners.keras3.tpu`).

    >>> Keras3Runner(build_model=build, dataset_fn=dataset)  # doctest: +SKIP
    """

    # one replica, on CPU or a TPU (`verify.runners.keras3.tpu`); mutants and nudges run in
    # the suite's own environment only
    capabilities: ClassVar[frozenset[str]] = frozenset({"tpu"})

    build_model: Callable[[int], Any]
    dataset_fn: Callable[[Examples, int], Any]
    steps_per_execution: int = 1
    eval_steps: int = 1
    weighted_ids: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def describe(self) -> dict[str, Any]:
        keras = _keras3()
        out = {"api": "Keras 3 Model.compile/fit", "backend": keras.backend.backend(),
               "keras": keras.__version__, "steps_per_execution": self.steps_per_execution}
        for module in ("keras_rs", "jax", "tensorflow"):
            version = _version(module)
            if version:
                out[module.replace("_", "-")] = version
        return out

    def run(self, request: RunRequest) -> Trace:
        from verify.runners.keras3 import tpu

        keras = _keras3()
        case = request.case
        if request.implementation.replicas != 1:
            raise NotImplementedError("the Keras 3 runner trains one replica (Implementation("
                                      f"replicas=1)), not {request.implementation.replicas}")
        backend = keras.backend.backend()
        strategy = tpu.tpu_strategy_for(backend, request)
        scope = strategy.scope if strategy is not None else contextlib.nullcontext
        on_tpu = request.device == "tpu"
        every = tables_every(request.tables_every, request.steps)
        spe = self.steps_per_execution
        if on_tpu and request.capture_steps:   # the engine is read between executions only
            spe = math.gcd(spe, every)
        keras.backend.clear_session()          # stable layer names: dense, not dense_3
        keras.utils.set_random_seed(case.seed)
        with scope():
            model = self.build_model(spe)
        trace = request.trace
        engine = tpu.EngineTables(model, backend, request.workdir / request.implementation.name
                                  / "engine")
        variables = load_initial_values(model, request, trace, engine)
        self._train(model, request, variables, engine, strategy, every, spe)
        if engine:
            tpu.declare_engine_reads(engine, trace, every if request.capture_steps else spe,
                                     request.capture_steps)
        trace.meta.replicas = 1
        trace.meta.details.update({"steps_per_execution": spe, "keras_backend": backend})
        if on_tpu:
            trace.meta.details.update({
                "strategy": type(strategy).__name__ if strategy else "jax default device",
                "tables_in_engine": len(engine.tables), "table_reads": engine.reads})
        return trace

    def _train(self, model, request: RunRequest, variables: dict[str, Any], engine,
               strategy, every: int, spe: int) -> None:
        """Train with the model's own `fit` (under `strategy` when given) and evaluate,
        captured every step by the taps, or read at execution ends; the engine's tables are
        read every `every` steps (every execution when uncaptured)."""
        from verify.runners.capture.tpu import host_transfer
        from verify.runners.keras3 import tpu
        from verify.runners.keras3.taps import Keras3Taps

        case, trace, backend = request.case, request.trace, _keras3().backend.backend()
        scope = strategy.scope if strategy is not None else contextlib.nullcontext
        jax_model = model if backend == "jax" else None
        train = self.dataset_fn(case.examples, case.batch_size)
        with scope():
            if request.capture_steps:
                taps = Keras3Taps(trace, variables, backend, self.weighted_ids,
                                  host_transfer=host_transfer if strategy else None)
                reads = [tpu.engine_reads(engine, trace, request.steps, every, jax_model)
                         ] if engine else []
                with taps.installed(model):
                    model.fit(train, epochs=1, steps_per_epoch=request.steps, verbose=0,
                              callbacks=[_at_execution_ends(*reads)] if reads else [])
                taps.check_complete()
                if taps.recorded != request.steps:
                    raise RuntimeError(f"capture saw {taps.recorded} of {request.steps} steps: "
                                       f"the model's step did not go through the tapped calls")
            else:
                reads = [_boundary_reads(trace, variables, model)] + (
                    [tpu.engine_reads(engine, trace, request.steps, 1, jax_model)]
                    if engine else [])
                model.fit(train, epochs=1, steps_per_epoch=request.steps, verbose=0,
                          callbacks=[_at_execution_ends(*reads)])
                trace.meta.capture_every = spe
            if case.eval_examples is not None:
                result = model.evaluate(self.dataset_fn(case.eval_examples, case.batch_size),
                                        steps=self.eval_steps, return_dict=True, verbose=0)
                StepRecorder(trace).evaluation(request.steps, result)

    def declared_config(self, case, implementation) -> dict[str, Any]:
        """The static configuration (see `verify.runners.capture.static_config`), read from the built
        model and dataset without training."""
        import tensorflow as tf

        from verify.runners.capture.static_config import describe_dataset, describe_optimizer
        from verify.runners.capture.tf_internals import serialized_dataset_graph

        keras = _keras3()
        keras.backend.clear_session()
        tf.random.set_seed(None)   # an unseeded shuffle must look unseeded
        model = self.build_model(self.steps_per_execution)
        config: dict[str, Any] = {
            "loop/steps_per_call": f"steps_per_execution={self.steps_per_execution}"}
        config.update(describe_optimizer(model.optimizer, "optimizer/model"))
        config["loss/reduction"] = loss_reduction(model.loss)
        dataset = self.dataset_fn(case.examples, case.batch_size)
        config.update(describe_dataset(serialized_dataset_graph(dataset).numpy()))
        config.update(declared_tables(model, implementation.names))
        keras.backend.clear_session()
        return config


def load_initial_values(model, request: RunRequest, trace: Trace,
                        engine: "EngineTables | None" = None) -> dict[str, Any]:
    """Check the name map against every variable the model keeps (by path) and the tables
    in the TPU embedding engine (`engine`, by their default-device path), assign the case's
    initial values and record them as step 0; return the model's variables by path: the
    trainable ones and its non-trainable weights (a BatchNormalization's moving mean and
    variance); keras-rs' gradient trap, which trains nothing, its own variables for the
    engine's tables, and random seed states (not weights) left out."""
    from keras import ops

    implementation = request.implementation
    engine_own = engine.own_variables() if engine else set()
    variables = {v.path: v for v in model.trainable_variables
                 if not is_gradient_trap(v) and id(v) not in engine_own}
    variables.update({v.path: v for v in model.non_trainable_weights
                      if id(v) not in engine_own})
    shapes = {n: tuple(v.shape) for n, v in variables.items()}
    in_engine = engine.shapes() if engine else {}
    implementation.names.check_against({**shapes, **in_engine},
                                       request.case.canonical_shapes(), implementation.name)
    for name, value in request.initial_values.items():
        if name not in in_engine:
            variables[name].assign(value)
    recorder = StepRecorder(trace)
    recorder.weights(0, ((name, ops.convert_to_numpy(variable))
                          for name, variable in variables.items()))
    if engine:
        engine.load({n: v for n, v in request.initial_values.items() if n in in_engine})
        recorder.weights(0, engine.read()[0])   # read back: what the engine holds
    return variables


def loss_reduction(loss) -> str:
    """The reduction of the loss given to `compile`: a name or a `keras.losses.Loss`."""
    if loss is None or isinstance(loss, str) or not hasattr(loss, "reduction"):
        return "sum_over_batch_size"   # Keras 3's default for names and functions
    return str(loss.reduction)


def declared_tables(model, names: NameMap) -> dict[str, Any]:
    """`table/<canonical>/*` and `optimizer/embedding/*` for every keras-rs
    `DistributedEmbedding` in `model`.

    A table's optimizer is described as keras-rs hands it to the TPU embedding engine
    (`verify.runners.capture.keras3_internals.tpu_table_optimizer`), which is what trains the table
    on a SparseCore TPU; an option the engine does not support is recorded as
    `optimizer/embedding/unsupported`. The first table's optimizer is `optimizer/embedding/*`;
    a table whose optimizer differs from it adds `optimizer/embedding/<canonical table>/*`.
    """
    import keras

    from verify.runners.capture.static_config import describe_initializer

    config: dict[str, Any] = {}
    embedding_optimizers: dict[str, dict[str, Any]] = {}
    for layer in filter(is_distributed_embedding, all_layers(model)):
        for table, variable, features in distributed_embedding_tables(layer):
            found = names.canonical_of(variable.path) if variable is not None else None
            canonical = found[0] if found else f"?{table.name}"
            initializer = (keras.initializers.get(table.initializer)
                           if isinstance(table.initializer, str) else table.initializer)
            config.update({
                f"table/{canonical}/vocabulary_size": table.vocabulary_size,
                f"table/{canonical}/dim": table.embedding_dim,
                f"table/{canonical}/combiner": table.combiner,
                f"table/{canonical}/initializer": describe_initializer(initializer),
                f"table/{canonical}/features": features,
                f"table/{canonical}/placement":
                    f"{table.placement} ({table_placement(layer, table)} here)"})
            embedding_optimizers[canonical] = describe_table_optimizer(table.optimizer,
                                                                       "optimizer/embedding")
    if embedding_optimizers:
        first = next(iter(embedding_optimizers.values()))
        config.update(first)
        for canonical, described in embedding_optimizers.items():
            if described != first:
                config.update({k.replace("optimizer/embedding", f"optimizer/embedding/{canonical}"):
                               v for k, v in described.items()})
    return config


def describe_table_optimizer(optimizer, prefix: str) -> dict[str, Any]:
    """A keras-rs table optimizer as the TPU embedding engine would run it; when keras-rs
    cannot convert it, its kind and `<prefix>/unsupported` with keras-rs' reason."""
    from verify.runners.capture.static_config import describe_optimizer

    try:
        return describe_optimizer(tpu_table_optimizer(optimizer), prefix)
    except ValueError as e:
        import keras

        keras_optimizer = keras.optimizers.get(optimizer) if isinstance(optimizer, str) \
            else optimizer
        described = describe_optimizer(keras_optimizer, prefix)
        described[f"{prefix}/unsupported"] = f"keras-rs cannot run it on a TPU: {e}"
        return described


def _keras3():
    """The `keras` module, which must be Keras 3."""
    import keras

    if not str(getattr(keras, "__version__", "")).startswith("3."):
        raise RuntimeError(f"Keras3Runner needs Keras 3, this environment has Keras "
                           f"{getattr(keras, '__version__', '?')}: give the implementation a "
                           f"Keras 3 environment (Implementation(environment='keras3-jax'), "
                           f"see python -m verify envs list)")
    return keras


def _version(module: str) -> str:
    import sys

    found = sys.modules.get(module)
    return str(getattr(found, "__version__", "")) if found else ""


def _boundary_reads(trace: Trace, variables: dict[str, Any], model):
    """`at_step(step)` recording the variables and slots as they are after an execution (every
    `steps_per_execution` steps): what an uninstrumented run shows."""
    import keras

    recorder = StepRecorder(trace)

    def at_step(step: int) -> None:
        sync_jax_state(model)
        recorder.weights(step, ((name, keras.ops.convert_to_numpy(v))
                                 for name, v in variables.items()))
        recorder.slots(step, ((name, keras.ops.convert_to_numpy(slot)) for name, slot in
                               optimizer_slots(model.optimizer, variables).items()))

    return at_step


def _at_execution_ends(*at_steps):
    """A Keras 3 callback calling each `at_step(step)` at the end of every execution (the only
    time the host can read between steps)."""
    import keras

    class ExecutionEnds(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            for at_step in at_steps:
                at_step(batch + 1)

    return ExecutionEnds()
