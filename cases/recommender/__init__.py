"""A realistic recommender migration, once per optimizer: `recommender_sgd`, `recommender_adagrad`,
`recommender_adam`, `recommender_ftrl`.

TF1 TPUEstimator (`embedding_column`, `shared_embedding_columns`, `EmbeddingConfigSpec`)
against tfrs `TPUEmbedding` with four `FeatureConfig`s over three `TableConfig`s (one shared),
combiners mean/sqrtn/sum, variable-length ids with empty rows, three dense features, a
22-8-4-1 ReLU MLP, sigmoid cross-entropy, batch 8, 20 steps, then evaluate. See `data.py`.

Each case has three faithful implementations and compares every pair of them:
- `tf1` (reference) and `tf2`: the two pipelines, captured every step;
- `oracle`: `cases.recommender.oracle.OracleRunner`, the same model and optimizer in float64 numpy, so
  that a difference between tf1 and tf2 is attributed to the side that departs from the math.

One case per optimizer (rather than one case with per-optimizer implementations): each
optimizer gets its own verdict lines, its own controls and tolerances, and `--case` runs one.

Negative controls (each compared against tf1 and against the oracle):
- recommender_adagrad `control-combiner-category-mean`: the category table's combiner is `mean`
  where TF1's column uses `sqrtn` (one feature only);
- recommender_adagrad `control-split-item-table`: the two item features get one TableConfig
  each instead of one shared TableConfig object;
- recommender_adam `control-adam-keras-epsilon`: `legacy.Adam()`'s default epsilon 1e-7 where
  TF1's `AdamOptimizer` uses 1e-8. Visible here because some gradient elements are 1e-6 to
  1e-5 (at step 1 the update is `lr * g / (|g| + epsilon)`); with all |g| >> 1e-5 it would sink
  below float32 noise;
- recommender_ftrl `control-ftrl-beta-dropped`: `beta` given to the tfrs layer's
  `tf.tpu.experimental.embedding.FTRL` only, the compile optimizer (which trains the tables on
  CPU and the Dense layers everywhere) has `beta=0`, so beta is never folded into l2.

Resume pairs (`verify.checkpoint`), every optimizer: `tf1-resume` (tf1 trained, saved, resumed
from its own checkpoint) against `tf2-resume` (the TF2 rewrite restored from that checkpoint,
converted through both name maps), both training the case's steps again; and, where the
optimizer has slots, `control-resume-slot-not-carried`: the conversion leaves one slot of the
item table (Adagrad's accumulator, Adam's v, FTRL's linear) at its initial value; for Adam also
`control-resume-step-not-carried`: TF1's global_step not carried into the optimizer's
iterations; for SGD, which keeps neither, `control-resume-kernel-rows-not-permuted`: the first
kernel converted without the row permutation its name map declares.
"""
import dataclasses
from pathlib import Path

from verify import Case, Expectation, Implementation, Mapped, NameMap, PermuteRows, ResumeRunner
from verify import Tolerances, lazy_runner
from verify.checkpoint import STEP
from cases.recommender.oracle import DenseInput, Embedded, EmbeddingMLP, OracleRunner

from cases.recommender.data import (CANONICAL_FEATURE_ORDER, DENSE_FEATURES, HIDDEN, TABLE_OF,
                                    TABLES, TF2_FEATURE_ORDER, make_examples,
                                    make_initial_values)
from cases.recommender.optimizers import ADAM_EPSILON_KERAS, RECIPES
from cases.recommender.keras_rs_sides import keras_rs_implementations, keras_rs_names

SEED = 11
STEPS = 20
BATCH_SIZE = 8
LAYERS = tuple((f"dense{n}", "relu") for n in range(len(HIDDEN))) + ((f"dense{len(HIDDEN)}", None),)
DENSE_NAMES = [f"{layer}/{part}" for layer, _ in LAYERS for part in ("kernel", "bias")]

# The model as the oracle computes it, inputs in the canonical (TF1) concatenation order.
ORACLE_MODEL = EmbeddingMLP(
    tuple(Embedded(f, TABLE_OF[f].name, TABLE_OF[f].combiner) for f in CANONICAL_FEATURE_ORDER)
    + (DenseInput("dense"),), LAYERS, loss="sigmoid_cross_entropy")

