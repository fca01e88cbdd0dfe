"""Comparing tables captured by the rows each step touched (`TouchedRows`).

A side that records a table whole only now and then, and in between only the rows each step
updated, still knows every row at every step: the last whole table, overwritten by the rows
touched since. Two sides are compared at a step on the union of the rows either touched, each
side's rows as it knows them, so an update to a row that only one side made (a dropped update,
a wrong id) shows: the other side's row is its older value.

>>> ref, cand = Trace("tf1"), Trace("tf2")
>>> for t in (ref, cand):
...     t.record(0, "weight", "w", np.zeros((4, 2), np.float32))
>>> ref.record(1, "weight", "w", TouchedRows(np.array([1, 2]), np.ones((2, 2), np.float32), (4, 2)))
>>> cand.record(1, "weight", "w", TouchedRows(np.array([1]), np.ones((1, 2), np.float32), (4, 2)))
>>> drift = TouchedComparison(ref, cand).compare(Key(1, "weight", "w"), Tolerance(1e-6, 0))
>>> drift.passed, drift.worst_index
(False, '(2, 0)')
"""
from __future__ import annotations

import dataclasses
import re

import numpy as np

from verify.core.tolerances import Tolerance
from verify.core.trace import Key, Trace, TouchedRows
from verify.judge.arrays import Drift, compare_arrays


class RowState:
    """One side's table (`quantity`, `tensor`) as its trace tells it, advanced step by step:
    the last whole table at or before the step, and the rows touched since (latest wins)."""

    def __init__(self, trace: Trace, quantity: str, tensor: str):
        self.trace, self.quantity, self.tensor = trace, quantity, tensor
        self.steps = sorted(k.step for k in trace.values
                            if k.quantity == quantity and k.tensor == tensor)
        self._reset()

    def _reset(self):
        self.step, self.base, self.ids, self.rows = -1, None, np.zeros(0, np.int64), None

    def advance(self, step: int) -> None:
        if step < self.step:
            self._reset()
        for s in self.steps:
            if self.step < s <= step:
                key = Key(s, self.quantity, self.tensor)
                self._apply(key, self.trace.values[key])
        self.step = step

    def _apply(self, key: Key, value) -> None:
        if not isinstance(value, TouchedRows):          # a whole table: the new base
            # kept by its key, read again for each lookup: a table kept on disk is mapped
            # only while rows are taken from it, so its pages do not stay in memory
            self.base, self.ids, self.rows = key, np.zeros(0, np.int64), None
            return
        if self.rows is None:
            self.ids, self.rows = value.ids, np.asarray(value.rows)
            return
        ids = np.concatenate([self.ids, value.ids])
        rows = np.concatenate([self.rows, np.asarray(value.rows)])
        order = np.argsort(ids, kind="stable")          # equal ids: the older first
        ids, rows = ids[order], rows[order]
        last = np.append(ids[1:] != ids[:-1], True)      # keep the newest of each id
        self.ids, self.rows = ids[last], rows[last]

    def rows_at(self, ids: np.ndarray) -> np.ndarray | None:
        """The rows `ids` as this side knows them now; None when no whole table precedes and
        some row was never touched (its value is unknown)."""
        known = np.zeros(len(ids), bool)
        out = None
        if self.base is not None:
            out = np.asarray(self.trace.values[self.base])[ids]
            known[:] = True
        if self.rows is not None and len(self.ids):
            at = np.minimum(np.searchsorted(self.ids, ids), len(self.ids) - 1)
            hit = self.ids[at] == ids
            if out is None:
                out = np.zeros((len(ids), *self.rows.shape[1:]), self.rows.dtype)
            out[hit] = self.rows[at[hit]]
            known |= hit
        return out if out is not None and known.all() else None


@dataclasses.dataclass
class TouchedComparison:
    """The row states of both sides of a pair, one per (quantity, tensor) compared so far."""

    reference: Trace
    candidate: Trace
    states: dict = dataclasses.field(default_factory=dict)

    def _state(self, trace: Trace, key: Key) -> RowState:
        index = (id(trace), key.quantity, key.tensor)
        if index not in self.states:
            self.states[index] = RowState(trace, key.quantity, key.tensor)
        state = self.states[index]
        state.advance(key.step)
        return state

    def rows(self, key: Key) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """The ids either side touched at `key`'s step and both sides' rows there (reference,
        candidate); None when a side's rows are unknown or the shapes differ."""
        values = [self.reference.values.get(key), self.candidate.values.get(key)]
        if len({shapes_of(v) for v in values}) > 1:
            return None
        ids = np.unique(np.concatenate([v.ids for v in values if isinstance(v, TouchedRows)]))
        rows = [self._state(t, key).rows_at(ids) for t in (self.reference, self.candidate)]
        return None if rows[0] is None or rows[1] is None else (ids, rows[0], rows[1])

    def compare(self, key: Key, tol: Tolerance):
        """The Drift of `key` over the rows either side touched at its step."""

        values = [self.reference.values.get(key), self.candidate.values.get(key)]
        shapes = {tuple(v.dense_shape) if isinstance(v, TouchedRows) else np.shape(v)
                  for v in values}
        if len(shapes) > 1:
            return Drift(reason=f"Shape mismatch: candidate {shapes_of(values[1])}, reference "
                                f"{shapes_of(values[0])}.")
        ids = np.unique(np.concatenate([v.ids for v in values if isinstance(v, TouchedRows)]))
        shape = shapes.pop()
        if len(ids) and (ids[0] < 0 or ids[-1] >= shape[0]):
            return Drift(reason=f"Touched row ids outside a table of {shape[0]} rows: "
                                f"{ids[(ids < 0) | (ids >= shape[0])][:10].tolist()}.")
        sides = {}
        for side, trace in (("reference", self.reference), ("candidate", self.candidate)):
            rows = self._state(trace, key).rows_at(ids)
            if rows is None:
                return Drift(reason=f"{side} {trace.implementation} recorded no whole "
                                    f"{key.quantity} {key.tensor!r} before step {key.step} and "
                                    f"did not touch every row compared: its rows are unknown.")
            sides[side] = rows
        if not len(ids):
            return Drift(0.0, 0.0, 0.0, 0.0, "", True, "", 0.0)
        drift = compare_arrays(sides["candidate"], sides["reference"], tol)
        return _in_table(drift, ids, len(shape) > 1)


def shapes_of(value) -> tuple:
    return tuple(value.dense_shape) if isinstance(value, TouchedRows) else np.shape(value)


_INDEX = re.compile(r"\((\d+)(,|\))")


def _in_table(drift, ids: np.ndarray, has_rows: bool):
    """`drift` of the touched rows stacked (row k is table row ids[k]) with its indices in
    the table's own coordinates and its reason saying what was compared."""
    def table_index(match):
        return f"({int(ids[int(match.group(1))])}{match.group(2)}"

    reason = drift.reason
    if reason:
        reason = (f"On the {len(ids)} rows either side touched: "
                  + _INDEX.sub(table_index, reason))
    return dataclasses.replace(drift, worst_index=_INDEX.sub(table_index, drift.worst_index)
                               if drift.worst_index else "", reason=reason)
