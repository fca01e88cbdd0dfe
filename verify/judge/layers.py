"""Where inside the step: compare two sides' replayed step layer by layer and name the first
layer that diverges, forward then backward.

The two `LayerCapture`s (`verify.core.layer_capture`) meet by layer (named by the canonical
variables each holds) and kind (input, output, per-example loss). In forward order (the
reference's call order) the first value beyond its tolerance is the first divergent layer; when
every forward value agrees, the step's own rows say what follows: a loss that differs is the
loss's reduction (or the loss, where a side's per-example losses were not observed); then the
gradients flowing back through each layer, last layer first; when they all agree and the
gradients the optimizer applied differ, what changed them came after the backward pass
(clipping, aggregation across replicas, scaling).

Forward values are judged with the quantity table's default `loss` tolerance, their gradients
with its default `grad` tolerance (`verify.core.quantities`, measured on faithful pairs), fixed
in advance whatever the pair: a case's own tolerances may be loosened for the drift many steps
accumulate, and are capped by calibrated noise floors a replayed activation does not have.

>>> import numpy as np
>>> from verify.core.layer_capture import LayerCapture, ObservedLayer
>>> def side(scale):
...     out = ObservedLayer("dense", "output", 0, "Dense", "", np.ones((2, 1)) * scale, None)
...     return LayerCapture(1, (out,))
>>> found = compare_layers(side(1.0), side(1.5))
>>> found.first, found.first_drift
('`dense` output (Dense): max abs 0.5', 0.5)
"""
from __future__ import annotations

import dataclasses
import math
import numpy as np
import pandas as pd

from verify.core.layer_capture import LayerCapture, ObservedLayer
from verify.core.tolerances import Tolerances
from verify.judge.arrays import compare_arrays

LAYER_COLUMNS = ["case", "reference", "candidate", "replicas", "step", "direction", "order",
                 "layer", "kind", "part", "reference_layer", "candidate_layer", "fed_by", "status",
                 "max_abs", "max_rel", "times_tolerance", "reason"]
DEFAULT_TOLERANCES = Tolerances.default()
# Classes whose output is an embedding lookup after its combiner.
EMBEDDING_CLASSES = ("Embedding", "DenseFeatures", "SequenceFeatures")


@dataclasses.dataclass(frozen=True)
class LayerComparison:
    """The replayed step compared: one row per value (`LAYER_COLUMNS` without the pair's
    columns), the first divergent place as a sentence and its max abs drift (NaN when
    nothing diverged inside the step)."""

    rows: pd.DataFrame
    first: str
    first_drift: float


def compare_layers(reference: LayerCapture, candidate: LayerCapture,
                   tolerances: Tolerances = DEFAULT_TOLERANCES, *, loss_differs: bool = False,
                   grads_differ: bool = False) -> LayerComparison:
    """Compare the replayed step of two sides (see the module's docstring). `loss_differs`
    and `grads_differ` say whether the pair's own rows at that step failed for its loss and
    for the gradients the optimizer applied. `tolerances` are the defaults (a test may pass
    others)."""
    ref, cand = reference.by_key(), candidate.by_key()
    forward_tol = tolerances.lookup("loss", "loss")
    order = [e.key for e in reference.entries] + [e.key for e in candidate.entries
                                                  if e.key not in ref]
    rows, first, drift = [], "", math.nan
    backward = []
    for n, key in enumerate(order):
        a, b = cand.get(key), ref.get(key)
        if a is None or b is None:
            side = "reference" if b is not None else "candidate"
            rows.append(_row("forward", n, key, b, a, f"only on the {side}", why=(
                f"observed on the {side} only: the other side has no layer holding "
                f"{key[0]!r}" + (f" (or no feature {key[2]!r} in it)" if key[2] else "")
                if key[0] != "loss" else
                f"observed on the {side} only: the other side's loss is not a Keras Loss")))
            continue
        value_drift = compare_arrays(_squeezed(a.forward, b.forward), b.forward, forward_tol)
        rows.append(_row("forward", n, key, b, a, "passed" if value_drift.passed else "failed",
                         value_drift))
        if not value_drift.passed and not first:
            first, drift = f"{_place(key, b, a)}: {_figure(value_drift)}", value_drift.max_abs
        backward.append((n, key, a, b))
    if not first and loss_differs:
        observed = any(key[:2] == ("loss", "per-example loss") for _, key, _, _ in backward)
        first = ("the loss's reduction: every layer and the per-example losses agree, the "
                 "loss the step minimized does not" if observed else
                 "the loss: every layer observed agrees, the loss the step minimized does not "
                 "(per-example losses not observed on both sides)")
    for n, key, a, b in reversed(backward):
        if a.backward is None or b.backward is None:
            rows.append(_row("backward", n, key, b, a, "no gradient", why=(
                "no gradient flowed back through it on "
                + ("either side" if a.backward is None and b.backward is None else
                   "the candidate" if a.backward is None else "the reference"))))
            continue
        backward_tol = tolerances.lookup("grad", key[0])
        grad_drift = compare_arrays(_squeezed(a.backward, b.backward), b.backward, backward_tol)
        rows.append(_row("backward", n, key, b, a, "passed" if grad_drift.passed else "failed",
                         grad_drift))
        if not grad_drift.passed and not first:
            first = f"backward: the gradient at {_place(key, b, a)}: {_figure(grad_drift)}"
            drift = grad_drift.max_abs
    if not first and grads_differ:
        first = ("after the backward pass: every layer's value and gradient agree, the "
                 "gradients the optimizer applied do not (clipping, aggregation across "
                 "replicas or scaling after tape.gradient)")
    return LayerComparison(pd.DataFrame(rows, columns=LAYER_COLUMNS[5:]), first, drift)


