"""Trace x Trace -> long-form drift rows, and where two traces first diverge.

Pure numpy/pandas: nothing here imports TensorFlow, so saved traces compare anywhere.
"""
from __future__ import annotations

import dataclasses
import functools
import itertools
from typing import Iterator

import pandas as pd

from verify.core.noise_floor import MULTIPLE, NoiseFloor
from verify.core.tolerances import Tolerance, Tolerances
from verify.core.trace import QUANTITIES, Key, TouchedRows, Trace
from verify.judge.arrays import Drift, compare_values
from verify.judge.records import COLUMNS, DriftRow, Status, rows_frame
from verify.judge.touched_rows import TouchedComparison

__all__ = ["COLUMNS", "compare_traces", "first_divergence", "Divergence"]


def compare_traces(reference: Trace, candidate: Trace, tolerances: Tolerances | None = None,
                   *, case: str = "", replicas: int | None = None,
                   floor: NoiseFloor | None = None, multiple: float = MULTIPLE) -> pd.DataFrame:
    """Compare every captured value of `candidate` with `reference`: one drift row each.

    Values are compared on the steps both traces captured (a trace whose meta has
    `capture_every: k` captured only every k-th step, or `read_every` k for a tensor). A tensor
    present on one side only, a run that raised, or a step one side should have captured but
    did not, gives a failing row with its reason: never an exception. A value a side declares
    its device never let it capture (`not_captured`) gives a row that passes with the reason
    "not captured on <device>: ..." and no number (`not_captured_rows`). With the reference's
    measured noise `floor`, each numeric tensor's tolerance is capped at `multiple` times its
    floor at that step.

    >>> import numpy as np
    >>> ref, cand = Trace("tf1"), Trace("tf2")
    >>> for t, v in ((ref, 0.5), (cand, 0.5)):
    ...     t.record(1, "loss", "loss", np.float32(v))
    >>> rows = compare_traces(ref, cand, case="demo")
    >>> rows[["step", "quantity", "passed"]].values.tolist()
    [[1, 'loss', True]]
    """
    tolerances = tolerances or Tolerances.default()
    if replicas is None:
        replicas = candidate.meta.replicas or 1
    run_tol = tolerances.lookup("run", "")
    touched = TouchedComparison(reference, candidate)   # tables captured by touched rows
    on_side = {id(t): {k.quantity for k in t.values} for t in (reference, candidate)}
    captured = on_side[id(reference)] & on_side[id(candidate)]
    found = itertools.chain(
        _raised_runs(reference, candidate, run_tol),
        _quantities_missing(reference, candidate, on_side, tolerances),
        _walk_steps(reference, candidate, captured, touched, run_tol,
                    functools.partial(_tolerance, tolerances, floor, multiple)))
    return rows_frame([DriftRow.of(case=case, reference=reference.implementation,
                                   candidate=candidate.implementation, replicas=replicas,
                                   step=key.step, quantity=key.quantity, tensor=key.tensor,
                                   drift=drift, tolerance=tol, status=status)
                       for key, drift, tol, status in found])


# What the checks below give for a drift row: its key, its drift, the tolerance it was judged
# by, and its status when the drift alone does not say it (None: passed or failed).
_Found = tuple[Key, Drift, Tolerance, Status | None]


def _raised_runs(reference: Trace, candidate: Trace, run_tol: Tolerance) -> Iterator[_Found]:
    """A failing 'run' row for each side whose run raised, one step after its last."""
    for side, trace in (("candidate", candidate), ("reference", reference)):
        if trace.error is not None:
            last = max(trace.steps(), default=0)
            yield (Key(last + 1, "run", trace.implementation),
                   Drift(reason=f"{side} {trace.implementation} raised: {trace.error}"),
                   run_tol, None)


def _quantities_missing(reference: Trace, candidate: Trace, on_side: dict,
                        tolerances: Tolerances) -> Iterator[_Found]:
    """A failing '(all)' row for each quantity a side captured none of while the other did.

    A run captured at boundaries only (meta `capture_every` > 1: an uninstrumented run has no
    per-step loss or gradients) is compared on the quantities it has. A run captured every
    step that lacks a whole quantity the other side has (e.g. optimizer slots it could not
    read) fails; so does a name missing within a captured quantity (`_walk_steps`)."""
    for side, trace, other in (("candidate", candidate, reference),
                               ("reference", reference, candidate)):
        if trace.error is not None or trace.meta.capture_every > 1:
            continue
        for quantity in sorted(on_side[id(other)] - on_side[id(trace)], key=QUANTITIES.index):
            if {k.tensor for k in other.values if k.quantity == quantity} <= set(
                    trace.meta.not_captured.get(quantity, {})):
                continue   # declared: rows say "not captured" below
            first = min(k.step for k in other.values if k.quantity == quantity)
            yield (Key(first, quantity, "(all)"),
                   Drift(reason=f"{side} {trace.implementation} captured no {quantity} value at "
                                f"all, {other.implementation} did: its runner cannot read them "
                                f"(e.g. an optimizer whose slots it does not know)."),
                   tolerances.lookup(quantity, "(all)"), None)


