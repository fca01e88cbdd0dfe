"""Hypotheses read from what the pair consumed and declared: the input, the declared
configuration differences (preflight), the embedding combiner, and the known legitimate
rounding differences of Adam between the stacks.
"""
from __future__ import annotations

import fnmatch
import os

import numpy as np
import pandas as pd

from verify.core.inputs import InputFeature
from verify.explain.evidence import Evidence, Finding
from verify.explain.forward import forward_pass

# Declared keys -> the hypothesis whose effect they have, and where that effect first shows.
DECLARED_EFFECTS = (
    ("*learning_rate", "learning_rate", ("slot", "weight")),
    ("*epsilon", "epsilon", ("weight",)),
    ("*initial_accumulator_value", "initial_accumulator", ("slot", "weight")),
    ("*beta_*", "betas", ("slot", "weight")),
    ("*/beta", "ftrl_beta", ("weight",)),
    ("*initial_accumulator*", "initial_accumulator", ("slot",)),
    ("loop/clip_where", "clip_per_replica", ("grad",)),
    ("*clip*", "clip_global_norm", ("grad",)),
    ("*combiner", "combiner", ("loss",)),
    ("loop/reduce_op", "gradient_scale", ("grad", "loss")),
    ("loss/*", "loss_scale", ("loss", "grad")),
)


def _batch_keys(evidence: Evidence, side: str, tensor: str) -> dict[int, tuple[bytes, bytes]]:
    """Per step, the feature's examples as (their digests in order, the same digests sorted):
    layout-free (an `InputFeature`'s canonical per-example digests), or an older trace's string
    digest of the whole batch twice."""
    trace = evidence.trace(side)
    out = {}
    for step in trace.steps():
        value = trace.get(step, "input", tensor)
        if isinstance(value, str):
            out[step] = (value.encode(), value.encode())
        elif isinstance(value, InputFeature):
            pairs = np.stack([value.digests.astype(np.uint64),
                              value.lengths.astype(np.uint64)], axis=1)
            ordered = np.sort(pairs.view([("d", np.uint64), ("n", np.uint64)]), axis=0)
            out[step] = (pairs.tobytes(), ordered.tobytes())
    return out


def input_batch(evidence: Evidence) -> Finding | None:
    """Which features differ at the first divergent step, and whether the candidate consumed
    the reference's examples in another order: within the step's batch, or a batch the
    reference consumed at another step (the same batches in another order)."""
    if evidence.quantity != "input":
        return None
    step, differ, elsewhere, reordered = evidence.step, [], [], []
    for tensor in evidence.tensors("input"):
        ref = _batch_keys(evidence, "reference", tensor)
        cand = _batch_keys(evidence, "candidate", tensor)
        if ref.get(step) == cand.get(step) or (ref.get(step) is None and cand.get(step) is None):
            continue
        differ.append(tensor)
        if step in cand and cand[step][0] in {key[0] for key in ref.values()}:
            elsewhere.append(tensor)
        elif step in cand and step in ref and cand[step][1] == ref[step][1]:
            reordered.append(tensor)
    if not differ:
        return Finding("input", False, evidence=f"no feature's digest differs at step {step}")
    if elsewhere and len(elsewhere) == len(differ):
        order = (f"; the candidate's batch of {', '.join(elsewhere)} is one the reference "
                 f"consumed at another step: the same batches in another order (a shuffle)")
    elif reordered and len(reordered) == len(differ):
        order = "; the same examples in another order within the batch (a shuffle)"
    else:
        order = "; other values"
    return Finding("input", True, None,
                   f"input differs at step {step} in {', '.join(differ[:4])}"
                   + (f" and {len(differ) - 4} more" if len(differ) > 4 else "") + order,
                   f"{len(differ)} of {len(evidence.tensors('input'))} features differ")


def combiner(evidence: Evidence) -> Finding | None:
    """The loss differs from a step whose inputs and variables agree (`forward_pass`) and the
    two sides declare another combiner for a table: the combiner acts there. (Which combiner
    each side applied is not derivable from a trace: it holds the ids' digests, not the ids.)"""
    if evidence.quantity != "loss":
        return None
    keys = sorted({k for side in ("reference", "candidate")
                   for k in (*evidence.trace(side).meta.declared_config,
                             *(evidence.trace(side).meta.details.get("math_config") or {}))
                   if fnmatch.fnmatchcase(k, "table/*/combiner")})
    differ = [(k, evidence.declared("reference", k), evidence.declared("candidate", k))
              for k in keys]
    differ = [(k, r, c) for k, r, c in differ if r is not None and c is not None and r != c]
    forward = forward_pass(evidence)
    if not differ or forward is None:
        return Finding("combiner", False, evidence="the trace holds the inputs' digests, not "
                       "the ids; " + ("no table's combiner declared apart" if not differ else
                                      "the variables before the step differ"))
    key, ref, cand = differ[0]
    return Finding("combiner", True, None,
                   f"{key.split('/')[-2]} combiner {cand} where the reference's is {ref} "
                   f"(declared); the loss differs from equal inputs and variables, where a "
                   f"combiner acts ({forward.evidence.split('; ')[-1]})",
                   f"{key}: {ref} → {cand}; {forward.evidence}")


def blocking_findings(evidence: "Evidence | pd.DataFrame") -> list[tuple[str, str, str]]:
    """(key, reference value, candidate value) of every blocking preflight finding."""
    rows = evidence.preflight if isinstance(evidence, Evidence) else evidence
    if rows is None or not len(rows) or "severity" not in rows:
        return []
    return [(str(r.key), str(r.reference_value), str(r.candidate_value))
            for r in rows.itertuples(index=False) if r.severity == "blocking"]


