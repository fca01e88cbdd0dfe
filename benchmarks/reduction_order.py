"""Where replica-count drift comes from: gradient summation order, amplified by training.

Trains the custom-loop CNN three ways from the same weights on the same global batches:
- `full`: no strategy, one gradient over the global batch (the case's reference);
- `chunked`: no strategy, one gradient per replica-sized chunk, summed with `tf.add_n`;
- `mirrored`: MirroredStrategy over N logical CPUs, the seed's loop.
and prints the max |weight difference| between them at a few steps.

    python benchmarks/reduction_order.py --replicas 2 [--steps 100]

Measured (TF 2.15.1, 2-core x86-64 CPU, synthetic images, 16 per replica): the forward pass is
bitwise identical for any batch size; at 2 replicas `chunked` equals `mirrored` bitwise for
100 steps while `full` parts from both (4.4e-7 at step 1, 4.5e-2 at step 100); at 8 replicas
the all-reduce adds in another order than `tf.add_n`, and all three part alike.
"""
import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from verify.runners.capture.devices import configure_cpu_replicas, mirrored_strategy  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--batch-per-replica", type=int, default=16)
    args = parser.parse_args()
    configure_cpu_replicas()
    import tensorflow as tf

    from cases.custom_loop import seed_loop

    n, steps = args.replicas, args.steps
    global_batch = args.batch_per_replica * n
    rng = np.random.default_rng(0)
    images = (rng.integers(0, 256, (global_batch * 20, 28, 28, 1)) / np.float32(255)).astype(
        np.float32)
    labels = rng.integers(0, 10, len(images))
    tf.keras.utils.set_random_seed(0)
    first = seed_loop.create_model()
    first.build((None, 28, 28, 1))
    initial = [v.numpy() for v in first.trainable_variables]

    def build():
        model = seed_loop.create_model()
        model.build((None, 28, 28, 1))
        for v, value in zip(model.trainable_variables, initial):
            v.assign(value)
        loss_object = tf.keras.losses.SparseCategoricalCrossentropy(
            from_logits=True, reduction=tf.keras.losses.Reduction.NONE)
        return model, seed_loop.create_optimizer(), loss_object

    def loss_and_grads(model, loss_object, x, y):
        with tf.GradientTape() as tape:
            loss = tf.nn.compute_average_loss(loss_object(y, model(x, training=True)),
                                              global_batch_size=global_batch)
        return tape.gradient(loss, model.trainable_variables)

    def without_strategy(chunks):
        tf.keras.backend.clear_session()
        model, optimizer, loss_object = build()

        @tf.function
        def step(x, y):
            grads = [loss_and_grads(model, loss_object, xc, yc)
                     for xc, yc in zip(tf.split(x, chunks), tf.split(y, chunks))]
            summed = [tf.add_n(list(g)) for g in zip(*grads)]
            optimizer.apply_gradients(zip(summed, model.trainable_variables))

        weights = []
        for s in range(steps):
            start = (s * global_batch) % len(images)
            step(images[start:start + global_batch], labels[start:start + global_batch])
            weights.append([v.numpy() for v in model.trainable_variables])
        return weights

    def mirrored():
        tf.keras.backend.clear_session()
        strategy = mirrored_strategy(n)
        with strategy.scope():
            model, optimizer, loss_object = build()

        def train_step(inputs):
            grads = loss_and_grads(model, loss_object, *inputs)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))

        @tf.function
        def step(inputs):
            strategy.run(train_step, args=(inputs,))

        batches = iter(strategy.experimental_distribute_dataset(
            tf.data.Dataset.from_tensor_slices((images, labels)).batch(global_batch).repeat()))
        weights = []
        for _ in range(steps):
            step(next(batches))
            weights.append([v.numpy() for v in model.trainable_variables])
        return weights

    runs = {"full": without_strategy(1), "chunked": without_strategy(n), "mirrored": mirrored()}
    print(f"max |weight difference|, {n} replicas x {args.batch_per_replica} examples")
    for s in sorted({0, 9, steps // 2 - 1, steps - 1}):
        diff = {f"{a} vs {b}": max(np.abs(x - y).max() for x, y in zip(runs[a][s], runs[b][s]))
                for a, b in (("full", "mirrored"), ("chunked", "mirrored"), ("full", "chunked"))}
        print(f"  step {s + 1:4d}: " + "   ".join(f"{k} {v:.3g}" for k, v in diff.items()))


if __name__ == "__main__":
    main()
