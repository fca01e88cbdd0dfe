"""Hypotheses on which rows of an embedding table an update moved: a row with a gradient that
kept its value (an update skipped), rows without a gradient that moved (an update computed
for the whole table), and a row looked up twice in a batch whose lookups were applied as
separate updates (Adagrad's accumulator adding the square of each, not of their sum).

Rows are read as each side's own update `w[k] - w[k-1]` (a table captured by touched rows is
read on the rows either side touched), against the step's gradient summed per row.
"""
from __future__ import annotations

import numpy as np

from verify.core.trace import SparseRows
from verify.explain.evidence import Evidence, Finding, agree, is_table

MOVED = 1e-12   # an update below this (float32 rounding of a zero) did not move the row


def _row_norms(values: np.ndarray) -> np.ndarray:
    return np.sqrt((values.reshape(len(values), -1) ** 2).sum(axis=1)) if values.ndim else \
        np.abs(values)


def _gradient_rows(evidence: Evidence, variable: str) -> np.ndarray | None:
    """The reference's gradient of the divergent step on the rows its update is read on."""
    g = evidence.value("reference", evidence.step, "grad", variable)
    ids = evidence.row_ids(variable)
    return g if g is None or ids is None else g[ids]


def _tables(evidence: Evidence) -> list[tuple[str, np.ndarray, np.ndarray, np.ndarray]]:
    """(table, gradient rows, reference update, candidate update) of every table whose
    gradient both sides applied alike at the divergent step."""
    out = []
    for variable in evidence.variables():
        if not is_table(variable):
            continue
        grads = evidence.both(evidence.step, "grad", variable)
        g = _gradient_rows(evidence, variable)
        ref, cand = (evidence.update(side, variable) for side in ("reference", "candidate"))
        if grads is None or not agree(*grads) or g is None or ref is None or cand is None \
                or not (g.shape == ref.shape == cand.shape) or g.ndim < 2:
            continue
        out.append((variable, g, ref, cand))
    return out


def row_update(evidence: Evidence) -> Finding | None:
    """Rows the reference updated and the candidate did not, with the same gradient (an
    update skipped), or rows without a gradient the candidate moved and the reference did not
    (a dense update of a sparse table); the other rows' updates agree."""
    if evidence.quantity not in ("slot", "weight") or evidence.step < 1:
        return None
    tables = _tables(evidence)
    if not tables:
        return None
    figures, found = [], None
    for variable, g, ref, cand in tables:
        touched = _row_norms(g) > 0
        moved_ref, moved_cand = _row_norms(ref) > MOVED, _row_norms(cand) > MOVED
        skipped = touched & moved_ref & ~moved_cand
        extra = ~touched & ~moved_ref & moved_cand
        rest = ~(skipped | extra)
        rest_agree = bool(rest.any()) and agree(ref[rest], cand[rest], within=1e-3)
        if not (skipped.any() or extra.any()):
            continue   # every row moved where the reference's did: not about rows
        figures.append(f"{variable}: {int(skipped.sum())} rows with a gradient not moved, "
                       f"{int(extra.sum())} rows without one moved (of {len(g)}); the other "
                       f"rows' updates {'agree' if rest_agree else 'differ'}")
        if found is None and rest_agree and skipped.any() and not extra.any():
            found = Finding("row_skipped", True, None,
                            f"the update skipped {int(skipped.sum())} row(s) of {variable} "
                            f"that have a gradient (ids {_ids(evidence, variable, skipped)}); "
                            f"the other rows' updates agree", "")
        elif found is None and rest_agree and extra.any() and not skipped.any():
            found = Finding("untouched_rows_updated", True, None,
                            f"{int(extra.sum())} row(s) of {variable} without a gradient moved "
                            f"(the reference leaves them): the update is computed for the "
                            f"whole table, not the rows looked up", "")
    text = "; ".join(figures)
    if not figures:
        return None
    if found is None:
        return Finding("row_update", False, evidence=text)
    return Finding(found.hypothesis, True, None, found.sentence, text)


def _ids(evidence: Evidence, variable: str, rows: np.ndarray) -> str:
    ids = evidence.row_ids(variable)
    chosen = (ids[rows] if ids is not None else np.flatnonzero(rows))[:3]
    return ", ".join(str(int(i)) for i in chosen)


def _pieces(evidence: Evidence, variable: str) -> SparseRows | None:
    """A side's sparse gradient that keeps repeated ids apart (one row per lookup)."""
    for side in ("reference", "candidate"):
        value = evidence.trace(side).get(evidence.step, "grad", variable)
        if isinstance(value, SparseRows) and not value.problem() and \
                len(np.unique(value.ids)) < len(value.ids):
            return value
    return None


def _sides(fits: dict, rule: str) -> str:
    return ", ".join(side for side in fits if fits[side][rule]) or "neither side"


def repeated_rows(evidence: Evidence) -> Finding | None:
    """Adagrad's accumulator of a table grew on one side by the square of the gradient summed
    per row (one update per row) and on the other by the sum of each lookup's square (repeated
    ids applied as separate updates)."""
    if evidence.quantity != "slot" or evidence.step < 1:
        return None
    for slot in evidence.tensors("slot"):
        variable, _, name = slot.rpartition("/")
        pieces = _pieces(evidence, variable) if name == "accumulator" else None
        pair = evidence.both(evidence.step, "slot", slot)
        if pieces is None or pair is None or evidence.row_ids(variable) is not None:
            continue
        before = evidence.both(evidence.step - 1, "slot", slot)
        start = evidence.number("reference", "optimizer/embedding/initial_accumulator_value")
        start = before if before is not None else (start if start is not None else 0.1,) * 2
        summed = pieces.to_dense().astype(np.float64) ** 2
        apart = np.zeros(pieces.dense_shape)
        np.add.at(apart, pieces.ids.astype(np.int64), pieces.rows.astype(np.float64) ** 2)
        grown = [pair[i] - start[i] for i in (0, 1)]
        fits = {side: {"summed": agree(grown[i], summed, 1e-3),
                       "apart": agree(grown[i], apart, 1e-3)}
                for i, side in enumerate(("reference", "candidate"))}
        figures = (f"{slot} grew by the squared sum per row on {_sides(fits, 'summed')}, by "
                   f"each lookup's square on {_sides(fits, 'apart')}")
        if agree(summed, apart, 1e-3):
            continue   # no row looked up twice with a gradient: the two rules agree
        if not any(fit for side in fits.values() for fit in side.values()):
            continue   # neither side grew by either rule from the start: not about lookups
        if fits["reference"]["summed"] and fits["candidate"]["apart"]:
            return Finding("repeated_rows", True, None,
                           f"rows looked up more than once in a batch are updated once per "
                           f"lookup: {slot} adds the square of each lookup's gradient, not of "
                           f"their sum", figures)
        return Finding("repeated_rows", False, evidence=figures)
    return None
