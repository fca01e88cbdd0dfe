"""What a hypothesis reads: both sides' numbers at and around a pair's first divergence, the
optimizer each side declares, and the pair's preflight findings.

Values are read from the traces as float64 arrays; a value a trace does not hold (or holds only
as touched rows of a table too large to be made whole) reads as None, and a hypothesis that
needs it does not apply. Nothing here imports TensorFlow.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pandas as pd

from verify.core.trace import SparseRows, TouchedRows, Trace
from verify.judge.touched_rows import RowState

# How far two arrays may be apart and still count as equal here: far above float32 rounding of
# one step (1e-7 relative), far below the smallest mutation the suite makes (1e-2).
SAME = 1e-4


@dataclasses.dataclass(frozen=True)
class Finding:
    """What one hypothesis concluded about one pair.

    `fits`: its test on the numbers supported it; `value` is the figure it recovered (a factor,
    a norm cap, a step); `sentence` says the cause with its figures (when it fits); `evidence`
    gives the figures that support or rule it out.

    >>> Finding("drop_step", True, 2.0, "the update of step 2 is missing", "grads 0").label()
    'drop_step 2'
    """

    hypothesis: str
    fits: bool
    value: float | None = None
    sentence: str = ""
    evidence: str = ""
    keys: tuple[str, ...] = ()   # the declared keys it rests on (the 'declared' cause)

    def label(self) -> str:
        """The hypothesis and its value as a control declares it ('learning_rate x1.01',
        'declared table/user/initializer')."""
        if self.keys:
            return f"{self.hypothesis} {self.keys[0]}"
        if self.value is None:
            return self.hypothesis
        if self.hypothesis in ("drop_step", "adam_step_count"):
            return f"{self.hypothesis} {int(round(self.value))}"
        prefix = "" if self.hypothesis.startswith("clip_") else "x"
        return f"{self.hypothesis} {prefix}{self.value:.4g}"


@dataclasses.dataclass
class Evidence:
    """Both traces of a pair, where it first diverged and what each side declared.

    >>> ref, cand = Trace("a"), Trace("b")
    >>> ref.record(1, "grad", "w", np.ones(2)); cand.record(1, "grad", "w", 2 * np.ones(2))
    >>> Evidence(ref, cand, 1, "grad", "w").value("candidate", 1, "grad", "w").tolist()
    [2.0, 2.0]
    """

    reference: Trace
    candidate: Trace
    step: int
    quantity: str
    tensor: str
    preflight: pd.DataFrame = dataclasses.field(default_factory=pd.DataFrame)
    # read once: each side's (step, quantity) -> tensors, and the values asked for
    _index: dict = dataclasses.field(default_factory=dict, repr=False)
    _read: dict = dataclasses.field(default_factory=dict, repr=False)

    def held(self, side: str, step: int, quantity: str) -> list[str]:
        """The tensors of `quantity` one side holds at `step`."""
        if side not in self._index:
            index: dict[tuple[int, str], list[str]] = {}
            for key in self.trace(side).values:
                index.setdefault((key.step, key.quantity), []).append(key.tensor)
            self._index[side] = index
        return self._index[side].get((step, quantity), [])

    def trace(self, side: str) -> Trace:
        return self.reference if side == "reference" else self.candidate

    def value(self, side: str, step: int, quantity: str, tensor: str) -> np.ndarray | None:
        """The value as float64 (sparse gradients made dense), None when not held."""
        key = (side, step, quantity, tensor)
        if key not in self._read:
            self._read[key] = self._dense(side, step, quantity, tensor)
        return self._read[key]

    def _dense(self, side: str, step: int, quantity: str, tensor: str) -> np.ndarray | None:
        value = self.trace(side).get(step, quantity, tensor)
        if isinstance(value, TouchedRows) or (value is not None and self.row_ids(tensor)
                                              is not None and quantity in ("weight", "slot")):
            return self._rows(side, step, quantity, tensor)
        if isinstance(value, SparseRows):
            return value.to_dense().astype(np.float64) if not value.problem() else None
        if isinstance(value, np.ndarray) and value.dtype.kind in "fiu":
            return value.astype(np.float64)
        return None

    def row_ids(self, tensor: str) -> np.ndarray | None:
        """The rows of a table captured by the rows each step touched (`TouchedRows`) that a
        hypothesis reads: those either side's update of the table touched at the divergent
        step (a slot's rows are its variable's); None for a variable captured whole."""
        variable = tensor if self.held("reference", self.step, "weight").count(tensor) else \
            tensor.rpartition("/")[0]
        key = ("rows", variable)
        if key not in self._read:
            touched = [v.ids for v in (self.trace(s).get(self.step, "weight", variable)
                                       for s in ("reference", "candidate"))
                       if isinstance(v, TouchedRows)]
            self._read[key] = np.unique(np.concatenate(touched)) if touched else None
        return self._read[key]

    def _rows(self, side: str, step: int, quantity: str, tensor: str) -> np.ndarray | None:
        """A touched-rows table's rows `row_ids` as the side knows them after `step`."""
        ids = self.row_ids(tensor)
        if ids is None:
            return None
        state = RowState(self.trace(side), quantity, tensor)
        state.advance(step)
        rows = state.rows_at(ids)
        return None if rows is None else np.asarray(rows, np.float64)

    def both(self, step: int, quantity: str, tensor: str
             ) -> tuple[np.ndarray, np.ndarray] | None:
        """Both sides' values, None unless both hold it with one shape."""
        a = self.value("reference", step, quantity, tensor)
        b = self.value("candidate", step, quantity, tensor)
        return (a, b) if a is not None and b is not None and a.shape == b.shape else None

    def tensors(self, quantity: str, step: int | None = None) -> list[str]:
        """Tensors of `quantity` both sides hold at `step` (the divergence's by default)."""
        step = self.step if step is None else step
        held = set(self.held("candidate", step, quantity))
        return sorted(n for n in self.held("reference", step, quantity) if n in held)

    def variables(self) -> list[str]:
        """Variables whose weights both sides hold before and after the divergent step."""
        before = set(self.tensors("weight", self.step - 1))
        return [t for t in self.tensors("weight") if t in before]

    def trained_variables(self) -> list[str]:
        """`variables()` a gradient reaches on either side at the divergent step: what an
        optimizer updates, not state the model keeps beside it (a moving statistic). All of
        `variables()` when neither side recorded gradients at that step."""
        graded = set(self.held("reference", self.step, "grad")) | set(
            self.held("candidate", self.step, "grad"))
        held = self.variables()
        return [t for t in held if t in graded] if graded else held

    def slots_of(self, variable: str) -> list[str]:
        return [t for t in self.tensors("slot") if t.startswith(variable + "/")]

    def update(self, side: str, variable: str, step: int | None = None) -> np.ndarray | None:
        """The change a side's own update made to a variable at `step`: w[k] - w[k-1]."""
        step = self.step if step is None else step
        after = self.value(side, step, "weight", variable)
        before = self.value(side, step - 1, "weight", variable)
        if after is None or before is None or after.shape != before.shape:
            return None
        return after - before

    def declared(self, side: str, key: str) -> Any:
        """A side's declared configuration value (`optimizer/model/learning_rate`), or None;
        for a side that is the math rather than a pipeline (an oracle, which declares no
        configuration to preflight), the constants its math used (`details["math_config"]`)."""
        meta = self.trace(side).meta
        value = meta.declared_config.get(key)
        return value if value is not None else (meta.details.get("math_config") or {}).get(key)

    def optimizer(self, side: str = "reference") -> str:
        """The optimizer family a side declares for its model ('adam'), '' when not declared."""
        return str(self.declared(side, "optimizer/model/kind") or "")

    def number(self, side: str, key: str) -> float | None:
        value = self.declared(side, key)
        return float(value) if isinstance(value, (int, float)) else None

    def steps(self) -> list[int]:
        return sorted(set(self.reference.steps()) & set(self.candidate.steps()))


