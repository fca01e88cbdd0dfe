"""Custom training loops, run as their users wrote them, captured by observation.

A custom loop is the user's own code: their model and optimizer built under
`strategy.scope()`, their `train_step`, their `distributed_train_step` (`strategy.run` +
`strategy.reduce`, clipping, several losses, whatever they wrote), their epoch loop and their
evaluation. The case hands the runner a `build_loop(strategy, context)` that builds the user's
loop object under the strategy the runner chose; the runner loads the case's initial values
into `loop.model`, calls `loop.train_epoch()` once per epoch, and records what the epoch
reports (`{"train/loss": ..., "test/accuracy": ...}`) as metrics at the epoch's last step.

Nothing of the user's step is replaced: `verify.runners.capture.taps` observes every optimizer step
(the batch each replica received through `strategy.run`, the loss it differentiated, the
gradients the optimizer applied after aggregation and clipping, the variables and slots after
the update), in any iteration style, including a whole epoch inside one `tf.function`.

The loop object the case builds needs `model`, `optimizer` and `train_epoch()`; it may add
`declared_config()` (loss reduction, loss scaling, reduce op, ...) for preflight.
"""
from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path
from typing import Any, Callable, ClassVar, Mapping

from verify.core.case import Examples
from verify.core.trace import Trace
from verify.core.runner import RunRequest, UnsupportedRequest
from verify.runners.run import (checked_variables, kept_variables, load_initial_values,
                                variable_shapes)
from verify.runners.capture.mutations import gradient_transform, prepare_optimizer
from verify.runners.capture.step_record import StepRecorder
from verify.runners.capture.taps import StepTaps
from verify.runners.capture.tf_internals import keras_optimizer_slots

STRATEGIES = ("default", "mirrored")


@dataclasses.dataclass(frozen=True)
class LoopContext:
    """What the runner gives the user's loop, `build_loop(strategy, context)`.

    - `examples`, `eval_examples`: the case's training and evaluation data
      (`verify.Examples`: `features` by name, `labels`), in training order; build the loop's
      datasets from them, unshuffled (or seeded) so every implementation sees the same batches.
    - `batch_size_per_replica`: the case's `batch_size`.
    - `global_batch_size`: `batch_size_per_replica * replicas` (or `* global_batch_replicas`
      for a single-device reference fed N replicas' global batches): batch the dataset with it
      and divide the summed per-example loss by it (`tf.nn.compute_average_loss(...,
      global_batch_size=context.global_batch_size)`).
    - `replicas`: the replicas the strategy the runner built holds (`strategy.num_replicas_in_sync`).
    - `seed`: the case's seed (the runner already called `tf.keras.utils.set_random_seed`).
    - `workdir`: a private, empty directory for the run's files (checkpoints).

    The loop object `build_loop` returns must have `model` (its variables, trainable or not,
    are loaded with the case's initial values and observed), `optimizer` (tapped at every apply)
    and `train_epoch()` (one epoch; may return a dict of metrics, recorded at the epoch's last
    step). `declared_config()` is optional: a flat dict preflight compares between two loops
    (see `verify.judge.preflight.RULES`); keys it understands:

    - `loss/reduction`: the loss object's reduction (blocking when the two differ);
    - `loss/scaling`: what the per-example loss is divided by, e.g. "sum / global batch
      (compute_average_loss)" (blocking);
    - `loop/reduce_op`: how `strategy.reduce` combines the replicas, "SUM" or "MEAN"
      (blocking);
    - `loop/clip_global_norm`, `loop/clip_where`: gradient clipping and where it happens
      (blocking);
    - `loop/train_loss_tracking`: how the reported training loss is formed (blocking);
    - `loop/steps_per_call`: steps per host call (informational: speed only);
    - any other key is compared too and is blocking when the two sides differ.

    The runner adds `data/global_batch_size` and `optimizer/model/*` (the optimizer's class and
    hyperparameters) itself.

    >>> LoopContext(None, None, 16, 32, 2, 11, Path("run")).global_batch_size
    32
    """

    examples: Examples
    eval_examples: Examples | None
    batch_size_per_replica: int
    global_batch_size: int
    replicas: int
    seed: int
    workdir: Path


