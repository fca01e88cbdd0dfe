"""summary.md: the pull-request summary, short whatever the number of pairs and tensors.

Every name and message is escaped (`verify.render.text.markdown`): a case, implementation or
tensor name shows as written, never as markup, a table cell or raw HTML.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pandas as pd

from verify.core.noise_floor import LOOSE
from verify.core.quantities import NUMERIC
from verify.judge.compare import not_captured_rows
from verify.judge.preflight import blocking as preflight_blocking
from verify.judge.verdict import CAUGHT, FAIL, MISSED, PASS
from verify.core.meta import SUITE_ENVIRONMENT
from verify.render.text import code, markdown, plural
from verify.results import (INCOMPLETE, RunResults, divergence_text, layer_text, pair_of_test,
                            pair_title, sort_pairs, worst_drift)

if TYPE_CHECKING:
    from verify.history import RunComparison

MAX_PAIR_LINES = 40       # summary.md stays pasteable whatever the number of pairs
MAX_FAILING_DETAIL = 10
MAX_NAME = 80             # longest tensor or pair name printed in summary.md
MAX_LISTED = 15           # regressions and changes listed since a compared run
MAX_FACT = 120            # longest environment fact or option value
MAX_TEXT = 300            # longest regression or change line
MEANINGFUL_FLOOR = 1e-30  # below it a floor is the spacing of zero, not a measurement


def summary_markdown(results: RunResults, record: dict[str, Any] | None = None,
                     comparison: "RunComparison | None" = None) -> str:
    """The pull-request summary, short whatever the number of pairs and tensors.

    Order: verdict line, environment, regressions since the compared run, what failed (first
    divergence and reason), worst drift per quantity, then every pair (collapsed, at most
    MAX_PAIR_LINES lines).

    >>> text = summary_markdown(RunResults.empty())
    >>> text.splitlines()[0]
    '## Parity: NO RESULTS (0 pairs: none)'
    """
    pairs = sort_pairs(results.pairs)
    elsewhere = destination_environments(pairs)
    lines = [summary_headline(results, pairs, comparison), ""]
    lines += environment_lines(results, record or {}, elsewhere)
    if comparison is not None:
        lines += ["", *comparison_lines(comparison)]
    lines += incomplete_lines(results, len(pairs))
    lines += failure_lines(results, pairs)
    lines += preflight_lines(results.preflight, pairs)
    lines += not_captured_lines(pairs, results.rows)
    lines += tolerance_lines(results.rows, pairs)
    lines += sensitivity_lines(pairs)
    lines += worst_drift_lines(results.rows, pairs)
    lines += pair_table_lines(pairs, elsewhere)
    lines += ["", f"{len(results.rows)} drift rows in drift.csv; plots in report.html."]
    return "\n".join(lines) + "\n"


def summary_headline(results: RunResults, pairs: pd.DataFrame,
                     comparison: "RunComparison | None") -> str:
    """'## Parity: FAIL (3 pairs: 1 fail, 2 pass)', with the comparison's headline if any."""
    counts = pairs["verdict"].value_counts().to_dict()
    tally = ", ".join(f"{counts[v]} {v.lower()}" for v in (FAIL, MISSED, PASS, CAUGHT)
                      if v in counts)
    headline = f"## Parity: {results.verdict} ({plural(len(pairs), 'pair')}: {tally or 'none'})"
    if results.verdict == INCOMPLETE:
        headline = f"## Parity: {INCOMPLETE} ({incomplete_tally(results, len(pairs), tally)})"
    if comparison is not None:
        headline += f" · {comparison.headline()}"
    return headline


def environment_lines(results: RunResults, record: dict[str, Any],
                      elsewhere: list[str]) -> list[str]:
    """Where the run ran (versions, device, CPU, commit), the other environments some pair's
    side ran in (`elsewhere`), and the options."""
    environment, options = results.environment, results.options
    env = ", ".join(f"{k} {markdown(environment[k], MAX_FACT)}"
                    for k in ("tensorflow", "numpy", "python") if environment.get(k))
    provenance = record.get("provenance", {})
    commit = provenance.get("git_commit")
    lines = [f"Environment: {env or 'unknown'}; "
             f"device {markdown(options.get('device', 'cpu'), MAX_FACT)}; "
             f"CPU {markdown(environment.get('cpu', '?'), MAX_FACT)}"
             + (f"; commit {code(commit[:12], 12)}" if commit else "") + "."]
    if elsewhere:
        lines.append("Other environments (pairs with a side in them show where each side ran): "
                     + ", ".join(markdown(e, MAX_FACT) for e in elsewhere) + ".")
    if options:
        lines.append("Options: " + ", ".join(markdown(f"{k}={v}", MAX_FACT)
                                             for k, v in sorted(options.items())
                                             if k != "device") + ".")
    return lines


