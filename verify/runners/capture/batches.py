"""A step's batch as the taps send it and the host joins it: flattened to named tensors
(`flatten_batch`), back in `digest_batch`'s form on the host (`unflatten_batch`: sparse ids as
(indices, values, shape), ragged ids as `RaggedIds`), and the replicas' batches joined into
the global batch in replica order (`global_batch`).

>>> per_replica = {1: {"x": np.array([[2.0]])}, 0: {"x": np.array([[1.0]])}}
>>> global_batch(per_replica)["x"].tolist()
[[1.0], [2.0]]
"""
from __future__ import annotations

from typing import Any

import numpy as np

from verify.core.case import SparseIds
from verify.core.inputs import RaggedIds


def flatten_batch(data) -> dict[str, Any]:
    """A step's batch `(features, labels[, sample_weights])` as name -> tensor; sparse
    features as `name::indices`, `name::values`, `name::shape`; ragged ones (one ragged
    dimension) as `name::ragged` (their values) and `name::row_splits`."""
    import tensorflow as tf

    if isinstance(data, (tuple, list)):
        parts = list(data)
    else:
        parts = [data]
    named: dict[str, Any] = {}
    features = parts[0]
    if isinstance(features, dict):
        named.update(features)
    else:
        named["features"] = features
    if len(parts) > 1 and parts[1] is not None:
        named["label"] = parts[1]
    flat = {}
    for name, value in named.items():
        if isinstance(value, tf.SparseTensor):
            flat[f"{name}::indices"], flat[f"{name}::values"] = value.indices, value.values
            flat[f"{name}::shape"] = value.dense_shape
        elif isinstance(value, tf.RaggedTensor):
            flat[f"{name}::ragged"], flat[f"{name}::row_splits"] = ragged_parts(value)
        elif isinstance(value, tf.Tensor) or hasattr(value, "dtype"):
            flat[name] = value
    return flat


def unflatten_batch(values: dict[str, np.ndarray]) -> dict[str, Any]:
    """A batch sent to the host as flat arrays, back in `digest_batch`'s form: a sparse
    feature's `name::indices`, `::values` and `::shape` as one (indices, values, shape)."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        name, _, part = key.partition("::")
        if not part:
            out[name] = value
        elif part == "indices":
            out[name] = (value, values[f"{name}::values"], values[f"{name}::shape"])
        elif part == "ragged":
            out[name] = RaggedIds.from_row_splits(value, values[f"{name}::row_splits"])
    return out


def ragged_parts(value):
    """A `tf.RaggedTensor`'s ids and row splits over its first dimension: its deeper ragged
    or dense dimensions are flattened into each example's list."""
    import tensorflow as tf

    splits = value.row_splits
    flat = value.values
    while isinstance(flat, tf.RaggedTensor):   # deeper ragged dimensions: whole examples
        splits = tf.gather(flat.row_splits, splits)
        flat = flat.values
    width = tf.reduce_prod(tf.shape(flat, out_type=tf.int64)[1:])
    return tf.reshape(flat, [-1]), splits * width


def global_batch(per_replica: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """The replicas' batches as one global batch, in replica order (sparse rows offset)."""
    replicas = sorted(per_replica)
    out: dict[str, Any] = {}
    for name in per_replica[replicas[0]]:
        parts = [per_replica[r][name] for r in replicas]
        if isinstance(parts[0], RaggedIds):
            out[name] = RaggedIds.concat(parts)
        elif isinstance(parts[0], tuple):
            indices, values, rows, width = [], [], 0, 0
            for index, value, shape in parts:
                index = np.asarray(index, np.int64).reshape(-1, 2).copy()
                index[:, 0] += rows
                indices.append(index)
                values.append(np.asarray(value))
                rows += int(shape[0])
                width = max(width, int(shape[1]))
            out[name] = SparseIds(np.concatenate(indices), np.concatenate(values), (rows, width))
        else:
            out[name] = np.concatenate([np.asarray(p) for p in parts], axis=0) \
                if np.ndim(parts[0]) else np.asarray(parts)
    return out
