"""TF1 side: run a real `TPUEstimator` model_fn and capture every step.

On CPU, `TPUEstimator(use_tpu=False)` runs the model_fn as a plain Estimator (the
`EmbeddingConfigSpec` is accepted and ignored; embedding columns fall back to ordinary
variables trained by the model_fn's optimizer). Initial values are loaded by warm-starting
from a checkpoint the harness writes under the model's own variable names; a resumed run
(`RunRequest.restore_from`) starts instead from a checkpoint put into its model_dir, which the
Estimator restores whole (weights, slots, global step), as TF1 resumes. Per step, a
`SessionRunHook` (`verify.runners.tf1.capture_hook`) fetches the batch, the loss and the
gradients in the same `session.run` as the train op, then reads the variables and optimizer
slots after the update. The variables are every one the model keeps, trainable or not (a
BatchNormalization's moving mean and variance), but the global step and the optimizer's own
(`verify.runners.capture.host_call.model_variables`); the warm start loads each of them with
the case's initial value.

Gradients are found without touching the model_fn: while the model_fn builds its graph,
`Optimizer.apply_gradients` records the (gradient, variable) pairs it is given. Wrapped
optimizers (`CrossShardOptimizer`) pass the aggregated gradients on to the inner optimizer, so
the recorded gradients are the ones applied.

On a TPU (`--tpu`), and on CPU with `capture="host_call"`, the step is captured instead with
what a TPU lets the host see (`verify.runners.capture.host_call`): the spec's `host_call` every step,
the input pipeline, and the tables and their slots from checkpoints every K steps.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import re
import shutil
from pathlib import Path
from typing import Any, Callable, ClassVar

import numpy as np

from verify.core.case import Examples
from verify.core.runner import RunRequest, UnsupportedRequest
from verify.core.names import native_name
from verify.core.trace import Trace
from verify.runners.capture.host_call import (HostCallCapture, embedding_feature_keys,
                                              model_variables, spec_tables, tables_every)
from verify.runners.capture.mutations import tf1_gradient_transform
from verify.runners.capture.step_record import StepRecorder
from verify.runners.capture.tables import TableCapture
from verify.runners.capture.tf_internals import recording_tf1_apply_gradients, serialized_dataset_graph
from verify.runners.tf1.capture_hook import hook_class


@dataclasses.dataclass(frozen=True)
class EstimatorRunner:
    """A TF1 Estimator implementation: a `TPUEstimator` model_fn, or a plain
    `tf.estimator.Estimator` one returning an `EstimatorSpec` (the runner runs both through
    `TPUEstimator(use_tpu=False)` on CPU).

    ```python
    EstimatorRunner(model_fn=model_fn, input_fn=input_fn)
    ```
    """

    # The Estimator restores model_dir itself (resume), with no restore code of the pipeline's
    # to call (no own_restore); only calibration's gradient nudges reach its graph.
    capabilities: ClassVar[frozenset[str]] = frozenset(
        {"tpu", "nudges", "resume", "write_checkpoint", "tf1_checkpoint_source",
         "layer_replay"})

    model_fn: Callable
    """`model_fn(features, labels, mode, params)`: the pipeline's own, returning a
    `TPUEstimatorSpec` or an `EstimatorSpec` (wrap the optimizer in `CrossShardOptimizer` only
    when `params["use_tpu"]`)."""
    input_fn: Callable[[Examples, dict], Any]
    """`input_fn(examples, params)` -> a `tf.data.Dataset` of `(features, labels)` built from
    the case's `Examples` (or read from your files: the examples then only seed the rest);
    batch with `params["batch_size"]` and `drop_remainder=True`; repeat for training."""
    embedding_config_spec: Callable[[], Any] | None = None
    """Returns the pipeline's `EmbeddingConfigSpec` (None: the model has none)."""
    iterations_per_loop: int = 10
    """`RunConfig`'s TPU loop length (on CPU: how often the host runs between checks)."""
    eval_steps: int = 1
    """Batches of `Case.eval_examples` evaluated through `input_fn`."""
    capture: str = "hook"
    """How a CPU run is observed: "hook" (a `SessionRunHook` in the train op's `session.run`)
    or "host_call" (what a TPU run always uses: `verify.runners.capture.host_call`)."""
    capture_tables: str = "whole"
    """Tables whole every step ("whole") or by the rows each step touched ("touched_rows",
    whole every `tables_every` steps): see `verify.runners.capture.tables`."""
    tables_every: int | None = None
    """With "touched_rows": read whole tables every this many steps."""

    def __post_init__(self):
        if self.capture not in ("hook", "host_call"):
            raise ValueError(f"EstimatorRunner(capture=...) is 'hook' or 'host_call', "
                             f"got {self.capture!r}")
        TableCapture(self.capture_tables, self.tables_every)   # checks both

    def describe(self) -> dict[str, Any]:
        return {"api": "tf.compat.v1.estimator.tpu.TPUEstimator",
                "iterations_per_loop": self.iterations_per_loop,
                "embedding_config_spec": self.embedding_config_spec is not None,
                "capture": self.capture,
                **TableCapture(self.capture_tables, self.tables_every).describe()}

    def run(self, request: RunRequest) -> Trace:
        impl, case = request.implementation, request.case
        on_tpu = request.device == "tpu"
        model_dir = Path(request.checkpoint_dir or request.workdir / impl.name / "model")
        warm = _warm_start(request, model_dir)
        trace = request.trace
        transform = tf1_gradient_transform(impl.mutation)
        embedding_spec = self.embedding_config_spec() if self.embedding_config_spec else None
        capture = None
        every = tables_every(request.tables_every, request.steps)
        iterations = self.iterations_per_loop
        if request.capture_steps and (on_tpu or self.capture == "host_call"):
            capture = HostCallCapture(trace, steps=request.steps, every=every, on_tpu=on_tpu)
            # a checkpoint (the tables) can only be written between TPU loops
            iterations = math.gcd(iterations, every)
        model_fn = self._capturing_model_fn(request, transform, capture, embedding_spec)
        estimator, config, use_tpu = self._estimator(
            request, model_fn, model_dir, iterations, embedding_spec, warm,
            save_every=every if capture is not None else request.steps)

        def evaluate(step):
            if case.eval_examples is not None:
                result = estimator.evaluate(
                    lambda params: self.input_fn(case.eval_examples, params), steps=self.eval_steps)
                StepRecorder(trace).evaluation(step, result)

        if request.restore_from is not None:
            evaluate(0)    # the restored model, before it trains
        train_input = lambda params: self.input_fn(case.examples, params)  # noqa: E731
        listeners = []
        if capture is not None:
            skip = embedding_feature_keys(embedding_spec)
            train_input = lambda params: capture.input_tap(  # noqa: E731
                self.input_fn(case.examples, params), case.batch_size // params["batch_size"],
                skip)
            listeners = [capture.checkpoint_listener(config.model_dir, request)]
        estimator.train(train_input, steps=request.steps, saving_listeners=listeners)
        if capture is not None:
            capture.check_complete()
        evaluate(request.steps)
        if not request.capture_steps:
            _record_final_weights(trace, estimator, request)
        trace.meta.details.update({"iterations_per_loop": iterations,
                                   "use_tpu": use_tpu, "strategy": "TPUEstimator",
                                   "capture": "host_call" if capture is not None else "hook"})
        if capture is not None:
            trace.meta.details["tables_every"] = every
        return trace

    def _capturing_model_fn(self, request: RunRequest, transform, capture, embedding_spec):
        """The pipeline's model_fn with its TF1 optimizer's apply_gradients recorded (and its
        gradients changed by `transform`, a mutation); in training the capture joins its spec:
        `capture`'s host_call, or (None) the capture hook."""
        import tensorflow as tf

        trace = request.trace

        def model_fn(features, labels, mode, params):
            training = mode == tf.estimator.ModeKeys.TRAIN
            sink = _layer_sink(request, capture) if training else None
            with recording_tf1_apply_gradients(transform) as calls, \
                    _observing_layers(request.layers, sink):
                spec = self.model_fn(features, labels, mode, params)
            if training and request.capture_steps:
                if capture is not None:
                    spec = _with_host_call(spec, capture.host_call(
                        features, labels, spec.loss, calls, spec.train_op, embedding_spec,
                        request, user_host_call=getattr(spec, "host_call", None)))
                else:
                    hook = hook_class()(trace, features, labels, spec.loss, calls, request,
                                        TableCapture(self.capture_tables, self.tables_every),
                                        layers=None if sink is None else sink.tensors)
                    spec = spec._replace(
                        training_hooks=tuple(spec.training_hooks or ()) + (hook,))
            return spec

        return model_fn

    def _estimator(self, request: RunRequest, model_fn, model_dir: Path, iterations: int,
                   embedding_spec, warm, save_every: int) -> tuple[Any, Any, bool]:
        """The `TPUEstimator` of the run, on the TPU `--tpu` names or on CPU (`use_tpu`
        False), checkpointing every `save_every` steps; with its `RunConfig` and whether it
        uses the TPU."""
        import tensorflow as tf

        tf1 = tf.compat.v1
        case = request.case
        resolver, use_tpu = None, False
        if request.device == "tpu":
            from verify.runners.capture import tpu
            resolver, use_tpu = tpu.estimator_cluster(request.tpu_name)
        config = tf1.estimator.tpu.RunConfig(
            cluster=resolver, model_dir=str(model_dir), tf_random_seed=case.seed,
            # evaluate() reads the last checkpoint; without one it silently re-initializes.
            # A host_call capture reads the tables from a checkpoint every K steps.
            save_checkpoints_steps=save_every,
            keep_checkpoint_max=1, log_step_count_steps=None, save_summary_steps=None,
            tpu_config=tf1.estimator.tpu.TPUConfig(
                iterations_per_loop=iterations,
                per_host_input_for_training=tf1.estimator.tpu.InputPipelineConfig.PER_HOST_V2))
        estimator = tf1.estimator.tpu.TPUEstimator(
            model_fn=model_fn, config=config, use_tpu=use_tpu,
            train_batch_size=case.batch_size, eval_batch_size=case.batch_size,
            embedding_config_spec=embedding_spec, warm_start_from=warm)
        return estimator, config, use_tpu

    def native_variables(self, case, implementation) -> dict[str, tuple]:
        """Every variable the model_fn's model keeps, trainable or not (native name -> (shape,
        dtype)), in creation order (`verify.runners.capture.host_call.model_variables`): the
        training graph built once on CPU, nothing run."""
        import tensorflow as tf

        from verify.runners.run import variable_shapes

        tf1 = tf.compat.v1
        with tf.Graph().as_default():
            params = {"batch_size": case.batch_size, "use_tpu": False}
            features, labels = tf1.data.make_one_shot_iterator(
                self.input_fn(case.examples, params)).get_next()
            tf1.train.create_global_step()
            with recording_tf1_apply_gradients() as calls:
                self.model_fn(features, labels, tf.estimator.ModeKeys.TRAIN, params)
            return variable_shapes(model_variables(calls).values())

    def declared_config(self, case, implementation) -> dict[str, Any]:
        """The static configuration (see `verify.runners.capture.static_config`), read by building the train
        graph once without running it."""
        import tensorflow as tf

        from verify.runners.capture.static_config import describe_dataset, describe_initializer, describe_optimizer

        tf1 = tf.compat.v1
        config: dict[str, Any] = {
            "loop/steps_per_call": f"iterations_per_loop={self.iterations_per_loop}"}
        with tf.Graph().as_default():
            params = {"batch_size": case.batch_size, "use_tpu": False}
            dataset = self.input_fn(case.examples, params)
            serialized = serialized_dataset_graph(dataset)
            features, labels = tf1.data.make_one_shot_iterator(dataset).get_next()
            tf1.train.get_or_create_global_step()
            with recording_tf1_apply_gradients() as calls:
                self.model_fn(features, labels, tf.estimator.ModeKeys.TRAIN, params)
            variables = {native_name(v): v for v in tf1.trainable_variables()}
            with tf1.Session() as session:
                config.update(describe_dataset(session.run(serialized)))
        if calls:
            config.update(describe_optimizer(calls[0][0], "optimizer/model"))
        spec = self.embedding_config_spec() if self.embedding_config_spec else None
        if spec is None:
            return config
        if spec.optimization_parameters is not None:
            config.update(describe_optimizer(spec.optimization_parameters, "optimizer/embedding"))
        tables: dict[str, list] = {}
        found_tables = spec_tables(spec, {n: tuple(v.shape) for n, v in variables.items()})
        for column in spec.feature_columns:
            rows, dim = column.get_embedding_table_size()
            var = next((n for n, columns in found_tables.items() if column in columns), None)
            found = implementation.names.canonical_of(var) if var else None
            table = found[0] if found else f"?{column.get_embedding_var_name()}"
            tables.setdefault(table, []).append(column)
            config[f"table/{table}/vocabulary_size"] = rows
            config[f"table/{table}/dim"] = dim
            config[f"table/{table}/initializer"] = describe_initializer(column.get_initializer())
        for table, columns in tables.items():
            combiners = sorted({c.get_combiner() for c in columns})
            config[f"table/{table}/combiner"] = (combiners[0] if len(combiners) == 1
                                                 else "mixed: " + ", ".join(combiners))
            config[f"table/{table}/features"] = len(columns)
        return config


