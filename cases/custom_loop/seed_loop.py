"""The seed's custom training loop (TF tutorial "Custom training with tf.distribute.Strategy"),
written as its user writes it, and the mistaken variants the negative controls use.

`TutorialLoop` is the tutorial's code with the data and the strategy handed in: the model,
optimizer, loss object and metrics built under `strategy.scope()`, its `train_step`,
`test_step`, `distributed_train_step` (`strategy.run` + `strategy.reduce(SUM)`) and its epoch
loop in the tutorial's three iteration styles. `verify.LoopRunner` runs it unchanged and
observes it. TensorFlow is imported inside the functions, so importing the case stays cheap.

Differences from the seed, each for a reason:
- the training set is shuffled with a seed (`shuffle(len, seed=...)`); the seed's unseeded
  shuffle gives every run other batches, and no two runs could be compared;
- checkpoints go to the run's work directory, and the model restored without a strategy is
  built after `tf.keras.backend.clear_session()` so that its variables keep their names.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from verify import Examples
from verify.runners.loop.runner import LoopContext, RestoredState

ITERATIONS = ("for", "iterator", "epoch_function")
LOSS_SCALINGS = ("compute_average_loss", "reduce_mean", "per_replica_batch",
                 "sum_over_batch_size")
TRAIN_LOSS_TRACKING = ("returned", "mean_metric")
CLIP_WHERE = ("after_aggregation", "per_replica")


def create_model():
    """The seed's `create_model()`, verbatim."""
    import tensorflow as tf

    return tf.keras.Sequential([
        tf.keras.layers.Conv2D(32, 3, activation="relu"),
        tf.keras.layers.MaxPooling2D(),
        tf.keras.layers.Conv2D(64, 3, activation="relu"),
        tf.keras.layers.MaxPooling2D(),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(64, activation="relu"),
        tf.keras.layers.Dense(10)])


def dataset_fn(examples: Examples, global_batch_size: int, training: bool, seed: int):
    """The seed's input pipeline: images scaled to [0, 1] with a channel axis, global batches."""
    return examples_dataset(examples, training, seed).batch(global_batch_size)


def examples_dataset(examples: Examples, training: bool, seed: int):
    """The seed's examples before batching: images scaled to [0, 1] with a channel axis; the
    training set shuffled with `seed`."""
    import tensorflow as tf

    images = examples.features["image"][..., None] / np.float32(255)
    dataset = tf.data.Dataset.from_tensor_slices((images, examples.labels))
    if training:
        dataset = dataset.shuffle(len(examples), seed=seed)
    return dataset


@dataclasses.dataclass(frozen=True)
class Variant:
    """How this loop is written: the seed's way, or with one mistake (a negative control), or
    with the user's own gradient clipping."""

    iteration: str = "for"
    loss_scaling: str = "compute_average_loss"
    train_loss: str = "returned"
    clip_global_norm: float | None = None     # the user's step clips its gradients...
    clip_where: str = "after_aggregation"     # ...summed over replicas first, or per replica
    # A single-device reference that sums like N replicas: each global batch split into the
    # N replicas' batches, their gradients summed in replica order (None: the whole batch).
    sum_like_replicas: int | None = None
    adam_epsilon: float | None = None         # None: Keras' default
    learning_rate: float | None = None        # None: Keras' default
    # The seed's `metric.reset_states()`; Keras 3 (TF 2.16+) has only `reset_state()`, which
    # Keras 2 has too: the one change the loop needs to run on TF 2.21.
    metrics_reset: str = "reset_states"
    # Keras 3 under MirroredStrategy cannot create Adam's slots inside the first distributed
    # step (TF 2.21: "You must feed a value for placeholder tensor 'cond/.../Placeholder'"):
    # the loop builds its optimizer with the model, before training.
    build_optimizer: bool = False

    def __post_init__(self):
        for field, allowed in (("iteration", ITERATIONS), ("loss_scaling", LOSS_SCALINGS),
                               ("train_loss", TRAIN_LOSS_TRACKING), ("clip_where", CLIP_WHERE)):
            if getattr(self, field) not in allowed:
                raise ValueError(f"{field} must be one of {allowed}, got {getattr(self, field)!r}")


