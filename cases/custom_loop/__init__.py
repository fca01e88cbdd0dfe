"""Custom training loop under MirroredStrategy, 1/2/4/8 replicas against one device.

The seed: TensorFlow's tutorial "Custom training with tf.distribute.Strategy" (a small CNN on
Fashion-MNIST, `compute_average_loss` over the GLOBAL batch, `strategy.run` +
`strategy.reduce(SUM)`, `tf.keras.optimizers.Adam`). Does the loop train the same numbers with
N replicas as on one device, and is the loss scaled right?

Implementations (N = 1, 2, 4, 8):
- `reference-xN`: the seed's loop WITHOUT a strategy, fed the global batches of N replicas
  (`BATCH_SIZE_PER_REPLICA * N`) in the same order, from the same initial weights.
- `mirrored-xN`: the seed's loop under MirroredStrategy over N devices (logical CPUs here),
  compared with `reference-xN` every step.
- `mirrored-x2-iterator`, `mirrored-x2-epoch-function`: the seed's two other ways to iterate,
  compared with `mirrored-x2` (the for loop).
- `mirrored-x2-restored`: trained under the strategy, saved with `tf.train.Checkpoint`,
  restored into a fresh model and optimizer without a strategy and evaluated; its last step
  holds the restored weights, slots and test metrics.
- negative controls, each with one real mistake, caught where it is wrong and harmless
  where it is not (`reduce-mean-x1`).
- the same loop on 2 worker processes under MultiWorkerMirroredStrategy (`multi-worker-2x1`,
  `multi-worker-2x2`), its references and controls: `cases.custom_loop.multi_worker`.

Tiers: the default (quick) tier trains 2 epochs over the first 640 training examples with 16
examples per replica and evaluates on the first 256 test examples; `--full` trains the seed's
10 epochs over all 60,000 with 64 per replica (gradients, weights and slots recorded at epoch
ends, inputs and losses every step). Real Fashion-MNIST when it is on disk (see
`cases.custom_loop.data`), else a synthetic set of the same shapes; the case description and
every trace's meta (`data`) say which.
"""
from __future__ import annotations

import dataclasses
import math
from pathlib import Path

from verify import (Case, Examples, Expectation, Implementation, LoopRunner, NameMap,
                    Tolerance, Tolerances)
from verify.core.case import SuiteOptions

from cases.custom_loop import multi_worker
from cases.custom_loop.seed_loop import Variant, loop_builder, restore_without_strategy
from cases.custom_loop.data import FashionMnist, load_fashion_mnist, make_initial_values

SEED = 11
REPLICAS = (1, 2, 4, 8)
STYLE_REPLICAS = 2   # iteration styles, checkpoint round trip and most controls
# The clipping user step's global norm: below the first steps' gradient norms, so it acts.
CLIP_NORM = 0.5

NAMES = NameMap({
    "conv1/kernel": "conv2d/kernel", "conv1/bias": "conv2d/bias",
    "conv2/kernel": "conv2d_1/kernel", "conv2/bias": "conv2d_1/bias",
    "dense1/kernel": "dense/kernel", "dense1/bias": "dense/bias",
    "dense2/kernel": "dense_1/kernel", "dense2/bias": "dense_1/bias",
})
# TF 2.21's tf.keras is Keras 3: a variable is known by its path under the model, and Adam
# calls its slots momentum and velocity where Keras 2 says m and v.
KERAS3_NAMES = NameMap({canonical: f"sequential/{NAMES.native(canonical).native}"
                        for canonical in NAMES.entries})
KERAS3_SLOTS = {"momentum": "m", "velocity": "v"}
DESTINATION = "tf221-keras3"   # where the loop is going: TF 2.21 with its own Keras 3


@dataclasses.dataclass(frozen=True)
class Tier:
    """How much of the seed's training a session runs."""

    name: str
    train_examples: int | None     # None: all 60,000
    test_examples: int | None      # None: all 10,000
    batch_per_replica: int
    epochs: int
    # gradients, weights and slots every step (None) or every k-th step (long runs); inputs
    # and losses are recorded every step either way
    variables_every: int | None

    def steps_per_epoch(self, data: FashionMnist, replicas: int) -> int:
        return math.ceil(len(data.train_labels) / (self.batch_per_replica * replicas))


