"""Hypotheses on the optimizer's constants: the learning rate and epsilon, recovered from each
side's own update where both sides applied the same gradients.

The update each side made (`w[k] - w[k-1]`, from its own trace) is compared with the other's:
a learning rate scales every update of a group of variables by one factor (SGD `lr*g`,
Adagrad `lr*g/sqrt(acc)`, Adam `lr_t*m/(sqrt(v)+eps)`: the slots do not depend on it); an
epsilon moves each element's update by a factor that depends on its slot,
`(s + eps_c)/(s + eps_r)` with `s = sqrt(v)` (Adam) or `sqrt(acc)` (Adagrad).
"""
from __future__ import annotations

import numpy as np

from verify.explain.evidence import SAME, Evidence, Finding, agree, fitted_factor, is_table
from verify.explain.state import adam_step_count

# The spread a factor may have across the elements of a group and still be one factor.
CONSTANT = 1e-3
SLOT_ROOT = {"adam": "v", "adagrad": "accumulator"}


def same_gradients(evidence: Evidence) -> tuple[bool, str]:
    """Whether both sides applied the same gradients at the divergent step (vacuously when no
    gradient was captured), and the figure."""
    worst, name = 0.0, ""
    for tensor in evidence.tensors("grad"):
        pair = evidence.both(evidence.step, "grad", tensor)
        if pair is None:
            continue
        a, b = pair
        scale = max(float(np.linalg.norm(a)), 1e-30)
        drift = float(np.linalg.norm(a - b)) / scale
        if drift > worst:
            worst, name = drift, tensor
    return worst <= SAME, (f"gradients of step {evidence.step} agree (worst {worst:.1e} rel)"
                           if worst <= SAME else
                           f"gradients of step {evidence.step} differ ({name} {worst:.2g} rel)")


def update_factors(evidence: Evidence) -> dict[str, tuple[float, float]]:
    """Per variable: the factor of the candidate's update over the reference's, and how far
    from one factor its elements are."""
    out = {}
    for variable in evidence.variables():
        ref, cand = (evidence.update(side, variable) for side in ("reference", "candidate"))
        if ref is not None and cand is not None and ref.shape == cand.shape and ref.any():
            out[variable] = fitted_factor(ref, cand)
    return out


def ftrl_rate(evidence: Evidence, side: str, variable: str) -> tuple[float, float] | None:
    """The learning rate a side's FTRL step applied to a variable, from its own state after the
    step: `w = (sign(z) l1 - z) / ((beta + sqrt(n)) / lr + 2 l2)` where |z| > l1 (TF's FTRL,
    learning_rate_power -0.5), with the side's declared l1, l2 and beta."""
    declared = {}
    for k in ("l1_regularization_strength", "l2_regularization_strength", "beta"):
        own = evidence.number(side, f"optimizer/model/{k}")
        declared[k] = own if own is not None else (
            evidence.number("reference", f"optimizer/model/{k}") or 0.0)
    w = evidence.value(side, evidence.step, "weight", variable)
    z = evidence.value(side, evidence.step, "slot", f"{variable}/linear")
    n = evidence.value(side, evidence.step, "slot", f"{variable}/accumulator")
    if w is None or z is None or n is None or not (w.shape == z.shape == n.shape):
        return None
    l1, l2 = declared["l1_regularization_strength"], declared["l2_regularization_strength"]
    use = (w != 0) & (np.abs(z) > l1)
    if not use.any():
        return None
    quadratic = (np.sign(z[use]) * l1 - z[use]) / w[use]
    rates = (declared["beta"] + np.sqrt(n[use])) / (quadratic - 2 * l2)
    median = float(np.median(rates))
    return median, float(np.ptp(rates)) / abs(median) if median else float("inf")


def ftrl_learning_rate(evidence: Evidence) -> Finding:
    """FTRL's learning rate recovered from each side's own weights and slots, per group."""
    ratios: dict[str, list[float]] = {"tables": [], "dense layers": []}
    lr, spread = None, 0.0
    for variable in evidence.variables():
        rates = [ftrl_rate(evidence, side, variable) for side in ("reference", "candidate")]
        if rates[0] and rates[1] and rates[0][0]:
            ratios["tables" if is_table(variable) else "dense layers"].append(
                rates[1][0] / rates[0][0])
            lr, spread = lr or rates[0][0], max(spread, rates[0][1], rates[1][1])
    groups = {g: float(np.median(r)) for g, r in ratios.items() if r}
    spread = max([spread] + [float(np.ptp(r)) for r in ratios.values() if r]) if groups \
        else float("inf")
    figures = (f"FTRL rate recovered from each side's weights and slots: "
               + "; ".join(f"{g} x{f:.4f}" for g, f in groups.items())
               + f" (spread {spread:.1e})")
    moved = {g: f for g, f in groups.items() if abs(f - 1) > max(10 * spread, SAME)}
    if not moved or spread > CONSTANT:
        return Finding("learning_rate", False, evidence=figures)
    factor = float(np.median(list(moved.values())))
    return Finding("learning_rate", True, factor, rate_sentence(moved, list(groups), lr),
                   figures)


