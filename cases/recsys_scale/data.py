"""Synthetic data shaped like a production recommender, and the case's initial values.

Five sparse features over four tables, Zipf-distributed ids (a few rows take most lookups, a
long tail is touched rarely), multivalent features with empty rows, eight dense features:

| feature          | table    | rows (full / default)  | dim | combiner | ids per example |
|------------------|----------|------------------------|-----|----------|-----------------|
| `user`           | user     | 1,000,000 / 100,000    | 64  | mean     | 1 (raw id, hashed) |
| `item_history`   | item     | 50,000                 | 32  | mean     | 0 to 20         |
| `candidate_item` | item     | 50,000                 | 32  | mean     | 1               |
| `categories`     | category | 1,000                  | 16  | sqrtn    | 0 to 4          |
| `query_terms`    | query    | 20,000                 | 16  | sum      | 0 to 8          |

The `user` feature carries raw 64-bit ids (most beyond int32); both pipelines map them to a
row with `raw % rows` in their input pipelines, as production hashes user ids into a table.
Other features carry row ids directly. Ids of a feature follow a Zipf law (exponent 1.1) over a
fixed random permutation of the table's rows, so the hot rows are spread over the table.
"""
import dataclasses

import numpy as np

from verify import Examples, SparseIds

DENSE_FEATURES = 8
HIDDEN = (64, 16)
FULL_USER_ROWS, DEFAULT_USER_ROWS = 1_000_000, 100_000
ZIPF_EXPONENT = 1.1
# raw user ids: rank * RAW_ID_STRIDE + RAW_ID_OFFSET, so most of them do not fit in int32
RAW_ID_STRIDE, RAW_ID_OFFSET = 2_654_435_761, 12_345
# TF2 concatenates its inputs in this order after the dense features; TF1 sorts by name.
TF2_FEATURE_ORDER = ("user", "item_history", "candidate_item", "categories", "query_terms")


@dataclasses.dataclass(frozen=True)
class Table:
    """One embedding table: name, rows, width, combiner and the features it serves."""

    name: str
    vocabulary: int
    dim: int
    combiner: str
    features: tuple[str, ...]


def tables(user_rows: int) -> tuple[Table, ...]:
    return (Table("user", user_rows, 64, "mean", ("user",)),
            Table("item", 50_000, 32, "mean", ("item_history", "candidate_item")),
            Table("category", 1_000, 16, "sqrtn", ("categories",)),
            Table("query", 20_000, 16, "sum", ("query_terms",)))


IDS_PER_EXAMPLE = {"user": (1, 1), "item_history": (0, 20), "candidate_item": (1, 1),
                   "categories": (0, 4), "query_terms": (0, 8)}
CANONICAL_FEATURE_ORDER = tuple(sorted(IDS_PER_EXAMPLE))   # TF1's DenseFeatures order


def table_of(user_rows: int) -> dict[str, Table]:
    return {f: t for t in tables(user_rows) for f in t.features}


def input_width() -> int:
    return sum(t.dim * len(t.features) for t in tables(1)) + DENSE_FEATURES


def _zipf_ranks(rng, count: int, support: int) -> np.ndarray:
    """`count` ranks in [0, support) with P(rank r) proportional to 1/(r+1)**ZIPF_EXPONENT."""
    weights = 1.0 / np.arange(1, support + 1) ** ZIPF_EXPONENT
    cumulative = np.cumsum(weights)
    return np.searchsorted(cumulative, rng.uniform(0, cumulative[-1], count)).astype(np.int64)


def _sparse(rng, count: int, low: int, high: int, ids_of) -> SparseIds:
    """Variable-length ids per example (low..high of them, drawn by `ids_of(n)`), laid out as
    `SparseIds`; the middle example has none when `low == 0`."""
    lengths = rng.integers(low, high + 1, count)
    if low == 0:
        lengths[count // 2] = 0
    rows = np.repeat(np.arange(count, dtype=np.int64), lengths)
    starts = np.cumsum(lengths) - lengths
    positions = np.arange(lengths.sum(), dtype=np.int64) - np.repeat(starts, lengths)
    return SparseIds(np.stack([rows, positions], axis=1), ids_of(int(lengths.sum())),
                     (count, max(high, 1)))


def make_examples(count: int, seed: int, user_rows: int) -> Examples:
    rng = np.random.default_rng(seed)
    features = {"dense": rng.normal(size=(count, DENSE_FEATURES)).astype(np.float32)}
    by_feature = table_of(user_rows)
    for feature, (low, high) in IDS_PER_EXAMPLE.items():
        table = by_feature[feature]
        if feature == "user":   # raw ids over 1.5x the table's rows, hashed by the pipelines
            def ids_of(n, support=int(table.vocabulary * 1.5)):
                return _zipf_ranks(rng, n, support) * RAW_ID_STRIDE + RAW_ID_OFFSET
        else:
            permutation = rng.permutation(table.vocabulary)

            def ids_of(n, permutation=permutation, support=table.vocabulary):
                return permutation[_zipf_ranks(rng, n, support)].astype(np.int64)
        features[feature] = _sparse(rng, count, low, high, ids_of)
    labels = (rng.uniform(size=(count, 1)) < 0.3).astype(np.float32)   # clicks
    return Examples(features, labels=labels)


def make_initial_values(seed: int, user_rows: int) -> dict[str, np.ndarray]:
    """Canonical initial values: tables (truncated normal, stddev 1/sqrt(dim), as TF1's
    embedding columns) and Glorot-scaled Dense layers in the canonical (TF1) row layout."""
    rng = np.random.default_rng(seed)
    values = {}
    for table in tables(user_rows):
        stddev = 1 / np.sqrt(table.dim)
        values[f"embedding/{table.name}"] = np.clip(
            rng.standard_normal((table.vocabulary, table.dim), np.float32) * np.float32(stddev),
            -2 * stddev, 2 * stddev).astype(np.float32)
    widths = (input_width(),) + HIDDEN + (1,)
    for n, (fan_in, fan_out) in enumerate(zip(widths[:-1], widths[1:])):
        values[f"dense{n}/kernel"] = rng.normal(0, np.sqrt(2 / (fan_in + fan_out)),
                                                (fan_in, fan_out)).astype(np.float32)
        values[f"dense{n}/bias"] = rng.normal(0, 0.05, (fan_out,)).astype(np.float32)
    return values