TF1_TABLE_NAMES = {"item": "candidate_item_item_history_shared_embedding",
                   "category": "dense_features/categories_embedding/embedding_weights",
                   "query": "dense_features/query_terms_embedding/embedding_weights"}
TF1_NAMES = NameMap({**{f"embedding/{t}": n for t, n in TF1_TABLE_NAMES.items()},
                     **{n: n for n in DENSE_NAMES}})


def tf2_kernel_rows() -> PermuteRows:
    """Canonical row i of dense0/kernel is TF2 row order[i]: TF2 concatenates
    [dense, *TF2_FEATURE_ORDER], TF1 the features sorted by name, then dense."""
    starts, offset = {}, 0
    for block in ("dense",) + TF2_FEATURE_ORDER:
        starts[block] = offset
        offset += DENSE_FEATURES if block == "dense" else TABLE_OF[block].dim
    order = []
    for block in CANONICAL_FEATURE_ORDER + ("dense",):
        width = DENSE_FEATURES if block == "dense" else TABLE_OF[block].dim
        order.extend(range(starts[block], starts[block] + width))
    return PermuteRows(tuple(order))


def dense_first_rows() -> PermuteRows:
    """Canonical row i of dense0/kernel in a TF1 model that concatenates the dense features
    first: TF1's own order is the features sorted by name, then dense."""
    width = {block: DENSE_FEATURES if block == "dense" else TABLE_OF[block].dim
             for block in ("dense",) + CANONICAL_FEATURE_ORDER}
    starts, offset = {}, 0
    for block in ("dense",) + CANONICAL_FEATURE_ORDER:
        starts[block], offset = offset, offset + width[block]
    return PermuteRows(tuple(row for block in CANONICAL_FEATURE_ORDER + ("dense",)
                             for row in range(starts[block], starts[block] + width[block])))


TF1_DENSE_FIRST_NAMES = NameMap({**TF1_NAMES.entries,
                                 "dense0/kernel": Mapped("dense0/kernel", dense_first_rows())})
TF2_NAMES = NameMap({**{f"embedding/{t.name}": f"tpu_embedding/{t.name}" for t in TABLES},
                     **{n: n for n in DENSE_NAMES},
                     "dense0/kernel": Mapped("dense0/kernel", tf2_kernel_rows())})
# The tfrs.Model subclass names its variables under the model: click_model/dense0/kernel.
TFRS_MODEL_NAMES = NameMap({canonical: Mapped(f"click_model/{TF2_NAMES.native(canonical).native}",
                                              TF2_NAMES.native(canonical).transform)
                            for canonical in TF2_NAMES.entries})
TF2_NAMES_UNPERMUTED = NameMap({**TF2_NAMES.entries, "dense0/kernel": "dense0/kernel"})
KERAS_RS_NAMES = keras_rs_names(TF2_NAMES, TABLES)
SPLIT_TABLE = "embedding/item_candidate_item"
TF2_SPLIT_NAMES = NameMap({**TF2_NAMES.entries, SPLIT_TABLE: "tpu_embedding/item_candidate_item"})

# The suite's defaults hold for every faithful pair here, the float64 oracle included. Worst
# drift measured over the four optimizers (20 steps, 2-core x86-64, TF 2.15.1): loss 2.4e-7 abs
# (4.0e-7 rel), grad 2.0e-7 abs, slot 2.4e-7 abs, weight 4.8e-7 abs, eval loss 6.0e-8 abs; no
# element needed more than the defaults (tightest_rtol 0 everywhere).
TOLERANCES = Tolerances.default()


def _tf2(optimizer, **mistake):
    return lazy_runner("cases.recommender.tf2_keras:runner", optimizer=optimizer, **mistake)


