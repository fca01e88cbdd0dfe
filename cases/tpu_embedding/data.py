"""Deterministic data and initial values for the TPU-embedding case.

The seed pipeline trains on one example; this case keeps its shape (two dense features, one
sparse id feature over a vocabulary of 10, a float label) but draws 32 examples with 0 to 3 ids
each (an empty row included), so that batching, ordering and the combiner all matter.
"""
import numpy as np

from verify import Examples, SparseIds

VOCABULARY = 10
DIMENSION = 5
DENSE_FEATURES = 2


def make_examples(count: int, seed: int) -> Examples:
    rng = np.random.default_rng(seed)
    dense = rng.normal(size=(count, DENSE_FEATURES)).astype(np.float32)
    ids = [sorted(rng.choice(VOCABULARY, size=rng.integers(1, 4), replace=False).tolist())
           for _ in range(count)]
    ids[3] = []  # an example with no ids: the safe lookup gives it a zero embedding
    labels = rng.uniform(0, 1, size=(count, 1)).astype(np.float32)
    return Examples({"dense_feature": dense, "sparse_feature": SparseIds.from_lists(ids, width=3)},
                    labels=labels)


def make_initial_values(seed: int) -> dict[str, np.ndarray]:
    """Canonical initial values. The kernel's rows follow the TF1 layout: [embedding, dense]."""
    rng = np.random.default_rng(seed)
    stddev = 1 / np.sqrt(DIMENSION)  # TF1 embedding_column's default initializer scale
    table = np.clip(rng.normal(0, stddev, (VOCABULARY, DIMENSION)), -2 * stddev, 2 * stddev)
    return {
        "embedding/sparse_feature": table.astype(np.float32),
        "dense/kernel": rng.normal(0, 0.5, (DIMENSION + DENSE_FEATURES, 1)).astype(np.float32),
        "dense/bias": np.array([0.1], np.float32),
    }
