"""The sections of summary.md below what a reviewer acts on: the overview of each case (its
verdicts, where its tolerances come from, its detection limit), and the collapsed details
(preflight, values a device did not capture, tolerance findings, worst drift) and where every
pair and drift row is.
"""
from __future__ import annotations

import pandas as pd

from verify.core.noise_floor import LOOSE
from verify.core.quantities import NUMERIC
from verify.judge.compare import not_captured_rows
from verify.judge.preflight import blocking as preflight_blocking
from verify.judge.verdict import CAUGHT, FAIL, MISSED, PASS
from verify.render.text import code, markdown
from verify.store.results import pair_title, worst_drift

MAX_LISTED_DETAIL = 10    # lines of one list (findings, not captured, ...)
MAX_CASES = 30            # cases in the overview table
MAX_FINDINGS = 4          # tolerance findings listed in the details
MAX_TRAINED = 2           # "tables trained by" lines
MAX_NAME = 80             # longest tensor or pair name printed
MEANINGFUL_FLOOR = 1e-30  # below it a floor is the spacing of zero, not a measurement


def case_overview_lines(rows: pd.DataFrame, pairs: pd.DataFrame) -> list[str]:
    """One table row per case (`case_facts`): its verdicts, where its tolerances come from and
    how much of them its worst faithful pair uses, and its detection limit.

    >>> pairs = pd.DataFrame({"case": ["c", "c"], "candidate": ["tf2", "tf2~learning_rate"],
    ...     "role": ["faithful", "mutant"], "verdict": ["PASS", "CAUGHT"], "margin": [0, 4e3],
    ...     "calibration": ["10x the floor of tf1 (2026-11-25)", ""]})
    >>> case_overview_lines(pd.DataFrame(), pairs)[-1]
    '| c | 1 pass, 1 caught | 10x the floor of tf1 (2026-11-25) | 1/1 mutants caught, weakest 4e+03x (learning_rate) |'
    """
    if pairs.empty:
        return []
    lines = ["", "### Per case", "", "| case | verdicts | tolerances | detection limit |",
             "|---|---|---|---|"]
    facts = case_facts(rows, pairs)
    for case in list(facts)[:MAX_CASES]:
        lines.append("| " + " | ".join(markdown(facts[case][k], 300) for k in
                                       ("case", "verdicts", "tolerances", "detection")) + " |")
    if len(facts) > MAX_CASES:
        lines.append(f"| … | {len(facts) - MAX_CASES} more cases in summary.csv | | |")
    return lines


def case_facts(rows: pd.DataFrame, pairs: pd.DataFrame) -> dict[str, dict[str, str]]:
    """What the overview says of each case (in name order), as plain text: `case`, `verdicts`
    ('12 pass, 3 caught'), `tolerances` (where they come from, how much of them its worst
    faithful pair uses) and `detection` (the weakest mutant caught). One pass over the rows."""
    worst = _worst_faithful_use(rows, pairs)
    facts = {}
    for case, of_case in pairs.groupby("case", sort=True):
        counts = of_case["verdict"].value_counts()
        facts[case] = {"case": str(case),
                       "verdicts": ", ".join(f"{counts[v]} {v.lower()}"
                                             for v in (FAIL, MISSED, PASS, CAUGHT)
                                             if v in counts) + explained_count(of_case),
                       "tolerances": tolerance_source(of_case, worst.get(case, float("nan"))),
                       "detection": detection_limit(of_case)}
    return facts


def explained_count(of_case: pd.DataFrame) -> str:
    """' (3 of 4 controls explained)': of the controls and mutants that declare the cause
    that must explain them (`expected_cause`), how many were explained by it; '' when none
    declares one.

    >>> explained_count(pd.DataFrame({"expected_cause": ["drop_step 2", "", "epsilon x10"],
    ...                               "explained": ["yes", "", "no: found learning_rate x1.5"]}))
    ' (1 of 2 explained)'
    """
    if "expected_cause" not in of_case:
        return ""
    declaring = of_case[of_case["expected_cause"].apply(lambda v: isinstance(v, str) and bool(v))]
    if declaring.empty:
        return ""
    return f" ({int((declaring['explained'] == 'yes').sum())} of {len(declaring)} explained)"


def tolerance_source(of_case: pd.DataFrame, worst_use: float) -> str:
    """Where a case's tolerances come from (its pairs' `calibration`), and how much of them its
    worst faithful pair uses (`worst_use`, NaN when unknown)."""
    sources = sorted({str(c) for c in of_case.get("calibration", []) if isinstance(c, str) and c})
    text = (sources[0] + (f" (+{len(sources) - 1} more)" if len(sources) > 1 else "")
            if sources else "the case's own (not calibrated)")
    return text + (f"; worst faithful drift uses {worst_use:.2g} of it"
                   if worst_use == worst_use else "")