def _figure(drift) -> str:
    return f"max abs {drift.max_abs:.3g}" if not math.isnan(drift.max_abs) else drift.reason


def _place(key, reference: ObservedLayer, candidate: ObservedLayer) -> str:
    """The place a value is observed, in words: "embedding lookup `embedding/items` (after
    its combiner)", "the input of `dense` (the Concatenate feeding it)"."""
    layer, kind, part = key
    classes = _classes(reference, candidate)
    feature = f"feature `{part}`, " if part else ""
    if kind == "per-example loss":
        return f"the per-example loss ({classes})"
    if kind == "input":
        feeding = reference.fed_by or candidate.fed_by
        return f"the input of `{layer}`" + (f" (the {feeding} feeding it)" if feeding else "")
    if any(name in c for c in (reference.layer_class, candidate.layer_class)
           for name in EMBEDDING_CLASSES):
        return f"embedding lookup `{layer}` ({feature}after its combiner; {classes})"
    return f"`{layer}` output ({feature}{classes})"


def _classes(reference: ObservedLayer, candidate: ObservedLayer) -> str:
    if reference.layer_class == candidate.layer_class:
        return reference.layer_class
    return f"{reference.layer_class} | {candidate.layer_class}"


def _squeezed(candidate: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """The candidate in the reference's shape where they differ only by axes of size 1
    (TF1's per-element losses `[batch, 1]` against a Keras loss's `[batch]`)."""
    a = np.asarray(candidate)
    if a.shape != np.shape(reference) and a.size == np.size(reference) and \
            [d for d in a.shape if d != 1] == [d for d in np.shape(reference) if d != 1]:
        return a.reshape(np.shape(reference))
    return a


def _row(direction: str, order: int, key, reference: ObservedLayer | None,
         candidate: ObservedLayer | None, status: str, drift=None, why: str = "") -> dict:
    return {"direction": direction, "order": order, "layer": key[0], "kind": key[1],
            "part": key[2],
            "reference_layer": reference.layer_class if reference else "",
            "candidate_layer": candidate.layer_class if candidate else "",
            "fed_by": (reference or candidate).fed_by,
            "status": status,
            "max_abs": drift.max_abs if drift is not None else math.nan,
            "max_rel": drift.max_rel if drift is not None else math.nan,
            "times_tolerance": drift.times_tolerance if drift is not None else math.nan,
            "reason": drift.reason if drift is not None else why}


def layer_rows(comparison: LayerComparison, case: str, reference: str, candidate: str,
               replicas: int, step: int) -> pd.DataFrame:
    """The comparison's rows with the pair's columns (`LAYER_COLUMNS`)."""
    rows = comparison.rows.copy()
    for column, value in zip(LAYER_COLUMNS[:5], (case, reference, candidate, replicas, step)):
        rows.insert(LAYER_COLUMNS.index(column), column, value)
    return rows.reindex(columns=LAYER_COLUMNS)


def unobserved_lines(*captures: tuple[str, LayerCapture]) -> list[str]:
    """The layers a side saw but could not compare, one line per side that had any."""
    return [f"{side}: not compared: {', '.join(c.unobserved)}" for side, c in captures
            if c.unobserved]
