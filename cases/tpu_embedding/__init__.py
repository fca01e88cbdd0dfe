"""TPU embeddings, TF1 -> TF2: TPUEstimator + embedding_column against tfrs TPUEmbedding + Keras.

Implementations:
- `tf1`: the reference, the seed's TPUEstimator pipeline.
- `tf2`: the faithful rewrite under the default strategy, captured every step.
- `tf2-mirrored`: the same under MirroredStrategy over 2 logical CPUs (`-spe10`: as shipped,
  uninstrumented). It sums gradients with `ReductionToOneDevice`: TF's default collectives fail
  on these sparse gradients with `steps_per_execution=10` on CPU.
- `tf2-spe10`: the rewrite as shipped (`steps_per_execution=10`), not instrumented; captured
  at execution boundaries only, to show that capture and `steps_per_execution` change nothing.
- `keras3-jax`, `keras3-tf`: the destination without legacy Keras, a keras-rs
  `DistributedEmbedding` + Keras 3 rewrite (`keras_rs.py`), each in a worker process of its
  environment (JAX / TensorFlow backend).
- negative controls, each with one real migration mistake and where it must be caught.
- `tf2-resume-own-restore` and `control-own-restore-model-only`: the TF2 rewrite resumed by
  the pipeline's own restore code (`ResumeRunner(restore=...)`), once right and once
  compiling the restored model again with a new optimizer (its state lost).
- `tf1-resume`, `tf2-resume`, `tf2-mirrored-resume`: the resume pairs (`verify.checkpoint`):
  tf1's trained checkpoint carried into the TF2 model, both training on from it; the control
  `control-resume-accumulator-not-carried` converts it without the table's accumulator.
"""
from pathlib import Path

from verify import (Case, Expectation, Implementation, Mapped, NameMap, PermuteRows,
                    ResumeRunner, lazy_runner)

from cases.tpu_embedding.data import DENSE_FEATURES, DIMENSION, make_examples, make_initial_values

SEED = 7

TF1_NAMES = NameMap({
    "embedding/sparse_feature": "dense_features/sparse_feature_embedding/embedding_weights",
    "dense/kernel": "dense/kernel",
    "dense/bias": "dense/bias",
})
# TF2 concatenates [dense, embedding]: canonical row i (TF1 layout) is TF2 row order[i].
TF2_KERNEL_ROWS = PermuteRows.swap_blocks(DENSE_FEATURES, DIMENSION)
TF2_NAMES = NameMap({
    "embedding/sparse_feature": "tpu_embedding/table_0",
    "dense/kernel": Mapped("dense/kernel", TF2_KERNEL_ROWS),
    "dense/bias": "dense/bias",
})
TF2_NAMES_WITHOUT_PERMUTATION = NameMap({**TF2_NAMES.entries, "dense/kernel": "dense/kernel"})
# keras-rs on CPU: one Keras embedding per table, `<layer>/<table>/embeddings`.
KERAS_RS_NAMES = NameMap({**TF2_NAMES.entries,
                          "embedding/sparse_feature": "distributed_embedding/sparse_feature/embeddings"})

# Each side is named, not imported: the case imports in every environment (see verify.lazy).
TF2_MODULE = "cases.tpu_embedding.tf2_keras"
TF2 = f"{TF2_MODULE}:runner"
faithful_tf2 = lazy_runner(TF2, steps_per_execution=10)

# Sparse table gradients differ in length per replica; TF's default collectives cannot gather
# them inside a multi-step function on CPU (see verify.runners.capture.devices.mirrored_strategy).
mirrored_tf2 = lazy_runner(TF2, strategy="mirrored", steps_per_execution=10,
                           cross_device_ops="reduction_to_one_device")


TF1 = Implementation("tf1", lazy_runner("cases.tpu_embedding.tf1_estimator:runner"), TF1_NAMES,
                     description="the seed's TPUEstimator pipeline")

# Resume pairs: tf1 trains the case's steps and saves; tf1 resumes from its own checkpoint (the
# reference), the TF2 rewrite from that checkpoint converted through both name maps
# (verify.checkpoint); both train the same steps again, compared step by step.
RESUMED = (
    Implementation("tf1-resume", ResumeRunner(TF1, TF1.runner), TF1_NAMES,
                   description="tf1 resumed from its own checkpoint"),
    Implementation("tf2-resume", ResumeRunner(TF1, faithful_tf2), TF2_NAMES,
                   description="the TF2 rewrite restored from tf1's checkpoint, converted"),
    Implementation("tf2-mirrored-resume", ResumeRunner(TF1, mirrored_tf2), TF2_NAMES, replicas=2,
                   description="the same under MirroredStrategy, 2 replicas"),
    Implementation("tf2-resume-own-restore",
                   ResumeRunner(TF1, faithful_tf2, restore=f"{TF2_MODULE}:restore_training_state"), TF2_NAMES,
                   description="the TF2 rewrite restored from tf1's checkpoint, converted, by "
                               "the pipeline's own restore code (model and optimizer)"),
    Implementation(
        "control-own-restore-recompiled",
        ResumeRunner(TF1, faithful_tf2, restore=f"{TF2_MODULE}:restore_then_recompile"),
        TF2_NAMES,
        description="the pipeline's own restore code restores the model, then compiles it "
                    "again with a new Adagrad: the optimizer's state starts fresh",
        expect=Expectation(step=1, quantity="slot", cause="slot_not_restored",
                           why="the restored weights are right; every Adagrad accumulator "
                               "the first update reads starts at 0.1 instead of tf1's")),
    Implementation(
        "control-resume-accumulator-not-carried",
        ResumeRunner(TF1, faithful_tf2,
                     leave_at_initial=("embedding/sparse_feature/accumulator",)),
        TF2_NAMES, description="tf1's checkpoint converted without the table's Adagrad "
                               "accumulator: the TF2 slot keeps its initial 0.1",
        expect=Expectation(step=1, quantity="slot", cause="slot_not_restored",
                           tensor="embedding/sparse_feature/accumulator",
                           why="weights and gradients of the restore point agree; the "
                               "accumulator the first update divides by does not")),
)