QUICK = Tier("quick", train_examples=640, test_examples=256, batch_per_replica=16, epochs=2,
             variables_every=None)
FULL = Tier("full", train_examples=None, test_examples=None, batch_per_replica=64, epochs=10,
            variables_every=100)

# The case's own tolerances are the fallback where its calibration does not apply (real
# Fashion-MNIST, --full) and the ceiling where it does. They are what `python -m verify
# calibrate custom_loop` says to set: 10x the largest noise floor of the quick tier
# (calibration_quick.json, 2026-11-25: loss 3.0e-2, grad 8.5e-2, slot 1.5e-2, weight 1.3e-2,
# metric 1.6e-2, all at the last steps of reference-x1 / mirrored-x1), because a single-device
# run parts chaotically from itself once a ReLU or max-pool decision flips on a one-ulp
# difference (benchmarks/reduction_order.py), and a ceiling below the floor could not tell a
# mistake from that noise. Calibrated, every element is judged at 10x its own floor at its
# step, which is far tighter until the runs part (floors at step 1: 1e-8 to 1e-6).
TOLERANCES = Tolerances.default().override(
    loss=Tolerance(atol=0.3, rtol=0.0),
    grad=Tolerance(atol=0.9, rtol=0.0),
    slot=Tolerance(atol=0.2, rtol=0.0),
    weight=Tolerance(atol=0.2, rtol=0.0),
    metric=Tolerance(atol=0.2, rtol=0.0),
)


def cases(options: SuiteOptions) -> list[Case]:
    tier = FULL if options.full else QUICK
    data = load_fashion_mnist(
        options.data_dir, synthetic_seed=SEED,
        synthetic_counts=(tier.train_examples or 60000, tier.test_examples or 10000),
    ).head(tier.train_examples, tier.test_examples)
    return [build_case(data, tier, options.steps)]


