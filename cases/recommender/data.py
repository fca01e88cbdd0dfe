"""Deterministic data and initial values for the recommender case.

A click model over four sparse features and three dense ones. The item table is shared by the
watch history and the candidate item; every sparse feature has a variable number of ids per
example, and each one has examples with no id at all (their embedding is the zero vector).

| feature          | table    | vocabulary | dim | combiner | ids per example |
|------------------|----------|------------|-----|----------|-----------------|
| `item_history`   | item     | 20         | 6   | mean     | 0 to 5          |
| `candidate_item` | item     | 20         | 6   | mean     | 0 or 1          |
| `categories`     | category | 8          | 3   | sqrtn    | 0 to 3          |
| `query_terms`    | query    | 15         | 4   | sum      | 0 to 4          |

The canonical layout of the first Dense kernel's rows is TF1's: `DenseFeatures` orders its
columns by name (candidate_item, categories, item_history, query_terms), then the dense features.
"""
import dataclasses

import numpy as np

from verify import Examples, SparseIds

# The order the TF2 rewrite concatenates its embedded features in (after the dense input).
TF2_FEATURE_ORDER = ("item_history", "candidate_item", "categories", "query_terms")

DENSE_FEATURES = 3
HIDDEN = (8, 4)


@dataclasses.dataclass(frozen=True)
class Table:
    """One embedding table: name, vocabulary, width, combiner and the features it serves."""

    name: str
    vocabulary: int
    dim: int
    combiner: str
    features: tuple[str, ...]


TABLES = (
    Table("item", 20, 6, "mean", ("item_history", "candidate_item")),
    Table("category", 8, 3, "sqrtn", ("categories",)),
    Table("query", 15, 4, "sum", ("query_terms",)),
)
TABLE_OF = {feature: table for table in TABLES for feature in table.features}
IDS_PER_EXAMPLE = {"item_history": (0, 5), "candidate_item": (0, 1), "categories": (0, 3),
                   "query_terms": (0, 4)}
# TF1's DenseFeatures concatenates columns sorted by name: the canonical order.
CANONICAL_FEATURE_ORDER = tuple(sorted(TABLE_OF))


def input_width() -> int:
    return sum(TABLE_OF[f].dim for f in CANONICAL_FEATURE_ORDER) + DENSE_FEATURES


def make_examples(count: int, seed: int) -> Examples:
    rng = np.random.default_rng(seed)
    features = {"dense": rng.normal(size=(count, DENSE_FEATURES)).astype(np.float32)}
    for feature, (low, high) in IDS_PER_EXAMPLE.items():
        table = TABLE_OF[feature]
        ids = [sorted(rng.choice(table.vocabulary, size=rng.integers(low, high + 1),
                                 replace=False).tolist()) for _ in range(count)]
        ids[count // 2] = []  # at least one example without ids for every feature
        features[feature] = SparseIds.from_lists(ids, width=high)
    labels = (rng.uniform(size=(count, 1)) < 0.4).astype(np.float32)  # clicks
    return Examples(features, labels=labels)


def make_initial_values(seed: int) -> dict[str, np.ndarray]:
    """Canonical initial values: tables (truncated normal, stddev 1/sqrt(dim), as TF1's
    embedding columns) and Glorot-scaled Dense layers in the canonical (TF1) row layout."""
    rng = np.random.default_rng(seed)
    values = {}
    for table in TABLES:
        stddev = 1 / np.sqrt(table.dim)
        values[f"embedding/{table.name}"] = np.clip(
            rng.normal(0, stddev, (table.vocabulary, table.dim)), -2 * stddev, 2 * stddev)
    widths = (input_width(),) + HIDDEN + (1,)
    for n, (fan_in, fan_out) in enumerate(zip(widths[:-1], widths[1:])):
        name = f"dense{n}"
        values[f"{name}/kernel"] = rng.normal(0, np.sqrt(2 / (fan_in + fan_out)), (fan_in, fan_out))
        values[f"{name}/bias"] = rng.normal(0, 0.05, (fan_out,))
    return {name: v.astype(np.float32) for name, v in values.items()}