def failure_lines(results: RunResults, pairs: pd.DataFrame) -> list[str]:
    """The tests that left no result, then what failed: each failing pair's first divergence
    and reason (at most MAX_FAILING_DETAIL of each)."""
    lines = []
    if results.lost:
        lines += ["", f"### {plural(len(results.lost), 'test')} left no result"]
        for test_id, why in list(results.lost.items())[:MAX_FAILING_DETAIL]:
            lines.append(f"- {code(test_id, MAX_NAME)}: {markdown(why, 300)}")
    bad = pairs[pairs["verdict"].isin([FAIL, MISSED])]
    if not bad.empty:
        lines += ["", "### What failed"]
        for p in bad.head(MAX_FAILING_DETAIL).itertuples(index=False):
            where = divergence_text(p)
            layer = layer_text(p)
            lines.append(f"- **{markdown(pair_title(p), MAX_NAME)}** {p.verdict}"
                         + (f" at {markdown(where, MAX_NAME + 20)}" if where else "")
                         + (f" (first divergent layer: {markdown(layer, 200)})" if layer else "")
                         + f": {markdown(p.message, 400)}")
        if len(bad) > MAX_FAILING_DETAIL:
            lines.append(f"- … {len(bad) - MAX_FAILING_DETAIL} more failing pairs in summary.csv")
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


def pair_table_lines(pairs: pd.DataFrame, elsewhere: list[str]) -> list[str]:
    """Every pair (at most MAX_PAIR_LINES) with its verdict and first divergence, collapsed;
    with the environments of its sides when some ran elsewhere."""
    lines = ["", f"<details><summary>All {len(pairs)} pairs</summary>", "",
             "| verdict | pair | first divergence |" + (" environments |" if elsewhere else ""),
             "|---|---|---|" + ("---|" if elsewhere else "")]
    for p in pairs.head(MAX_PAIR_LINES).itertuples(index=False):
        where = divergence_text(p)
        envs = (f" {markdown(_text(getattr(p, 'environments', '')), MAX_NAME)} |"
                if elsewhere else "")
        lines.append(f"| {p.verdict} | {markdown(pair_title(p), MAX_NAME)} "
                     f"| {markdown(where, MAX_NAME + 20) or '—'} |" + envs)
    if len(pairs) > MAX_PAIR_LINES:
        lines.append(f"| … | {len(pairs) - MAX_PAIR_LINES} more pairs in summary.csv | |")
    return lines + ["", "</details>"]


def destination_environments(pairs) -> list[str]:
    """The environments other than the suite's own that some pair's side ran in, e.g.
    ['tf221 (TF 2.21.0)'] (from the pairs' `environments` column)."""
    found: dict[str, str] = {}   # name -> its fullest description
    if "environments" not in pairs:
        return []
    for text in pairs["environments"].dropna():
        for side in str(text).split(" → "):
            name = side.split(" ", 1)[0]
            if name and name != SUITE_ENVIRONMENT and len(side) > len(found.get(name, "")):
                found[name] = side
    return [found[name] for name in sorted(found)]


def _text(value) -> str:
    return "" if value is None or (isinstance(value, float) and value != value) else str(value)


def incomplete_tally(results: RunResults, judged: int, tally: str) -> str:
    """'5 of 9 pairs judged: 5 pass; 4 not run; interrupted by KeyboardInterrupt'."""
    missing = len(results.not_run) + len(results.lost)
    parts = [f"{judged} of {plural(judged + missing, 'pair')} judged: {tally or 'none'}"]
    if results.not_run:
        parts.append(f"{len(results.not_run)} not run")
    if results.stopped:
        parts.append(results.stopped)
    return "; ".join(parts)


