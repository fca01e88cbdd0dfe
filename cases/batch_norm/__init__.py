"""BatchNormalization in a custom training loop: the moving statistics are state to compare.

A small classifier (Dense, BatchNormalization, ReLU, Dense) trained by a user's custom loop
(`strategy.run` + `strategy.reduce`, SGD, `compute_average_loss` over the global batch), as
its TF1 original had it: BatchNormalization with momentum 0.997, TF1's common choice.
BatchNormalization's moving mean and variance are not trainable: no gradient reaches them,
the layer updates them itself in every training forward pass, and they change what the model
predicts at serving time. They are compared as `weight` rows like every other variable.

Implementations:
- `reference-x1`: the loop without a strategy.
- `mirrored-x1`: the same loop under MirroredStrategy over one device: faithful, must PASS.
- `control-bn-momentum-x1`: the migrated loop with Keras' default momentum 0.99: gradients
  and trainable weights are the same, the moving statistics move 0.01 of the way to each
  batch's statistics instead of 0.003. Caught at step 1 on the moving statistics.
- `tf1`: the TF1 original, a `TPUEstimator` model_fn with
  `tf.compat.v1.layers.batch_normalization(momentum=0.997)` and its `UPDATE_OPS` run before the
  train op (`tf1_estimator.py`): faithful to the loop, must PASS against `reference-x1`.
- `control-tf1-bn-momentum`: that model_fn with momentum 0.99: caught at step 1 on the moving
  statistics while its gradients and trainable weights agree.
- `bn-per-replica-statistics-x2`: the faithful loop under MirroredStrategy over 2 devices,
  against the reference fed the same global batches on one device. BatchNormalization
  normalizes each replica's batch by that replica's own statistics, so the forward pass is not
  the one-device one: caught at step 1 on the loss. Only 1 replica is faithful to a one-device
  run (SyncBatchNormalization would compute the global batch's statistics).

Tolerances are 10x the reference's measured noise floor (`calibration.json`, `python -m
verify calibrate batch_norm`).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from verify import (Case, Examples, Expectation, Implementation, LoopRunner, NameMap,
                    Tolerance, Tolerances, lazy_runner)

SEED = 7
FEATURES, HIDDEN, CLASSES = 6, 8, 3
EXAMPLES, BATCH = 64, 16
TF1_MOMENTUM = 0.997      # the original's; Keras' default is 0.99

# What `python -m verify calibrate batch_norm` says to set (2026-11-27): the default gradient
# atol 1e-6 is below 10x the largest gradient floor (1.49e-7, reference-x1 step 4 dense1/kernel).
TOLERANCES = Tolerances.default().override(grad=Tolerance(atol=2e-6, rtol=1e-4))

NAMES = NameMap({
    "dense1/kernel": "dense/kernel", "dense1/bias": "dense/bias",
    "bn/gamma": "batch_normalization/gamma", "bn/beta": "batch_normalization/beta",
    "bn/moving_mean": "batch_normalization/moving_mean",
    "bn/moving_variance": "batch_normalization/moving_variance",
    "dense2/kernel": "dense_1/kernel", "dense2/bias": "dense_1/bias",
})


class BatchNormLoop:
    """The user's loop: their model, optimizer and step under `strategy.scope()`."""

    def __init__(self, strategy, context, momentum: float | None = TF1_MOMENTUM):
        import tensorflow as tf

        batch_norm = {} if momentum is None else {"momentum": momentum}
        with strategy.scope():
            self.model = tf.keras.Sequential([
                tf.keras.layers.Dense(HIDDEN),
                tf.keras.layers.BatchNormalization(**batch_norm),
                tf.keras.layers.ReLU(),
                tf.keras.layers.Dense(CLASSES)])
            self.model.build((None, FEATURES))
            self.optimizer = tf.keras.optimizers.SGD(0.1)
            loss_object = tf.keras.losses.SparseCategoricalCrossentropy(
                from_logits=True, reduction=tf.keras.losses.Reduction.NONE)
        global_batch = context.global_batch_size
        examples = context.examples
        self.dataset = strategy.experimental_distribute_dataset(
            tf.data.Dataset.from_tensor_slices((examples.features["x"], examples.labels))
            .batch(global_batch))
        model, optimizer = self.model, self.optimizer

        def train_step(inputs):
            x, y = inputs
            with tf.GradientTape() as tape:
                per_example = loss_object(y, model(x, training=True))
                loss = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch)
            gradients = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(gradients, model.trainable_variables))
            return loss

        @tf.function
        def distributed_train_step(inputs):
            losses = strategy.run(train_step, args=(inputs,))
            return strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)

        self.distributed_train_step = distributed_train_step

    def train_epoch(self) -> dict[str, float]:
        # no metric: every step's loss is compared already, and the TF1 original
        # (`tf1_estimator.py`) reports none, so a metric of the loop's alone would be a row
        # its pair cannot match
        for inputs in self.dataset:
            self.distributed_train_step(inputs)
        return {}


