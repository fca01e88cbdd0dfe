"""Custom training loops: `strategy.run(train_step)` + `strategy.reduce(SUM)`, captured every step.

The loop is the one of TensorFlow's tutorial "Custom training with tf.distribute.Strategy",
assembled from a case's pieces (model, optimizer, loss object, loss scaling, input pipeline):

    train_step(inputs):                 # per replica, under strategy.run
        loss = scale_loss(loss_object(labels, model(images, training=True)), GLOBAL_BATCH, N)
        optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
        train_accuracy.update_state(labels, predictions)
    distributed_train_step(x):          # tf.function
        return strategy.reduce(SUM, strategy.run(train_step, args=(x,)), axis=None)

Capture: `train_step` applies the gradients the seed's way (`optimizer.apply_gradients`, which
sums them across replicas itself), and in addition all-reduces a copy of the gradients for the
trace and returns its batch, so capturing cannot change the update nor hide a failure of it.
Per step the trace holds the digest of the GLOBAL batch (per-replica batches concatenated in
replica order), the loss `distributed_train_step` returns, the summed gradients, and the
weights and optimizer slots (`var::m`, `var::v`) after the step. At the end of every complete
epoch it holds the metrics `train/loss` (the mean of the epoch's step losses, as the seed
computes it), `train/accuracy`, `test/loss` and `test/accuracy`.

The seed's three ways of iterating (`iteration`):
- "for": `for x in dist_dataset: distributed_train_step(x)`, captured from Python every step;
- "iterator": `it = iter(dist_dataset)` then `distributed_train_step(next(it))` per step;
- "epoch_function": the whole epoch in one tf.function. Per-step values leave the function in
  TensorArrays (capture "step"), or only the loss does and variables are read at epoch ends
  (capture "epoch"). The optimizer's slots are created before the first epoch (zeros, as
  `apply_gradients` would create them) so the function knows what to capture.
"""
from __future__ import annotations

import dataclasses
import math
import time
from typing import Any, Callable

import numpy as np

from verify.core.case import Examples
from verify.runners.protocol import RunRequest
from verify.core.names import native_name
from verify.runners.run import checked_variables, load_initial_values
from verify.core.trace import Trace, digest_batch
from verify.runners.tf_internals import create_legacy_optimizer_slots

STRATEGIES = ("default", "mirrored")
ITERATIONS = ("for", "iterator", "epoch_function")
TRAIN_LOSS_TRACKING = ("returned", "mean_metric")
ROUND_TRIPS = ("", "model_and_optimizer", "model_only")
CAPTURES = ("step", "epoch")


