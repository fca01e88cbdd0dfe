"""Hypotheses on the state an update starts from: an optimizer slot that starts at another
value (an initial accumulator), a slot not restored (its optimizer's initial value where the
reference carries its training state), an update applied twice in one step, Adam's step count
not carried over, and a variable or shape present on one side only.

A slot's value before step k is recovered from its value after it and the step's gradient,
by the optimizer's own rule: Adagrad `acc[k-1] = acc[k] - g^2`, Adam
`v[k-1] = (v[k] - (1-beta_2) g^2) / beta_2` and `m[k-1] = (m[k] - (1-beta_1) g) / beta_1`.
"""
from __future__ import annotations

import functools

import numpy as np

from verify.explain.evidence import SAME, Evidence, Finding, agree

RECOVERABLE = ("accumulator", "v", "m", "linear")


def state_before(evidence: Evidence, side: str, slot: str) -> np.ndarray | None:
    """A side's slot before the divergent step, from its value after it and the gradient."""
    variable, _, name = slot.rpartition("/")
    after = evidence.value(side, evidence.step, "slot", slot)
    g = evidence.value(side, evidence.step, "grad", variable)
    if after is None or g is None or after.shape != g.shape or name not in RECOVERABLE:
        return None
    if name == "accumulator":
        return after - g * g
    if name == "linear":
        return _ftrl_linear_before(evidence, side, variable, after, g)
    beta = evidence.number("reference", f"optimizer/model/beta_{2 if name == 'v' else 1}")
    beta = beta or (0.999 if name == "v" else 0.9)
    one_minus = float(np.float32(1.0) - np.float32(beta))   # as TF1 and legacy Keras hold it
    return (after - one_minus * (g * g if name == "v" else g)) / beta


def _applied(name: str, before: np.ndarray, g: np.ndarray, evidence: Evidence) -> np.ndarray:
    """A slot after one update from `before` with gradient `g` (Adagrad, Adam's m and v)."""
    if name == "accumulator":
        return before + g * g
    beta = evidence.number("reference", f"optimizer/model/beta_{2 if name == 'v' else 1}")
    beta = beta or (0.999 if name == "v" else 0.9)
    one_minus = float(np.float32(1.0) - np.float32(beta))
    return beta * before + one_minus * (g * g if name == "v" else g)


def repeated_update(evidence: Evidence) -> Finding | None:
    """The candidate's slots after the step are the reference's state before it updated twice
    with the step's gradient (the update applied two times in one step), where the
    reference's are it updated once."""
    if evidence.quantity not in ("slot", "weight") or evidence.step < 1:
        return None
    twice, checked = [], 0
    for slot in evidence.tensors("slot"):
        variable, _, name = slot.rpartition("/")
        before = state_before(evidence, "reference", slot) if name in ("accumulator", "v",
                                                                         "m") else None
        grads = evidence.both(evidence.step, "grad", variable)
        after = evidence.value("candidate", evidence.step, "slot", slot)
        if before is None or grads is None or after is None or not agree(*grads):
            continue
        once = _applied(name, before, grads[0], evidence)
        if agree(after, once, SAME):
            continue
        checked += 1
        if agree(after, _applied(name, once, grads[0], evidence), SAME):
            twice.append(slot)
    if not checked:
        return None
    figures = (f"{len(twice)} of {checked} slots that differ are the reference's state before "
               f"step {evidence.step} updated twice with its gradient")
    if len(twice) != checked:
        return Finding("repeated_update", False, evidence=figures)
    return Finding("repeated_update", True, 2.0, f"the update of step {evidence.step} is "
                   f"applied twice: {', '.join(twice[:2])} hold two updates with the step's "
                   f"gradient", figures)


def _ftrl_linear_before(evidence: Evidence, side: str, variable: str, after: np.ndarray,
                        g: np.ndarray) -> np.ndarray | None:
    """FTRL's `linear` before a step: `z[k-1] = z[k] - g + (sqrt(n[k]) - sqrt(n[k-1])) / lr
    * w[k-1]` with `n[k-1] = n[k] - g^2` (TF's FTRL, learning_rate_power -0.5)."""
    n = evidence.value(side, evidence.step, "slot", f"{variable}/accumulator")
    w = evidence.value(side, evidence.step - 1, "weight", variable)
    lr = evidence.number("reference", "optimizer/model/learning_rate")
    if n is None or w is None or not lr or not (n.shape == w.shape == after.shape):
        return None
    return after - g + (np.sqrt(n) - np.sqrt(np.maximum(n - g * g, 0.0))) / lr * w


def _constant(values: np.ndarray, scale: float) -> float | None:
    """The one value every element holds (to the float32 rounding of values of size
    `scale`), None when they differ."""
    if not values.size:
        return None
    low, high = float(values.min()), float(values.max())
    return (low + high) / 2 if high - low <= 1e-4 * max(scale, 1e-6) else None


def _fresh_after(evidence: Evidence, slot: str, pair: tuple[np.ndarray, np.ndarray]
                 ) -> Finding | None:
    """The candidate's slot after the step one constant everywhere (an optimizer's initial
    value, not one update away from it) where the reference's varies, its variable's weights
    agreeing: a restore that brought back the model and not its optimizer."""
    variable = slot.rpartition("/")[0]
    weights = evidence.both(evidence.step, "weight", variable)
    scale = float(np.abs(pair[0]).max())
    value = _constant(pair[1], scale)
    if weights is None or not agree(*weights) or value is None or _constant(pair[0], scale) \
            is not None:
        return None
    return Finding("slot_not_restored", True, None,
                   f"{slot} holds {value:.4g} everywhere after step {evidence.step} (an "
                   f"optimizer's initial value) where the reference's carries its training "
                   f"state, the weights agreeing: the optimizer was not restored",
                   f"{slot} after step {evidence.step}: candidate {value:.4g} everywhere, "
                   f"reference from {float(pair[0].min()):.4g} to {float(pair[0].max()):.4g}; "
                   f"{variable} agrees")


