"""Explain: a likely cause for every failing pair, derived from both traces' numbers.

After the judge (`verify.judge.judge_pair`), `explain_pair` adds to a pair's record the likely
cause of its first divergence (`likely_cause`, one line with its figures), the figures of
every hypothesis tried (`cause_evidence`) and, for a control that declares the cause it must
be explained by (`Expectation.cause`, or `Implementation.preflight_cause` for one that
preflight alone catches), whether it was (`explained`). A pair whose numbers agree but whose
verdict a blocking preflight finding decides gets that finding as its cause ('declared'). It
reads traces, drift rows and preflight rows only, so it runs on kept traces and goldens too,
and never imports TensorFlow. `substitution` judges what a layer or optimizer substitution
(run by `verify.session.substitution`) computed, and `repro` writes the standalone script of a
unit found local (the script imports TensorFlow, this package does not).

    from verify.explain import explain_pair
    result = explain_pair(judge_pair(spec, traces, tolerances), spec, traces)
"""
from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Callable

from verify.core.case import PairSpec
from verify.core.trace import Trace
from verify.explain.stage import (CAUSES, HYPOTHESES, NO_CAUSE, Explanation, explain_agreeing,
                                  explain_traces, explained)
from verify.judge.compare import Divergence

if TYPE_CHECKING:
    from verify.judge.pair import PairResult

__all__ = ["CAUSES", "HYPOTHESES", "NO_CAUSE", "Explanation", "explain_agreeing", "explain_pair",
           "explain_traces", "explained"]


def explain_pair(result: "PairResult", spec: PairSpec,
                 traces: Callable[[str], Trace]) -> "PairResult":
    """`result` with its record's likely cause, its evidence and, for a control declaring one,
    whether the cause found is the declared one. A pair that passes gets no cause; one whose
    numbers agree but that preflight fails or catches gets its blocking findings
    (`explain_agreeing`)."""
    record = result.record   # the judge's first divergence (a pair that agrees has none)
    if record.first_step is None or not record.first_quantity:
        if result.verdict.status == "PASS":
            return result
        # the numbers agree and the verdict is not a pass: a blocking declared difference
        explanation = explain_agreeing(result.preflight, result.rows)
    else:
        divergence = Divergence(int(record.first_step), record.first_quantity,
                                record.first_tensor, "")
        explanation = explain_traces(traces(spec.reference), traces(spec.candidate), divergence,
                                     result.preflight)
    expected = spec.expect.cause if spec.expect is not None else spec.preflight_cause
    result.record = replace(result.record, likely_cause=explanation.cause,
                            cause_evidence=explanation.evidence(), expected_cause=expected,
                            explained=explained(expected, explanation))
    return result
