"""The verdict on one compared pair.

- A faithful pair PASSES when every drift row passes, and FAILS otherwise.
- A negative control is CAUGHT when its first divergence is at the step and quantity it
  declares (and tensor, if it names one) and the worst failing row there is at least
  `min_ratio` times beyond its tolerance. Otherwise it is MISSED: the suite could not see the
  mistake, or saw it somewhere else, and that is a failure of the suite. A control whose run
  raised where it declared no failed run (a full disk, a crash) FAILS: it was not judged.
"""
from __future__ import annotations

import dataclasses
import fnmatch

import numpy as np
import pandas as pd

from verify.core.case import Expectation
from verify.judge.compare import Divergence, first_divergence, not_captured_rows
from verify.judge.preflight import blocking as preflight_blocking

PASS, FAIL, CAUGHT, MISSED = "PASS", "FAIL", "CAUGHT", "MISSED"
GOOD = (PASS, CAUGHT)


@dataclasses.dataclass(frozen=True)
class Verdict:
    status: str
    message: str
    divergence: Divergence | None = None
    margin: float = np.nan   # for controls: how many times beyond the tolerance it was caught

    @property
    def ok(self) -> bool:
        return self.status in GOOD


def margin_at(rows: pd.DataFrame, divergence: Divergence) -> float:
    """How many times its tolerance the worst failing row of the divergence's step and quantity
    exceeds (`times_tolerance`: max |a-b| / (atol + rtol*|b|) over its elements).

    Structural failures (missing name, shape, NaN, a run that raised, an input digest) have
    no finite ratio and count as infinitely far from the tolerance.
    """
    at = rows[(rows["step"] == divergence.step) & (rows["quantity"] == divergence.quantity)
              & ~rows["passed"].astype(bool)]
    if at.empty:
        return np.nan
    ratios = at["times_tolerance"].astype(float).fillna(np.inf)
    return float(ratios.max())


def judge(rows: pd.DataFrame, expect: Expectation | None) -> Verdict:
    """Verdict for one pair's drift rows; `expect` is set for negative controls.

    >>> rows = pd.DataFrame({"step": [1], "quantity": ["loss"], "tensor": ["loss"],
    ...     "passed": [False], "reason": ["off"], "times_tolerance": [3e4], "status": ["failed"]})
    >>> judge(rows, Expectation(1, "loss", why="wrong combiner")).status
    'CAUGHT'
    >>> judge(rows, None).status
    'FAIL'
    """
    divergence = first_divergence(rows)
    if expect is None:
        unseen = int(not_captured_rows(rows).sum())
        compared = len(rows) - unseen
        # values a device did not let a run see pass without a number: said, never counted
        aside = (f"; {unseen} values not captured on the device (listed apart, not compared)"
                 if unseen else "")
        if compared == 0:
            return Verdict(FAIL, "nothing was compared: the two traces share no step and "
                                 "quantity" + aside)
        if divergence is None:
            return Verdict(PASS, f"{compared} values agree within tolerance{aside}")
        failed = int((~rows["passed"].astype(bool)).sum())
        return Verdict(FAIL, f"{failed} of {compared} values differ; {divergence.describe()}"
                             f"{aside}", divergence)
    wanted = f"step {expect.step} {expect.quantity}" + (f" {expect.tensor}" if expect.tensor else "")
    if divergence is None:
        return Verdict(MISSED, f"negative control passed every check; it should have diverged at "
                               f"{wanted} ({expect.why})")
    margin = margin_at(rows, divergence)
    where_ok = (divergence.step == expect.step
                and divergence.quantity in expect.quantity.split("|")
                and (expect.tensor is None or fnmatch.fnmatchcase(divergence.tensor, expect.tensor)))
    if divergence.quantity == "run" and "candidate" in rows and len(rows):
        # a raised run is the candidate's mistake only if the candidate raised
        where_ok = where_ok and divergence.tensor in (str(rows["candidate"].iloc[0]), "(step)")
    if (not where_ok and divergence.quantity == "run"
            and "run" not in expect.quantity.split("|")):
        # a run that raised (a full disk, a crash) is not the suite failing to see the mistake:
        # the control was never judged, and that is what the report says
        return Verdict(FAIL, f"negative control not judged: a run raised before it reached "
                             f"{wanted}; {divergence.describe()}", divergence, margin)
    if not where_ok:
        return Verdict(MISSED, f"negative control diverged at step {divergence.step} "
                               f"{divergence.quantity} {divergence.tensor}, expected at {wanted} "
                               f"({expect.why}); {divergence.describe()}", divergence, margin)
    if not margin >= expect.min_ratio:
        return Verdict(MISSED, f"negative control diverged at {wanted} only {margin:.3g}x beyond "
                               f"the tolerance (at least {expect.min_ratio:g}x required)",
                       divergence, margin)
    return Verdict(CAUGHT, f"caught where expected, {_times(margin)} beyond tolerance: "
                           f"{divergence.describe()}", divergence, margin)


def _times(margin: float) -> str:
    return "infinitely far (structural)" if np.isinf(margin) else f"{margin:.3g}x"


def judge_with_preflight(numeric: Verdict, findings: pd.DataFrame, expect: Expectation | None,
                         preflight_expect: tuple[str, ...]) -> Verdict:
    """Fold the preflight findings of a pair into its numeric verdict.

    - A faithful pair whose numbers agree FAILS when preflight found a blocking difference:
      agreement on this device does not vouch for it.
    - A control with `preflight_expect` is CAUGHT when preflight flags every expected key as
      blocking and the numbers behave as declared (agree when `expect` is None, else caught).

    >>> rows = pd.DataFrame({"key": ["table/t/initializer"], "severity": ["blocking"],
    ...     "reference_value": ["a"], "candidate_value": ["b"], "rule": ["r"], "side": ["both"]})
    >>> judge_with_preflight(Verdict(PASS, "agree"), rows, None, ("table/*/initializer",)).status
    'CAUGHT'
    >>> judge_with_preflight(Verdict(PASS, "agree"), rows, None, ()).status
    'FAIL'
    """
    blocking = preflight_blocking(findings) if len(findings) else findings
    listed = "; ".join(f"{r.key}: {r.reference_value or '·'} → {r.candidate_value or '·'}"
                       for r in blocking.itertuples(index=False)) if len(blocking) else ""
    if preflight_expect:
        keys = list(blocking["key"]) if len(blocking) else []
        missing = [p for p in preflight_expect if not any(fnmatch.fnmatchcase(k, p) for k in keys)]
        if missing:
            return Verdict(MISSED, f"preflight did not flag {missing} as blocking",
                           numeric.divergence, numeric.margin)
        numbers_ok = numeric.status == (PASS if expect is None else CAUGHT)
        if not numbers_ok:
            return Verdict(MISSED, f"preflight flagged it, but the numbers did not behave as "
                                   f"declared: {numeric.message}", numeric.divergence,
                           numeric.margin)
        return Verdict(CAUGHT, f"preflight flags it as blocking ({listed}); numbers: "
                               f"{numeric.message}", numeric.divergence, numeric.margin)
    if expect is None and numeric.status == PASS and len(blocking):
        return Verdict(FAIL, f"the numbers agree on this device, but preflight found blocking "
                             f"differences: {listed}", None, numeric.margin)
    return numeric