@dataclasses.dataclass(frozen=True)
class RestoredState:
    """What a loop's `after_training` hands back: a model and optimizer restored from the
    trained loop's checkpoint, and the metrics it evaluated with them.

    ```python
    def after_training(loop, context):
        loop.checkpoint.save(context.workdir / "ckpt")
        model, optimizer = restore_without_strategy(context.workdir)   # your code
        return RestoredState(model, optimizer, metrics={"eval/loss": evaluate(model)})
    ```
    """

    model: Any
    """The restored model: its variables are recorded at the last step."""
    optimizer: Any
    """The restored optimizer: its slots are recorded at the last step."""
    metrics: Mapping[str, float] = dataclasses.field(default_factory=dict)
    """Metric name -> value, recorded as `metric` rows of the last step."""


@dataclasses.dataclass(frozen=True)
class LoopRunner:
    """A custom training loop under `MirroredStrategy` ("mirrored"; `TPUStrategy` under
    `--tpu`) or no strategy ("default"), built by the case's `build_loop(strategy, context)`.

    The case's `batch_size` is the batch per replica; the global batch is `batch_size *
    replicas`. A single-device reference that must see the global batches of N replicas sets
    `global_batch_replicas=N`. `epochs` epochs run, or the fewer whole epochs that cover the
    steps the session asks for (the user's loop cannot stop inside an epoch); every step
    trained is recorded.
    `after_training(loop, context)`, when given, returns a `RestoredState` (e.g. the loop
    saved, restored without a strategy and evaluated): its weights, slots and metrics are
    recorded at the last step in place of the trained ones. `data` says where the examples
    came from (written into the trace's meta). `variables_every=k` records gradients, weights
    and slots every k-th step only, for long runs.

    >>> LoopRunner(build_loop=TutorialLoop.build, epochs=2)  # doctest: +SKIP
    """

    # mutations through its optimizer tap (verify.runners.capture.mutations); CPUs and GPUs
    # (MirroredStrategy), and a TPU (a "mirrored" loop under TPUStrategy: `_strategy`)
    capabilities: ClassVar[frozenset[str]] = frozenset(
        {"tpu", "mutations", "nudges", "layer_replay"})

    build_loop: Callable[[Any, LoopContext], Any]
    """`build_loop(strategy, context)` -> your loop object (`model`, `optimizer`,
    `train_epoch()`), built under the strategy the runner chose."""
    strategy: str = "mirrored"
    """"mirrored" (`MirroredStrategy` over `Implementation.replicas` devices) or "default"."""
    global_batch_replicas: int | None = None
    """A single-device reference fed the global batches of this many replicas."""
    epochs: int = 1
    """Epochs to run (fewer when they cover the session's steps)."""
    after_training: Callable[[Any, LoopContext], RestoredState] | None = None
    """`after_training(loop, context)` -> a `RestoredState` recorded at the last step."""
    data: str = ""
    """Where the examples came from (written into the trace's meta)."""
    variables_every: int | None = None
    """Long runs: gradients, weights and slots every k-th step only (inputs and losses every
    step). None: everything every step."""

    def __post_init__(self):
        if self.strategy not in STRATEGIES:
            raise ValueError(f"LoopRunner.strategy must be one of {STRATEGIES}, "
                             f"got {self.strategy!r}")
        if self.epochs < 1:
            raise ValueError(f"LoopRunner.epochs must be >= 1, got {self.epochs}")

    def describe(self) -> dict[str, Any]:
        out = {"api": "custom training loop (the user's own step under strategy.run)",
               "strategy": self.strategy, "epochs": self.epochs,
               "build_loop": getattr(self.build_loop, "__qualname__", repr(self.build_loop))}
        if self.after_training is not None:
            out["after_training"] = getattr(self.after_training, "__qualname__",
                                            repr(self.after_training))
        if self.data:
            out["data"] = self.data
        return out

    def native_variables(self, case, implementation) -> dict[str, tuple]:
        """The loop model's variables, trainable or not (native name -> (shape, dtype)) in
        creation order, the loop built under the default strategy without training."""
        import tensorflow as tf

        tf.keras.backend.clear_session()
        loop = self.build_loop(tf.distribute.get_strategy(),
                               self._context(case, implementation.replicas, Path(".")))
        found = variable_shapes(kept_variables(loop.model))
        tf.keras.backend.clear_session()
        return found

    def declared_config(self, case, implementation) -> dict[str, Any]:
        """The loop's optimizer and global batch, plus what the loop object itself declares
        (`declared_config()`: loss reduction and scaling, reduce op), read from the loop
        built under the default strategy without training."""
        import tensorflow as tf

        from verify.runners.capture.static_config import describe_optimizer

        tf.keras.backend.clear_session()
        context = self._context(case, implementation.replicas, Path("."))
        loop = self.build_loop(tf.distribute.get_strategy(), context)
        config = {"data/global_batch_size": context.global_batch_size}
        config.update(describe_optimizer(loop.optimizer, "optimizer/model"))
        if hasattr(loop, "declared_config"):
            config.update(loop.declared_config())
        tf.keras.backend.clear_session()
        return config

    def run(self, request: RunRequest) -> Trace:
        import tensorflow as tf

        case = request.case
        strategy, on_tpu = self._strategy(request)
        replicas = strategy.num_replicas_in_sync
        context = self._context(case, replicas, request.workdir / request.implementation.name)
        steps_per_epoch = math.ceil(len(context.examples) / context.global_batch_size)
        # The user's loop runs whole epochs (it cannot be stopped inside one without changing
        # its code), on the case's own data: a shorter run asked for trains the epochs that
        # cover its steps, and every step trained is recorded and compared.
        epochs = min(self.epochs, math.ceil(request.steps / steps_per_epoch))

        tf.keras.backend.clear_session()          # stable layer names: conv2d, not conv2d_3
        tf.keras.utils.set_random_seed(case.seed)
        loop = self.build_loop(strategy, context)
        trace = request.trace
        trace.meta.replicas = replicas
        trace.meta.details.update({
            "strategy": type(strategy).__name__, "global_batch_size": context.global_batch_size,
            "per_replica_batch_size": case.batch_size, "steps_per_epoch": steps_per_epoch,
            "epochs": epochs})
        variables = load_initial_values(kept_variables(loop.model), request, trace)
        taps = self._taps(trace, variables, strategy, request.layers,
                          host_transfer=_host_transfer() if on_tpu else None)
        mutation = request.implementation.mutation
        if mutation is not None and not request.capture_steps:
            raise ValueError("a mutation needs a captured run (capture_steps=True)")
        prepare_optimizer(loop.optimizer, mutation)
        transform = gradient_transform(loop.optimizer, mutation)
        seconds = []
        for epoch in range(1, epochs + 1):
            started = time.perf_counter()
            if request.capture_steps:
                metrics = _captured_epoch(loop, taps, strategy, transform, request)
                if metrics is None:
                    trace.meta.details["stopped"] = \
                        f"after step {request.layers.step} (a layer replay)"
                    return trace
            else:
                metrics = loop.train_epoch() or {}
            seconds.append(time.perf_counter() - started)
            step = epoch * steps_per_epoch
            if not request.capture_steps:
                _record_variables(trace, step, variables, loop.optimizer)
            for name, value in metrics.items():
                StepRecorder(trace).metric(step, name, value)
        if not request.capture_steps:
            trace.meta.capture_every = steps_per_epoch
        if self.after_training is not None:
            restored = self.after_training(loop, context)
            last = epochs * steps_per_epoch
            request_variables = checked_variables(kept_variables(restored.model), request)
            _record_variables(trace, last, request_variables, restored.optimizer)
            for name, value in restored.metrics.items():
                StepRecorder(trace).metric(last, name, value)
        trace.meta.details.update(_throughput(seconds, steps_per_epoch,
                                              context.global_batch_size))
        return trace

    def _taps(self, trace: Trace, variables: dict[str, Any], strategy,
              layers=None, host_transfer=None) -> StepTaps:
        """The taps that observe every step of a run under `strategy` (and every layer of
        one, for a layer replay: `layers`; sent through `host_transfer` under TPUStrategy)."""
        if layers is not None:   # a layer replay: the user's epoch stops at its step
            layers.stop_after_step = True
        return StepTaps(trace, variables, strategy.num_replicas_in_sync,
                        lambda optimizer: keras_optimizer_slots(optimizer, variables),
                        variables_every=self.variables_every, layers=layers,
                        host_transfer=host_transfer)

    def _context(self, case, replicas: int, workdir: Path) -> LoopContext:
        global_batch = case.batch_size * (self.global_batch_replicas or replicas)
        return LoopContext(case.examples, case.eval_examples, case.batch_size, global_batch,
                           replicas, case.seed, workdir)

    def _strategy(self, request: RunRequest):
        """The run's strategy, and whether it is `TPUStrategy`. Under `--tpu` a "mirrored"
        loop (the candidate) runs under `TPUStrategy` over the TPU's cores, which must be the
        replicas the implementation asks for; a "default" loop (the one-device reference)
        runs where TensorFlow places it, the TPU VM's host CPU."""
        from verify.runners.capture import devices

        implementation = request.implementation
        if request.device == "tpu" and self.strategy == "mirrored":
            from verify.runners.capture import tpu

            if request.layers is not None:
                raise UnsupportedRequest(f"{implementation.name}: a layer replay runs on CPU "
                                         f"only, not under TPUStrategy")

            strategy = tpu.tpu_strategy(request.tpu_name)
            cores = strategy.num_replicas_in_sync
            if cores != implementation.replicas:
                raise UnsupportedRequest(
                    f"{implementation.name} asks for {implementation.replicas} replicas; "
                    f"TPUStrategy on this TPU has {cores}: run the pairs of {cores} replicas "
                    f"(--replicas {cores})")
            return strategy, True
        return devices.strategy_for(self.strategy, implementation.replicas,
                                    implementation.name), False