def rate_sentence(moved: dict[str, float], groups: list[str], lr: float | None) -> str:
    """'tables trained at 1.010x the reference's learning rate (0.0505 vs 0.05); dense layers
    equal', one phrase for every group moved by one factor.

    >>> rate_sentence({"tables": 1.01, "dense layers": 1.01}, ["tables", "dense layers"], 0.1)
    "tables and dense layers trained at 1.010x the reference's learning rate (0.101 vs 0.1)"
    """
    if len(moved) > 1 and np.ptp(list(moved.values())) <= CONSTANT:
        moved = {" and ".join(moved): float(np.median(list(moved.values())))}
    parts = [f"{g} trained at {f:.3f}x the reference's learning rate"
             + (f" ({lr * f:.4g} vs {lr:.4g})" if lr else "") for g, f in moved.items()]
    named = " and ".join(moved)
    return "; ".join(parts + [f"{g} equal" for g in groups if g not in named])


def learning_rate(evidence: Evidence) -> Finding | None:
    """The candidate's updates a constant multiple of the reference's, per group (tables,
    dense layers), with the same gradients: its learning rate is that multiple (FTRL: the
    rate recovered from each side's own state, `ftrl_learning_rate`)."""
    if evidence.quantity not in ("slot", "weight") or evidence.step < 1:
        return None
    if evidence.optimizer("reference") == "ftrl":
        return ftrl_learning_rate(evidence)
    factors = update_factors(evidence)
    if not factors:
        return None
    same, gradients = same_gradients(evidence)
    groups = {"tables": [v for v in factors if is_table(v)],
              "dense layers": [v for v in factors if not is_table(v)]}
    summary, group_factor = [], {}
    for group, names in groups.items():
        if not names:
            continue
        values = np.array([factors[n][0] for n in names])
        spread = max(max(factors[n][1] for n in names), float(np.ptp(values)))
        group_factor[group] = (float(np.median(values)), spread)
        summary.append(f"{group} x{np.median(values):.4f} (spread {spread:.1e})")
    constant = all(spread <= CONSTANT for _, spread in group_factor.values())
    moved = {g: f for g, (f, spread) in group_factor.items()
             if abs(f - 1) > max(10 * spread, SAME)}
    evidence_text = f"update ratio {'; '.join(summary)}; {gradients}"
    if not (same and constant and moved):
        return Finding("learning_rate", False, evidence=evidence_text)
    factor = float(np.median(list(moved.values())))
    restarted = adam_step_count(evidence, factor) if len(set(moved.values())) == 1 or len(
        moved) == len(group_factor) else None
    if restarted is not None:
        return restarted
    lr = evidence.number("reference", "optimizer/model/learning_rate")
    return Finding("learning_rate", True, factor, rate_sentence(moved, list(group_factor), lr),
                   evidence_text)


def epsilon(evidence: Evidence) -> Finding | None:
    """With the same gradients and slots, the candidate's update per element is the
    reference's times `(s + eps_r)/(s + eps_c)`: the epsilon that fits, from every element."""
    kind = evidence.optimizer("reference") or evidence.optimizer("candidate")
    root = SLOT_ROOT.get(kind)
    if root is None or evidence.quantity not in ("slot", "weight"):
        return None
    eps_r = evidence.number("reference", "optimizer/model/epsilon") or 0.0
    same, gradients = same_gradients(evidence)
    xs, ys, slots_differ = [], [], []
    for variable in evidence.variables():
        slot = f"{variable}/{root}"
        pair = evidence.both(evidence.step, "slot", slot)
        ref, cand = (evidence.update(side, variable) for side in ("reference", "candidate"))
        if pair is None or ref is None or cand is None:
            continue
        if not agree(*pair):
            slots_differ.append(slot)
            continue
        use = (ref != 0) & (cand != 0)
        xs.append(1.0 / (np.sqrt(np.maximum(pair[0][use], 0.0)) + eps_r))
        ys.append(ref[use] / cand[use] - 1.0)
    if not xs:
        return Finding("epsilon", False, evidence=f"no {root} slot to fit an epsilon from"
                       + (f" ({', '.join(slots_differ)} differ)" if slots_differ else ""))
    factors = update_factors(evidence)
    if factors and all(residual <= CONSTANT for _, residual in factors.values()):
        return Finding("epsilon", False, evidence="every variable's update is one constant "
                       "multiple of the reference's: a step size, not an epsilon")
    x, y = np.concatenate(xs), np.concatenate(ys)
    delta = float(x @ y / (x @ x))
    fit = 1.0 - float(np.sum((y - delta * x) ** 2)) / max(float(np.sum(y ** 2)), 1e-300)
    eps_c = eps_r + delta
    figures = (f"epsilon fitted {eps_c:.3g} against the reference's {eps_r:.3g} "
               f"(explains {fit:.1%} of the update ratios over {x.size} elements); {gradients}"
               + (f"; {', '.join(slots_differ)} differ" if slots_differ else ""))
    if not (same and not slots_differ and fit >= 0.9 and abs(delta) > 0):
        return Finding("epsilon", False, evidence=figures)
    factor = eps_c / eps_r if eps_r else None
    said = f"x{factor:.3f} " if factor else ""
    return Finding("epsilon", True, factor,
                   f"{kind} epsilon {said}({eps_c:.3g} vs {eps_r:.3g}): gradients and slots "
                   f"agree, the update differs most where sqrt({root}) is small", figures)