def declared(evidence: Evidence) -> Finding | None:
    """A blocking declared difference whose effect first shows where the pair diverged."""
    findings = blocking_findings(evidence)
    if not findings:
        return None
    for key, ref, cand in findings:
        for pattern, hypothesis, shows in DECLARED_EFFECTS:
            if fnmatch.fnmatchcase(key, pattern) and evidence.quantity in shows:
                return Finding(hypothesis, True, _ratio(ref, cand) if hypothesis in (
                    "learning_rate", "epsilon") else None,
                    f"declared: {key} {ref} → {cand}; tied by place only, no test on the "
                    f"numbers fits (first divergence at step {evidence.step} "
                    f"{evidence.quantity}, where it first acts)",
                    f"preflight: {key} {ref} → {cand}")
    listed = "; ".join(f"{k} {r} → {c}" for k, r, c in findings[:3])
    return Finding("declared", False, evidence=f"declared ({listed}) but none first acts on "
                                               f"step {evidence.step} {evidence.quantity}")


def declared_only(preflight: pd.DataFrame, rows: pd.DataFrame,
                  width: int = 200) -> Finding | None:
    """The cause of a pair whose compared numbers all agree while preflight found blocking
    differences: those declared differences, which only the declaration shows on this device
    (a table initializer the suite overrides with the case's values, an optimizer the device
    does not use). None without a blocking finding or a compared value (rows 'not captured'
    on the device are not compared), or when a value differs (a divergence is explained from the numbers, `declared`). The sentence fits in
    `width` characters, the declared values shortened to fit.

    >>> preflight = pd.DataFrame([{"key": "table/user/initializer", "severity": "blocking",
    ...                            "reference_value": "a", "candidate_value": "b"}])
    >>> rows = pd.DataFrame({"step": [0, 1, 1], "passed": [True, True, True]})
    >>> declared_only(preflight, rows).label()
    'declared table/user/initializer'
    """
    findings = blocking_findings(preflight)
    if not findings or rows is None or not len(rows) or not bool(rows["passed"].all()):
        return None
    compared = rows[rows["status"] == "passed"] if "status" in rows else rows
    if not len(compared):
        return None
    key, ref, cand = findings[0]
    more = f" and {len(findings) - 1} more" if len(findings) > 1 else ""
    tail = (f"{more}; the numbers agree on this device through step "
            f"{int(compared['step'].max())} ({len(compared)} values): only the declaration "
            f"shows it")
    room = max(24, width - len(f"declared: {key}  → ") - len(tail))
    cand = _after_common_prefix(ref, cand)
    shown_cand = _short(cand, max(12, room // 2))
    return Finding("declared", True, None,
                   f"declared: {key} {_short(ref, room - len(shown_cand))} → {shown_cand}{tail}",
                   "preflight (blocking): " + "; ".join(f"{k} {r} → {c}" for k, r, c in findings)
                   + f"; {len(compared)} compared values within tolerance, none differs",
                   tuple(k for k, _, _ in findings))


def _after_common_prefix(reference: str, candidate: str) -> str:
    """`candidate` from the argument where it departs from `reference`, when they share a
    long prefix: 'Normal(mean=0, stddev=1)' after 'Normal(mean=0, stddev=0.4)' reads
    '…stddev=1)'."""
    shared = len(os.path.commonprefix([reference, candidate]))
    cut = max(candidate.rfind(", ", 0, shared) + 2, candidate.rfind("(", 0, shared) + 1)
    return "…" + candidate[cut:] if cut > 8 else candidate


def _short(value: str, limit: int) -> str:
    return value if len(value) <= limit else value[:limit - 1] + "…"


def _ratio(reference: str, candidate: str) -> float | None:
    try:
        return float(candidate) / float(reference)
    except (TypeError, ValueError, ZeroDivisionError):
        return None


def adam_one_minus_beta_2(evidence: Evidence) -> Finding | None:
    """Adam's `1 - beta_2` held in float32 (TF1, legacy Keras: 0.00099998713) or taken from
    the Python float (Keras 2.11+, Keras 3: 0.001): which one reproduces each side's v."""
    if evidence.optimizer("reference") != "adam" or evidence.quantity not in ("slot", "weight"):
        return None
    beta_2 = evidence.number("reference", "optimizer/model/beta_2") or 0.999
    forms = {"float32": float(np.float32(1.0) - np.float32(beta_2)), "float": 1.0 - beta_2}
    misses = {side: {form: 0.0 for form in forms} for side in ("reference", "candidate")}
    seen = 0
    for variable in evidence.variables():
        slot, step = f"{variable}/v", evidence.step
        for side in misses:
            v = evidence.value(side, step, "slot", slot)
            before = evidence.value(side, step - 1, "slot", slot) if step > 1 else 0.0
            g = evidence.value(side, step, "grad", variable)
            if v is None or g is None or before is None:
                continue
            seen += 1
            for form, one_minus in forms.items():
                guess = (np.float32(beta_2) * np.float32(before)
                         + np.float32(one_minus) * np.float32(g) ** 2)
                misses[side][form] += float(np.abs(guess - v).sum())
    if not seen:
        return None
    best = {side: min(m, key=m.get) for side, m in misses.items()}
    figures = ", ".join(f"{side} v fits 1-beta_2 as {best[side]}" for side in best)
    if best["reference"] == best["candidate"]:
        return Finding("adam_one_minus_beta_2", False, evidence=figures)
    return Finding("adam_one_minus_beta_2", True, None,
                   "a legitimate rounding difference of Adam: 1-beta_2 in float32 on one side, "
                   "from the Python float on the other; give beta_2 as float(np.float32(...)) "
                   "or declare the variant as noise", figures)
