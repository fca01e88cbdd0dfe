"""A fresh process's sequence of distributed runs for tests/runners/test_run_isolation.py (run
as a script).

    python tests/distributed_isolation_run.py ORDER OUT.json

Two custom-loop cases whose models differ ("small": one hidden layer, "large": three, so four
more variables), each judged reference-xN against mirrored-xN at 2 and 4 replicas. ORDER
"fresh-large" runs the large case alone (its verdicts in a fresh process); "sequence" runs the
small case, the large one, a run that sets a strategy for the whole process and never unsets
it, the small case again, and then, with the suite's fresh collective keys switched off (the
negative control), a 2-replica run of each model. Writes each pair's verdict and trace digest.
"""
from __future__ import annotations

import json
import sys

import numpy as np

from isolation_run import fingerprint

EXAMPLES, PER_REPLICA, FEATURES, CLASSES = 16, 4, 5, 3


class TinyLoop:
    """A user's loop: dense layers, SGD, `compute_average_loss`, `strategy.run` + reduce."""

    def __init__(self, strategy, context, hidden: int, set_strategy: bool = False):
        import tensorflow as tf

        if set_strategy:   # a user's notebook habit: the strategy for the whole process
            tf.distribute.experimental_set_strategy(strategy)
        with strategy.scope():
            self.model = tf.keras.Sequential(
                [tf.keras.layers.Dense(4, activation="relu") for _ in range(hidden)]
                + [tf.keras.layers.Dense(CLASSES)])
            self.model.build((None, FEATURES))
            self.optimizer = tf.keras.optimizers.SGD(0.1)
            loss_object = tf.keras.losses.SparseCategoricalCrossentropy(
                from_logits=True, reduction="none")
        batch = context.global_batch_size
        examples = context.examples
        self.dataset = strategy.experimental_distribute_dataset(
            tf.data.Dataset.from_tensor_slices((examples.features["x"], examples.labels))
            .batch(batch))
        model, optimizer = self.model, self.optimizer

        def step(inputs):
            x, y = inputs
            with tf.GradientTape() as tape:
                loss = tf.nn.compute_average_loss(loss_object(y, model(x, training=True)),
                                                  global_batch_size=batch)
            gradients = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(gradients, model.trainable_variables))
            return loss

        @tf.function
        def distributed_step(inputs):
            return strategy.reduce("SUM", strategy.run(step, args=(inputs,)), axis=None)

        self.distributed_step = distributed_step

    def train_epoch(self):
        for inputs in self.dataset:
            self.distributed_step(inputs)
        return {}


def tiny_case(name: str, hidden: int):
    from verify import Case, Examples, Implementation, LoopRunner, NameMap

    rng = np.random.default_rng(hidden)
    widths = [FEATURES] + [4] * hidden + [CLASSES]
    names, initial = {}, {}
    for i in range(hidden + 1):
        native = "dense" if i == 0 else f"dense_{i}"
        for part, shape in (("kernel", widths[i:i + 2]), ("bias", widths[i + 1:i + 2])):
            names[f"layer{i}/{part}"] = f"{native}/{part}"
            initial[f"layer{i}/{part}"] = (rng.normal(size=shape) * 0.3).astype(np.float32)

    def build(strategy, context):
        return TinyLoop(strategy, context, hidden)

    implementations = []
    for n in (2, 4):
        implementations += [
            Implementation(f"reference-x{n}", LoopRunner(build, strategy="default",
                                                         global_batch_replicas=n),
                           NameMap(names)),
            Implementation(f"mirrored-x{n}", LoopRunner(build), NameMap(names), replicas=n)]
    implementations.append(Implementation(
        "set-strategy-x2", LoopRunner(lambda s, c: TinyLoop(s, c, hidden, set_strategy=True)),
        NameMap(names), replicas=2))
    return Case(name=name, batch_size=PER_REPLICA, steps=2, initial_values=initial,
                examples=Examples({"x": rng.normal(size=(EXAMPLES, FEATURES)).astype(np.float32)},
                                  labels=rng.integers(0, CLASSES, EXAMPLES).astype(np.int32)),
                implementations=tuple(implementations), reference="reference-x2",
                pairs=(("reference-x2", "mirrored-x2"), ("reference-x4", "mirrored-x4")))


def judged(case) -> dict[str, dict[str, str]]:
    """Each pair's verdict (PASS or its first divergence) and both traces' digests."""
    from verify.judge.compare import compare_traces, first_divergence
    from verify.runners.run import run_implementation

    out = {}
    for reference, candidate in case.pairs:
        traces = [run_implementation(case, case.implementation(name))
                  for name in (reference, candidate)]
        divergence = first_divergence(compare_traces(*traces, case.tolerances))
        out[f"{case.name} {candidate}"] = {
            "verdict": "PASS" if divergence is None else divergence.describe()[:600],
            "digests": [fingerprint(t) for t in traces]}
    return out


def without_fresh_keys() -> None:
    """The negative control: every strategy numbers its collectives from the same keys again."""
    from verify.runners.capture import devices, tf_internals

    tf_internals.fresh_collective_keys = devices.fresh_collective_keys = lambda: None


def main(order: str, out: str) -> None:
    from verify.runners.capture.devices import configure_cpu_replicas
    from verify.runners.run import run_implementation

    configure_cpu_replicas()
    small, large = tiny_case("small", 1), tiny_case("large", 3)
    found = {}
    if order == "fresh-large":
        found["first"] = judged(large)
    else:
        found["first"] = judged(small)
        found["after"] = judged(large)
        leaking = run_implementation(small, small.implementation("set-strategy-x2"))
        found["leaking_error"] = leaking.error
        found["again"] = judged(small)
        found["reset_after_leak"] = leaking.meta.details.get("process_state_reset", [])
        without_fresh_keys()
        controls = [run_implementation(case, case.implementation("mirrored-x2"))
                    for case in (large, small)]
        found["control_errors"] = [t.error for t in controls]
    with open(out, "w") as f:
        json.dump(found, f)


if __name__ == "__main__":
    main(*sys.argv[1:])