@dataclasses.dataclass(frozen=True)
class LoopRunner:
    """A custom training loop under `MirroredStrategy` ("mirrored") or no strategy ("default").

    The case's `batch_size` is the batch per replica (the seed's `BATCH_SIZE_PER_REPLICA`); the
    global batch is `batch_size * replicas`. A single-device reference that must see the
    global batches of N replicas sets `global_batch_replicas=N`. Training runs `epochs` epochs
    or the requested number of steps, whichever ends first.

    - `create_model()`, `create_optimizer()`, `create_loss_object()` are called under the
      strategy's scope; the model is built for inputs of shape `(None, *input_shape)`.
    - `scale_loss(per_example_loss, global_batch_size, replicas)` turns the loss object's output
      into the loss one replica differentiates (the seed: `tf.nn.compute_average_loss`).
    - `dataset_fn(examples, global_batch_size, training, seed)` returns the dataset of global
      batches `(images, labels)` that `strategy.experimental_distribute_dataset` splits.
    - `train_loss`: "returned" (the seed: mean of `distributed_train_step`'s results) or
      "mean_metric" (a `tf.keras.metrics.Mean` updated with each replica's scaled loss).
    - `checkpoint_round_trip`: after training, save with `tf.train.Checkpoint`, restore into a
      fresh model (and optimizer, "model_and_optimizer") built WITHOUT a strategy, and record
      the restored weights, slots and test metrics at the last step instead of the trained ones.
    - `capture`: "step" (everything every step) or "epoch" (input digests and loss every step;
      gradients, weights and slots at epoch ends: for long runs).
    - `data` says where the examples came from; it is written into the trace's meta.

    >>> LoopRunner(create_model=create_model, create_optimizer=tf.keras.optimizers.Adam,
    ...            create_loss_object=loss_object, scale_loss=compute_average_loss,
    ...            dataset_fn=dataset_fn, input_shape=(28, 28, 1))  # doctest: +SKIP
    """

    create_model: Callable[[], Any]
    create_optimizer: Callable[[], Any]
    create_loss_object: Callable[[], Any]
    scale_loss: Callable[[Any, int, int], Any]
    dataset_fn: Callable[[Examples, int, bool, int], Any]
    input_shape: tuple[int, ...]
    strategy: str = "mirrored"
    global_batch_replicas: int | None = None
    epochs: int = 1
    iteration: str = "for"
    train_loss: str = "returned"
    checkpoint_round_trip: str = ""
    capture: str = "step"
    data: str = ""

    def __post_init__(self):
        for field, allowed in (("strategy", STRATEGIES), ("iteration", ITERATIONS),
                               ("train_loss", TRAIN_LOSS_TRACKING),
                               ("checkpoint_round_trip", ROUND_TRIPS), ("capture", CAPTURES)):
            if getattr(self, field) not in allowed:
                raise ValueError(f"LoopRunner.{field} must be one of {allowed}, "
                                 f"got {getattr(self, field)!r}")
        if self.epochs < 1:
            raise ValueError(f"LoopRunner.epochs must be >= 1, got {self.epochs}")

    def describe(self) -> dict[str, Any]:
        out = {"api": "custom training loop (strategy.run + strategy.reduce SUM)",
               "strategy": self.strategy, "iteration": self.iteration,
               "train_loss": self.train_loss, "capture_variables": self.capture,
               "epochs": self.epochs}
        if self.checkpoint_round_trip:
            out["checkpoint_round_trip"] = self.checkpoint_round_trip
        if self.data:
            out["data"] = self.data
        return out

    def declared_config(self, case, implementation) -> dict[str, Any]:
        """Not read yet for custom loops: preflight says "not declared" for their pairs."""
        return {}

    def run(self, request: RunRequest) -> Trace:
        import tensorflow as tf

        if request.device == "tpu":
            raise NotImplementedError("LoopRunner runs on CPUs and GPUs (MirroredStrategy); "
                                      "drop --tpu for this case")
        impl, case = request.implementation, request.case
        strategy = self._strategy(request)
        replicas = strategy.num_replicas_in_sync
        global_batch = case.batch_size * (self.global_batch_replicas or replicas)
        steps_per_epoch = math.ceil(len(case.examples) / global_batch)
        steps = min(request.steps, self.epochs * steps_per_epoch)

        tf.keras.backend.clear_session()          # stable layer names: conv2d, not conv2d_3
        tf.keras.utils.set_random_seed(case.seed)
        loop = _Loop.create(self, strategy, global_batch)
        trace = request.trace
        trace.meta.replicas = replicas
        trace.meta.details.update({
            "strategy": type(strategy).__name__, "global_batch_size": global_batch,
            "per_replica_batch_size": case.batch_size, "steps_per_epoch": steps_per_epoch,
            "trained_steps": steps})
        variables = load_initial_values(loop.model.trainable_variables, request, trace)

        train = strategy.experimental_distribute_dataset(
            self.dataset_fn(case.examples, global_batch, True, case.seed))
        test = None if case.eval_examples is None else strategy.experimental_distribute_dataset(
            self.dataset_fn(case.eval_examples, global_batch, False, case.seed))
        recorder = _Recorder(trace, loop, variables, steps_per_epoch,
                             every_step=request.capture_steps and self.capture == "step",
                             export=request.capture_steps)
        if self.iteration == "epoch_function":
            self._train_epoch_function(loop, recorder, train, test, steps)
        else:
            self._train_python_loop(loop, recorder, train, test, steps)
        if self.checkpoint_round_trip:
            _round_trip(self, loop, request, trace, steps, global_batch)
        trace.meta.details.update(recorder.timing())
        return trace

    # ---- the seed's loops ----

    def _train_python_loop(self, loop: "_Loop", recorder: "_Recorder", train, test, steps: int):
        """`for x in dist_dataset` ("for") or `next(iterator)` a fixed number of times
        ("iterator"): one call of the tf.function `distributed_train_step` per step."""
        distributed_train_step = loop.distributed_train_step(recorder.export)
        step = 0
        for _ in range(self.epochs):
            total_loss, num_batches = 0.0, 0

            def train_on(x):
                nonlocal step, total_loss, num_batches
                started = time.perf_counter()
                loss, captured = distributed_train_step(x)
                total_loss += loss
                num_batches += 1
                step += 1
                recorder.step(step, loss, captured, num_batches == recorder.steps_per_epoch)
                recorder.add_time(step, time.perf_counter() - started)

            if self.iteration == "for":
                for x in train:
                    if step >= steps:
                        break
                    train_on(x)
            else:
                train_iter = iter(train)
                for _ in range(recorder.steps_per_epoch):
                    if step >= steps:
                        break
                    train_on(next(train_iter))
            if num_batches == recorder.steps_per_epoch:
                recorder.epoch_end(step, total_loss / num_batches, test)
            if step >= steps:
                break
        if not recorder.export:
            recorder.trace.meta.capture_every = recorder.steps_per_epoch

    def _train_epoch_function(self, loop: "_Loop", recorder: "_Recorder", train, test,
                              steps: int):
        """The seed's `distributed_train_epoch`: the whole epoch inside one tf.function."""
        if recorder.every_step:
            loop.create_slots()
        distributed_train_epoch = loop.distributed_train_epoch(recorder.export,
                                                               recorder.every_step)
        step = 0
        for _ in range(self.epochs):
            if step >= steps:
                break
            started = time.perf_counter()
            train_loss, num_batches, captured = distributed_train_epoch(train)
            num_batches = int(num_batches)
            recorder.add_time(step + num_batches, time.perf_counter() - started, num_batches)
            if captured:
                recorder.steps_from_arrays(step, captured, limit=steps)
            step += num_batches
            if step <= steps:
                recorder.epoch_end(step, train_loss, test, read_variables=True)
        if not recorder.export:
            recorder.trace.meta.capture_every = recorder.steps_per_epoch

    def _strategy(self, request: RunRequest):
        from verify.runners import devices

        return devices.strategy_for(self.strategy, request.implementation.replicas,
                                    request.implementation.name)


