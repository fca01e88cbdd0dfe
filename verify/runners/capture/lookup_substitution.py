"""Run an embedding lookup and its combiner on values handed in: the TensorFlow half of a lookup
substitution (`verify.session.lookup_substitution` chooses the table, the ids and each side's
declared combiner; `verify.explain.substitution` judges the outputs; `verify.explain.repro`
writes the same steps as a script).

The lookup is TensorFlow's own op, `tf.nn.safe_embedding_lookup_sparse`, which a TF1
`embedding_column` and a tfrs `TPUEmbedding` on the CPU both run (an example without ids looks
up zeros); each id weighs 1 (the canonical input a trace keeps holds the ids, not per-id
weights). Eagerly, on the CPU, on a fresh constant table: no user object is called again.
"""
from __future__ import annotations

import numpy as np

from verify.runners.capture.substitution import one_ulp_up

COMBINERS = ("sum", "mean", "sqrtn")


def run_lookup(table: np.ndarray, ids: np.ndarray, row_lengths: np.ndarray,
               combiner: str, nudged: bool = False) -> np.ndarray:
    """Per example, `combiner` over the rows of `table` its ids (`ids`, in example order,
    `row_lengths` of them per example) select. `nudged`: the table moved one ulp up first
    (the reference's own noise of the lookup)."""
    import tensorflow as tf

    if combiner not in COMBINERS:
        raise ValueError(f"combiner must be one of {COMBINERS}, got {combiner!r}")
    table = np.asarray(table)
    if nudged:
        table = one_ulp_up(table)
    lengths = np.asarray(row_lengths, np.int64)
    rows = np.repeat(np.arange(len(lengths), dtype=np.int64), lengths)
    positions = np.arange(len(rows), dtype=np.int64) - np.repeat(np.cumsum(lengths) - lengths,
                                                                  lengths)
    with tf.device("/cpu:0"):
        sparse = tf.SparseTensor(np.stack([rows, positions], axis=1).reshape(-1, 2),
                                 np.asarray(ids, np.int64),
                                 [len(lengths), max(int(lengths.max(initial=0)), 1)])
        return tf.nn.safe_embedding_lookup_sparse(tf.constant(table), sparse, None,
                                                  combiner=combiner).numpy()
