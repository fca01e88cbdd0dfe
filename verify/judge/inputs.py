"""Two sides' `input` at one step, compared example by example in canonical form
(`verify.core.inputs`), with a message that says what the model would train on differently:
other batching, the same examples in another order (a shuffle), other examples, a different
value (example, position, both values), a dropped or added id, a padding id counted as an id.
A layout the canonical form removes is not a difference here (`layout_difference` words it
for preflight, as information).

>>> from verify.core.inputs import input_feature
>>> ref = input_feature(np.array([[1.0], [2.0], [3.0]], np.float32))
>>> compare_inputs(input_feature(np.array([1, 2, 3])), ref)
''
>>> compare_inputs(input_feature(np.array([3.0, 1.0, 2.0])), ref)
"Same examples, other order (a shuffle?): the candidate's examples are the reference's 2, 0, 1, in that order."
>>> compare_inputs(input_feature(np.array([1.0, 2.5, 3.0])), ref)
'A different value: 1 of 3 examples differ, first example 1: candidate 2.5, reference 2.'
"""
from __future__ import annotations

import re

import numpy as np
import pandas as pd

from verify.core.inputs import InputFeature
from verify.core.trace import Trace
from verify.judge.preflight import INFORMATIONAL

SHOWN = 6     # list items a message shows at most


def compare_inputs(candidate: InputFeature, reference: InputFeature) -> str:
    """'' when both sides hold the same examples in the same order, each the same list of
    numbers; else what differs, in words (the first example that does, both its values)."""
    a, b = candidate.digests, reference.digests
    if len(a) == len(b) and (a == b).all():
        return ""
    if len(a) != len(b):
        common = min(len(a), len(b))
        agree = int((a[:common] == b[:common]).sum())
        return (f"Other batching: the candidate's batch holds {len(a)} examples, the "
                f"reference's {len(b)}; {agree} of the first {common} agree.")
    if np.array_equal(np.sort(a), np.sort(b)):
        return (f"Same examples, other order (a shuffle?): the candidate's examples are the "
                f"reference's {_listed(_positions(a, b))}, in that order.")
    differ = np.flatnonzero(a != b)
    first = int(differ[0])
    counted = f"{len(differ)} of {len(a)} examples differ, first example {first}"
    elsewhere = int(np.isin(a[differ], b).sum())
    if len(differ) > 1 and elsewhere and len(np.unique(b)) > len(b) // 2:
        # examples tell apart by this feature, several differ, and some of those are others
        # of the reference's batch: examples moved (their values need not have changed)
        moved = np.flatnonzero(b == a[first])
        which = f", which is the reference's example {int(moved[0])}" if len(moved) else ""
        return (f"Other examples: {counted}{which}; {elsewhere} of the {len(differ)} that "
                f"differ are elsewhere in the reference's batch (a shuffle across steps, or "
                f"other batching?).")
    return _example_difference(candidate, reference, first, counted)


def _positions(a: np.ndarray, b: np.ndarray) -> list[int]:
    """For each of `a`'s digests, the position of an equal one in `b` (each used once)."""
    order = np.argsort(b, kind="stable")
    sorted_b = b[order]
    taken: dict[int, int] = {}
    out = []
    for digest in a.tolist():
        start = int(np.searchsorted(sorted_b, np.uint64(digest)))
        n = taken.get(digest, 0)
        taken[digest] = n + 1
        out.append(int(order[start + n]))
    return out


def _example_difference(candidate: InputFeature, reference: InputFeature, first: int,
                        counted: str) -> str:
    """What differs in example `first`: its values, ids dropped or added, padding counted."""
    mine, theirs = candidate.example(first), reference.example(first)
    n_mine, n_theirs = int(candidate.lengths[first]), int(reference.lengths[first])
    if mine is None or theirs is None:
        size = (f"{n_mine} numbers against {n_theirs}" if n_mine != n_theirs
                else f"{n_mine} numbers each")
        return (f"Different examples: {counted} ({size}; the batch is too large for its "
                f"values to be kept, digests only).")
    if n_mine == n_theirs:
        at = int(np.flatnonzero(mine != theirs)[0])
        where = f", position {at}" if n_mine > 1 else ""
        return (f"A different value: {counted}{where}: candidate {_number(mine[at])}, "
                f"reference {_number(theirs[at])}.")
    both = f"candidate [{_listed(mine)}], reference [{_listed(theirs)}]"
    if n_mine < n_theirs:
        missing = _removed(theirs, mine)
        what = (f"id {_listed(missing)} dropped" if missing is not None and len(missing) == 1
                else f"ids {_listed(missing)} dropped" if missing is not None
                else "fewer ids")
        return f"Dropped ids: {counted}, {what}: {both}."
    extra = _removed(mine, theirs)
    if extra is not None and len(set(extra.tolist())) == 1 and (
            mine[len(theirs):] == extra).all() and (extra[0] <= 0 or len(extra) > 1):
        return (f"A padding id counted as an id: {counted}, which ends in {len(extra)} x id "
                f"{_number(extra[0])} the reference's does not have: {both}.")
    what = (f"id {_listed(extra)} added" if extra is not None and len(extra) == 1
            else f"ids {_listed(extra)} added" if extra is not None else "more ids")
    return f"Added ids: {counted}, {what}: {both}."


