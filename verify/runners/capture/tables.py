"""How a runner captures embedding tables: whole after every step, or by the rows each step
touched.

A production table has millions of rows and a step updates a few thousand of them; reading
the whole table and its optimizer slots after every step costs more than the step. With
`TableCapture("touched_rows", every=K)` a runner records, for every variable whose gradient is
sparse (a table), after each step only the rows that step's gradient names (distinct ids,
sorted) and the same rows of its optimizer slots, as `TouchedRows`; whole tables at step 0,
every K steps and at the last step (slots, which exist only after the first update, also at
step 1). Dense variables are recorded whole every step. `verify.judge.touched_rows` compares
the two sides on the union of the rows either touched.

>>> capture = TableCapture("touched_rows", every=50)
>>> [capture.whole(step, steps=100, quantity="weight") for step in (1, 50, 99, 100)]
[False, True, False, True]
>>> capture.whole(1, steps=100, quantity="slot")
True
"""
from __future__ import annotations

import dataclasses

import numpy as np

from verify.core.quantities import SLOT

MODES = ("whole", "touched_rows")


@dataclasses.dataclass(frozen=True)
class TableCapture:
    """`mode`: "whole" (every variable whole every step, the default) or "touched_rows";
    `every`: K, whole tables every K steps besides step 0 and the last (None: only those)."""

    mode: str = "whole"
    every: int | None = None

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"capture_tables is one of {MODES}, got {self.mode!r}")
        if self.every is not None and self.every < 1:
            raise ValueError(f"tables_every is a step count >= 1 (or None), got {self.every!r}")

    @property
    def touched(self) -> bool:
        return self.mode == "touched_rows"

    def whole(self, step: int, steps: int, quantity: str) -> bool:
        """Whether the tables' `quantity` ("weight" or "slot") is recorded whole at `step`."""
        if not self.touched or step in (0, steps) or (quantity == SLOT and step == 1):
            return True
        return bool(self.every) and step % self.every == 0

    def whole_at(self, step, steps: int, quantity: str):
        """`whole` inside a TensorFlow function: `step` a scalar int64 tensor (>= 1, the steps
        after an update), a scalar bool tensor back."""
        import tensorflow as tf

        whole = tf.equal(step, steps)
        if quantity == SLOT:
            whole = tf.logical_or(whole, tf.equal(step, 1))
        if self.every:
            whole = tf.logical_or(whole, tf.equal(step % self.every, 0))
        return whole

    def describe(self) -> dict:
        return {"capture_tables": self.mode, **({"tables_every": self.every}
                                                if self.touched else {})}


def distinct_ids(indices) -> np.ndarray:
    """The sorted distinct row ids of a sparse gradient's indices.

    >>> distinct_ids(np.array([4, 1, 4])).tolist()
    [1, 4]
    """
    return np.unique(np.asarray(indices, np.int64).reshape(-1))