def optimizer_slot_variables(optimizer, variables: dict[str, Any]) -> dict[str, Any]:
    """`var::slot` -> slot variable, for new (TF 2.11+) and legacy Keras optimizers.

    New optimizers name a slot `<scope>/<slot>/<variable name>` (`m/conv2d/kernel`, or
    `while/Adam/m/conv2d/kernel` when created inside a loop); the variable is the longest
    name that ends the slot's name.
    """
    if hasattr(optimizer, "get_slot_names"):
        from verify.runners.keras_runner import optimizer_slots

        return optimizer_slots(optimizer, variables)
    out = {}
    for slot in optimizer.variables:
        name = native_name(slot)
        owner = max((n for n in variables if name.endswith("/" + n)), key=len, default=None)
        if owner is not None:
            kind = name[:-len(owner) - 1].rsplit("/", 1)[-1]
            out[f"{owner}::{kind}"] = slot
    return out


@dataclasses.dataclass
class _Loop:
    """The seed's objects (built under one strategy) and its tf.functions."""

    runner: LoopRunner
    strategy: Any
    global_batch: int
    model: Any
    optimizer: Any
    loss_object: Any
    metrics: dict[str, Any]

    @classmethod
    def create(cls, runner: LoopRunner, strategy, global_batch: int) -> "_Loop":
        import tensorflow as tf

        with strategy.scope():
            model = runner.create_model()
            model.build((None, *runner.input_shape))
            optimizer = runner.create_optimizer()
            loss_object = runner.create_loss_object()
            metrics = {"test/loss": tf.keras.metrics.Mean(name="test_loss"),
                       "train/accuracy": tf.keras.metrics.SparseCategoricalAccuracy(
                           name="train_accuracy"),
                       "test/accuracy": tf.keras.metrics.SparseCategoricalAccuracy(
                           name="test_accuracy")}
            if runner.train_loss == "mean_metric":
                metrics["train/loss"] = tf.keras.metrics.Mean(name="train_loss")
        return cls(runner, strategy, global_batch, model, optimizer, loss_object, metrics)

    def create_slots(self) -> None:
        """Create the optimizer's slots now (zeros), as its first `apply_gradients` would."""
        variables = self.model.trainable_variables
        with self.strategy.scope():
            if hasattr(self.optimizer, "get_slot_names"):
                create_legacy_optimizer_slots(self.optimizer, variables)
            else:
                self.optimizer.build(variables)

    def train_step(self, export: bool):
        """The seed's `train_step`; with `export`, it also returns summed gradients and its batch."""
        import tensorflow as tf

        runner, model, optimizer = self.runner, self.model, self.optimizer
        replicas = self.strategy.num_replicas_in_sync
        track_loss = self.metrics.get("train/loss")

        def train_step(inputs):
            images, labels = inputs
            with tf.GradientTape() as tape:
                predictions = model(images, training=True)
                loss = runner.scale_loss(self.loss_object(labels, predictions),
                                         self.global_batch, replicas)
            gradients = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(gradients, model.trainable_variables))
            self.metrics["train/accuracy"].update_state(labels, predictions)
            if track_loss is not None:
                track_loss.update_state(loss)
            if not export:
                return loss
            summed = tf.distribute.get_replica_context().all_reduce(
                tf.distribute.ReduceOp.SUM, gradients)
            return loss, summed, images, labels

        return train_step

    def run_step(self, train_step, inputs, export: bool):
        """Cross-replica part of the seed's `distributed_train_step` (inside a tf.function)."""
        import tensorflow as tf

        strategy = self.strategy
        results = strategy.run(train_step, args=(inputs,))
        if not export:
            return strategy.reduce(tf.distribute.ReduceOp.SUM, results, axis=None), None
        loss, summed, images, labels = results
        local = strategy.experimental_local_results
        # Variables are read here, after the update (automatic control dependencies order the
        # reads after the assignments): one function call a step instead of one read each.
        variables = {native_name(v): v for v in self.model.trainable_variables}
        slots = optimizer_slot_variables(self.optimizer, variables)
        captured = {"grads": [local(g)[0] for g in summed],
                    "image": tf.concat(local(images), 0), "label": tf.concat(local(labels), 0),
                    "weights": {n: tf.identity(v) for n, v in variables.items()},
                    "slots": {n: tf.identity(v) for n, v in slots.items()}}
        return strategy.reduce(tf.distribute.ReduceOp.SUM, loss, axis=None), captured

    def distributed_train_step(self, export: bool):
        import tensorflow as tf

        train_step = self.train_step(export)

        @tf.function
        def distributed_train_step(dataset_inputs):
            return self.run_step(train_step, dataset_inputs, export)

        return distributed_train_step

    def distributed_train_epoch(self, export: bool, every_step: bool):
        """The seed's `distributed_train_epoch`; returns (mean loss, batches, captured arrays)."""
        import tensorflow as tf

        exports_step = export and every_step
        train_step = self.train_step(exports_step)
        variables = {native_name(v): v for v in self.model.trainable_variables}
        slots = optimizer_slot_variables(self.optimizer, variables) if every_step else {}

        def step_values(loss, captured):
            values = {"loss": tf.expand_dims(loss, 0)}
            if captured is not None:
                values["image"], values["label"] = captured["image"], captured["label"]
                values["batch"] = tf.shape(captured["label"])[:1]
                for name, g in zip(variables, captured["grads"]):
                    values[f"grad/{name}"] = tf.expand_dims(g, 0)
                for name, v in captured["weights"].items():
                    values[f"weight/{name}"] = tf.expand_dims(v, 0)
                for name, v in captured["slots"].items():
                    values[f"slot/{name}"] = tf.expand_dims(v, 0)
            return values

        @tf.function
        def distributed_train_epoch(dataset):
            total_loss = 0.0
            num_batches = 0
            arrays = {}
            if export:
                names = ["loss"] + (["image", "label", "batch"]
                                    + [f"grad/{n}" for n in variables]
                                    + [f"weight/{n}" for n in variables]
                                    + [f"slot/{n}" for n in slots] if every_step else [])
                arrays = {n: tf.TensorArray(tf.int32 if n == "batch" else
                                            tf.int64 if n == "label" else tf.float32,
                                            size=0, dynamic_size=True, infer_shape=False)
                          for n in names}
            for x in dataset:
                loss, captured = self.run_step(train_step, x, exports_step)
                total_loss += loss
                if export:
                    values = step_values(loss, captured)
                    arrays = {n: a.write(num_batches, tf.cast(values[n], a.dtype))
                              for n, a in arrays.items()}
                num_batches += 1
            captured_steps = {n: a.concat() for n, a in arrays.items()}
            return total_loss / tf.cast(num_batches, dtype=tf.float32), num_batches, captured_steps

        return distributed_train_epoch

    def distributed_test_step(self):
        import tensorflow as tf

        model, loss_object, metrics = self.model, self.loss_object, self.metrics

        def test_step(inputs):
            images, labels = inputs
            predictions = model(images, training=False)
            metrics["test/loss"].update_state(loss_object(labels, predictions))
            metrics["test/accuracy"].update_state(labels, predictions)

        @tf.function
        def distributed_test_step(dataset_inputs):
            return self.strategy.run(test_step, args=(dataset_inputs,))

        return distributed_test_step