def _layer_sink(request: RunRequest, capture):
    """Where a layer replay's tensors go in the training graph (None: no replay)."""
    if request.layers is None:
        return None
    if capture is not None:
        raise UnsupportedRequest(
            f"{request.implementation.name}: a layer replay observes the layers through the "
            f"capture hook of a CPU run; this run captures through host_call (a TPU, or "
            f"EstimatorRunner(capture='host_call')), which it does not reach")
    from verify.runners.capture.layer_taps import GraphSink

    return GraphSink()


def _observing_layers(recorder, sink):
    if sink is None:
        return contextlib.nullcontext()
    from verify.runners.capture.layer_taps import observing_layers

    return observing_layers(recorder, sink)


def _warm_start(request: RunRequest, model_dir: Path):
    """How the run starts: from the initial values, written to a checkpoint under the model's
    own variable names (its `WarmStartSettings`); or, resumed, from the checkpoint put into
    `model_dir`, which the Estimator restores whole (None)."""
    import tensorflow as tf

    if request.restore_from is not None:   # resume: the Estimator restores model_dir
        _start_from_checkpoint(Path(request.restore_from), model_dir)
        return None
    return tf.estimator.WarmStartSettings(
        ckpt_to_initialize_from=_write_checkpoint(
            request.initial_values, request.workdir / request.implementation.name / "init"),
        vars_to_warm_start=[re.escape(n) + ":" for n in request.initial_values])


