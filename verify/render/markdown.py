"""summary.md: the pull-request summary, short whatever the number of pairs and tensors.

Every name and message is escaped (`verify.render.text.markdown`): a case, implementation or
tensor name shows as written, never as markup, a table cell or raw HTML.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pandas as pd

from verify.core.meta import SUITE_ENVIRONMENT
from verify.judge.verdict import CAUGHT, FAIL, MISSED, PASS
from verify.render.summary_sections import (MAX_LISTED_DETAIL, MAX_NAME, blocking_lines,
                                            case_overview_lines, control_findings_lines,
                                            not_captured_lines, tables_trained_lines,
                                            tolerance_lines, where_to_look_lines,
                                            worst_drift_lines)
from verify.render.text import code, markdown, plural
from verify.store.results import (INCOMPLETE, RunResults, divergence_text, layer_text, pair_of_test,
                            pair_title, sort_pairs)

if TYPE_CHECKING:
    from verify.store.history import RunComparison

MAX_LISTED = 15           # regressions and changes listed since a compared run
MAX_FACT = 120            # longest environment fact or option value
MAX_TEXT = 300            # longest regression or change line
MAX_CAUSE = 200           # longest likely cause (verify.explain writes at most this)


def summary_markdown(results: RunResults, record: dict[str, Any] | None = None,
                     comparison: "RunComparison | None" = None) -> str:
    """The pull-request summary, short whatever the number of pairs and tensors: what a
    reviewer acts on first, everything else collapsed.

    Order: verdict line, environment, regressions since the compared run, what did not run,
    what failed (first divergence, first divergent layer, reason), the blocking preflight
    findings of the migration itself, one row per case (verdicts, tolerances, detection
    limit); then, collapsed: other environments and options, the rest of preflight, values a
    device did not capture, tolerance findings, worst drift; then where every pair and row
    is.

    >>> text = summary_markdown(RunResults.empty())
    >>> text.splitlines()[0]
    '## Parity: NO RESULTS (0 pairs: none)'
    """
    pairs = sort_pairs(results.pairs)
    elsewhere = destination_environments(pairs)
    environment = environment_lines(results, record or {}, elsewhere)
    lines = [summary_headline(results, pairs, comparison), "", environment[0]]
    if comparison is not None:
        lines += ["", *comparison_lines(comparison)]
    lines += incomplete_lines(results, len(pairs))
    lines += failure_lines(results, pairs)
    lines += blocking_lines(results.preflight, pairs)
    lines += case_overview_lines(results.rows, pairs)
    details = [*environment[1:], *tables_trained_lines(pairs),
               *control_findings_lines(results.preflight, pairs),
               *not_captured_lines(pairs, results.rows), *tolerance_lines(results.rows, pairs),
               *worst_drift_lines(results.rows, pairs)]
    lines += ["", "<details><summary>Details: environments, preflight, tolerances, "
                  "drift</summary>", "", *details, "", "</details>"]
    lines += where_to_look_lines(pairs, elsewhere, len(results.rows))
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
        lines.append("Other environments (where each pair's sides ran: summary.csv's "
                     "environments column, report.html's overview): "
                     + ", ".join(markdown(e, MAX_FACT) for e in elsewhere) + ".")
    if options:
        lines.append("Options: " + ", ".join(markdown(f"{k}={v}", MAX_FACT)
                                             for k, v in sorted(options.items())
                                             if k != "device") + ".")
    return lines


def failure_lines(results: RunResults, pairs: pd.DataFrame) -> list[str]:
    """The tests that left no result, then what failed: each failing pair's first divergence
    and reason (at most MAX_LISTED_DETAIL of each)."""
    lines = []
    if results.lost:
        lines += ["", f"### {plural(len(results.lost), 'test')} left no result"]
        for test_id, why in list(results.lost.items())[:MAX_LISTED_DETAIL]:
            lines.append(f"- {code(test_id, MAX_NAME)}: {markdown(why, 300)}")
    bad = pairs[pairs["verdict"].isin([FAIL, MISSED])]
    if not bad.empty:
        lines += ["", "### What failed"]
        for p in bad.head(MAX_LISTED_DETAIL).itertuples(index=False):
            where = divergence_text(p)
            layer = layer_text(p)
            lines.append(f"- **{markdown(pair_title(p), MAX_NAME)}** {p.verdict}"
                         + (f" at {markdown(where, MAX_NAME + 20)}" if where else "")
                         + (f" (first divergent layer: {markdown(layer, 200)})" if layer else "")
                         + f": {markdown(p.message, 400)}")
            cause = getattr(p, "likely_cause", "")
            if isinstance(cause, str) and cause:
                lines.append(f"  - likely cause: {markdown(cause, MAX_CAUSE)}")
        if len(bad) > MAX_LISTED_DETAIL:
            lines.append(f"- … {len(bad) - MAX_LISTED_DETAIL} more failing pairs in summary.csv")
    lines += misexplained_lines(pairs)
    return lines


def misexplained_lines(pairs: pd.DataFrame) -> list[str]:
    """The controls and mutants caught where they declared, but whose likely cause is not
    the one they declare (`explained` 'no: ...'): shown, not failed (see verify.explain)."""
    if "explained" not in pairs:
        return []
    wrong = pairs[(pairs["verdict"] == CAUGHT)
                  & pairs["explained"].apply(lambda v: isinstance(v, str) and v.startswith("no"))]
    if wrong.empty:
        return []
    lines = ["", f"### {plural(len(wrong), 'control')} caught but not explained by its declared "
                 f"cause"]
    for p in wrong.head(MAX_LISTED_DETAIL).itertuples(index=False):
        lines.append(f"- {markdown(pair_title(p), MAX_NAME)}: declared "
                     f"{code(p.expected_cause, MAX_NAME)}, {markdown(p.explained, MAX_CAUSE)}")
    if len(wrong) > MAX_LISTED_DETAIL:
        lines.append(f"- … {len(wrong) - MAX_LISTED_DETAIL} more in summary.csv (column "
                     f"explained)")
    return lines


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
        for test_id, why in list(results.not_run.items())[:MAX_LISTED_DETAIL]:
            lines.append(f"- {code(pair_of_test(test_id), MAX_NAME)}: {markdown(why, 200)}")
        if len(results.not_run) > MAX_LISTED_DETAIL:
            lines.append(f"- … {len(results.not_run) - MAX_LISTED_DETAIL} more in run.json")
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