def _host_transfer():
    from verify.runners.capture import tpu

    return tpu.host_transfer


def _captured_epoch(loop, taps: StepTaps, strategy, transform, request: RunRequest):
    """One epoch of the user's loop under the taps: its metrics, or None when a layer replay
    ended it once its step was observed (`StepSeen`, as TensorFlow re-raises it)."""
    replay = request.layers
    try:
        with taps.installed(strategy, loop.optimizer, transform):
            metrics = loop.train_epoch()
    except Exception:   # noqa: BLE001 - StepSeen, or a failure (raised on)
        if replay is None or replay.values is None:
            raise
        return None
    taps.check_complete()
    return metrics or {}


def _record_variables(trace: Trace, step: int, variables: dict[str, Any], optimizer) -> None:
    recorder = StepRecorder(trace)
    recorder.weights(step, ((name, v.numpy()) for name, v in variables.items()))
    recorder.slots(step, ((name, slot.numpy()) for name, slot in
                           keras_optimizer_slots(optimizer, variables).items()))


def _throughput(seconds: list[float], steps_per_epoch: int, global_batch: int) -> dict:
    """Examples per second over the epochs after the first (which traces the functions)."""
    timed = seconds[1:] or seconds
    if not timed or not sum(timed):
        return {}
    return {"train_seconds": round(sum(timed), 4),
            "examples_per_second": round(len(timed) * steps_per_epoch * global_batch
                                         / sum(timed), 1)}

