"""Hypotheses on what differs while the training itself agrees: the initial values, a tracked
metric, the state a layer keeps beside its trainable variables (BatchNormalization's moving
statistics), and a forward pass computed in another order.

A variable without a gradient on either side is state the model keeps (non-trainable): its
update is the layer's own, `s[k] = m s[k-1] + (1 - m) x` for a moving average of momentum m,
so another momentum scales every element's update by `(1 - m_c) / (1 - m_r)`.
"""
from __future__ import annotations

import numpy as np

from verify.explain.evidence import SAME, Evidence, Finding, agree, fitted_factor

CONSTANT = 1e-3
# How far a loss computed another way must be from the reference's: far above the float32
# rounding of one forward pass (1e-6), below the smallest shipped layout or combiner (0.8%).
FORWARD = 1e-3


def _all_agree(evidence: Evidence, quantity: str, step: int, names: list[str],
               within: float = SAME) -> bool:
    pairs = [evidence.both(step, quantity, t) for t in names]
    return bool(pairs) and all(p is not None and agree(*p, within=within) for p in pairs)


def non_trainable(evidence: Evidence, step: int | None = None) -> list[str]:
    """The variables both sides hold that neither side computes a gradient for."""
    step = evidence.step if step is None else step
    graded = set(evidence.held("reference", step, "grad")) | set(
        evidence.held("candidate", step, "grad"))
    return [t for t in evidence.tensors("weight", step) if t not in graded]


def _permutation(reference: np.ndarray, candidate: np.ndarray) -> np.ndarray | None:
    """The order of the reference's rows (first axis) that gives the candidate's, None when
    the candidate is not a reordering of them."""
    if reference.ndim < 2 or reference.shape != candidate.shape:
        return None
    flat_r, flat_c = reference.reshape(len(reference), -1), candidate.reshape(len(candidate), -1)
    order_r, order_c = np.lexsort(flat_r.T[::-1]), np.lexsort(flat_c.T[::-1])
    if not np.array_equal(flat_r[order_r], flat_c[order_c]):
        return None
    order = np.empty(len(order_c), np.int64)
    order[order_c] = order_r
    return order


def initializer(evidence: Evidence) -> Finding | None:
    """The initial values differ (step 0): the reference's rows in another order (a kernel
    layout, a concat order), or other values (another initializer, values not loaded)."""
    if evidence.step != 0 or evidence.quantity != "weight":
        return None
    pair = evidence.both(0, "weight", evidence.tensor)
    if pair is None or agree(*pair):
        return None
    order = _permutation(*pair)
    if order is not None:
        moved = np.flatnonzero(order != np.arange(len(order)))
        return Finding("kernel_layout", True, None,
                       f"{evidence.tensor} holds the reference's rows in another order at step "
                       f"0 ({len(moved)} of {len(order)} rows moved): a kernel layout or concat "
                       f"order not mapped", f"candidate row i = reference row "
                       f"{order[moved[:4]].tolist()} for i in {moved[:4].tolist()}")
    ref, cand = (float(np.std(v)) for v in pair)
    ratio = cand / ref if ref else float("inf")
    figures = (f"{evidence.tensor} at step 0: standard deviation {cand:.4g} against the "
               f"reference's {ref:.4g} (x{ratio:.4g}), not a reordering of its rows")
    return Finding("initializer", True, None, f"initial values differ: {evidence.tensor} starts "
                   f"with std x{ratio:.3g} the reference's (another initializer, or the "
                   f"initial values not loaded)", figures)


def metric_only(evidence: Evidence) -> Finding | None:
    """A tracked metric differs while the loss, the gradients and the variables agree at that
    step: the metric is computed another way, the training is not at fault."""
    if evidence.quantity != "metric":
        return None
    pair = evidence.both(evidence.step, "metric", evidence.tensor)
    trained = [(q, names) for q in ("loss", "grad", "weight")
               if (names := evidence.tensors(q))]
    # the judge compared them first (a metric is the last quantity of a step) and found them
    # within tolerance; checked again here at 0.1%, far below a metric's 2x
    agreeing = [q for q, names in trained
                if _all_agree(evidence, q, evidence.step, names, within=1e-3)]
    factor = fitted_factor(*pair)[0] if pair is not None and pair[0].any() else float("nan")
    figures = (f"{evidence.tensor} x{factor:.4g} at step {evidence.step}; "
               + (f"{', '.join(agreeing)} agree there" if len(agreeing) == len(trained) else
                  f"of {', '.join(q for q, _ in trained) or 'nothing'} only "
                  f"{', '.join(agreeing) or 'none'} agree there"))
    # a training metric: the step's loss is there to agree (an evaluation is forward_pass's)
    if "loss" not in agreeing or len(agreeing) != len(trained) or "weight" not in agreeing:
        return Finding("metric", False, evidence=figures)
    return Finding("metric", True, factor if np.isfinite(factor) else None,
                   f"only the tracked metric {evidence.tensor} differs (x{factor:.4g}); loss, "
                   f"gradients and weights agree: the metric is computed another way", figures)


