"""The explanation stage: after a pair is judged, a likely cause for its first divergence,
derived from both traces' numbers, with the figures of every hypothesis tried.

A hypothesis is a small function `(Evidence) -> Finding | None` (None: it does not apply to
this divergence). They are tried in the order of `HYPOTHESES`; the first that fits is the
likely cause. A declared difference (preflight) is tied to it when its effect matches, or is
the cause itself when no test on the numbers fits but its effect first acts where the pair
diverged. When nothing fits, the cause says so and lists what was ruled out.

>>> ref, cand = Trace("a"), Trace("b")
>>> for step, g in ((1, 1.0), (2, 1.0)):
...     ref.record(step, "grad", "w", np.array([g, 2 * g]))
...     cand.record(step, "grad", "w", np.array([g, 2 * g]) * (0.5 if step == 1 else 1))
>>> explain_traces(ref, cand, Divergence(1, "grad", "w", "off")).cause
'gradients x0.5: the loss divided by 2 once more (averaged twice)'
"""
from __future__ import annotations

import dataclasses
import fnmatch
from typing import Callable

import numpy as np
import pandas as pd

from verify.core.trace import Trace
from verify.explain import declared as declared_module
from verify.explain.declared import adam_one_minus_beta_2, combiner, declared_only, input_batch
from verify.explain.evidence import Evidence, Finding
from verify.explain.forward import (batch_statistics, forward_pass, initializer, metric_only,
                                    state)
from verify.explain.gradients import (clip_global_norm, clip_per_replica, clip_per_variable,
                                      drop_step, gradient_scale, loss_scale)
from verify.explain.rows import repeated_rows, row_update
from verify.explain.state import repeated_update, slot_state, structure
from verify.explain.step_size import epsilon, ftrl_beta, learning_rate
from verify.judge.compare import Divergence

Hypothesis = Callable[[Evidence], "Finding | None"]

# name -> hypothesis, in the order they are tried (the most specific test first).
HYPOTHESES: dict[str, Hypothesis] = {
    "structure": structure,
    "input": input_batch,
    "initializer": initializer,
    "metric": metric_only,
    "drop_step": drop_step,
    "loss_scale": loss_scale,
    "clip_global_norm": clip_global_norm,
    "clip_per_replica": clip_per_replica,
    "clip_norm": clip_per_variable,
    "gradient_scale": gradient_scale,
    "slot_state": slot_state,
    "repeated_update": repeated_update,
    "repeated_rows": repeated_rows,
    "row_update": row_update,
    "state": state,
    "batch_statistics": batch_statistics,
    "learning_rate": learning_rate,
    "ftrl_beta": ftrl_beta,
    "epsilon": epsilon,
    "adam_one_minus_beta_2": adam_one_minus_beta_2,
    "combiner": combiner,
}
# Every cause a finding can name (a hypothesis may name a more specific one than its key:
# slot_state finds slot_not_restored or initial_accumulator), as a control declares it;
# 'declared KEY-PATTERN': numbers that agree and a blocking preflight finding (`explain_agreeing`).
CAUSES = ("structure", "input", "initializer", "kernel_layout", "metric", "drop_step",
          "loss_scale", "clip_global_norm", "clip_per_replica", "clip_norm", "clip_value",
          "gradient_scale", "slot_not_restored", "initial_accumulator", "repeated_update",
          "repeated_rows",
          "row_skipped", "untouched_rows_updated", "state", "batch_statistics", "learning_rate",
          "adam_step_count", "ftrl_beta", "epsilon", "betas", "adam_one_minus_beta_2",
          "combiner", "forward_pass", "declared")
NO_CAUSE = "no known cause fits"
MAX_CAUSE = 200


@dataclasses.dataclass(frozen=True)
class Explanation:
    """The likely cause of one pair's divergence and every hypothesis tried."""

    cause: str                       # one line, <= MAX_CAUSE characters; '' when it passed
    finding: Finding | None          # the hypothesis that fits (None: none fits)
    tried: tuple[Finding, ...] = ()

    def evidence(self) -> str:
        """Every hypothesis tried with its figures, one ' | '-separated line."""
        return " | ".join(f"{f.hypothesis} {'fits' if f.fits else 'ruled out'}: {f.evidence}"
                         for f in self.tried if f.evidence)

    def label(self) -> str:
        return self.finding.label() if self.finding else ""