def incomplete_lines(results: RunResults, judged: int) -> list[str]:
    """Why the verdict does not cover the whole selection, and the pairs that did not run."""
    lines = []
    if results.nothing_selected:
        lines += ["", f"**Nothing was checked:** {markdown(results.nothing_selected, 600)}"]
    if results.verdict != INCOMPLETE:
        return lines
    why = f"{results.stopped}; " if results.stopped else ""
    lines += ["", f"**Incomplete:** {why}this verdict covers only the {plural(judged, 'pair')} "
                  f"judged; a PASS needs a run that judges every selected pair."]
    if results.not_run:
        lines += ["", f"### {plural(len(results.not_run), 'selected pair')} not run"]
        for test_id, why in list(results.not_run.items())[:MAX_FAILING_DETAIL]:
            lines.append(f"- {code(pair_of_test(test_id), MAX_NAME)}: {markdown(why, 200)}")
        if len(results.not_run) > MAX_FAILING_DETAIL:
            lines.append(f"- … {len(results.not_run) - MAX_FAILING_DETAIL} more in run.json")
    return lines


def preflight_lines(findings: pd.DataFrame, pairs: pd.DataFrame) -> list[str]:
    """Which optimizer trained the tables, and the blocking configuration differences
    (at most MAX_FAILING_DETAIL lines; all of them are in preflight.csv)."""
    lines = []
    trained: dict[str, None] = {}   # "case impl: optimizer ..." once each, in order
    faithful = pairs[pairs["role"] == "faithful"]
    for case, text in zip(faithful["case"], faithful.get("tables_trained_by",
                                                         [""] * len(faithful))):
        for part in str(text).split("; ") if isinstance(text, str) and text else []:
            trained[f"{case} {part}"] = None
    blocking = preflight_blocking(findings) if not findings.empty else findings
    if not trained and blocking.empty:
        return lines
    lines += ["", "### Preflight (declared configuration)"]
    for text in list(trained)[:MAX_FAILING_DETAIL]:
        lines.append(f"- tables trained by {markdown(text, 240)}")
    if len(trained) > MAX_FAILING_DETAIL:
        lines.append(f"- … {len(trained) - MAX_FAILING_DETAIL} more in summary.csv")
    controls = set(zip(pairs.loc[pairs["role"] == "control", "case"],
                       pairs.loc[pairs["role"] == "control", "candidate"]))
    if not blocking.empty:   # the migration's own findings before the negative controls'
        is_control = [(c, n) in controls for c, n in zip(blocking["case"], blocking["candidate"])]
        blocking = blocking.assign(is_control=is_control).sort_values("is_control", kind="stable")
    else:
        lines.append("- no blocking configuration difference")
    for f in blocking.head(MAX_FAILING_DETAIL).itertuples(index=False):
        values = (f"{f.reference_value or '·'} → {f.candidate_value or '·'}" if f.side == "both"
                  else f"{f.side}: {f.reference_value or f.candidate_value}")
        lines.append(f"- **blocking**{' (negative control)' if f.is_control else ''} "
                     f"{markdown(f.case, MAX_NAME)}: {markdown(f.reference, MAX_NAME)} → "
                     f"{markdown(f.candidate, MAX_NAME)} {code(f.key, MAX_NAME)} "
                     f"({markdown(values, 120)}): {markdown(f.rule, 160)}")
    if len(blocking) > MAX_FAILING_DETAIL:
        lines.append(f"- … {len(blocking) - MAX_FAILING_DETAIL} more in preflight.csv")
    return lines


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
    for p in listed.head(MAX_FAILING_DETAIL).itertuples(index=False):
        lines.append(f"- {markdown(pair_title(p), MAX_NAME)}: {markdown(p.not_captured, 300)}")
    if len(listed) > MAX_FAILING_DETAIL:
        lines.append(f"- … {len(listed) - MAX_FAILING_DETAIL} more pairs in summary.csv "
                     f"(column not_captured)")
    reasons = rows.loc[not_captured_rows(rows), "reason"] if len(rows) else []
    lines += [f"- {markdown(why, 400)}" for why in dict.fromkeys(map(str, reasons))]
    return lines