def state(evidence: Evidence) -> Finding | None:
    """A non-trainable variable's update a constant multiple of the reference's while the
    gradients and every trainable variable agree: another momentum of a moving average
    (BatchNormalization's `momentum`)."""
    if evidence.quantity != "weight" or evidence.step < 1:
        return None
    kept = [t for t in non_trainable(evidence) if t in evidence.variables()]
    if evidence.tensor not in kept:
        return None
    trainable = [t for t in evidence.variables() if t not in kept]
    factors = {t: fitted_factor(ref, cand) for t in kept
               if (ref := evidence.update("reference", t)) is not None
               and (cand := evidence.update("candidate", t)) is not None and ref.any()}
    values = [f for f, _ in factors.values()]
    spread = max([float(np.ptp(values))] + [r for _, r in factors.values()]) if values \
        else float("inf")
    trained_agree = _all_agree(evidence, "weight", evidence.step, trainable) and _all_agree(
        evidence, "grad", evidence.step, evidence.tensors("grad"))
    factor = float(np.median(values)) if values else float("nan")
    figures = (f"non-trainable {', '.join(kept[:3])}: update x{factor:.4g} (spread "
               f"{spread:.1e}); gradients and trainable weights "
               f"{'agree' if trained_agree else 'differ'} at step {evidence.step}")
    if not trained_agree or spread > CONSTANT or abs(factor - 1) <= 10 * CONSTANT:
        return Finding("state", False, evidence=figures)
    return Finding("state", True, factor,
                   f"non-trainable state {evidence.tensor} moves x{factor:.4g} the reference's "
                   f"per step while gradients and trainable weights agree: a moving average's "
                   f"1 - momentum x{factor:.4g} (BatchNormalization's momentum)", figures)


def batch_statistics(evidence: Evidence) -> Finding | None:
    """The loss differs from a step whose inputs and variables agree, the candidate runs more
    replicas than the reference, and the moving statistics the step adds differ: the only
    input of a BatchNormalization's moving statistics is the batch it normalizes, so each
    replica normalized its own part of the batch by that part's statistics."""
    if evidence.quantity != "loss" or evidence.step < 1:
        return None
    moving = [t for t in non_trainable(evidence) if "moving_" in t]
    replicas = [evidence.trace(side).meta.replicas or 1 for side in ("reference", "candidate")]
    if not moving:
        return None
    same_start = _all_agree(evidence, "weight", evidence.step - 1, evidence.variables())
    ratios = {t: fitted_factor(ref, cand)[0] for t in moving
              if (ref := evidence.update("reference", t)) is not None
              and (cand := evidence.update("candidate", t)) is not None and ref.any()
              and not agree(ref, cand, within=1e-3)}
    figures = (f"variables before step {evidence.step} {'agree' if same_start else 'differ'}; "
               f"{len(ratios)} of {len(moving)} moving statistics' updates differ ("
               + ", ".join(f"{t} x{f:.3g}" for t, f in list(ratios.items())[:2])
               + f"); replicas {replicas[0]} against {replicas[1]}")
    # the inputs agree: the judge compares them before the loss, which diverged first
    fits = same_start and bool(ratios) and replicas[1] > replicas[0]
    return Finding("batch_statistics", fits, None,
                   f"BatchNormalization normalized each of the {replicas[1]} replicas' part of "
                   f"the batch by its own statistics: with equal variables the moving "
                   f"statistics' update differs"
                   if fits else "", figures)


def forward_pass(evidence: Evidence) -> Finding | None:
    """Tried when nothing else fits: the loss (or an evaluation) differs at a step whose
    inputs and variables agree. The model then applies the same variables to the same inputs
    another way: a kernel's rows meeting other inputs (a layout or concat order), a combiner,
    another layer. Which one, the numbers captured cannot tell; the layer replay shows where."""
    if evidence.quantity not in ("loss", "metric"):
        return None
    before = evidence.step - 1 if evidence.quantity == "loss" else evidence.step
    names = evidence.tensors("weight", before)
    pair = evidence.both(evidence.step, evidence.quantity, evidence.tensor)
    if not names or pair is None or not _all_agree(evidence, "weight", before, names):
        return None
    factor = fitted_factor(*pair)[0] if pair[0].any() else float("nan")
    if not abs(factor - 1) > FORWARD:   # within rounding of one forward pass: not another way
        return None
    return Finding("forward_pass", True, None,
                   f"{evidence.tensor} x{factor:.4g} at step {evidence.step} from equal inputs "
                   f"and {len(names)} equal variables: the model applies them another way (a "
                   f"kernel layout or concat order, a combiner, another layer)",
                   f"{len(names)} variables agree at step {before}; "
                   + ("the inputs agree (the judge compares them first)"
                      if evidence.quantity == "loss" else "an evaluation of the case's own "
                      "examples") + f"; {evidence.tensor} x{factor:.4g}")