def _worst_faithful_use(rows: pd.DataFrame, pairs: pd.DataFrame) -> dict[str, float]:
    """case -> the largest `times_tolerance` of a numeric row of its faithful pairs."""
    if rows.empty or "times_tolerance" not in rows:
        return {}
    faithful = pairs.loc[pairs["role"] == "faithful", ["case", "candidate"]]
    of_faithful = pd.MultiIndex.from_frame(rows[["case", "candidate"]]).isin(
        pd.MultiIndex.from_frame(faithful))
    used = rows[of_faithful & rows["quantity"].isin(NUMERIC).to_numpy()]
    return used["times_tolerance"].astype(float).groupby(used["case"]).max().to_dict()


def detection_limit(of_case: pd.DataFrame) -> str:
    """'12/12 mutants caught, weakest 1.5e+03x (learning_rate)', or that none ran."""
    mutants = of_case[of_case["role"] == "mutant"]
    if mutants.empty:
        return "no mutants run"
    caught = mutants[mutants["verdict"] == CAUGHT]
    text = f"{len(caught)}/{len(mutants)} mutants caught"
    if "explained" in mutants and mutants["explained"].apply(
            lambda v: isinstance(v, str) and bool(v)).any():
        text += f", {int((mutants['explained'] == 'yes').sum())} explained"
    if not caught.empty:
        weakest = caught.loc[caught["margin"].astype(float).idxmin()]
        kind = str(weakest["candidate"]).split("~", 1)[-1]
        text += f", weakest {float(weakest['margin']):.3g}x ({kind})"
    return text


def tables_trained_lines(pairs: pd.DataFrame) -> list[str]:
    """Which optimizer trained the tables of each faithful pair's sides, on the device used
    (at most MAX_TRAINED lines; every one is in summary.csv)."""
    trained: dict[str, None] = {}   # "case impl: optimizer ..." once each, in order
    faithful = pairs[pairs["role"] == "faithful"] if "role" in pairs else pairs.iloc[0:0]
    for case, text in zip(faithful["case"], faithful.get("tables_trained_by",
                                                         [""] * len(faithful))):
        for part in str(text).split("; ") if isinstance(text, str) and text else []:
            trained[f"{case} {part}"] = None
    if not trained:
        return []
    lines = ["", "### Tables trained by"]
    lines += [f"- {markdown(text, 240)}" for text in list(trained)[:MAX_TRAINED]]
    if len(trained) > MAX_TRAINED:
        lines.append(f"- … {len(trained) - MAX_TRAINED} more in summary.csv "
                     f"(column tables_trained_by)")
    return lines