def is_table(tensor: str) -> bool:
    """Embedding tables are named `embedding/...` canonically in every shipped case."""
    return tensor.startswith("embedding/") or "/embedding" in tensor


def agree(a: np.ndarray, b: np.ndarray, within: float = SAME) -> bool:
    """Two arrays equal to `within` relative to the larger's norm (both zero: equal).

    >>> agree(np.array([1.0, 2.0]), np.array([1.0, 2.00001]))
    True
    """
    scale = max(float(np.linalg.norm(a)), float(np.linalg.norm(b)))
    return scale == 0.0 or float(np.linalg.norm(a - b)) <= within * scale


def fitted_factor(reference: np.ndarray, candidate: np.ndarray) -> tuple[float, float]:
    """The factor c that best gives `candidate` as c * `reference` (least squares) and how far
    from it the candidate is (relative residual); (nan, inf) when the reference is zero.

    >>> fitted_factor(np.array([1.0, 2.0]), np.array([2.0, 4.0]))
    (2.0, 0.0)
    """
    a, b = reference.ravel(), candidate.ravel()
    denominator = float(a @ a)
    if denominator == 0.0:
        return float("nan"), float("inf")
    factor = float(a @ b) / denominator
    norm = float(np.linalg.norm(b))
    residual = float(np.linalg.norm(b - factor * a)) / norm if norm else float("inf")
    return factor, residual


def global_norm(evidence: Evidence, side: str, step: int) -> float | None:
    """The global norm of a side's captured gradients at `step` as `tf.clip_by_global_norm`
    takes it: a sparse gradient's pieces (one row per lookup, repeated ids apart), not their
    sums per row. None without gradients."""
    total, seen = 0.0, False
    for tensor in evidence.tensors("grad", step):
        value = evidence.trace(side).get(step, "grad", tensor)
        pieces = value.rows if isinstance(value, SparseRows) else value
        if isinstance(pieces, np.ndarray) and pieces.dtype.kind == "f":
            total, seen = total + float((pieces.astype(np.float64) ** 2).sum()), True
    return float(np.sqrt(total)) if seen else None
