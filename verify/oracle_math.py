"""The documented math in numpy: safe embedding lookups, optimizers and input batching.

Independent of TensorFlow (numpy only, float64 throughout), it implements what the TF sources
document:

- embedding lookups as `tf.nn.safe_embedding_lookup_sparse` does them (combiners `sum`, `mean`,
  `sqrtn`, optional per-id weights, ids < 0 and weights <= 0 pruned, an example without ids
  gets the zero vector and, like TF, looks up id 0 so that row 0 counts as touched);
- the optimizers SGD, Adagrad, Adam and FTRL, dense and sparse (sparse: only the touched rows,
  repeated ids summed first), with the TF1, Keras-legacy and TPU-embedding-engine variants as
  options;
- the batch a step consumes from `repeat().batch(batch_size)`.

A case builds its oracle (a model and a runner producing a `Trace`) from these parts; see
`cases/recommender/oracle.py`.

>>> table = np.arange(6, dtype=np.float64).reshape(3, 2)
>>> embedding_lookup(table, [[0, 2], [], [1]], "mean").tolist()
[[2.0, 3.0], [0.0, 0.0], [2.0, 3.0]]
"""
from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np

from verify.core.case import Examples, SparseIds
from verify.core.trace import SparseRows, digest_batch

COMBINERS = ("sum", "mean", "sqrtn")


# ---------------------------------------------------------------- embedding lookups

def _rows(ids) -> list[np.ndarray]:
    """Per-example id lists (in position order) from a `SparseIds` or a list of lists."""
    if isinstance(ids, SparseIds):
        order = np.lexsort((ids.indices[:, 1], ids.indices[:, 0]))
        rows, values = ids.indices[order, 0], ids.values[order]
        return [values[rows == r] for r in range(len(ids))]
    return [np.asarray(r, np.int64) for r in ids]


def _scales(weights: np.ndarray, combiner: str) -> np.ndarray:
    """Per-id factor of the combiner: w, w/sum(w) or w/sqrt(sum(w^2)), in float64 (the
    callers cast the factors to the table's precision before they scale its rows)."""
    if combiner == "sum":
        return weights
    if combiner == "mean":
        return weights / weights.sum()
    if combiner == "sqrtn":
        return weights / np.sqrt((weights ** 2).sum())
    raise ValueError(f"combiner must be one of {COMBINERS}, got {combiner!r}")