def _removed(longer: np.ndarray, shorter: np.ndarray) -> np.ndarray | None:
    """The items of `longer` that are not in `shorter`, when `shorter` is `longer` with them
    taken out (order kept); else None."""
    kept, n = [], 0
    for index, item in enumerate(longer.tolist()):
        if n < len(shorter) and item == shorter[n]:
            n += 1
        else:
            kept.append(index)
    return longer[kept] if n == len(shorter) else None


def layout_difference(candidate: InputFeature, reference: InputFeature) -> str:
    """How the two sides laid a feature out, where they differ ('' where they do not).

    >>> from verify.core.inputs import input_feature
    >>> layout_difference(input_feature(np.zeros(8, np.float32)),
    ...                   input_feature(np.zeros((8, 1), np.float32)))
    'shape (8,) vs (8, 1)'
    >>> from verify.core.case import SparseIds
    >>> ids = SparseIds.from_lists([[4, 2], [7]])
    >>> layout_difference(input_feature(SparseIds(ids.indices, ids.values.astype(np.int32),
    ...                                           ids.dense_shape)), input_feature(ids))
    'int32 vs int64'
    """
    if _without_batch(candidate.layout) == _without_batch(reference.layout):
        return ""     # the same layout (another batch size is batching: the input rows say it)
    mine, theirs = candidate.layout.rsplit(" (", 1), reference.layout.rsplit(" (", 1)
    if len(mine) == len(theirs) == 2 and mine[0] == theirs[0]:
        return f"shape ({mine[1]} vs ({theirs[1]}"
    words, other = candidate.layout.split(), reference.layout.split()
    differ = [n for n, (a, b) in enumerate(zip(words, other)) if a != b]
    if len(words) == len(other) and len(differ) == 1:    # e.g. the dtype alone
        return f"{words[differ[0]]} vs {other[differ[0]]}"
    return f"{candidate.layout} vs {reference.layout}"


def layout_findings(reference: Trace, candidate: Trace, rows: pd.DataFrame) -> list[dict]:
    """Preflight findings, informational: each input feature the two sides laid out
    differently, as seen at the first step both captured ('label: shape (8,) vs (8, 1), same
    values'), and whether its values agreed at every step (`rows`: the pair's drift rows).

    >>> from verify.core.inputs import input_feature
    >>> ref, cand = Trace("tf1"), Trace("tf2")
    >>> ref.record(1, "input", "label", input_feature(np.zeros((8, 1), np.float32)))
    >>> cand.record(1, "input", "label", input_feature(np.zeros(8, np.float32)))
    >>> rows = pd.DataFrame({"quantity": ["input"], "tensor": ["label"], "passed": [True]})
    >>> layout_findings(ref, cand, rows)[0]["rule"]
    'label: shape (8,) vs (8, 1), same values (input is compared per example, as the model trains on it)'
    """
    steps = [{k.step for k in t.values if k.quantity == "input"} for t in (reference, candidate)]
    if not steps[0] & steps[1]:
        return []
    step = min(steps[0] & steps[1])
    input_rows = rows[rows["quantity"] == "input"] if len(rows) else rows
    failed = set(input_rows.loc[~input_rows["passed"].astype(bool), "tensor"]) if len(
        input_rows) else set()
    findings = []
    for key in sorted((k for k in reference.keys_at(step) if k.quantity == "input"),
                      key=lambda k: k.tensor):
        ref, cand = reference.values.get(key), candidate.values.get(key)
        if not (isinstance(ref, InputFeature) and isinstance(cand, InputFeature)):
            continue
        difference = layout_difference(cand, ref)
        if difference:
            values = ("values differ too (see the input rows)" if key.tensor in failed else
                      "same values (input is compared per example, as the model trains on it)")
            findings.append({"side": "both", "key": f"input/{key.tensor}",
                             "reference_value": ref.layout, "candidate_value": cand.layout,
                             "severity": INFORMATIONAL,
                             "rule": f"{key.tensor}: {difference}, {values}"})
    return findings


def _without_batch(layout: str) -> str:
    return re.sub(r"\((\d+)", "(", layout, count=1)


def _number(value) -> str:
    value = value.item() if hasattr(value, "item") else value
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


def _listed(items) -> str:
    items = [_number(i) for i in (items.tolist() if hasattr(items, "tolist") else items)]
    shown = ", ".join(items[:SHOWN])
    return shown + (f", … ({len(items)} in all)" if len(items) > SHOWN else "")