class _Recorder:
    """Writes what one run trains into its trace, and times the training steps."""

    def __init__(self, trace: Trace, loop: _Loop, variables: dict[str, Any],
                 steps_per_epoch: int, every_step: bool, export: bool):
        self.trace, self.loop, self.variables = trace, loop, variables
        self.steps_per_epoch, self.every_step, self.export = steps_per_epoch, every_step, export
        self._test_step = None
        self._seconds, self._examples = 0.0, 0

    def step(self, step: int, loss, captured, epoch_end: bool) -> None:
        trace = self.trace
        trace.record(step, "loss", "loss", np.float32(loss.numpy()))
        if captured is not None:
            batch = {"image": captured["image"].numpy(), "label": captured["label"].numpy()}
            for name, d in digest_batch(batch).items():
                trace.record(step, "input", name, d)
        if not (self.every_step or epoch_end):
            return
        if captured is None:
            self.read_variables(step)
            return
        for name, g in zip(self.variables, captured["grads"]):
            trace.record(step, "grad", name, g.numpy())
        for quantity, key in (("weight", "weights"), ("slot", "slots")):
            for name, value in captured[key].items():
                trace.record(step, quantity, name, value.numpy())

    def steps_from_arrays(self, first: int, arrays: dict[str, Any], limit: int) -> None:
        """Record the per-step TensorArrays an epoch function returned (steps first+1, ...)."""
        values = {n: a.numpy() for n, a in arrays.items()}
        count = len(values["loss"])
        offsets = np.concatenate([[0], np.cumsum(values["batch"])]) if "batch" in values else None
        for i in range(count):
            step = first + i + 1
            if step > limit:
                break
            self.trace.record(step, "loss", "loss", values["loss"][i])
            if offsets is None:
                continue
            batch = {k: values[k][offsets[i]:offsets[i + 1]] for k in ("image", "label")}
            for name, d in digest_batch(batch).items():
                self.trace.record(step, "input", name, d)
            for key, array in values.items():
                quantity, _, name = key.partition("/")
                if quantity in ("grad", "weight", "slot"):
                    self.trace.record(step, quantity, name, array[i])

    def read_variables(self, step: int) -> None:
        for name, v in self.variables.items():
            self.trace.record(step, "weight", name, v.numpy())
        for name, s in optimizer_slot_variables(self.loop.optimizer, self.variables).items():
            self.trace.record(step, "slot", name, s.numpy())

    def epoch_end(self, step: int, train_loss, test, read_variables: bool = False) -> None:
        """The seed's end of epoch: evaluate on the test set, record the metrics, reset them."""
        metrics = self.loop.metrics
        if read_variables and not self.every_step:
            self.read_variables(step)
        if test is not None:
            self._test_step = self._test_step or self.loop.distributed_test_step()
            for x in test:
                self._test_step(x)
        if "train/loss" not in metrics:
            self.trace.record(step, "metric", "train/loss", np.float32(train_loss))
        for name, metric in metrics.items():
            if name.startswith("train/") or test is not None:
                self.trace.record(step, "metric", name, np.float32(metric.result().numpy()))
            metric.reset_states()

    def add_time(self, step: int, seconds: float, steps: int = 1) -> None:
        """Time spent training (and capturing); the first call, which traces, is left out."""
        if step > steps:
            self._seconds += seconds
            self._examples += steps * self.loop.global_batch

    def timing(self) -> dict[str, float]:
        if not self._seconds:
            return {}
        return {"train_seconds": round(self._seconds, 4),
                "examples_per_second": round(self._examples / self._seconds, 1)}