def slot_state(evidence: Evidence) -> Finding | None:
    """The slot a divergent step's update starts from: a constant (an optimizer's initial
    value) on the candidate's side where the reference's is another constant (another
    initial accumulator) or carries training state (a slot not restored)."""
    if evidence.quantity != "slot":
        return None
    pairs = {t: evidence.both(evidence.step, "slot", t) for t in evidence.tensors("slot")}
    # the slots that differ, largest first: one element is constant whatever it holds
    differing = sorted(((t, p) for t, p in pairs.items()
                        if p is not None and p[0].size >= 2 and not agree(*p)),
                       key=lambda item: -item[1][0].size)
    for slot, pair in differing:
        fresh = _fresh_after(evidence, slot, pair)
        if fresh is not None:
            return fresh
        ref, cand = (state_before(evidence, side, slot) for side in ("reference", "candidate"))
        if ref is None or cand is None:
            continue
        scale = max(float(np.abs(pair[0]).max()), float(np.abs(pair[1]).max()))
        ref_value, cand_value = _constant(ref, scale), _constant(cand, scale)
        figures = (f"{slot} before step {evidence.step}: candidate "
                   + (f"{cand_value:.4g} everywhere" if cand_value is not None else "varies")
                   + ", reference " + (f"{ref_value:.4g} everywhere" if ref_value is not None
                                       else "carries training state"))
        if cand_value is None:
            return Finding("slot_state", False, evidence=figures)
        cand_value = 0.0 if abs(cand_value) <= 1e-4 * scale else cand_value
        if ref_value is None:
            return Finding("slot_not_restored", True, None,
                           f"{slot} starts step {evidence.step} at {cand_value:.4g} everywhere "
                           f"(an optimizer's initial value) where the reference's carries its "
                           f"training state: not restored", figures)
        if ref_value and abs(cand_value - ref_value) > SAME * abs(ref_value):
            factor = cand_value / ref_value
            return Finding("initial_accumulator", True, factor,
                           f"{slot.rpartition('/')[2]} initialized at {cand_value:.4g} where "
                           f"the reference's starts at {ref_value:.4g} (x{factor:.4g})", figures)
        return Finding("slot_state", False, evidence=figures)
    return None


def adam_bias_correction(t: np.ndarray, beta_1: float = 0.9, beta_2: float = 0.999
                         ) -> np.ndarray:
    """Adam's step size factor at step t: sqrt(1 - beta_2^t) / (1 - beta_1^t)."""
    return np.sqrt(1 - beta_2 ** t) / (1 - beta_1 ** t)


STEPS_SEARCHED = 1_000_000


@functools.lru_cache(maxsize=1)
def _corrections() -> np.ndarray:
    """Adam's bias correction factor at steps 0, 1, 2, ... (default betas), computed once."""
    with np.errstate(invalid="ignore", divide="ignore"):   # step 0 has none
        return adam_bias_correction(np.arange(0, STEPS_SEARCHED + 64, dtype=np.float64))


def adam_step_count(evidence: Evidence, factor: float) -> Finding | None:
    """An Adam update that is a constant multiple of the reference's, with the learning rates
    declared equal, as Adam's bias correction makes it when the candidate restarts its step
    count at 1 where the reference is at step T (a resumed optimizer whose iterations were
    not carried over)."""
    lr = [evidence.number(side, "optimizer/model/learning_rate")
          for side in ("reference", "candidate")]
    if evidence.optimizer("reference") != "adam" or lr[0] is None or lr[0] != lr[1]:
        return None
    steps = np.arange(2, STEPS_SEARCHED + 1, dtype=np.float64)
    first = evidence.step + 1   # the reference at step T >= 2 where the candidate is at 1
    ratios = adam_bias_correction(np.float64(evidence.step)) / _corrections()[
        first:first + steps.size]
    best = int(np.argmin(np.abs(ratios / factor - 1)))
    if abs(ratios[best] / factor - 1) > 1e-5:
        return None
    at = int(steps[best]) + evidence.step - 1
    return Finding("adam_step_count", True, float(at),
                   f"Adam's step count restarted: the update is x{factor:.4g}, Adam's bias "
                   f"correction at step {evidence.step} against the reference's at step {at} "
                   f"(learning rates declared equal, {lr[0]:g})",
                   f"update ratio x{factor:.5g} = c({evidence.step})/c({at}), "
                   f"c(t) = sqrt(1-beta_2^t)/(1-beta_1^t)")


def structure(evidence: Evidence) -> Finding | None:
    """A value present on one side only, or of another shape."""
    reference, candidate = (set(evidence.held(side, evidence.step, evidence.quantity))
                            for side in ("reference", "candidate"))
    only = sorted(candidate - reference), sorted(reference - candidate)
    if not (only[0] or only[1]):
        return None
    said = "; ".join(f"{', '.join(names[:3])} only in the {side}"
                     for names, side in zip(only, ("candidate", "reference")) if names)
    return Finding("structure", True, None, f"{evidence.quantity} {said}: the two sides keep "
                   f"other variables (a table split or merged, a name map that misses)", said)