def _tolerance(tolerances: Tolerances, floor: NoiseFloor | None, multiple: float,
               key: Key) -> Tolerance:
    """`key`'s tolerance, capped at `multiple` times its noise floor at its step if measured."""
    tol = tolerances.lookup(key.quantity, key.tensor)
    if floor is not None:
        tol = tol.with_floor(floor.at(key.quantity, key.tensor, key.step), multiple)
    return tol


def _walk_steps(reference: Trace, candidate: Trace, captured: set, touched: TouchedComparison,
                run_tol: Tolerance, tolerance_of) -> Iterator[_Found]:
    """Step by step: a failing 'run' row for a step one side captured and the other should
    have but did not; on the steps both captured, a row per value of the quantities both
    captured (`_value_row`), judged by `tolerance_of(key)`."""
    ref_steps, cand_steps = set(_all_steps(reference)), set(_all_steps(candidate))
    for step in sorted(ref_steps | cand_steps):
        if step not in cand_steps or step not in ref_steps:
            missing, trace = ("candidate", candidate) if step not in cand_steps else (
                "reference", reference)
            if trace.error is None and step % trace.meta.capture_every == 0:
                yield (Key(step, "run", "(step)"),
                       Drift(reason=f"{missing} {trace.implementation} captured no value at "
                                    f"step {step}, which it should have."), run_tol, None)
            continue
        for quantity, tensor in _names_at(step, reference, candidate, captured):
            key = Key(step, quantity, tensor)
            found = _value_row(key, tolerance_of(key), reference, candidate, touched)
            if found is not None:
                yield found


def _names_at(step: int, reference: Trace, candidate: Trace,
              captured: set) -> list[tuple[str, str]]:
    """The (quantity, tensor) pairs to compare at `step`, in quantity order: those either side
    holds or declares not captured, of the quantities both sides captured."""
    keys = {(k.quantity, k.tensor) for k in reference.keys_at(step)}
    keys |= {(k.quantity, k.tensor) for k in candidate.keys_at(step)}
    here = {q for q, _ in keys}
    keys |= {(q, t) for trace in (reference, candidate)
             for q, tensors in trace.meta.not_captured.items() if q in here for t in tensors}
    keys = {(q, t) for q, t in keys if q in captured}
    return sorted(keys, key=lambda qt: (QUANTITIES.index(qt[0]), qt[1]))


def _value_row(key: Key, tol: Tolerance, reference: Trace, candidate: Trace,
               touched: TouchedComparison) -> _Found | None:
    """`key`'s row: the two values compared, or what a side's missing value means (None: a
    value read every k steps only, not at this one)."""
    ref_value, cand_value = reference.values.get(key), candidate.values.get(key)
    if ref_value is None or cand_value is None:
        absent = [trace for trace in (reference, candidate) if key not in trace.values]
        declared = _declared_not_captured(key, reference, candidate)
        if len(declared) == len(absent):
            return (key, Drift(passed=True, reason=not_captured_reason(
                declared, key.quantity, key.tensor)), tol, Status.NOT_CAPTURED)
        if all(_not_read_at(trace, key) for trace in absent):
            return None   # read every k steps only, and this is not one of them
        side = "candidate" if cand_value is None else "reference"
        return (key, Drift(reason=f"Missing in {side}: {key.quantity} {key.tensor!r} at step "
                                  f"{key.step} exists on one side only; "
                                  + _missing_hint(key, reference, candidate)),
                tol, Status.MISSING)
    if isinstance(ref_value, TouchedRows) or isinstance(cand_value, TouchedRows):
        return key, touched.compare(key, tol), tol, None
    return key, compare_values(cand_value, ref_value, tol), tol, None


def _missing_hint(key: Key, reference: Trace, candidate: Trace) -> str:
    """What to check for a value one side lacks: an input's feature keys differ between the
    sides' datasets (each side's keys named), a variable's name maps."""
    if key.quantity != "input":
        return "check the name maps."
    keys = [sorted({k.tensor for k in trace.keys_at(key.step) if k.quantity == "input"})
            for trace in (reference, candidate)]
    return (f"the sides' batches hold other features (reference: {', '.join(keys[0]) or 'none'}; "
            f"candidate: {', '.join(keys[1]) or 'none'}): both datasets must yield the same "
            f"feature keys (a bare tensor is recorded as 'features').")