def _round_trip(runner: LoopRunner, loop: _Loop, request: RunRequest, trace: Trace, step: int,
                global_batch: int) -> None:
    """The seed's restore: save under the strategy, restore WITHOUT one, evaluate the restored
    model; record its weights, slots and test metrics at `step`."""
    import tensorflow as tf

    impl, case = request.implementation, request.case
    directory = request.workdir / impl.name / "training_checkpoints"
    tf.train.Checkpoint(optimizer=loop.optimizer, model=loop.model).save(str(directory / "ckpt"))

    tf.keras.backend.clear_session()
    new_model = runner.create_model()
    new_model.build((None, *runner.input_shape))
    new_optimizer = runner.create_optimizer()
    restored = {"model": new_model}
    if runner.checkpoint_round_trip == "model_and_optimizer":
        restored["optimizer"] = new_optimizer
    tf.train.Checkpoint(**restored).restore(tf.train.latest_checkpoint(str(directory)))
    restored_loop = _Loop(runner, tf.distribute.get_strategy(), global_batch, new_model,
                          new_optimizer, runner.create_loss_object(), {})
    restored_loop.create_slots()   # restored slot values land when the slots are created
    variables = checked_variables(restored_loop.model.trainable_variables, request)
    recorder = _Recorder(trace, restored_loop, variables, 0, every_step=True, export=False)
    recorder.read_variables(step)

    if case.eval_examples is None or trace.get(step, "metric", "test/accuracy") is None:
        return
    test_loss = tf.keras.metrics.Mean(name="test_loss")
    eval_accuracy = tf.keras.metrics.SparseCategoricalAccuracy(name="eval_accuracy")
    loss_object = restored_loop.loss_object

    @tf.function
    def eval_step(images, labels):
        predictions = new_model(images, training=False)
        test_loss.update_state(loss_object(labels, predictions))
        eval_accuracy(labels, predictions)

    for images, labels in runner.dataset_fn(case.eval_examples, global_batch, False, case.seed):
        eval_step(images, labels)
    trace.record(step, "metric", "test/loss", np.float32(test_loss.result().numpy()))
    trace.record(step, "metric", "test/accuracy", np.float32(eval_accuracy.result().numpy()))