class TutorialLoop:
    """The tutorial's objects and functions, built under `strategy`."""

    def __init__(self, strategy, context: LoopContext, variant: Variant = Variant()):
        import tensorflow as tf

        self.strategy, self.context, self.variant = strategy, context, variant
        GLOBAL_BATCH_SIZE = context.global_batch_size
        reduction = (tf.keras.losses.Reduction.SUM_OVER_BATCH_SIZE
                     if variant.loss_scaling == "sum_over_batch_size"
                     else tf.keras.losses.Reduction.NONE)
        with strategy.scope():
            self.loss_object = tf.keras.losses.SparseCategoricalCrossentropy(
                from_logits=True, reduction=reduction)

            def compute_loss(labels, predictions):
                per_example_loss = self.loss_object(labels, predictions)
                if variant.loss_scaling == "reduce_mean":
                    return tf.reduce_mean(per_example_loss)
                if variant.loss_scaling == "per_replica_batch":
                    return tf.nn.compute_average_loss(
                        per_example_loss, global_batch_size=context.batch_size_per_replica)
                if variant.loss_scaling == "sum_over_batch_size":
                    return per_example_loss
                return tf.nn.compute_average_loss(per_example_loss,
                                                  global_batch_size=GLOBAL_BATCH_SIZE)

            self.test_loss = tf.keras.metrics.Mean(name="test_loss")
            self.train_accuracy = tf.keras.metrics.SparseCategoricalAccuracy(
                name="train_accuracy")
            self.test_accuracy = tf.keras.metrics.SparseCategoricalAccuracy(name="test_accuracy")
            self.train_loss_metric = (tf.keras.metrics.Mean(name="train_loss")
                                      if variant.train_loss == "mean_metric" else None)
            self.model = create_model()
            self.model.build((None, 28, 28, 1))
            self.optimizer = create_optimizer(variant)
            if variant.build_optimizer:
                self.optimizer.build(self.model.trainable_variables)
            self.checkpoint = tf.train.Checkpoint(optimizer=self.optimizer, model=self.model)

        model, optimizer = self.model, self.optimizer

        def chunked_step(inputs, chunks):
            """Per-replica batches of one global batch, gradients summed in replica order."""
            images, labels = inputs
            size = tf.shape(labels)[0]
            sizes = size // chunks + tf.cast(tf.range(chunks) < size % chunks, tf.int32)
            total_loss, gradients = 0.0, None
            for x, y in zip(tf.split(images, sizes, num=chunks), tf.split(labels, sizes, num=chunks)):
                with tf.GradientTape() as tape:
                    predictions = model(x, training=True)
                    loss = compute_loss(y, predictions)
                chunk = tape.gradient(loss, model.trainable_variables)
                gradients = chunk if gradients is None else [a + b for a, b in zip(gradients, chunk)]
                total_loss += loss
                self.train_accuracy.update_state(y, predictions)
            if variant.clip_global_norm is not None:   # the global batch's gradient
                gradients, _ = tf.clip_by_global_norm(gradients, variant.clip_global_norm)
            optimizer.apply_gradients(zip(gradients, model.trainable_variables))
            return total_loss

        def train_step(inputs):
            if variant.sum_like_replicas:
                return chunked_step(inputs, variant.sum_like_replicas)
            images, labels = inputs
            with tf.GradientTape() as tape:
                predictions = model(images, training=True)
                loss = compute_loss(labels, predictions)
            gradients = tape.gradient(loss, model.trainable_variables)
            if variant.clip_global_norm is None:
                optimizer.apply_gradients(zip(gradients, model.trainable_variables))
            elif variant.clip_where == "after_aggregation":
                # Clip the gradient of the whole global batch: sum over replicas first, then
                # clip, and tell the optimizer not to sum again.
                gradients = tf.distribute.get_replica_context().all_reduce(
                    tf.distribute.ReduceOp.SUM, gradients)
                gradients, _ = tf.clip_by_global_norm(gradients, variant.clip_global_norm)
                optimizer.apply_gradients(zip(gradients, model.trainable_variables),
                                          skip_gradients_aggregation=True)
            else:
                # Each replica clips its own share before the optimizer sums them: not the
                # clipped gradient of the global batch.
                gradients, _ = tf.clip_by_global_norm(gradients, variant.clip_global_norm)
                optimizer.apply_gradients(zip(gradients, model.trainable_variables))
            self.train_accuracy.update_state(labels, predictions)
            if self.train_loss_metric is not None:
                self.train_loss_metric.update_state(loss)
            return loss

        def test_step(inputs):
            images, labels = inputs
            predictions = model(images, training=False)
            t_loss = self.loss_object(labels, predictions)
            self.test_loss.update_state(t_loss)
            self.test_accuracy.update_state(labels, predictions)

        @tf.function
        def distributed_train_step(dataset_inputs):
            per_replica_losses = strategy.run(train_step, args=(dataset_inputs,))
            return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica_losses, axis=None)

        @tf.function
        def distributed_test_step(dataset_inputs):
            return strategy.run(test_step, args=(dataset_inputs,))

        @tf.function
        def distributed_train_epoch(dataset):
            total_loss = 0.0
            num_batches = 0
            for x in dataset:
                per_replica_losses = strategy.run(train_step, args=(x,))
                total_loss += strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica_losses,
                                              axis=None)
                num_batches += 1
            return total_loss / tf.cast(num_batches, dtype=tf.float32)

        self.distributed_train_step = distributed_train_step
        self.distributed_test_step = distributed_test_step
        self.distributed_train_epoch = distributed_train_epoch
        self.train_dist_dataset, self.test_dist_dataset = self.distributed_datasets()
        self.steps_per_epoch = -(-len(context.examples) // GLOBAL_BATCH_SIZE)

    def distributed_datasets(self):
        """The tutorial's input: global batches of the training and test sets (None without
        one), split over the replicas by `experimental_distribute_dataset`."""
        strategy, context = self.strategy, self.context
        train = strategy.experimental_distribute_dataset(
            dataset_fn(context.examples, context.global_batch_size, True, context.seed))
        test = None if context.eval_examples is None else \
            strategy.experimental_distribute_dataset(
                dataset_fn(context.eval_examples, context.global_batch_size, False, context.seed))
        return train, test

    @classmethod
    def build(cls, strategy, context: LoopContext) -> "TutorialLoop":
        return cls(strategy, context)

    def train_epoch(self) -> dict[str, float]:
        """One pass of the tutorial's `for epoch in range(EPOCHS):` body; returns what it
        prints."""
        if self.variant.iteration == "epoch_function":
            train_loss = self.distributed_train_epoch(self.train_dist_dataset)
        else:
            total_loss = 0.0
            num_batches = 0
            if self.variant.iteration == "for":
                for x in self.train_dist_dataset:
                    total_loss += self.distributed_train_step(x)
                    num_batches += 1
            else:
                train_iter = iter(self.train_dist_dataset)
                for _ in range(self.steps_per_epoch):
                    total_loss += self.distributed_train_step(next(train_iter))
                    num_batches += 1
            train_loss = total_loss / num_batches
        if self.train_loss_metric is not None:
            train_loss = self.train_loss_metric.result()
        if self.test_dist_dataset is not None:
            for x in self.test_dist_dataset:
                self.distributed_test_step(x)
        metrics = {"train/loss": float(train_loss),
                   "train/accuracy": float(self.train_accuracy.result())}
        if self.test_dist_dataset is not None:
            metrics.update({"test/loss": float(self.test_loss.result()),
                            "test/accuracy": float(self.test_accuracy.result())})
        for metric in (self.test_loss, self.train_accuracy, self.test_accuracy,
                       self.train_loss_metric):
            if metric is not None:
                getattr(metric, self.variant.metrics_reset)()
        return metrics

    def declared_config(self) -> dict[str, Any]:
        """What preflight compares between two loops: how the loss is reduced and scaled, and
        how the replicas' losses are combined."""
        scaling = {"compute_average_loss": "sum / global batch (compute_average_loss)",
                   "reduce_mean": "mean over the replica's batch (reduce_mean)",
                   "per_replica_batch": "sum / per-replica batch",
                   "sum_over_batch_size": "the loss object's own"}[self.variant.loss_scaling]
        return {"loss/reduction": str(self.loss_object.reduction), "loss/scaling": scaling,
                "loop/reduce_op": "SUM",
                "loop/train_loss_tracking": self.variant.train_loss,
                "loop/clip_global_norm": self.variant.clip_global_norm or "none",
                "loop/clip_where": (self.variant.clip_where if self.variant.clip_global_norm
                                    else "none")}


def create_optimizer(variant: Variant = Variant()):
    """`tf.keras.optimizers.Adam()` (on TF 2.15 the new, non-legacy Keras optimizer), with the
    variant's epsilon or learning rate where it sets one."""
    import tensorflow as tf

    kwargs = {}
    if variant.adam_epsilon is not None:
        kwargs["epsilon"] = variant.adam_epsilon
    if variant.learning_rate is not None:
        kwargs["learning_rate"] = variant.learning_rate
    return tf.keras.optimizers.Adam(**kwargs)


def loop_builder(variant: Variant):
    """`build_loop` for `verify.LoopRunner`: the tutorial's loop written as `variant` says."""
    def build(strategy, context: LoopContext) -> TutorialLoop:
        return TutorialLoop(strategy, context, variant)

    build.__qualname__ = f"TutorialLoop({variant})"
    return build


def restore_without_strategy(include_optimizer: bool = True):
    """The tutorial's last part as `after_training`: save the trained loop's checkpoint,
    restore it into a new model (and optimizer) built without a strategy, and evaluate the
    restored model on the test set."""
    def after_training(loop: TutorialLoop, context: LoopContext) -> RestoredState:
        import tensorflow as tf

        checkpoint_dir = str(context.workdir / "training_checkpoints")
        loop.checkpoint.save(f"{checkpoint_dir}/ckpt")

        tf.keras.backend.clear_session()
        eval_accuracy = tf.keras.metrics.SparseCategoricalAccuracy(name="eval_accuracy")
        test_loss = tf.keras.metrics.Mean(name="test_loss")
        new_model = create_model()
        new_model.build((None, 28, 28, 1))
        new_optimizer = create_optimizer(loop.variant)
        restored = {"model": new_model}
        if include_optimizer:
            restored["optimizer"] = new_optimizer
        checkpoint = tf.train.Checkpoint(**restored)
        checkpoint.restore(tf.train.latest_checkpoint(checkpoint_dir))
        new_optimizer.build(new_model.trainable_variables)   # restored slots land here
        loss_object = tf.keras.losses.SparseCategoricalCrossentropy(
            from_logits=True, reduction=tf.keras.losses.Reduction.NONE)

        @tf.function
        def eval_step(images, labels):
            predictions = new_model(images, training=False)
            test_loss.update_state(loss_object(labels, predictions))
            eval_accuracy(labels, predictions)

        metrics = {}
        if context.eval_examples is not None:
            for images, labels in dataset_fn(context.eval_examples, context.global_batch_size,
                                             False, context.seed):
                eval_step(images, labels)
            metrics = {"test/loss": float(test_loss.result()),
                       "test/accuracy": float(eval_accuracy.result())}
        return RestoredState(new_model, new_optimizer, metrics)

    after_training.__qualname__ = (f"restore_without_strategy(include_optimizer="
                                   f"{include_optimizer})")
    return after_training