def build_case(data: FashionMnist, tier: Tier, steps: int | None = None) -> Case:
    """The case for `data` at `tier`; `steps` is the session's --steps (None: whole epochs)."""
    case_steps = tier.epochs * tier.steps_per_epoch(data, 1)
    run_steps = steps or case_steps

    def runner(variant: Variant = Variant(), **changes) -> LoopRunner:
        fields = dict(build_loop=loop_builder(variant), epochs=tier.epochs, data=data.source,
                      variables_every=tier.variables_every)
        return LoopRunner(**{**fields, **changes})

    def last_step(replicas: int) -> int:
        """The last step trained: the loop runs the whole epochs that cover `run_steps`."""
        per_epoch = tier.steps_per_epoch(data, replicas)
        return min(tier.epochs, math.ceil(run_steps / per_epoch)) * per_epoch

    def implementation(name, runner_, replicas, description, expect=None, preflight_expect=(),
                       environment=None):
        caught = dict(expect=expect, preflight_expect=preflight_expect, preflight_cause=(
            f"declared {preflight_expect[0]}" if preflight_expect else ""))
        if environment:
            return Implementation(name, runner_, KERAS3_NAMES, description=description,
                                  replicas=replicas, environment=environment,
                                  slot_names=KERAS3_SLOTS, **caught)
        return Implementation(name, runner_, NAMES, description=description,
                              replicas=replicas, **caught)

    n = STYLE_REPLICAS
    implementations, pairs = [], []
    for replicas in REPLICAS:
        implementations += [
            implementation(f"reference-x{replicas}",
                           runner(strategy="default", global_batch_replicas=replicas), 1,
                           f"the seed's loop without a strategy, global batch of {replicas} "
                           f"replica(s)"),
            implementation(f"mirrored-x{replicas}", runner(), replicas,
                           f"the seed's loop under MirroredStrategy, {replicas} replica(s)")]
        pairs.append((f"reference-x{replicas}", f"mirrored-x{replicas}"))
        if replicas > 1:
            implementations.append(implementation(
                f"summed-reference-x{replicas}",
                runner(Variant(sum_like_replicas=replicas), strategy="default",
                       global_batch_replicas=replicas), 1,
                f"the seed's loop without a strategy, each global batch split into the "
                f"{replicas} replicas' batches and their gradients summed in replica order"))
            pairs.append((f"summed-reference-x{replicas}", f"mirrored-x{replicas}"))

    implementations += [
        implementation(f"mirrored-x{n}-iterator", runner(Variant(iteration="iterator")), n,
                       "the seed's loop iterated with next(iter(dist_dataset))"),
        implementation(f"mirrored-x{n}-epoch-function",
                       runner(Variant(iteration="epoch_function")), n,
                       "the seed's distributed_train_epoch: each epoch in one tf.function"),
        implementation(f"mirrored-x{n}-restored",
                       runner(after_training=restore_without_strategy()), n,
                       "trained under the strategy, checkpointed, restored without a strategy "
                       "into a fresh model and optimizer; last step = the restored state"),
        implementation("clipped-reference-x1",
                       runner(Variant(clip_global_norm=CLIP_NORM), strategy="default"), 1,
                       f"the user's step clips its gradients to global norm {CLIP_NORM}, one "
                       f"device"),
        implementation(f"clipped-mirrored-x{n}",
                       runner(Variant(clip_global_norm=CLIP_NORM)), n,
                       f"the user's step clips its gradients to global norm {CLIP_NORM}, "
                       f"MirroredStrategy"),
        implementation(f"clipped-reference-x{n}",
                       runner(Variant(clip_global_norm=CLIP_NORM), strategy="default",
                              global_batch_replicas=n), 1,
                       f"the user's clipping step without a strategy, global batch of {n}"),
        implementation(f"clipped-summed-reference-x{n}",
                       runner(Variant(clip_global_norm=CLIP_NORM, sum_like_replicas=n),
                              strategy="default", global_batch_replicas=n), 1,
                       f"the clipping step without a strategy, gradients of the {n} replicas' "
                       f"batches summed in replica order (calibration's other summation order)"),
    ]
    pairs += [(f"mirrored-x{n}", f"mirrored-x{n}-iterator"),
              (f"mirrored-x{n}", f"mirrored-x{n}-epoch-function"),
              (f"mirrored-x{n}", f"mirrored-x{n}-restored"),
              (f"clipped-reference-x{n}", f"clipped-mirrored-x{n}")]

    # The same loop at its destination, TF 2.21 and Keras 3 optimizers, against the TF 2.15
    # references and the same strategy on TF 2.15.
    keras3 = Variant(metrics_reset="reset_state", build_optimizer=True)
    for replicas in (1, n):
        implementations.append(implementation(
            f"mirrored-x{replicas}-{DESTINATION}", runner(keras3), replicas,
            f"the seed's loop under MirroredStrategy, {replicas} replica(s), on TF 2.21 with "
            f"its Keras 3 (a worker process of environment {DESTINATION}); metrics reset with "
            f"reset_state() and Adam built before training, as Keras 3 requires",
            environment=DESTINATION))
        pairs += [(f"reference-x{replicas}", f"mirrored-x{replicas}-{DESTINATION}"),
                  (f"mirrored-x{replicas}", f"mirrored-x{replicas}-{DESTINATION}")]
    pairs.append((f"summed-reference-x{n}", f"mirrored-x{n}-{DESTINATION}"))
    implementations.append(implementation(
        f"control-unchanged-loop-x{n}-{DESTINATION}", runner(), n,
        "control: the TF 2.15 loop moved to TF 2.21 unchanged",
        expect=Expectation(step=1, quantity="run",
                           why="under MirroredStrategy Keras 3 cannot create Adam's slots in "
                               "the first distributed step; built up front, the loop would "
                               "still raise at its first epoch's end (no reset_states())"),
        environment=DESTINATION))
    pairs.append((f"reference-x{n}", f"control-unchanged-loop-x{n}-{DESTINATION}"))
    implementations.append(implementation(
        f"control-adam-epsilon-x{n}-{DESTINATION}",
        runner(dataclasses.replace(keras3, adam_epsilon=1e-8)), n,
        "control: the Keras 3 loop with Adam(epsilon=1e-8), TF1's default, where the seed "
        "uses 1e-7",
        expect=Expectation(step=1, quantity="weight", cause="epsilon x0.1",
                           why="gradients and Adam's m and v agree; "
                           "the first update divides by sqrt(v) + epsilon"),
        environment=DESTINATION))
    pairs.append((f"mirrored-x{n}", f"control-adam-epsilon-x{n}-{DESTINATION}"))

    # reduce_mean divides by the batch a replica holds: right on one device as long as every
    # batch is full; the last batch of an epoch of 60,000 at 64 is not.
    partial = len(data.train_labels) % tier.batch_per_replica
    implementations.append(implementation(
        "reduce-mean-x1", runner(Variant(loss_scaling="reduce_mean")), 1,
        "control: tf.reduce_mean on one device; harmless while every batch is full, so only "
        "preflight (the declared loss scaling) can flag it"
        if not partial else
        "control: tf.reduce_mean on one device; the epoch's last, partial batch is divided by "
        "its own size, not the global batch size",
        expect=None if not partial else Expectation(
            step=tier.steps_per_epoch(data, 1), quantity="loss",
            cause=f"loss_scale x{tier.batch_per_replica / partial if partial else 1:g}",
            why=f"the last batch of the epoch holds {partial} examples; reduce_mean divides by "
                f"{partial}, compute_average_loss by {tier.batch_per_replica}"),
        preflight_expect=("loss/scaling",)))
    pairs.append(("reference-x1", "reduce-mean-x1"))

    controls = [
        ("control-reduce-mean", n, runner(Variant(loss_scaling="reduce_mean")),
         "tf.reduce_mean instead of tf.nn.compute_average_loss",
         Expectation(step=1, quantity="loss", tensor="loss", cause=f"loss_scale x{n}",
                     why=f"each replica divides by its own batch, not the global one: the "
                         f"summed loss is {n}x the true loss from the first step")),
        ("control-per-replica-divisor", 4, runner(Variant(loss_scaling="per_replica_batch")),
         "compute_average_loss(global_batch_size=BATCH_SIZE_PER_REPLICA)",
         Expectation(step=1, quantity="loss", tensor="loss", cause="loss_scale x4",
                     why="divided by the per-replica batch: loss and gradients 4x too large")),
        ("control-mean-metric-loss", n, runner(Variant(train_loss="mean_metric")),
         "training loss tracked with tf.keras.metrics.Mean over each replica's scaled loss",
         Expectation(step=tier.steps_per_epoch(data, n), quantity="metric", tensor="train/loss",
                     cause=f"metric x{1 / n:g}",
                     why=f"training is right; the tracked loss is the mean of per-replica "
                         f"losses that are each 1/{n} of the loss: off by the replica count")),
        ("control-sum-over-batch-size", n, runner(Variant(loss_scaling="sum_over_batch_size")),
         "Keras loss with reduction SUM_OVER_BATCH_SIZE inside strategy.run",
         Expectation(step=1, quantity="run",
                     why="TF refuses SUM_OVER_BATCH_SIZE under a strategy while tracing the "
                         "first step, before any collective runs")),
        ("control-restore-model-only", n,
         runner(after_training=restore_without_strategy(include_optimizer=False)),
         "checkpoint restored into the model only; the optimizer starts fresh",
         Expectation(step=last_step(n), quantity="slot", cause="slot_not_restored",
                     why="the restored weights are right, Adam's m and v are zeros"),
         f"mirrored-x{n}"),
        ("control-clip-per-replica", n,
         runner(Variant(clip_global_norm=CLIP_NORM, clip_where="per_replica")),
         f"each replica clips its own gradients to global norm {CLIP_NORM} before the "
         f"optimizer sums them",
         Expectation(step=1, quantity="grad", cause=f"clip_per_replica {CLIP_NORM:g}",
                     why="the sum of per-replica clipped gradients is not the clipped gradient "
                         "of the global batch"),
         f"clipped-reference-x{n}"),
    ]
    # Mistakes a migration makes in its optimizer, at 1 and at 2 replicas: each must be caught
    # where it first acts.
    for replicas in (1, n):
        controls += [
            ("control-clip-one-side", replicas, runner(),
             f"the clipping user step's loop without the clipping (global norm {CLIP_NORM})",
             Expectation(step=1, quantity="grad", cause=f"clip_global_norm {CLIP_NORM:g}",
                         why=f"the reference clips every step's gradients to global norm "
                             f"{CLIP_NORM}; the first step's gradients are already above it"),
             f"clipped-reference-x{replicas}"),
            ("control-adam-epsilon", replicas, runner(Variant(adam_epsilon=1e-8)),
             "Adam(epsilon=1e-8), TF1's default, where the seed uses Keras' 1e-7",
             Expectation(step=1, quantity="weight", cause="epsilon x0.1",
                         why="gradients and Adam's m and v are the same; the first update "
                             "divides by sqrt(v) + epsilon")),
            ("control-learning-rate", replicas, runner(Variant(learning_rate=1.01e-3)),
             "Adam(learning_rate=1.01e-3): the learning rate 1% off",
             Expectation(step=1, quantity="weight", cause="learning_rate x1.01",
                         why="the first update is 1% larger")),
        ]
    for name, replicas, runner_, description, expect, *reference in controls:
        implementations.append(implementation(f"{name}-x{replicas}", runner_, replicas,
                                              f"control: {description}", expect))
        pairs.append((reference[0] if reference else f"reference-x{replicas}",
                      f"{name}-x{replicas}"))
    # The order-matched and the style pairs judge against other references (their own
    # floors): the same mistake must be caught there too.
    pairs += [(f"summed-reference-x{n}", f"control-learning-rate-x{n}"),
              (f"mirrored-x{n}", f"control-learning-rate-x{n}")]
    # The same loop on several worker processes (MultiWorkerMirroredStrategy).
    worker_implementations, worker_pairs, worker_noise = multi_worker.implementations_and_pairs(
        NAMES, {"data": data.source, "variables_every": tier.variables_every},
        len(data.train_labels), tier.batch_per_replica, full=tier.name == "full")
    implementations += worker_implementations
    pairs += worker_pairs
    # The run that raises goes first: in one process, every later run shows that the failure
    # (raised while tracing, before any collective) leaves the process usable.
    pairs.sort(key=lambda pair: not pair[1].startswith("control-sum-over-batch-size"))

    return Case(
        name="custom_loop",
        description=(f"tf.distribute custom training loop (seed CNN, Adam, "
                     f"compute_average_loss) under MirroredStrategy vs one device; {tier.name} "
                     f"tier; data: {data.source}"),
        examples=Examples({"image": data.train_images}, labels=data.train_labels),
        eval_examples=Examples({"image": data.test_images}, labels=data.test_labels),
        batch_size=tier.batch_per_replica,
        steps=case_steps,
        initial_values=make_initial_values(SEED),
        implementations=tuple(implementations),
        reference="reference-x1",
        pairs=tuple(pairs),
        tolerances=TOLERANCES,
        seed=SEED,
        calibration_file=Path(__file__).with_name(f"calibration_{tier.name}.json"),
        noise_variants={**{f"reference-x{n}": [f"summed-reference-x{n}"]
                           for n in REPLICAS if n > 1},
                        f"clipped-reference-x{STYLE_REPLICAS}":
                            [f"clipped-summed-reference-x{STYLE_REPLICAS}"], **worker_noise},
        sensitivity=("learning_rate", "epsilon", "clip_global_norm", "drop_step"),
        # mutants at 1 and 2 replicas and of the clipping user step; the other candidates run
        # the same code (add --sensitivity for all of them)
        sensitivity_candidates=("mirrored-x1", "mirrored-x2", "clipped-mirrored-x2"),
    )