def _declared_not_captured(key: Key, *traces: Trace) -> list[Trace]:
    """The traces that hold no value at `key` and declared they could not capture it."""
    return [trace for trace in traces if key not in trace.values
            and key.tensor in trace.meta.not_captured.get(key.quantity, {})]


def _all_steps(trace: Trace) -> list[int]:
    return sorted({k.step for k in trace.values})


def _not_read_at(trace: Trace, key: Key) -> bool:
    """Whether `trace` reads `key`'s tensor only every k steps and `key.step` is not one of
    them (nor its last step, which is always read)."""
    every = trace.meta.read_every.get(key.quantity, {}).get(key.tensor)
    return bool(every) and key.step % every != 0 and key.step != trace.meta.steps


def not_captured_reason(traces: list[Trace], quantity: str, tensor: str) -> str:
    """'not captured on TPU by tf1 and tf2: why | why': the reason of a not-captured row,
    each distinct reason the traces give once, separated by ' | '."""
    whys = " | ".join(dict.fromkeys(t.meta.not_captured[quantity][tensor] for t in traces))
    return f"{_not_captured_where(traces)}: {whys}"


def _not_captured_where(traces: list[Trace]) -> str:
    """'not captured on TPU by tf1 and tf2': on which device by which runs."""
    devices = " and ".join(dict.fromkeys(t.meta.device.upper() for t in traces))
    return f"not captured on {devices} by {' and '.join(t.implementation for t in traces)}"


def not_captured_rows(rows: pd.DataFrame) -> pd.Series:
    """Which drift rows stand for values a device did not let a run capture (they pass and
    hold no number; see `compare_traces`).

    >>> rows = pd.DataFrame({"status": ["passed", "not captured"]})
    >>> not_captured_rows(rows).tolist()
    [False, True]
    """
    if rows.empty:
        return pd.Series([], dtype=bool)
    return rows["status"] == Status.NOT_CAPTURED.value


def describe_not_captured(rows: pd.DataFrame, reference: Trace, candidate: Trace) -> str:
    """The not-captured rows of one pair in a line: each tensor with its step count, and by
    which runs on which device (each row's reason says why).

    >>> import numpy as np
    >>> ref, cand = Trace("tf1"), Trace("tf2", {"device": "tpu",
    ...                                         "not_captured": {"grad": {"t": "in the engine"}}})
    >>> for step in (1, 2):
    ...     ref.record(step, "grad", "t", np.zeros(2, np.float32))
    ...     for trace in (ref, cand):
    ...         trace.record(step, "grad", "w", np.zeros(2, np.float32))
    >>> describe_not_captured(compare_traces(ref, cand), ref, cand)
    'grad t (2 steps): not captured on TPU by tf2'
    """
    part = rows[not_captured_rows(rows)]
    if part.empty:
        return ""
    groups = part.groupby(["quantity", "tensor"], sort=True)["step"].nunique()
    tensors = ", ".join(f"{q} {t} ({n} step{'s' if n != 1 else ''})"
                        for (q, t), n in groups.items())
    where = "; ".join(dict.fromkeys(
        _not_captured_where(_declared_not_captured(Key(step, q, t), reference, candidate))
        for step, q, t in zip(part["step"], part["quantity"], part["tensor"])))
    return f"{tensors}: {where}"


@dataclasses.dataclass(frozen=True)
class Divergence:
    """The earliest failing row of a comparison (step first, then quantity order)."""

    step: int
    quantity: str
    tensor: str
    reason: str
    status: str = Status.FAILED.value   # or 'missing': present on one side only

    def describe(self) -> str:
        return f"first divergence at step {self.step}, {self.quantity} {self.tensor}: {self.reason}"


def first_divergence(rows: pd.DataFrame) -> Divergence | None:
    """The earliest failing row: lowest step, then input < loss < grad < slot < weight < metric.

    A failed run ('run' rows) sorts at the step where it stopped.

    >>> rows = pd.DataFrame({"step": [2, 1, 1], "quantity": ["loss", "weight", "grad"],
    ...                      "tensor": ["loss", "w", "w"], "passed": [False, False, False],
    ...                      "reason": ["a", "b", "c"]})
    >>> first_divergence(rows).describe()
    'first divergence at step 1, grad w: c'
    """
    failed = rows[~rows["passed"].astype(bool)]
    if failed.empty:
        return None
    order = failed.assign(_q=failed["quantity"].map(QUANTITIES.index)).sort_values(
        ["step", "_q", "tensor"], kind="stable")
    top = order.iloc[0]
    return Divergence(int(top["step"]), str(top["quantity"]), str(top["tensor"]),
                      str(top["reason"]), str(top.get("status", Status.FAILED.value)))
