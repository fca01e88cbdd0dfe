"""Hypotheses on the gradients the optimizer applied: a constant scale, a clipping, a step whose
update is missing, a loss scaled or reduced another way.

Each reads both sides' captured gradients (after each side's aggregation and clipping) at the
first divergent step, and the candidate's own gradients at every step.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from verify.explain.evidence import SAME, Evidence, Finding, agree, fitted_factor, global_norm

CONSTANT = 1e-3


def _gradient_factors(evidence: Evidence, step: int) -> dict[str, tuple[float, float]]:
    out = {}
    for tensor in evidence.tensors("grad", step):
        pair = evidence.both(step, "grad", tensor)
        if pair is not None and pair[0].any():
            out[tensor] = fitted_factor(*pair)
    return out


def _named(factor: float) -> str:
    """What a gradient factor usually means, when it is a simple one."""
    for n in (2, 4, 8, 16, 32, 64, 128):
        if abs(factor - n) < 1e-3 * n:
            return f": a loss summed over {n} (replicas or examples) where the other averages"
        if abs(factor - 1 / n) < 1e-3 / n:
            return f": the loss divided by {n} once more (averaged twice)"
    return ""


def gradient_scale(evidence: Evidence) -> Finding | None:
    """Every gradient of the first divergent step a constant multiple of the reference's, and
    from the first step on (a clipping acts only on some steps)."""
    if evidence.quantity != "grad":   # a loss that differs too is loss_scale's
        return None
    factors = _gradient_factors(evidence, evidence.step)
    if not factors:
        return None
    values = np.array([f for f, _ in factors.values()])
    spread = max(float(np.ptp(values)), max(r for _, r in factors.values()))
    factor = float(np.median(values))
    figures = (f"gradient ratio x{factor:.4g} over {len(factors)} variables "
               f"(spread {spread:.1e}) at step {evidence.step}")
    if spread > CONSTANT or abs(factor - 1) <= 10 * CONSTANT:
        return Finding("gradient_scale", False, evidence=figures)
    if evidence.step > min(evidence.steps() or [1]):
        return Finding("gradient_scale", False, evidence=figures + f"; the gradients of "
                       f"earlier steps agree: not one scale from the start")
    return Finding("gradient_scale", True, factor, f"gradients x{factor:.4g}{_named(factor)}",
                   figures)


def clip_global_norm(evidence: Evidence) -> Finding | None:
    """The candidate's gradients are the reference's scaled to one global norm C at the
    divergent step, and never above C at any step: clipped by global norm C. Or the other
    way round: the reference clips and the candidate does not."""
    if evidence.quantity != "grad":
        return None
    found = _clipped(evidence)
    if found is None or found.fits:
        return found
    swapped = _clipped(dataclasses.replace(evidence, reference=evidence.candidate,
                                           candidate=evidence.reference, _index={}, _read={}))
    if swapped is None or not swapped.fits:
        return found
    return dataclasses.replace(swapped, sentence=swapped.sentence.replace(
        "gradients clipped", "the reference's gradients clipped").replace(
        "(the reference's is", "where the candidate does not clip (its norm"),
        evidence=swapped.evidence.replace("the reference's", "the candidate's", 1).replace(
            "candidate global norm", "reference global norm", 1))


def _clipped(evidence: Evidence) -> Finding | None:
    factors = _gradient_factors(evidence, evidence.step)
    cap = global_norm(evidence, "candidate", evidence.step)
    reference = global_norm(evidence, "reference", evidence.step)
    if not factors or cap is None or reference is None:
        return None
    values = np.array([f for f, _ in factors.values()])
    spread = max(float(np.ptp(values)), max(r for _, r in factors.values()))
    norms = [n for n in (global_norm(evidence, "candidate", s) for s in evidence.steps())
             if n is not None]
    at_cap = sum(abs(n - cap) <= SAME * cap for n in norms)
    above = max(norms) > cap * (1 + SAME)
    figures = (f"candidate global norm {cap:.4g} against the reference's {reference:.4g} at step "
               f"{evidence.step} (one factor x{np.median(values):.4g}, spread {spread:.1e}); "
               f"{at_cap} of {len(norms)} steps at that norm, "
               f"{'some above it' if above else 'none above it'}")
    fits = (spread <= CONSTANT and float(np.median(values)) < 1 - 10 * CONSTANT and not above
            and (at_cap >= 2 or evidence.step > min(evidence.steps() or [1])))
    return Finding("clip_global_norm", fits, cap if fits else None,
                   f"gradients clipped to global norm {cap:.4g} (the reference's is "
                   f"{reference:.4g} at step {evidence.step})" if fits else "", figures)


def clip_per_replica(evidence: Evidence) -> Finding | None:
    """The reference clips the global norm of its gradients to C (never above C, at C on two
    steps or more); the candidate, over N replicas, is above C on some step, never above N C,
    and not one multiple of the reference's: each replica clipped its own gradients to C
    before they were summed (a sum of N parts each at most C)."""
    if evidence.quantity != "grad":
        return None
    replicas = evidence.candidate.meta.replicas or 1
    reference = [n for n in (global_norm(evidence, "reference", s) for s in evidence.steps())
                 if n is not None]
    candidate = [n for n in (global_norm(evidence, "candidate", s) for s in evidence.steps())
                 if n is not None]
    if replicas < 2 or not reference or not candidate:
        return None
    cap = max(reference)
    at_cap = sum(abs(n - cap) <= SAME * cap for n in reference)
    factors = _gradient_factors(evidence, evidence.step)
    one_factor = bool(factors) and max(r for _, r in factors.values()) <= CONSTANT and float(
        np.ptp([f for f, _ in factors.values()])) <= CONSTANT
    figures = (f"reference global norm at most {cap:.4g} ({at_cap} of {len(reference)} steps "
               f"at it); candidate over {replicas} replicas between {min(candidate):.4g} and "
               f"{max(candidate):.4g}, {'one' if one_factor else 'not one'} factor of the "
               f"reference's")
    fits = (at_cap >= 2 and max(candidate) > cap * (1 + SAME)
            and max(candidate) <= replicas * cap * (1 + SAME) and not one_factor)
    return Finding("clip_per_replica", fits, cap if fits else None,
                   f"each of the {replicas} replicas clipped its own gradients to global norm "
                   f"{cap:.4g} before they were summed (the sum reaches {max(candidate):.4g})"
                   if fits else "", figures)


def clip_per_variable(evidence: Evidence) -> Finding | None:
    """Gradients clipped per variable (`clipnorm`) or by value (`clipvalue`) to a cap C."""
    if evidence.quantity != "grad":
        return None
    pairs = {t: evidence.both(evidence.step, "grad", t) for t in evidence.tensors("grad")}
    pairs = {t: p for t, p in pairs.items() if p is not None}
    if not pairs:
        return None
    norm_cap = max(float(np.linalg.norm(b)) for _, b in pairs.values())
    value_cap = max(float(np.abs(b).max()) for _, b in pairs.values() if b.size)
    by_norm = all(agree(b, a * min(1.0, norm_cap / max(float(np.linalg.norm(a)), 1e-30)))
                  for a, b in pairs.values())
    by_value = all(agree(b, np.clip(a, -value_cap, value_cap)) for a, b in pairs.values())
    changed = not all(agree(a, b) for a, b in pairs.values())
    factors = _gradient_factors(evidence, evidence.step)
    one_factor = bool(factors) and all(r <= CONSTANT for _, r in factors.values()) and float(
        np.ptp([f for f, _ in factors.values()])) <= CONSTANT
    if one_factor:   # one scale on every gradient: a clip per variable would not do that
        return Finding("clip_norm", False, evidence="every gradient is one multiple of the "
                                                    "reference's: not a clip per variable")
    figures = (f"largest candidate norm {norm_cap:.4g}, largest |g| {value_cap:.4g}; clipping "
               f"the reference there {'reproduces' if by_norm else 'does not reproduce'} it per "
               f"variable, {'reproduces' if by_value else 'does not reproduce'} it by value")
    if norm_cap == 0.0:   # no gradient at all: a missing update, not a clip
        return Finding("clip_norm", False, evidence="the candidate's gradients are zeros")
    if changed and by_norm:
        return Finding("clip_norm", True, norm_cap, f"gradients clipped per variable to norm "
                       f"{norm_cap:.4g}", figures)
    if changed and by_value:
        return Finding("clip_value", True, value_cap, f"gradients clipped by value to "
                       f"{value_cap:.4g}", figures)
    return Finding("clip_norm", False, evidence=figures)


def drop_step(evidence: Evidence) -> Finding | None:
    """The update of step k is missing: the candidate applied zero gradients there, or its
    variables after step k are the reference's before it."""
    step = evidence.step
    grads = [(evidence.both(step, "grad", t), t) for t in evidence.tensors("grad")]
    grads = [(p, t) for p, t in grads if p is not None]
    zero = bool(grads) and all(not b.any() for (_, b), _ in grads) and any(
        a.any() for (a, _), _ in grads)
    variables = evidence.variables()
    stale = bool(variables) and all(
        (after := evidence.value("candidate", step, "weight", v)) is not None
        and (before := evidence.value("reference", step - 1, "weight", v)) is not None
        and after.shape == before.shape and agree(after, before, 1e-7) for v in variables) and any(
        (u := evidence.update("reference", v)) is not None and u.any() for v in variables)
    figures = (f"candidate gradients of step {step} "
               f"{'all zero' if zero else 'not all zero'}"
               f"{'' if grads else ' (none captured)'}; its variables after step {step} "
               f"{'equal' if stale else 'differ from'} the reference's before it")
    if not (zero or stale):
        return Finding("drop_step", False, evidence=figures)
    how = "its gradients are zeros" if zero else "its variables did not move"
    return Finding("drop_step", True, float(step),
                   f"the update of step {step} is missing: {how}", figures)


def loss_scale(evidence: Evidence) -> Finding | None:
    """Same inputs and variables, the loss a constant multiple: a scale or another reduction."""
    if evidence.quantity != "loss":
        return None
    pair = evidence.both(evidence.step, "loss", evidence.tensor)
    if pair is None or not pair[0].any():
        return None
    factor = float(pair[1].sum() / pair[0].sum())
    grads = _gradient_factors(evidence, evidence.step)
    matching = [t for t, (f, r) in grads.items() if abs(f - factor) <= CONSTANT * abs(factor)
                and r <= CONSTANT]
    figures = (f"loss x{factor:.4g} at step {evidence.step}; gradients at that factor: "
               f"{len(matching)} of {len(grads)}")
    fits = bool(grads) and len(matching) == len(grads) and abs(factor - 1) > 10 * CONSTANT
    return Finding("loss_scale", fits, factor if fits else None,
                   f"loss and gradients x{factor:.4g}{_named(factor)}" if fits else "", figures)