def loop(momentum: float | None = TF1_MOMENTUM):
    """`build_loop` for `verify.LoopRunner` with BatchNormalization's `momentum` (None: Keras'
    default)."""
    def build(strategy, context) -> BatchNormLoop:
        return BatchNormLoop(strategy, context, momentum)

    build.__qualname__ = f"BatchNormLoop(momentum={momentum})"
    return build


def tf1_runner(momentum: float = TF1_MOMENTUM, **options):
    """The TF1 side (`tf1_estimator.py`; `options` for its `EstimatorRunner`), named lazily:
    the case imports without TF."""
    return lazy_runner("cases.batch_norm.tf1_estimator:runner", momentum=momentum,
                       classes=CLASSES, hidden=HIDDEN, **options)


MOMENTUM_CAUGHT = Expectation(step=1, quantity="weight", tensor="bn/moving_*",
                              cause="state x3.333",   # (1 - 0.99) / (1 - 0.997)
                              why="gradients and trainable weights agree; the moving statistics "
                                  "move 0.01 of the way to the batch's statistics instead of "
                                  "0.003")


def make_initial_values(seed: int = SEED) -> dict[str, np.ndarray]:
    """Glorot-like kernels, zero biases, BatchNormalization's own initial values."""
    rng = np.random.default_rng(seed)

    def kernel(rows, cols):
        return (rng.normal(size=(rows, cols)) * np.sqrt(2 / (rows + cols))).astype(np.float32)

    return {"dense1/kernel": kernel(FEATURES, HIDDEN), "dense1/bias": np.zeros(HIDDEN, np.float32),
            "bn/gamma": np.ones(HIDDEN, np.float32), "bn/beta": np.zeros(HIDDEN, np.float32),
            "bn/moving_mean": np.zeros(HIDDEN, np.float32),
            "bn/moving_variance": np.ones(HIDDEN, np.float32),
            "dense2/kernel": kernel(HIDDEN, CLASSES), "dense2/bias": np.zeros(CLASSES, np.float32)}


def make_case() -> Case:
    rng = np.random.default_rng(SEED)
    # features far from zero mean and unit variance, so the moving statistics move
    features = (rng.normal(size=(EXAMPLES, FEATURES)) * 3 + 2).astype(np.float32)
    labels = rng.integers(0, CLASSES, EXAMPLES).astype(np.int32)
    steps = EXAMPLES // BATCH

    def implementation(name, replicas, description, momentum=TF1_MOMENTUM, expect=None,
                       strategy="mirrored"):
        runner = LoopRunner(loop(momentum), strategy=strategy,
                            global_batch_replicas=replicas if strategy == "default" else None)
        return Implementation(name, runner, NAMES, description=description, expect=expect,
                              replicas=replicas if strategy == "mirrored" else 1)

    implementations = (
        implementation("reference-x1", 1, "the loop without a strategy", strategy="default"),
        implementation("reference-x2", 2, "the loop without a strategy, fed the global "
                       "batches of 2 replicas", strategy="default"),
        implementation("mirrored-x1", 1, "the loop under MirroredStrategy, 1 replica"),
        implementation(
            "control-bn-momentum-x1", 1,
            "control: BatchNormalization() with Keras' default momentum 0.99 where the "
            "original has 0.997", momentum=None,
            expect=MOMENTUM_CAUGHT),
        Implementation("tf1", tf1_runner(), NAMES,
                       description="the TF1 original: TPUEstimator model_fn with "
                                   "tf.compat.v1.layers.batch_normalization(momentum=0.997)"),
        Implementation("control-tf1-bn-momentum", tf1_runner(0.99), NAMES,
                       description="control: the TF1 model_fn with momentum 0.99 where the "
                                   "original has 0.997", expect=MOMENTUM_CAUGHT),
        implementation(
            "bn-per-replica-statistics-x2", 2,
            "the loop under MirroredStrategy, 2 replicas: BatchNormalization normalizes each "
            "replica's batch by its own statistics",
            expect=Expectation(step=1, quantity="loss", cause="batch_statistics",
                               why="each replica normalizes its half of the global batch by "
                                   "that half's mean and variance, the reference by the whole "
                                   "batch's: the forward pass differs from the first step")),
    )
    return Case(
        name="batch_norm",
        description="custom loop with BatchNormalization (momentum 0.997): moving statistics "
                    "compared as weights; MirroredStrategy at 1 replica; the TF1 Estimator "
                    "original",
        examples=Examples({"x": features}, labels=labels),
        batch_size=BATCH, steps=steps, initial_values=make_initial_values(),
        implementations=implementations, reference="reference-x1",
        pairs=(("reference-x1", "mirrored-x1"), ("reference-x1", "control-bn-momentum-x1"),
               ("reference-x1", "tf1"), ("reference-x1", "control-tf1-bn-momentum"),
               ("reference-x2", "bn-per-replica-statistics-x2")),
        seed=SEED, tolerances=TOLERANCES, calibration_file=Path(__file__).with_name("calibration.json"))


def cases(options=None) -> list[Case]:
    return [make_case()]