def tf2_control(name, why, expect, runner=faithful_tf2, names=TF2_NAMES):
    return Implementation(name, runner, names, description=why, expect=expect)


KERAS_RS = "cases.tpu_embedding.keras_rs:runner"


def keras_rs_implementations(batch_size: int) -> tuple[Implementation, ...]:
    """The Keras 3 + keras-rs rewrite on both backends, each fed the id format keras-rs
    documents for it, and the controls of that destination."""
    def keras_rs(**arguments):
        return lazy_runner(KERAS_RS, batch_size=batch_size, **arguments)

    return (
        Implementation("keras3-jax", keras_rs(ids="dense"), KERAS_RS_NAMES,
                       environment="keras3-jax",
                       description="keras-rs DistributedEmbedding + Keras 3 fit, JAX backend, "
                                   "dense ids + weights"),
        Implementation("keras3-tf", keras_rs(ids="sparse"), KERAS_RS_NAMES,
                       environment="keras3-tf",
                       description="keras-rs DistributedEmbedding + Keras 3 fit, TensorFlow "
                                   "backend, tf.SparseTensor ids"),
        Implementation(
            "control-keras3-tf-dense-ids", keras_rs(ids="dense"), KERAS_RS_NAMES,
            environment="keras3-tf",
            description="the JAX input format (dense ids + weights) on the TensorFlow backend: "
                        "the lookup's gradient keeps repeated ids apart and Keras 3's Adagrad "
                        "adds their squares, not the square of their sum",
            expect=Expectation(step=1, quantity="slot", cause="repeated_rows",
                               why="loss and gradients (summed per "
                               "row) of step 1 are right; the accumulators of rows looked up "
                               "twice in the batch are not")),
        Implementation(
            "control-keras-rs-table-optimizer",
            keras_rs(ids="dense", keras_rs_defaults=("optimizer",)), KERAS_RS_NAMES,
            environment="keras3-jax", preflight_expect=("optimizer/embedding/kind",),
            preflight_cause="declared optimizer/embedding/kind",
            expect_on_tpu=Expectation(step=1, quantity="weight", tensor="embedding/*",
                                      why="on a TPU keras-rs' default 'adam' trains the table "
                                          "in the embedding engine, not Adagrad(0.05)"),
            description="TableConfig without optimizer=: keras-rs' default 'adam' trains the "
                        "table on a TPU, compile's Adagrad(0.05) on CPU, so the numbers agree"),
        Implementation(
            "control-keras-rs-initializer",
            keras_rs(ids="dense", keras_rs_defaults=("initializer",)), KERAS_RS_NAMES,
            environment="keras3-jax", preflight_expect=("table/*/initializer",),
            preflight_cause="declared table/*/initializer",
            description="TableConfig without initializer=, trusting keras-rs' docstring "
                        "(truncated normal 1/sqrt(dim)); its code uses VarianceScaling(fan_out)"),
    )


