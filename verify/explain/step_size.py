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
    """Per trained variable: the factor of the candidate's update over the reference's, and
    how far from one factor its elements are (a moving statistic, which no optimizer updates,
    has no step size)."""
    out = {}
    for variable in evidence.trained_variables():
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


def ftrl_betas(evidence: Evidence, side: str, variable: str) -> np.ndarray | None:
    """The beta each element of a side's FTRL step implies, from its own weights and slots
    after the step and the reference's declared learning rate, l1 and l2:
    `beta = lr ((sign(z) l1 - z) / w - 2 l2) - sqrt(n)` where w != 0."""
    number = {k: evidence.number("reference", f"optimizer/model/{k}") for k in (
        "learning_rate", "l1_regularization_strength", "l2_regularization_strength")}
    w = evidence.value(side, evidence.step, "weight", variable)
    z = evidence.value(side, evidence.step, "slot", f"{variable}/linear")
    n = evidence.value(side, evidence.step, "slot", f"{variable}/accumulator")
    if not number["learning_rate"] or w is None or z is None or n is None or not (
            w.shape == z.shape == n.shape):
        return None
    l1, l2 = (number[k] or 0.0 for k in ("l1_regularization_strength",
                                          "l2_regularization_strength"))
    use = (w != 0) & (np.abs(z) > l1)
    return number["learning_rate"] * ((np.sign(z[use]) * l1 - z[use]) / w[use] - 2 * l2) \
        - np.sqrt(n[use]) if use.any() else None


def ftrl_beta(evidence: Evidence) -> Finding | None:
    """FTRL's beta each side's update implies, one value per side over every element: another
    beta when they differ (the learning rates declared equal)."""
    if evidence.optimizer("reference") != "ftrl" or evidence.quantity not in ("slot", "weight"):
        return None
    betas = {side: [] for side in ("reference", "candidate")}
    for variable in evidence.variables():
        found = [ftrl_betas(evidence, side, variable) for side in betas]
        if found[0] is not None and found[1] is not None:
            betas["reference"].append(found[0])
            betas["candidate"].append(found[1])
    if not betas["reference"]:
        return None
    values = {side: np.concatenate(b) for side, b in betas.items()}
    n = evidence.value("reference", evidence.step, "slot",
                       f"{evidence.variables()[0]}/accumulator")
    scale = float(np.sqrt(np.median(n))) if n is not None else 1.0
    spread = max(float(np.ptp(v)) for v in values.values()) / scale
    ref, cand = (float(np.median(values[side])) for side in ("reference", "candidate"))
    ref, cand = (b if abs(b) > 1e-6 * scale else 0.0 for b in (ref, cand))   # rounding of 0
    figures = (f"beta implied by each side's weights and slots: reference {ref:.4g}, candidate "
               f"{cand:.4g} (spread {spread:.1e} of sqrt(n) {scale:.3g})")
    if spread > CONSTANT or abs(cand - ref) <= 10 * CONSTANT * scale:
        return Finding("ftrl_beta", False, evidence=figures)
    return Finding("ftrl_beta", True, None, f"FTRL beta {cand:.4g} where the reference's is "
                   f"{ref:.4g}: recovered from each side's weights and slots", figures)


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
    equal = [g for g in groups if g not in named]
    return "; ".join(parts + ([f"{', '.join(equal[:-1])} and {equal[-1]} equal"
                               if len(equal) > 1 else f"{equal[0]} equal"] if equal else []))


def _groups(factors: dict[str, tuple[float, float]]) -> dict[str, list[str]]:
    """Tables apart from dense layers; each table apart when the tables' updates are not one
    multiple of the reference's (a rate given to one table)."""
    tables = [v for v in factors if is_table(v)]
    dense = {"dense layers": [v for v in factors if not is_table(v)]}
    values = [factors[t][0] for t in tables]
    if len(tables) > 1 and float(np.ptp(values)) > CONSTANT and all(
            factors[t][1] <= CONSTANT for t in tables):
        return {**{t: [t] for t in tables}, **dense}
    return {"tables": tables, **dense}


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
    groups = _groups(factors)
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
    # the model's declared rate is not a table's own (a table apart may have its own)
    lr = None if "tables" not in group_factor and any(is_table(g) for g in group_factor) else \
        evidence.number("reference", "optimizer/model/learning_rate")
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