def _valid(ids: np.ndarray, weights: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """Ids and weights after the safe lookup's pruning (ids < 0, weights <= 0)."""
    weights = np.ones(len(ids)) if weights is None else np.asarray(weights, np.float64)
    keep = (ids >= 0) & (weights > 0)
    return ids[keep], weights[keep]


def embedding_lookup(table: np.ndarray, ids, combiner: str,
                     weights: Sequence[Sequence[float]] | None = None) -> np.ndarray:
    """Combined embedding per example, as `tf.nn.safe_embedding_lookup_sparse`
    (tensorflow/python/ops/embedding_ops.py, `safe_embedding_lookup_sparse_v2` ->
    `embedding_lookup_sparse_v2`): `sum_j w_j e_j`, divided by `sum_j w_j` (mean) or
    `sqrt(sum_j w_j^2)` (sqrtn); an example with no valid id gets zeros.

    `ids` is a `SparseIds` or one list of ids per example; `weights` one list per example.

    >>> t = np.array([[1.0, 0.0], [0.0, 1.0], [3.0, 4.0]])
    >>> embedding_lookup(t, [[0, 1], [2], []], "sqrtn").round(4).tolist()
    [[0.7071, 0.7071], [3.0, 4.0], [0.0, 0.0]]
    >>> embedding_lookup(t, [[0, 2]], "mean", weights=[[3.0, 1.0]]).tolist()
    [[1.5, 1.0]]
    """
    per_row = _rows(ids)
    table = np.asarray(table)
    out = np.zeros((len(per_row), table.shape[1]), table.dtype)
    for r, row_ids in enumerate(per_row):
        row_ids, w = _valid(row_ids, None if weights is None else weights[r])
        if len(row_ids):
            out[r] = _scales(w, combiner).astype(table.dtype) @ table[row_ids]
    return out


def embedding_lookup_grad(ids, combiner: str, upstream: np.ndarray, vocabulary: int,
                          weights: Sequence[Sequence[float]] | None = None) -> SparseRows:
    """Gradient of `embedding_lookup` with respect to the table, as the sparse rows TF's
    gradient carries: one row per distinct id looked up (repeats summed), plus id 0 with a zero
    row when some example has no id (the safe lookup fills empty rows with id 0 and zeroes their
    result: `sparse_fill_empty_rows` in `safe_embedding_lookup_sparse_v2`).

    >>> g = embedding_lookup_grad([[0, 1], [1], []], "mean", np.array([[2.0], [4.0], [9.0]]), 3)
    >>> g.ids.tolist(), g.rows.ravel().tolist()
    ([0, 1], [1.0, 5.0])
    """
    per_row = _rows(ids)
    upstream = np.asarray(upstream)
    dtype = upstream.dtype if upstream.dtype.kind == "f" else np.dtype(np.float64)
    rows: dict[int, np.ndarray] = {}
    for r, row_ids in enumerate(per_row):
        row_ids, w = _valid(row_ids, None if weights is None else weights[r])
        if not len(row_ids):
            rows.setdefault(0, np.zeros(upstream.shape[1], dtype))
            continue
        for i, s in zip(row_ids, _scales(w, combiner).astype(dtype)):
            rows[int(i)] = rows.get(int(i), dtype.type(0)) + s * upstream[r].astype(dtype)
    ids_out = np.array(sorted(rows), np.int64)
    values = np.array([rows[i] for i in ids_out], dtype).reshape(len(ids_out),
                                                                 upstream.shape[1])
    return SparseRows(ids_out, values, (vocabulary, upstream.shape[1]))


# ---------------------------------------------------------------- optimizers
#
# Every optimizer updates numpy arrays in their own precision (float64 for the oracle; float32
# for its float32 twin, calibration's measure of float32 rounding).
# `apply(var, grad, slots, step, rows)`: `grad` is dense (same shape as var) when `rows` is
# None, else the gradient rows of the distinct touched `rows` (a sparse update). Slots use the
# Keras legacy slot names.


@dataclasses.dataclass(frozen=True)
class SGD:
    """`var -= lr * g`: tensorflow/python/training/gradient_descent.py
    (`GradientDescentOptimizer._apply_dense`, `_resource_apply_sparse_duplicate_indices`) and
    keras/src/optimizers/legacy/gradient_descent.py (`SGD._resource_apply_dense`, momentum 0).

    >>> SGD(0.1).apply(np.array([1.0]), np.array([2.0]), {}, 1)[0].tolist()
    [0.8]
    """

    learning_rate: float
    slot_names: tuple = ()

    def init_slots(self, var):
        return {}

    def apply(self, var, grad, slots, step, rows=None):
        var = var.copy()
        if rows is None:
            var -= self.learning_rate * grad
        else:
            var[rows] -= self.learning_rate * grad
        return var, slots


@dataclasses.dataclass(frozen=True)
class Adagrad:
    """`acc += g^2; var -= lr * g / (sqrt(acc) + epsilon)`, accumulator starting at
    `initial_accumulator_value`.

    Variants, by where the epsilon goes:
    - TF1 `tf.compat.v1.train.AdagradOptimizer` (tensorflow/python/training/adagrad.py,
      `_apply_dense` -> `ApplyAdagrad`): no epsilon, `epsilon=0`.
    - Keras legacy `Adagrad` (keras/src/optimizers/legacy/adagrad.py, `_resource_apply_dense` ->
      `ResourceApplyAdagradV2`): `epsilon` (default 1e-7; 0 silently becomes 1e-7) outside the
      square root.
    - TPU embedding engine (`tf.tpu.experimental.embedding.Adagrad`, TF1 `AdagradParameters`,
      tensorflow/python/tpu/tpu_embedding_v2_utils.py): no epsilon.
    - `epsilon_inside_sqrt=True`: `lr * g / sqrt(acc + epsilon)`, the new Keras `Adagrad`.

    >>> var, slots = Adagrad(0.1, 0.1).apply(np.array([1.0]), np.array([0.3]),
    ...                                      {"accumulator": np.array([0.1])}, 1)
    >>> round(float(var[0]), 6), round(float(slots["accumulator"][0]), 6)
    (0.931175, 0.19)
    """

    learning_rate: float
    initial_accumulator_value: float = 0.1
    epsilon: float = 0.0
    epsilon_inside_sqrt: bool = False
    slot_names: tuple = ("accumulator",)

    def init_slots(self, var):
        return {"accumulator": np.full(var.shape, self.initial_accumulator_value, var.dtype)}

    def apply(self, var, grad, slots, step, rows=None):
        var, acc = var.copy(), slots["accumulator"].copy()
        at = slice(None) if rows is None else rows
        acc[at] += grad ** 2
        if self.epsilon_inside_sqrt:
            var[at] -= self.learning_rate * grad / np.sqrt(acc[at] + self.epsilon)
        else:
            var[at] -= self.learning_rate * grad / (np.sqrt(acc[at]) + self.epsilon)
        return var, {"accumulator": acc}


@dataclasses.dataclass(frozen=True)
class Adam:
    """Adam with TF's "epsilon hat" placement:
    `m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;`
    `var -= lr * sqrt(1-b2^t)/(1-b1^t) * m / (sqrt(v) + epsilon)`.

    Sources: tensorflow/python/training/adam.py (`AdamOptimizer._resource_apply_dense` ->
    `ResourceApplyAdam`; `_apply_sparse_shared`: m and v decay on EVERY row, the touched rows
    get `(1-b) g`, every row moves), default epsilon 1e-8; keras/src/optimizers/legacy/adam.py
    (`Adam._resource_apply_dense`, `_resource_apply_sparse`, same non-lazy sparse update),
    default epsilon 1e-7.

    TPU embedding engine options (`tf.tpu.experimental.embedding.Adam`, TF1 `AdamParameters`,
    tensorflow/python/tpu/tpu_embedding_v2_utils.py `Adam.__init__` docstring):
    `lazy=True` updates only the rows looked up; `sum_inside_sqrt=True` uses
    `m / sqrt(v + epsilon^2)`; `bias_correction=False` drops the `sqrt(1-b2^t)/(1-b1^t)` factor
    (the engine's kernels are not in the Python package: not confirmed from source).

    >>> s = Adam(0.1).init_slots(np.zeros(1))
    >>> var, s = Adam(0.1, epsilon=1e-8).apply(np.array([1.0]), np.array([0.5]), s, 1)
    >>> round(float(var[0]), 6)
    0.9
    """

    learning_rate: float
    beta_1: float = 0.9
    beta_2: float = 0.999
    epsilon: float = 1e-8
    lazy: bool = False
    sum_inside_sqrt: bool = False
    bias_correction: bool = True
    slot_names: tuple = ("m", "v")

    def init_slots(self, var):
        return {"m": np.zeros(var.shape, var.dtype), "v": np.zeros(var.shape, var.dtype)}

    def apply(self, var, grad, slots, step, rows=None):
        var, m, v = var.copy(), slots["m"].copy(), slots["v"].copy()
        lr = self.learning_rate
        if self.bias_correction:
            lr = lr * np.sqrt(1 - self.beta_2 ** step) / (1 - self.beta_1 ** step)
        if rows is not None and not self.lazy:
            dense = np.zeros_like(var)
            dense[rows] = grad
            grad, rows = dense, None
        at = slice(None) if rows is None else rows
        m[at] = self.beta_1 * m[at] + (1 - self.beta_1) * grad
        v[at] = self.beta_2 * v[at] + (1 - self.beta_2) * grad ** 2
        if self.sum_inside_sqrt:
            var[at] -= lr * m[at] / np.sqrt(v[at] + self.epsilon ** 2)
        else:
            var[at] -= lr * m[at] / (np.sqrt(v[at]) + self.epsilon)
        return var, {"m": m, "v": v}


@dataclasses.dataclass(frozen=True)
class Ftrl:
    """FTRL-proximal, as TF's `ApplyFtrlV2` kernel documents it
    (tensorflow/python/ops/gen_training_ops.py `resource_apply_ftrl_v2`,
    `resource_sparse_apply_ftrl`; the docstring's `+` before the accumulator term is a typo,
    the kernel subtracts)::

        g_shrink  = g + 2 * l2_shrinkage * var
        acc_new   = acc + g^2
        linear   += g_shrink - (acc_new^(-p) - acc^(-p)) / lr * var
        quadratic = (acc_new^(-p) + beta) / lr + 2 * l2
        var       = (sign(linear) * l1 - linear) / quadratic if |linear| > l1 else 0

    with `p = learning_rate_power` (-0.5). `beta` enters as in the FTRL paper's
    `(beta + sqrt(n)) / alpha`: TF1 `FtrlOptimizer._prepare`
    (tensorflow/python/training/ftrl.py) and Keras legacy `Ftrl._resource_apply_dense`
    (keras/src/optimizers/legacy/ftrl.py) fold it into the kernel's l2 as
    `l2 + beta / (2 * lr)`, the same number; the TPU engine takes `beta` as its own parameter
    (`tf.tpu.experimental.embedding.FTRL`, tpu_embedding_v2_utils.py). Dropping `beta` (or
    passing it where it is not applied) is a different optimizer.

    >>> s = Ftrl(0.1).init_slots(np.zeros(1))
    >>> var, s = Ftrl(0.1).apply(np.array([0.0]), np.array([1.0]), s, 1)
    >>> round(float(s["linear"][0]), 6), round(float(var[0]), 6)
    (1.0, -0.095346)
    """

    learning_rate: float
    learning_rate_power: float = -0.5
    l1: float = 0.0
    l2: float = 0.0
    l2_shrinkage: float = 0.0
    beta: float = 0.0
    initial_accumulator_value: float = 0.1
    slot_names: tuple = ("accumulator", "linear")

    def init_slots(self, var):
        return {"accumulator": np.full(var.shape, self.initial_accumulator_value, var.dtype),
                "linear": np.zeros(var.shape, var.dtype)}

    def apply(self, var, grad, slots, step, rows=None):
        var, acc, linear = var.copy(), slots["accumulator"].copy(), slots["linear"].copy()
        at = slice(None) if rows is None else rows
        lr, p = self.learning_rate, -self.learning_rate_power
        w, a = var[at], acc[at]
        acc_new = a + grad ** 2
        linear[at] += (grad + 2 * self.l2_shrinkage * w) - (acc_new ** p - a ** p) / lr * w
        quadratic = (acc_new ** p + self.beta) / lr + 2 * self.l2
        lin = linear[at]
        var[at] = np.where(np.abs(lin) > self.l1, (np.sign(lin) * self.l1 - lin) / quadratic, 0.0)
        acc[at] = acc_new
        return var, {"accumulator": acc, "linear": linear}


# ---------------------------------------------------------------- batches

def batch_at(examples: Examples, step: int, batch_size: int) -> tuple[dict[str, Any], np.ndarray]:
    """The batch step `step` (1-based) consumes from `repeat().batch(batch_size)`.

    >>> ex = Examples({"x": np.arange(3.0)}, labels=np.arange(3.0))
    >>> batch_at(ex, 2, 2)[1].tolist()
    [2.0, 0.0]
    """
    positions = ((step - 1) * batch_size + np.arange(batch_size)) % len(examples)
    batch = {}
    for name, value in examples.features.items():
        if isinstance(value, SparseIds):
            per_row = _rows(value)
            chosen = [per_row[p] for p in positions]
            batch[name] = SparseIds.from_lists([r.tolist() for r in chosen],
                                               width=value.dense_shape[1])
        else:
            batch[name] = np.asarray(value)[positions]
    return batch, np.asarray(examples.labels)[positions]


def digests(batch, labels) -> dict[str, str]:
    """The input of a batch and its labels in canonical form, as the TF runners record it."""
    shown = {**batch, "label": labels}
    return digest_batch(shown)