CASE = Case(
    name="tpu_embedding",
    description="TPUEstimator + tpu.experimental.embedding_column -> tfrs TPUEmbedding + Keras fit",
    examples=make_examples(32, SEED),
    eval_examples=make_examples(8, SEED + 1),
    batch_size=8,
    steps=20,
    initial_values=make_initial_values(SEED),
    seed=SEED,
    reference="tf1",
    calibration_file=Path(__file__).with_name("calibration.json"),
    # Adagrad's epsilon x10 (1e-7 -> 1e-6) moves an update by < 3.2e-6 relative (accumulators
    # start at 0.1): below float32 noise here, so no epsilon mutant
    sensitivity=("learning_rate", "clip_global_norm", "drop_step"),
    implementations=(
        TF1,
        Implementation("tf2", faithful_tf2, TF2_NAMES,
                       description="the seed's TF2 rewrite, aligned, default strategy"),
        Implementation("tf2-tf221", faithful_tf2, TF2_NAMES, environment="tf221",
                       description="the same TF2 rewrite at its destination: TF 2.21 + tf_keras "
                                   "2.21 + tfrs 0.7.7, in a worker process of that environment"),
        Implementation("tf2-mirrored", mirrored_tf2, TF2_NAMES, replicas=2,
                       description="the TF2 rewrite under MirroredStrategy, 2 replicas"),
        Implementation("tf2-mirrored-spe10", mirrored_tf2, TF2_NAMES, replicas=2,
                       capture_steps=False,
                       description="MirroredStrategy, 2 replicas, as shipped: "
                                   "steps_per_execution=10, uninstrumented"),
        Implementation("tf2-spe10", faithful_tf2, TF2_NAMES, capture_steps=False,
                       description="the TF2 rewrite as shipped: steps_per_execution=10, "
                                   "uninstrumented, weights read every 10 steps"),
        tf2_control(
            "control-combiner-sum", "TableConfig(combiner='sum') where TF1 uses the default 'mean'",
            Expectation(step=1, quantity="loss", cause="combiner",
                        why="the embedding of a multi-id example is "
                        "a sum, not a mean, from the first forward pass"),
            runner=lazy_runner(TF2, combiner="sum")),
        tf2_control(
            "control-adagrad-accumulator",
            "legacy.Adagrad(initial_accumulator_value=0.01) where TF1's AdagradOptimizer uses 0.1",
            Expectation(step=1, quantity="slot", cause="initial_accumulator x0.1",
                        why="loss and gradients of step 1 are right; "
                        "the accumulator the update divides by is not"),
            runner=lazy_runner(TF2, initial_accumulator_value=0.01)),
        Implementation(
            "control-adagrad-accumulator-tf221", lazy_runner(TF2, initial_accumulator_value=0.01),
            TF2_NAMES, environment="tf221",
            description="the same accumulator mistake at the destination (TF 2.21 + tf_keras), "
                        "against the TF 2.15 rewrite: the tf2 -> tf2-tf221 comparison catches it",
            expect=Expectation(step=1, quantity="slot", cause="initial_accumulator x0.1",
                               why="the accumulator the first update "
                               "divides by starts at 0.01, not 0.1")),
        tf2_control(
            "control-unseeded-shuffle", "the seed's dataset.shuffle(10) without a seed",
            Expectation(step=1, quantity="input", cause="input",
                        why="the first batch holds other examples"),
            runner=lazy_runner(TF2, shuffle=True)),
        tf2_control(
            "control-concat-order",
            "[dense, embedding] concatenation loaded with the TF1 kernel layout (no row permutation)",
            Expectation(step=1, quantity="loss", cause="forward_pass",
                        why="the kernel's rows meet the wrong inputs; "
                        "the loaded values read back equal, so step 0 agrees"),
            names=TF2_NAMES_WITHOUT_PERMUTATION),
        Implementation(
            "control-initializer",
            lazy_runner(TF2, initializer_stddev=1.0),
            TF2_NAMES, preflight_expect=("table/*/initializer",),
            preflight_cause="declared table/*/initializer",
            description="the seed's TruncatedNormal(stddev=1) table initializer, TF1 uses "
                        "1/sqrt(5): the suite loads identical initial values, so the numbers "
                        "agree and only preflight can flag it"),
        Implementation(
            "control-layer-optimizer",
            lazy_runner(TF2, layer_learning_rate=0.5),
            TF2_NAMES, preflight_expect=("optimizer/embedding/learning_rate",),
            preflight_cause="declared optimizer/embedding/learning_rate",
            expect_on_tpu=Expectation(step=1, quantity="weight", tensor="embedding/*",
                                      why="on a TPU the layer's Adagrad(0.5) trains the table: "
                                          "its first update is 10x TF1's"),
            description="TPUEmbedding(optimizer=Adagrad(0.5)) with compile(Adagrad(0.05)): on "
                        "CPU the compile optimizer trains the tables and the numbers agree; on a "
                        "TPU the layer's does"),
        *RESUMED,
        *keras_rs_implementations(batch_size=8),
    ),
    pairs=(("tf1", "tf2"), ("tf1", "tf2-tf221"), ("tf2", "tf2-tf221"),
           ("tf2", "control-adagrad-accumulator-tf221"), ("tf1", "tf2-mirrored"), ("tf1", "tf2-spe10"), ("tf2", "tf2-spe10"),
           ("tf1", "tf2-mirrored-spe10"),
           ("tf1", "control-combiner-sum"), ("tf1", "control-adagrad-accumulator"),
           ("tf1", "control-unseeded-shuffle"), ("tf1", "control-concat-order"),
           ("tf1", "control-initializer"), ("tf1", "control-layer-optimizer"),
           ("tf1-resume", "tf2-resume"), ("tf1-resume", "tf2-mirrored-resume"),
           ("tf1-resume", "control-resume-accumulator-not-carried"),
           ("tf1-resume", "tf2-resume-own-restore"),
           ("tf1-resume", "control-own-restore-recompiled"),
           ("tf1", "keras3-jax"), ("tf1", "keras3-tf"), ("keras3-jax", "keras3-tf"),
           ("tf1", "control-keras3-tf-dense-ids"), ("tf1", "control-keras-rs-table-optimizer"),
           ("tf1", "control-keras-rs-initializer")),
)