def _controls(optimizer: str) -> list[Implementation]:
    if optimizer == "adagrad":
        return [
            Implementation(
                "control-combiner-category-mean", _tf2(optimizer, combiners={"category": "mean"}),
                TF2_NAMES, description="TableConfig(combiner='mean') for categories, TF1 sqrtn",
                expect=Expectation(step=1, quantity="loss", cause="combiner",
                                   why="categories with 2 or 3 ids are "
                                   "divided by n instead of sqrt(n) from the first forward pass")),
            Implementation(
                "control-split-item-table", _tf2(optimizer, split_tables=("item",)),
                TF2_SPLIT_NAMES, description="one TableConfig per item feature instead of one "
                                             "shared TableConfig object",
                expect=Expectation(step=0, quantity="weight", tensor=SPLIT_TABLE,
                                   cause="structure",
                                   why="the candidate item has a table of its own, which the "
                                       "reference does not have")),
        ]
    if optimizer == "adam":
        return [Implementation(
            "control-adam-keras-epsilon",
            _tf2(optimizer, keras_optimizer=lambda: RECIPES["adam"].keras_optimizer(
                epsilon=ADAM_EPSILON_KERAS)),
            TF2_NAMES, description="legacy.Adam default epsilon 1e-7, TF1 AdamOptimizer 1e-8",
            expect=Expectation(step=1, quantity="weight", cause="epsilon x10",
                               why="m and v of step 1 do not depend "
                               "on epsilon; the update lr*m/(sqrt(v)+eps) does, visibly where "
                               "|g| is 1e-6 to 1e-5"))]
    if optimizer == "ftrl":
        return [Implementation(
            "control-ftrl-beta-dropped",
            _tf2(optimizer, keras_optimizer=lambda: RECIPES["ftrl"].keras_optimizer(beta=0.0),
                 layer_optimizer="tpu_ftrl_with_beta"),
            TF2_NAMES, description="beta only on the layer's TPU FTRL; the compile optimizer "
                                   "has beta=0, so l2 is never raised by beta/(2*lr)",
            expect=Expectation(step=1, quantity="weight", cause="ftrl_beta",
                               why="loss, gradients and FTRL slots of "
                               "step 1 do not depend on beta; the new weights do"))]
    return []


def _input_layouts(optimizer: str) -> tuple[list[Implementation], list[tuple[str, str]]]:
    """recommender_sgd only (inputs do not depend on the optimizer): the rewrite fed the same
    examples in another layout, which must pass, and input pipeline mistakes that `input`
    must catch at step 1, each judged against tf1."""
    if optimizer != "sgd":
        return [], []
    def tf2(inputs):
        return lazy_runner("cases.recommender.tf2_keras:runner", optimizer=optimizer,
                           inputs=inputs)

    implementations = [
        Implementation("tf2-ragged-ids", tf2("ragged"), TF2_NAMES,
                       description="the same examples laid out as a rewrite may: ids as int32 "
                                   "RaggedTensors (TF1: int64 SparseTensors), labels of shape "
                                   "(8,) (TF1: (8, 1)); preflight lists the layouts"),
        Implementation("control-input-ids", tf2("ids"), TF2_NAMES,
                       description="the input pipeline drops the last item_history id of "
                                   "example 0 and changes the first category of example 1",
                       expect=Expectation(step=1, quantity="input", tensor="categories",
                                          cause="input", why="the first batch's example 1 has category 0 "
                                              "where TF1 has 4 (and item_history a dropped "
                                              "id)")),
        Implementation("control-input-shuffled", tf2("shuffled"), TF2_NAMES,
                       description="every batch holds the same examples in reverse order",
                       expect=Expectation(step=1, quantity="input", cause="input",
                                          why="same examples, other order: a mean loss over "
                                              "the batch barely moves; the input does")),
    ]
    return implementations, [("tf1", i.name) for i in implementations]


# The slot a converter most easily forgets, per optimizer: TF1 keeps Adam's v as `<var>/Adam_1`
# and FTRL's linear as `<var>/Ftrl_1`; Adagrad has one slot. SGD has none.
SLOT_NOT_CARRIED = {"adagrad": "embedding/item/accumulator", "adam": "embedding/item/v",
                    "ftrl": "embedding/item/linear"}