def _blocking(findings: pd.DataFrame, pairs: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The blocking findings of the migration's own pairs, and those of its negative controls
    (which declare them: they are expected)."""
    blocking = preflight_blocking(findings) if not findings.empty else findings
    if blocking.empty:
        return blocking, blocking
    controls = set(zip(pairs.loc[pairs["role"] == "control", "case"],
                       pairs.loc[pairs["role"] == "control", "candidate"]))
    is_control = pd.Series([(c, n) in controls for c, n in zip(blocking["case"],
                                                               blocking["candidate"])],
                           index=blocking.index, dtype=bool)
    return blocking[~is_control], blocking[is_control]


def blocking_lines(findings: pd.DataFrame, pairs: pd.DataFrame) -> list[str]:
    """The blocking configuration differences of the migration's own pairs (at most
    MAX_LISTED_DETAIL; all are in preflight.csv), or that there are none."""
    own, controls = _blocking(findings, pairs)
    if own.empty and controls.empty and findings.empty:
        return []
    lines = ["", "### Preflight (declared configuration)"]
    if own.empty:
        lines.append("- no blocking configuration difference"
                     + (f" (the negative controls' {len(controls)} are in the details)"
                        if len(controls) else ""))
    lines += [_finding_line(f) for f in own.head(MAX_LISTED_DETAIL).itertuples(index=False)]
    if len(own) > MAX_LISTED_DETAIL:
        lines.append(f"- … {len(own) - MAX_LISTED_DETAIL} more in preflight.csv")
    return lines


def control_findings_lines(findings: pd.DataFrame, pairs: pd.DataFrame) -> list[str]:
    """How many blocking findings the negative controls have (each control declares what
    preflight must flag; its verdict says whether it was): one line."""
    _, controls = _blocking(findings, pairs)
    if controls.empty:
        return []
    return ["", f"Preflight: {len(controls)} blocking findings on negative controls, which "
                f"declare them (preflight.csv)."]


def _finding_line(f) -> str:
    values = (f"{f.reference_value or '·'} → {f.candidate_value or '·'}" if f.side == "both"
              else f"{f.side}: {f.reference_value or f.candidate_value}")
    return (f"- **blocking** {markdown(f.case, MAX_NAME)}: {markdown(f.reference, MAX_NAME)} → "
            f"{markdown(f.candidate, MAX_NAME)} {code(f.key, MAX_NAME)} "
            f"({markdown(values, 120)}): {markdown(f.rule, 160)}")


def not_captured_lines(pairs: pd.DataFrame, rows: pd.DataFrame) -> list[str]:
    """The values a device did not let a run capture (table gradients on a TPU), per pair
    (faithful ones first), and why: informational rows that pass without a number, listed so
    that no reader takes them for compared values.

    >>> pairs = pd.DataFrame({"case": ["c"], "reference": ["tf1"], "candidate": ["tf2"],
    ...     "replicas": [1], "role": ["faithful"],
    ...     "not_captured": ["grad t (2 steps): not captured on TPU by tf2"]})
    >>> rows = pd.DataFrame({"status": ["not captured"], "reason": ["not captured on TPU by tf2: why"]})
    >>> not_captured_lines(pairs, rows)[1:]
    ['### Not captured on the device (informational, not compared)', '- c: tf1 → tf2 (x1): grad t (2 steps): not captured on TPU by tf2', '- not captured on TPU by tf2: why']
    """
    if "not_captured" not in pairs:
        return []
    listed = pairs[pairs["not_captured"].apply(lambda v: isinstance(v, str) and bool(v))]
    if listed.empty:
        return []
    listed = listed.assign(_faithful=listed["role"] != "faithful").sort_values(
        "_faithful", kind="stable")
    lines = ["", "### Not captured on the device (informational, not compared)"]
    for p in listed.head(MAX_LISTED_DETAIL).itertuples(index=False):
        lines.append(f"- {markdown(pair_title(p), MAX_NAME)}: {markdown(p.not_captured, 300)}")
    if len(listed) > MAX_LISTED_DETAIL:
        lines.append(f"- … {len(listed) - MAX_LISTED_DETAIL} more pairs in summary.csv "
                     f"(column not_captured)")
    reasons = rows.loc[not_captured_rows(rows), "reason"] if len(rows) else []
    lines += [f"- {markdown(why, 400)}" for why in dict.fromkeys(map(str, reasons))]
    return lines


def tolerance_lines(rows: pd.DataFrame, pairs: pd.DataFrame) -> list[str]:
    """The quantities whose case tolerance is more than LOOSE times the measured noise floor,
    per case (a finding: such a tolerance could hide a real mistake; the calibrated cap, a
    multiple of the floor, judged them). Where tolerances come from is in the case overview."""
    if pairs.empty or rows.empty or "looseness" not in rows:
        return []
    numeric = rows[rows["quantity"].isin(NUMERIC)]
    found = []
    for case in sorted(pairs["case"].unique()):
        of_rows = numeric[numeric["case"] == case]
        # a floor set by the spacing of an all-zero tensor (a bias as loaded) says nothing
        # about the tolerance
        loose = of_rows[(of_rows["looseness"].astype(float) > LOOSE)
                        & (of_rows["floor"].astype(float) >= MEANINGFUL_FLOOR)]
        for quantity in [q for q in NUMERIC if q in set(loose["quantity"])]:
            part = loose[loose["quantity"] == quantity]
            top = part.loc[part["looseness"].astype(float).idxmax()]
            found.append(f"- {markdown(case, MAX_NAME)} {quantity}: the case's own tolerance is "
                         f"up to {float(top['looseness']):.2g}x the noise floor "
                         f"({code(top['tensor'], MAX_NAME)} step {int(top['step'])}, floor "
                         f"{float(top['floor']):.2g}); the calibrated cap judged it")
    if not found:
        return []
    lines = ["", "### Case tolerances far above the noise floor"]
    lines += found[:MAX_FINDINGS]
    if len(found) > MAX_FINDINGS:
        lines.append(f"- … {len(found) - MAX_FINDINGS} more in drift.csv.gz (column looseness)")
    return lines


def worst_drift_lines(rows: pd.DataFrame, pairs: pd.DataFrame) -> list[str]:
    """The table of the worst drift per quantity over the faithful pairs."""
    worst = worst_drift(rows, pairs)
    if worst.empty:
        return []
    lines = ["", "### Worst drift per quantity (faithful pairs)", "",
             "| quantity | max abs | max rel | rel L2 | tightest rtol | rtol used | where |",
             "|---|---|---|---|---|---|---|"]
    for w in worst.itertuples(index=False):
        lines.append(f"| {w.quantity} | {w.max_abs:.3g} | {w.max_rel:.3g} | {w.rel_l2:.3g} "
                     f"| {w.tightest_rtol:.3g} | {w.rtol:.3g} "
                     f"| {markdown(w.where, MAX_NAME)} |")
    return lines


def where_to_look_lines(pairs: pd.DataFrame, elsewhere: list[str], rows: int) -> list[str]:
    """Where everything is: every pair (verdict, first divergence, layer, the environments of
    its sides) in summary.csv, each of the `rows` drift rows in drift.csv.gz, plots in
    report.html; the failing pairs are at the top of this summary."""
    where = " and the environments each side ran in" if elsewhere else ""
    return ["", f"All {len(pairs)} pairs with their first divergence{where}: summary.csv; "
                f"all {rows} drift rows: drift.csv.gz; plots: report.html."]
