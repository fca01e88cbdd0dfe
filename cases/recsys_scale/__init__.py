"""`recsys_scale`: the recommender migration at production size, checked step by step.

TF1 TPUEstimator (`embedding_column`, `shared_embedding_columns`, `EmbeddingConfigSpec`)
against tfrs `TPUEmbedding` + Keras fit, on synthetic production-shaped data (`data.py`): a
user table of 1,000,000 x 64 (100,000 x 64 in the default tier), item/category/query tables
of 50,000 x 32, 1,000 x 16 and 20,000 x 16, Zipf-distributed ids, multivalent features with
empty rows, raw 64-bit user ids hashed into their table by the input pipelines; Adagrad with
the user table at a learning rate of its own; batch 256. Default tier: 4 steps; `--full`:
100 steps with the 1M-row table.

Both sides capture tables by the rows each step touched (`verify.runners.capture.tables`): per
step the ids of each table's sparse gradient with those rows and their Adagrad accumulators
after the update; whole tables at step 0, every `TABLES_EVERY` steps and at the end.

Negative controls (against tf1):
- `control-table-learning-rate`: the user table trains at the global rate 0.1, not its 0.05;
- `control-user-id-cast-first`: the TF2 pipeline casts raw user ids to int32 before the
  modulo (ids beyond int32 wrap and land in other rows);
- `control-dropped-row-update`: the TF2 optimizer's sparse update of the user table skips the
  row unknown users hash to (the raw id RAW_ID_OFFSET, the hottest row), as if it were a
  padding row; its gradient is still right.
"""
from pathlib import Path

from verify import Case, Expectation, Implementation, Mapped, NameMap, PermuteRows
from verify import Tolerances, lazy_runner

from cases.recsys_scale.data import (CANONICAL_FEATURE_ORDER, DEFAULT_USER_ROWS, DENSE_FEATURES,
                                     FULL_USER_ROWS, HIDDEN, RAW_ID_OFFSET, TF2_FEATURE_ORDER,
                                     make_examples, make_initial_values, table_of, tables)

SEED = 23
BATCH = 256
DEFAULT_STEPS, FULL_STEPS = 4, 100
# whole tables every K steps besides step 0 and the last step (None: only those two)
TABLES_EVERY = {False: None, True: 50}
DENSE_NAMES = [f"dense{n}/{part}" for n in range(len(HIDDEN) + 1) for part in ("kernel", "bias")]
TF1_TABLE_NAMES = {"user": "dense_features/user_embedding/embedding_weights",
                   "item": "candidate_item_item_history_shared_embedding",
                   "category": "dense_features/categories_embedding/embedding_weights",
                   "query": "dense_features/query_terms_embedding/embedding_weights"}
TF1_NAMES = NameMap({**{f"embedding/{t}": n for t, n in TF1_TABLE_NAMES.items()},
                     **{n: n for n in DENSE_NAMES}})


def tf2_kernel_rows() -> PermuteRows:
    """Canonical row i of dense0/kernel is TF2 row order[i]: TF2 concatenates
    [dense, *TF2_FEATURE_ORDER], TF1 the features sorted by name, then dense."""
    width = {f: t.dim for f, t in table_of(1).items()} | {"dense": DENSE_FEATURES}
    starts, offset = {}, 0
    for block in ("dense",) + TF2_FEATURE_ORDER:
        starts[block], offset = offset, offset + width[block]
    order = []
    for block in CANONICAL_FEATURE_ORDER + ("dense",):
        order.extend(range(starts[block], starts[block] + width[block]))
    return PermuteRows(tuple(order))


TF2_NAMES = NameMap({**{f"embedding/{t.name}": f"tpu_embedding/{t.name}" for t in tables(1)},
                     **{n: n for n in DENSE_NAMES},
                     "dense0/kernel": Mapped("dense0/kernel", tf2_kernel_rows())})
# Tolerances: the case's calibration (calibration.json) where present, else the suite's defaults.
TOLERANCES = Tolerances.default()


def make_case(full: bool = False, steps: int | None = None) -> Case:
    user_rows = FULL_USER_ROWS if full else DEFAULT_USER_ROWS
    steps = steps or (FULL_STEPS if full else DEFAULT_STEPS)
    every = TABLES_EVERY[full]
    capture = dict(capture_tables="touched_rows", tables_every=every)

    def tf2(**mistake):
        return lazy_runner("cases.recsys_scale.tf2_keras:runner", user_rows=user_rows,
                           **mistake, **capture)

    tf1 = Implementation(
        "tf1", lazy_runner("cases.recsys_scale.tf1_estimator:runner", user_rows=user_rows,
                           **capture), TF1_NAMES,
        description="TPUEstimator, embedding_column + shared_embedding_columns, user ids "
                    "hashed in the input_fn; the user table's own AdagradOptimizer")
    controls = [
        Implementation(
            "control-table-learning-rate", tf2(table_rates={}), TF2_NAMES,
            description="the user table trains at the global learning rate 0.1, not its 0.05",
            expect=Expectation(step=1, quantity="weight", tensor="embedding/user",
                               cause="learning_rate x2",
                               why="Adagrad's accumulator does not depend on the rate; the "
                                   "user rows' update does")),
        Implementation(
            "control-user-id-cast-first", tf2(cast_first=True), TF2_NAMES,
            description="raw user ids cast to int32 before the modulo: ids beyond int32 wrap",
            expect=Expectation(step=1, quantity="input", tensor="user", cause="input",
                               why="the batch's user rows differ from the first step")),
        Implementation(
            "control-dropped-row-update",
            tf2(skipped_row=("user", RAW_ID_OFFSET % user_rows)), TF2_NAMES,
            description="the sparse update of the user table skips the row unknown users hash "
                        "to (the hottest row), as if it were a padding row",
            expect=Expectation(step=1, quantity="slot|weight", tensor="embedding/user*",
                               cause="row_skipped", why="the gradient is right; the skipped row keeps its value and "
                                   "accumulator")),
    ]
    implementations = [tf1, Implementation("tf2", tf2(), TF2_NAMES,
                                           description="tfrs TPUEmbedding, Keras fit"), *controls]
    return Case(
        name="recsys_scale",
        description=f"production-shaped recommender: user table {user_rows:,} x 64, "
                    f"3 more tables, Zipf ids, batch {BATCH}, {steps} steps",
        examples=make_examples(BATCH * steps, SEED, user_rows), batch_size=BATCH, steps=steps,
        initial_values=make_initial_values(SEED, user_rows), seed=SEED, reference="tf1",
        implementations=tuple(implementations),
        pairs=(("tf1", "tf2"), *(("tf1", c.name) for c in controls)), tolerances=TOLERANCES,
        calibration_file=Path(__file__).with_name(
            "calibration_full.json" if full else "calibration.json"))


def cases(options):
    return [make_case(full=options.full, steps=options.steps)]