def _resumed(optimizer: str, tf1: Implementation) -> list[Implementation]:
    """The resume pairs' implementations: tf1 resumed from its own checkpoint (the reference),
    the TF2 rewrite restored from it converted (verify.checkpoint), and a control that does
    not carry one slot over."""
    resumed = [
        Implementation("tf1-resume", ResumeRunner(tf1, tf1.runner), TF1_NAMES,
                       slot_names=tf1.slot_names,
                       description="tf1 resumed from its own checkpoint"),
        Implementation("tf2-resume", ResumeRunner(tf1, _tf2(optimizer)), TF2_NAMES,
                       description="the TF2 rewrite restored from tf1's checkpoint, converted")]
    slot = SLOT_NOT_CARRIED.get(optimizer)
    if slot:
        resumed.append(Implementation(
            "control-resume-slot-not-carried",
            ResumeRunner(tf1, _tf2(optimizer), leave_at_initial=(slot,)), TF2_NAMES,
            description=f"tf1's checkpoint converted without {slot}: the TF2 slot keeps the "
                        f"value its optimizer creates it with",
            expect=Expectation(step=1, quantity="slot", tensor=slot, cause="slot_not_restored",
                               why="weights and gradients of the restore point agree; the "
                                   "slot the first update reads does not")))
    if optimizer == "sgd":   # no slots, no step-dependent state: the weights alone carry over
        resumed.append(Implementation(
            "control-resume-kernel-rows-not-permuted",
            ResumeRunner(tf1, _tf2(optimizer)), TF2_NAMES_UNPERMUTED,
            description="tf1's checkpoint converted with dense0/kernel's rows in TF1's order, "
                        "where TF2 concatenates its inputs in another",
            expect=Expectation(step=0, quantity="metric", cause="forward_pass",
                               why="the restored values read back equal through the same "
                                   "map; the restored model's evaluation does not")))
    if optimizer == "adam":
        resumed.append(Implementation(
            "control-resume-step-not-carried",
            ResumeRunner(tf1, _tf2(optimizer), leave_at_initial=(STEP,)), TF2_NAMES,
            description="tf1's global_step not carried into the Keras optimizer's iterations: "
                        "Adam's bias correction restarts at step 1",
            expect=Expectation(step=1, quantity="weight", cause="adam_step_count",
                               why="m and v do not depend on the step count; the update's "
                                   "bias correction 1 - beta**t does")))
    return resumed