def comparison_lines(comparison: "RunComparison") -> list[str]:
    """The "Since run ..." section: regressions, then what changed around the numbers."""
    lines = [f"### Since {markdown(comparison.since(), MAX_TEXT)}", ""]
    if comparison.ok:
        lines.append(f"No regression (no good pair failing, no drift grown more than "
                     f"{comparison.factor:g}x).")
    else:
        lines += [f"- **{markdown(text, MAX_TEXT)}**"
                  for text in comparison.regressions[:MAX_LISTED]]
        if len(comparison.regressions) > MAX_LISTED:
            lines.append(f"- … {len(comparison.regressions) - MAX_LISTED} more regressions")
    if comparison.changes:
        lines += ["", "Changed: " + "; ".join(markdown(text, MAX_TEXT)
                                              for text in comparison.changes[:MAX_LISTED])
                  + (f"; … {len(comparison.changes) - MAX_LISTED} more"
                     if len(comparison.changes) > MAX_LISTED else "") + "."]
    return lines


def tolerance_lines(rows: pd.DataFrame, pairs: pd.DataFrame) -> list[str]:
    """Where each case's tolerances come from: calibrated against its measured noise floor or
    not, how much of its tolerance the worst faithful pair uses, and the quantities whose own
    tolerance is more than LOOSE times the floor (a finding: it could hide a real mistake)."""
    if pairs.empty or "calibration" not in pairs:
        return []
    lines = ["", "### Tolerances and noise floors", ""]
    faithful = pairs[pairs["role"] == "faithful"]
    numeric = rows[rows["quantity"].isin(NUMERIC)] if not rows.empty else rows
    for case in sorted(pairs["case"].unique()):
        of_case = pairs[pairs["case"] == case]
        sources = sorted({str(c) for c in of_case["calibration"] if isinstance(c, str) and c})
        used = numeric[(numeric["case"] == case) & numeric["candidate"].isin(
            faithful.loc[faithful["case"] == case, "candidate"])] if not numeric.empty else numeric
        worst = used["times_tolerance"].astype(float).max() if not used.empty else float("nan")
        more = f"; and {len(sources) - 3} more references" if len(sources) > 3 else ""
        line = (f"- **{markdown(case, MAX_NAME)}**: " + "; ".join(markdown(x, 160) for x in sources[:3])
                + more
                + (f"; worst faithful drift uses {worst:.2g} of its tolerance"
                   if worst == worst else ""))
        lines.append(line)
        of_rows = numeric[numeric["case"] == case] if not numeric.empty else numeric
        if "looseness" in of_rows and not of_rows.empty:
            # a floor set by the spacing of an all-zero tensor (a bias as loaded) says nothing
            # about the tolerance
            loose = of_rows[(of_rows["looseness"].astype(float) > LOOSE)
                            & (of_rows["floor"].astype(float) >= MEANINGFUL_FLOOR)]
            for quantity in [q for q in NUMERIC if q in set(loose["quantity"])]:
                part = loose[loose["quantity"] == quantity]
                top = part.loc[part["looseness"].astype(float).idxmax()]
                lines.append(f"  - {quantity}: the case's own tolerance is up to "
                             f"{float(top['looseness']):.2g}x the noise floor "
                             f"({code(top['tensor'], MAX_NAME)} step {int(top['step'])}, floor "
                             f"{float(top['floor']):.2g}); the calibrated cap, a multiple of "
                             f"the floor, judged it")
    return lines


def sensitivity_lines(pairs: pd.DataFrame) -> list[str]:
    """Per case, the automatic mutants (verify.sensitivity) and how far beyond tolerance each
    was caught: the case's detection limit is its weakest catch."""
    mutants = pairs[pairs["role"] == "mutant"] if "role" in pairs else pairs.iloc[0:0]
    if mutants.empty:
        return []
    lines = ["", "### Detection limits (automatic mutants)", ""]
    for case in sorted(mutants["case"].unique()):
        of_case = mutants[mutants["case"] == case]
        parts = []
        for kind in sorted({str(c).split("~", 1)[-1] for c in of_case["candidate"]}):
            of_kind = of_case[of_case["candidate"].str.endswith("~" + kind)]
            caught = of_kind[of_kind["verdict"] == CAUGHT]
            margins = caught["margin"].astype(float)
            weakest = f", weakest {margins.min():.3g}x" if len(margins) else ""
            parts.append(f"{kind} {len(caught)}/{len(of_kind)} caught{weakest}")
        lines.append(f"- **{markdown(case, MAX_NAME)}**: " + "; ".join(parts))
    return lines