def explain_traces(reference: Trace, candidate: Trace, divergence: Divergence | None,
                   preflight: pd.DataFrame | None = None) -> Explanation:
    """The likely cause of `divergence` between two traces (none when there is none)."""
    if divergence is None or divergence.quantity == "run":
        return Explanation("", None)
    evidence = Evidence(reference, candidate, divergence.step, divergence.quantity,
                        divergence.tensor, preflight if preflight is not None else pd.DataFrame())
    tried = []
    for hypothesis in HYPOTHESES.values():
        try:
            finding = hypothesis(evidence)
        except (ValueError, FloatingPointError, np.linalg.LinAlgError) as e:
            finding = Finding(hypothesis.__name__, False, evidence=f"not testable ({e})")
        if finding is not None:
            tried.append(finding)
    fitting = next((f for f in tried if f.fits), None)
    said = declared_module.declared(evidence)
    if said is not None:
        tried.append(said)
    if fitting is None and said is not None and said.fits:
        fitting = said
    elif fitting is not None and said is not None and said.fits and \
            said.hypothesis == fitting.hypothesis:
        fitting = dataclasses.replace(fitting, sentence=f"{said.sentence.split(';')[0]}; "
                                                        f"the numbers fit: {fitting.sentence}")
    if fitting is None:   # the least specific cause: only when nothing else, declared or not, fits
        fitting = forward_pass(evidence)
        tried += [fitting] if fitting is not None else []
    if fitting is not None:
        return Explanation(_line(fitting.sentence), fitting, tuple(tried))
    ruled_out = ", ".join(f.hypothesis for f in tried) or "no hypothesis applies to "
    where = f"step {divergence.step} {divergence.quantity}"
    return Explanation(_line(f"{NO_CAUSE} (ruled out: {ruled_out}; see the evidence)"
                             if tried else f"{NO_CAUSE}: no hypothesis applies to {where}"),
                       None, tuple(tried))


def explain_agreeing(preflight: pd.DataFrame | None, rows: pd.DataFrame) -> Explanation:
    """The cause of a pair whose compared values all agree (`rows`, the judge's drift rows)
    while preflight found blocking differences: the declared differences themselves. No cause
    when nothing blocking was found (informational rows are not a cause) or a value differs.

    >>> rows = pd.DataFrame({"step": [0, 1], "passed": [True, True]})
    >>> info = pd.DataFrame([{"key": "input/layout", "severity": "info",
    ...                       "reference_value": "a", "candidate_value": "b"}])
    >>> explain_agreeing(info, rows).cause
    ''
    """
    finding = declared_only(preflight if preflight is not None else pd.DataFrame(), rows,
                            MAX_CAUSE)
    if finding is None:
        return Explanation("", None)
    return Explanation(_line(finding.sentence), finding, (finding,))


def _line(text: str) -> str:
    return text if len(text) <= MAX_CAUSE else text[:MAX_CAUSE - 1] + "…"


def explained(expected: str, explanation: Explanation) -> str:
    """Whether a control's declared cause ('learning_rate x1.01', 'drop_step 2',
    'declared table/*/initializer') is the one found: 'yes', or 'no: ...' saying what was
    found; '' when nothing is declared. A value is matched within 1%, a declared key by its
    pattern.

    >>> explained("drop_step 2", Explanation("c", Finding("drop_step", True, 2.0)))
    'yes'
    >>> explained("learning_rate x1.01", Explanation("c", Finding("epsilon", True, 10.0)))
    'no: found epsilon x10'
    >>> explained("declared table/*/initializer", Explanation(
    ...     "c", Finding("declared", True, keys=("table/user/initializer",))))
    'yes'
    """
    if not expected:
        return ""
    found = explanation.finding
    if found is None:
        return "no: " + (NO_CAUSE if explanation.tried else "not explained")
    key, _, value = expected.partition(" ")
    if key != found.hypothesis:
        return f"no: found {found.label()}"
    if not value:
        return "yes"
    if key == "declared":   # a key pattern: one of the blocking keys it rests on
        return "yes" if any(fnmatch.fnmatchcase(k, value) for k in found.keys) else \
            f"no: found {found.label()}"
    wanted = float(value.lstrip("x"))
    if found.value is None or abs(found.value - wanted) > 0.01 * abs(wanted):
        return f"no: found {found.label()}"
    return "yes"