def _write_checkpoint(values: dict[str, np.ndarray], directory) -> str:
    """Save `values` under their variable names in a TF1 checkpoint; return its prefix."""
    import tensorflow as tf

    tf1 = tf.compat.v1
    directory.mkdir(parents=True, exist_ok=True)
    with tf.Graph().as_default():
        variables = [tf1.Variable(np.asarray(v), name=n) for n, v in values.items()]
        saver = tf1.train.Saver(variables)
        with tf1.Session() as session:
            session.run(tf1.variables_initializer(variables))
            return saver.save(session, str(directory / "init.ckpt"), write_meta_graph=False)


def _start_from_checkpoint(source: Path, model_dir: Path) -> None:
    """Put the latest checkpoint of directory `source` into the empty `model_dir`, where the
    Estimator restores every variable from it (weights, slots, global step): TF1's resume."""
    import tensorflow as tf

    prefix = tf.train.latest_checkpoint(str(source))
    if prefix is None:
        raise FileNotFoundError(f"no checkpoint to resume from in {source} (its 'checkpoint' "
                                f"file names none)")
    if model_dir.exists() and any(model_dir.iterdir()):
        raise FileExistsError(f"{model_dir} is not empty: a resumed run starts in a new model_dir")
    model_dir.mkdir(parents=True, exist_ok=True)
    for part in Path(prefix).parent.glob(Path(prefix).name + ".*"):
        if part.suffix != ".meta":    # the Estimator builds its own graph
            shutil.copy2(part, model_dir / part.name)
    tf.compat.v1.train.update_checkpoint_state(str(model_dir), str(model_dir / Path(prefix).name))


def _with_host_call(spec, host_call):
    """`spec` with `host_call` in place of its own (which `host_call` already chains). A new
    `TPUEstimatorSpec`: its constructor registers the host call (`_replace` would not)."""
    import tensorflow as tf

    tpu_spec = tf.compat.v1.estimator.tpu.TPUEstimatorSpec
    if not isinstance(spec, tpu_spec):
        raise TypeError(f"the host_call capture needs the model_fn to return a TPUEstimatorSpec "
                        f"(a TPU runs only those), got {type(spec).__name__}")
    fields = spec._asdict()
    fields["host_call"] = host_call
    return tpu_spec(**fields)


def _record_final_weights(trace: Trace, estimator, request: RunRequest) -> None:
    """Uninstrumented runs: read the trained variables from the final checkpoint."""
    names = {request.implementation.names.native(c).native
             for c in request.implementation.names.entries}
    StepRecorder(trace).weights(request.steps, (
        (name, estimator.get_variable_value(name)) for name in estimator.get_variable_names()
        if name in names))
    trace.meta.capture_every = request.steps