def make_case(optimizer: str, steps: int = STEPS) -> Case:
    recipe = RECIPES[optimizer]
    initial_values = make_initial_values(SEED)
    controls = _controls(optimizer)
    if any(c.names is TF2_SPLIT_NAMES for c in controls):
        initial_values[SPLIT_TABLE] = initial_values["embedding/item"].copy()
    oracle = OracleRunner(ORACLE_MODEL, recipe.oracle_optimizer())
    tf1 = Implementation(
        "tf1", lazy_runner("cases.recommender.tf1_estimator:runner", optimizer=optimizer),
        TF1_NAMES, description="TPUEstimator, embedding_column + shared_embedding_columns",
        slot_names=recipe.tf1_slot_names)
    resumed = _resumed(optimizer, tf1)
    implementations = [
        tf1,
        Implementation("tf2", _tf2(optimizer), TF2_NAMES,
                       description="tfrs TPUEmbedding, shared TableConfig, Keras fit"),
        Implementation("tf2-tf221", _tf2(optimizer), TF2_NAMES, environment="tf221",
                       description="the same rewrite at its destination: TF 2.21 + tf_keras "
                                   "2.21 + tfrs 0.7.7, in a worker process of that environment"),
        Implementation("tf2-tfrs-model",
                       lazy_runner("cases.recommender.tf2_keras:tfrs_model_runner",
                                   optimizer=optimizer), TFRS_MODEL_NAMES,
                       description="the rewrite as a tfrs.Model subclass (compute_loss), "
                                   "trained by tfrs' own train_step"),
        Implementation("oracle", oracle, oracle.names(),
                       description=f"numpy float64: {recipe.oracle_optimizer()!r}"),
        # never a pair's side: calibration's measure of float32 rounding in the math
        Implementation("oracle-float32", dataclasses.replace(oracle, dtype="float32"),
                       oracle.names(), description=f"the oracle's math in float32 numpy"),
        # never a pair's side: calibration's other summation order of tf1's first layer
        Implementation("tf1-dense-first",
                       lazy_runner("cases.recommender.tf1_estimator:runner", optimizer=optimizer,
                                   dense_first=True),
                       TF1_DENSE_FIRST_NAMES, slot_names=recipe.tf1_slot_names,
                       description="tf1 with its first layer's inputs concatenated dense "
                                   "first, kernel rows permuted to match: the same model"),
        *([Implementation("tf1-pow-bias-correction",
                          lazy_runner("cases.recommender.tf1_estimator:runner",
                                      optimizer=optimizer, pow_bias_correction=True),
                          TF1_NAMES, slot_names=recipe.tf1_slot_names,
                          description="tf1's Adam with beta^t computed by pow, as Keras does, "
                                      "not as running float32 products: the same formula")]
          if optimizer == "adam" else []),
        *controls,
        *resumed,
    ]
    pairs = [("tf1", "tf2"), ("oracle", "tf1"), ("oracle", "tf2"), ("tf1", "tf2-tfrs-model"),
             ("tf1", "tf2-tf221"), ("oracle", "tf2-tf221"), ("tf2", "tf2-tf221")]
    if optimizer == "adam":   # a destination mistake, judged against the TF 2.15 rewrite
        implementations.append(Implementation(
            "control-adam-keras-epsilon-tf221",
            _tf2(optimizer, keras_optimizer=lambda: RECIPES["adam"].keras_optimizer(
                epsilon=ADAM_EPSILON_KERAS)),
            TF2_NAMES, environment="tf221",
            description="legacy.Adam's default epsilon 1e-7 at the destination (TF 2.21 + "
                        "tf_keras), where the TF 2.15 rewrite keeps TF1's 1e-8",
            expect=Expectation(step=1, quantity="weight", cause="epsilon x10",
                               why="the first update divides by "
                               "sqrt(v) + epsilon; m and v agree")))
        pairs += [("tf2", "control-adam-keras-epsilon-tf221"),   # the destination comparison
                  ("tf1", "control-adam-keras-epsilon-tf221"),   # and, as every control here,
                  ("oracle", "control-adam-keras-epsilon-tf221")]  # against tf1 and the oracle
    for control in controls:
        pairs += [("tf1", control.name), ("oracle", control.name)]
    pairs += [("tf1-resume", r.name) for r in resumed[1:]]
    layouts, layout_pairs = _input_layouts(optimizer)
    implementations += layouts
    pairs += layout_pairs
    keras3, keras3_pairs = keras_rs_implementations(optimizer, BATCH_SIZE, KERAS_RS_NAMES)
    implementations += keras3
    pairs += keras3_pairs
    return Case(
        name=f"recommender_{optimizer}",
        description=f"recommender: 4 sparse features, 3 tables (1 shared), {optimizer}",
        examples=make_examples(64, SEED), eval_examples=make_examples(8, SEED + 1),
        batch_size=BATCH_SIZE, steps=steps, initial_values=initial_values, seed=SEED,
        reference="tf1", oracle="oracle", implementations=tuple(implementations),
        pairs=tuple(pairs), tolerances=TOLERANCES,
        calibration_file=Path(__file__).with_name(f"calibration_{optimizer}.json"),
        # The float64 oracle against float32 TensorFlow differs by the rounding of a float32
        # computation, which one-ulp nudges of the float32 side's inputs do not reach. The
        # oracle's own math in float32 measures it; the oracle's pairs take the larger floor.
        noise_variants={"oracle": ["oracle-float32"],
                        # Adam's update is about lr whatever |g| is, so a near-zero gradient's
                        # rounding (a sum that cancels) becomes a weight difference of lr x its
                        # relative error: the same first layer summed in another order (as the
                        # TF2 rewrite's concatenation does) measures it
                        "tf1": ["tf1-dense-first"]
                        # TF1 keeps Adam's beta^t as float32 running products, Keras computes
                        # pow(beta, t): the same formula, 1.7e-5 apart at step 3 in lr_t
                        + (["tf1-pow-bias-correction"] if optimizer == "adam" else [])},
        # epsilon only where the optimizer has one that matters: Adam's (SGD and FTRL have
        # none; Adagrad's is below float32 noise with accumulators starting at 0.1)
        sensitivity=("learning_rate", "clip_global_norm", "drop_step")
        + (("epsilon",) if optimizer == "adam" else ()),
        # the two rewrites' detection limits; tf2-ragged-ids is tf2's model fed another layout
        sensitivity_candidates=("tf2", "tf2-tfrs-model"))


def cases(options):
    return [make_case(name) for name in RECIPES]
