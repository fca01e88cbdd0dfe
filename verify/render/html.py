"""report.html: one self-contained page a reviewer reads first.

A table of the cases (verdicts, tolerances, detection limit), an overview of every pair
grouped by case with verdict filters (CSS only: the page runs no script), then per pair
(failures first): the loss curves of both sides, the drift per step on a log scale per
quantity, the first divergence with its reason, and the worst tensors. Plots are PNG images
(`verify.render.plots`) embedded as data URIs and the style sheet is inline: the file opens
offline, from an artifact or a mail attachment, and loads nothing.

Names (cases, implementations, tensors) are HTML-escaped wherever they appear, attributes
included, and drawn as plain text in the plots (no mathtext).

Size and time stay bounded whatever the run's size: at most MAX_PLOTTED_PAIRS pairs get a
plotted section (the others are in the overview and in the CSV files), at most
MAX_WORST_TENSORS tensors are listed per pair, and every image has the same small pixel size.
Nothing here imports TensorFlow.
"""
from __future__ import annotations

import base64
import html
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from verify.judge.verdict import CAUGHT, FAIL, MISSED, PASS
from verify.render.plots import PairPlotter
from verify.render.markdown import destination_environments
from verify.render.summary_sections import case_facts
from verify.render.text import clip, plural
from verify.store.results import (INCOMPLETE, PAIR_KEY, RunResults, cell_text, divergence_text,
                            layer_text,
                            pair_title,
                            sort_pairs, worst_drift)

if TYPE_CHECKING:
    from verify.store.history import RunComparison

MAX_PLOTTED_PAIRS = 50
MAX_WORST_TENSORS = 8
MAX_OVERVIEW_PAIRS = 2000

STYLE = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:1.5em auto;
max-width:1100px;color:#222;padding:0 1em}
h1{font-size:1.6em;margin-bottom:.2em} h2{margin-top:1.6em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:.5em 0;font-size:.9em}
th,td{border:1px solid #ddd;padding:.25em .5em;text-align:left;vertical-align:top}
th{background:#f4f4f4} td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
.badge{display:inline-block;padding:.05em .5em;border-radius:.3em;color:#fff;font-weight:600;
font-size:.85em}
.PASS{background:#2e7d32}.CAUGHT{background:#1565c0}.FAIL{background:#c62828}
.MISSED{background:#ef6c00}.NO{background:#757575}
.banner{padding:.6em 1em;border-radius:.4em;color:#fff;font-size:1.2em;font-weight:600}
.divergence{border-left:.35em solid #c62828;background:#fdecea;padding:.5em .8em;margin:.5em 0}
.caught{border-left:.35em solid #1565c0;background:#e8f0fb;padding:.5em .8em;margin:.5em 0}
.regression{border-left:.35em solid #c62828;background:#fdecea;padding:.3em .8em}
tr.first td{background:#fdecea;font-weight:600}
section.pair{margin:1.2em 0 2em} code{font-size:.95em}
img.plot{max-width:100%;height:auto;border:1px solid #eee}
.muted{color:#666;font-size:.9em}
.filters label{margin-right:1em;white-space:nowrap}
h3{margin:1.2em 0 .3em}
"""


def render_html(results: RunResults, record: dict[str, Any] | None = None,
                comparison: "RunComparison | None" = None) -> str:
    """The whole page as one string.

    >>> page = render_html(RunResults.empty())
    >>> page.startswith("<!DOCTYPE html>") and "NO RESULTS" in page
    True
    """
    record = record or {}
    pairs = sort_pairs(results.pairs)
    rows_by_pair = {_key(k): g for k, g in results.rows.groupby(PAIR_KEY, sort=False)}
    losses_by_pair = {_key(k): g for k, g in results.losses.groupby(PAIR_KEY, sort=False)}
    layers_by_pair = {_key(k): g for k, g in results.layers.groupby(PAIR_KEY, sort=False)}
    out = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
           '<meta name="viewport" content="width=device-width, initial-scale=1">',
           f"<title>Parity report: {_e(results.verdict)}</title>",
           f"<style>{STYLE}</style></head><body>"]
    out += _header(results, pairs, record)
    if comparison is not None:
        out += _comparison(comparison)
    if results.lost:
        out.append(f"<h2>{plural(len(results.lost), 'test')} left no result</h2><ul>")
        out += [f"<li><code>{_e(t)}</code>: {_e(why)}</li>" for t, why in results.lost.items()]
        out.append("</ul>")
    out += _incomplete(results)
    out += _cases(results.rows, pairs)
    out += _overview(pairs)
    out += _worst_table(worst_drift(results.rows, pairs))
    plotted = pairs.head(MAX_PLOTTED_PAIRS)
    if not plotted.empty:
        out.append("<h2>Pairs</h2>")
        with PairPlotter() as plotter:
            for n, p in enumerate(plotted.itertuples(index=False)):
                key = (p.case, p.reference, p.candidate, int(p.replicas))
                out += _pair_section(n, p, rows_by_pair.get(key, results.rows.iloc[:0]),
                                     losses_by_pair.get(key, results.losses.iloc[:0]), plotter,
                                     layers_by_pair.get(key, results.layers.iloc[:0]))
    if len(pairs) > MAX_PLOTTED_PAIRS:
        out.append(f'<p class="muted">{len(pairs) - MAX_PLOTTED_PAIRS} more pairs are listed in '
                   f"the overview without plots; every row is in drift.csv.gz.</p>")
    out.append("</body></html>")
    return "\n".join(out) + "\n"


def _key(key) -> tuple:
    case, reference, candidate, replicas = key
    return (case, reference, candidate, int(replicas))


def _e(value) -> str:
    return html.escape(str(value), quote=True)


def _badge(verdict: str) -> str:
    css = verdict if verdict in (PASS, FAIL, CAUGHT, MISSED) else "NO"
    return f'<span class="badge {css}">{_e(verdict)}</span>'


def _incomplete(results: RunResults) -> list[str]:
    """Why the verdict does not cover every selected pair, and the pairs that did not run."""
    out = [f"<p><b>Nothing was checked:</b> {_e(results.nothing_selected)}</p>"
           ] if results.nothing_selected else []
    if results.stopped:
        out.append(f"<p><b>Incomplete:</b> {_e(results.stopped)}; the verdict covers only "
                   f"the pairs judged.</p>")
    if results.not_run:
        out.append(f"<h2>{plural(len(results.not_run), 'selected pair')} not run</h2><ul>")
        out += [f"<li><code>{_e(t)}</code>: {_e(why)}</li>" for t, why in results.not_run.items()]
        out.append("</ul>")
    return out


def _header(results: RunResults, pairs: pd.DataFrame, record: dict[str, Any]) -> list[str]:
    verdict = results.verdict
    css = verdict if verdict in (PASS, FAIL) else FAIL if verdict == INCOMPLETE else "NO"
    counts = pairs["verdict"].value_counts().to_dict()
    tally = ", ".join(f"{counts[v]} {v.lower()}" for v in (FAIL, MISSED, PASS, CAUGHT)
                      if v in counts) or "none"
    provenance = record.get("provenance", {})
    facts = {**{k: results.environment.get(k) for k in
                ("tensorflow", "numpy", "python", "cpu", "platform")},
             "device": results.options.get("device"),
             "commit": provenance.get("git_commit") or "not a git checkout",
             "run": record.get("run_id"), "time": record.get("timestamp"),
             "seeds": ", ".join(f"{c} {s}" for c, s in provenance.get("seeds", {}).items()),
             "options": ", ".join(f"{k}={v}" for k, v in sorted(results.options.items()))}
    lines = ["<h1>Parity report</h1>",
             f'<div class="banner {css}">{_e(verdict)}: {plural(len(pairs), "pair")} '
             f"({_e(tally)})</div>",
             "<table>"]
    lines += [f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in facts.items() if v]
    lines.append("</table>")
    return lines


def _comparison(comparison: "RunComparison") -> list[str]:
    lines = [f"<h2>Since {_e(comparison.since())}: {_e(comparison.headline())}</h2>"]
    if comparison.regressions:
        lines.append("<ul>")
        lines += [f'<li class="regression">{_e(r)}</li>' for r in comparison.regressions]
        lines.append("</ul>")
    if comparison.changes:
        lines.append("<p>Changed: " + "; ".join(_e(c) for c in comparison.changes) + "</p>")
    return lines


def _cases(rows: pd.DataFrame, pairs: pd.DataFrame) -> list[str]:
    """One row per case: its verdicts as counted badges (linking to its pairs), where its
    tolerances come from and its detection limit (`case_facts`, as in summary.md)."""
    if pairs.empty:
        return []
    lines = ["<h2>Cases</h2>", "<table><tr><th>case</th><th>pairs</th><th>tolerances</th>"
             "<th>detection limit</th></tr>"]
    counts = pairs.groupby(["case", "verdict"]).size()
    for n, (case, facts) in enumerate(case_facts(rows, pairs).items()):
        badges = " ".join(f"{_badge(v)}&nbsp;{int(counts[(case, v)])}"
                          for v in (FAIL, MISSED, PASS, CAUGHT) if (case, v) in counts)
        lines.append(f'<tr><td><a href="#case-{n}">{_e(case)}</a></td><td>{badges}</td>'
                     f"<td>{_e(facts['tolerances'])}</td><td>{_e(facts['detection'])}</td></tr>")
    lines.append("</table>")
    return lines


def _filters(pairs: pd.DataFrame) -> list[str]:
    """Checkboxes that show or hide the overview's pairs by verdict, with CSS alone (the page
    runs no script): `body:has(#show-PASS:not(:checked)) tr.v-PASS` is hidden."""
    counts = pairs["verdict"].value_counts()
    present = [v for v in (FAIL, MISSED, PASS, CAUGHT) if v in counts]
    style = "".join(f"body:has(#show-{v}:not(:checked)) tr.v-{v}{{display:none}}"
                    for v in present)
    boxes = " ".join(f'<label><input type="checkbox" id="show-{v}" checked> {_badge(v)} '
                     f"{int(counts[v])}</label>" for v in present)
    return [f"<style>{style}</style>", f'<p class="filters">Show: {boxes}</p>']


def _overview(pairs: pd.DataFrame) -> list[str]:
    """Every pair (at most MAX_OVERVIEW_PAIRS), grouped by case, with verdict filters; a
    plotted pair links to its section."""
    lines = ["<h2>Overview</h2>", *(_filters(pairs) if not pairs.empty else [])]
    elsewhere = "environments" in pairs and bool(destination_environments(pairs))
    shown = pairs.head(MAX_OVERVIEW_PAIRS)
    shown = shown.assign(section=range(len(shown)))   # the order the plotted sections follow
    for n, case in enumerate(sorted(pairs["case"].unique())):
        of_case = shown[shown["case"] == case]
        lines += [f'<h3 id="case-{n}">{_e(case)}</h3>',
                  "<table><tr><th>verdict</th><th>pair</th><th>role</th>"
                  "<th>first divergence</th><th>message</th>"
                  + ("<th>environments</th>" if elsewhere else "") + "</tr>"]
        for p in of_case.itertuples(index=False):
            title = _e(pair_title(p))
            link = (f'<a href="#pair-{p.section}">{title}</a>' if p.section < MAX_PLOTTED_PAIRS
                    else title)
            lines.append(f'<tr class="v-{_e(p.verdict)}"><td>{_badge(p.verdict)}</td>'
                         f"<td>{link}</td><td>{_e(p.role)}</td>"
                         f"<td>{_e(divergence_text(p)) or '—'}</td>"
                         f"<td>{_e(clip(p.message, 240))}</td>"
                         + (f"<td>{_e(cell_text(p.environments))}</td>" if elsewhere else "")
                         + "</tr>")
        lines.append("</table>")
    if len(pairs) > MAX_OVERVIEW_PAIRS:
        lines.append(f'<p class="muted">{len(pairs) - MAX_OVERVIEW_PAIRS} more pairs in '
                     f"summary.csv.</p>")
    return lines


def _worst_table(worst: pd.DataFrame) -> list[str]:
    if worst.empty:
        return []
    lines = ["<h2>Worst drift per quantity (faithful pairs)</h2>",
             "<table><tr><th>quantity</th><th>max abs</th><th>max rel</th><th>rel L2</th>"
             "<th>tightest rtol</th><th>rtol used</th><th>where</th></tr>"]
    for w in worst.itertuples(index=False):
        lines.append(f"<tr><td>{_e(w.quantity)}</td>" + "".join(
            f'<td class="num">{v:.3g}</td>' for v in (w.max_abs, w.max_rel, w.rel_l2,
                                                       w.tightest_rtol, w.rtol))
            + f"<td>{_e(w.where)}</td></tr>")
    lines.append("</table>")
    return lines


def _pair_section(n: int, p, rows: pd.DataFrame, losses: pd.DataFrame,
                  plotter: "PairPlotter", layers: pd.DataFrame | None = None) -> list[str]:
    lines = [f'<section class="pair" id="pair-{n}">',
             f"<h3>{_badge(p.verdict)} {_e(pair_title(p))}</h3>",
             f'<p class="muted">{_e(p.role)}'
             + (f", expected to diverge at {_e(p.expected)}" if p.expected else "")
             + f"; {len(rows)} drift rows</p>"]
    where = divergence_text(p)
    if where:
        css = "caught" if p.verdict == CAUGHT else "divergence"
        lines.append(f'<div class="{css}"><strong>First divergence: {_e(where)}</strong><br>'
                     f"{_e(clip(p.message, 1200))}</div>")
    else:
        lines.append(f"<p>{_e(p.message)}</p>")
    lines += _likely_cause(p)
    lines += _substitution(p)
    unseen = getattr(p, "not_captured", "")
    if isinstance(unseen, str) and unseen:   # informational: passes without a number
        lines.append(f"<p><b>Not captured on the device (not compared):</b> {_e(unseen)}</p>")
    first_step = int(p.first_step) if where else None
    png = plotter.pair_png(rows, losses, p.reference, p.candidate, first_step)
    lines.append(f'<img class="plot" alt="loss and drift per step of {_e(pair_title(p))}" '
                 f'width="{plotter.width}" height="{plotter.height}" '
                 f'src="data:image/png;base64,{base64.b64encode(png).decode()}">')
    lines += _layer_replay(p, layers, plotter)
    lines += _worst_tensors_table(_with_first_divergence(worst_tensors(rows, None), p), p)
    lines.append("</section>")
    return lines


def _likely_cause(p) -> list[str]:
    """The pair's likely cause (verify.explain), whether it is the one a control declares,
    and the figures of every hypothesis tried."""
    cause, tried = getattr(p, "likely_cause", ""), getattr(p, "cause_evidence", "")
    if not isinstance(cause, str) or not cause:
        return []
    expected = getattr(p, "expected_cause", "")
    lines = [f"<p><strong>Likely cause:</strong> {_e(cause)}</p>"]
    if isinstance(expected, str) and expected:
        lines.append(f'<p class="muted">declared cause {_e(expected)}: explained '
                     f"{_e(getattr(p, 'explained', ''))}</p>")
    if isinstance(tried, str) and tried:
        items = "".join(f"<li>{_e(part)}</li>" for part in tried.split(" | ") if part)
        lines.append(f"<details><summary>Every hypothesis tried</summary><ul>{items}</ul>"
                     f"</details>")
    return lines


def _layer_replay(p, layers: pd.DataFrame | None, plotter: "PairPlotter") -> list[str]:
    """The pair's layer replay: the first divergent layer, what the replay did, and its plot."""
    note = getattr(p, "layer_replay", "")
    if not isinstance(note, str) or not note:
        return []
    lines = []
    layer = layer_text(p)
    if layer:
        lines.append(f"<p><b>First divergent layer:</b> {_e(layer)}</p>")
    lines.append(f'<p class="muted">{_e(note)}</p>')
    if layers is not None and not layers.empty:
        png = plotter.layers_png(layers)
        lines.append(f'<img class="plot" alt="drift per layer of the replayed step of '
                     f'{_e(pair_title(p))}" width="{plotter.width}" height="{plotter.height}" '
                     f'src="data:image/png;base64,{base64.b64encode(png).decode()}">')
    return lines


def _substitution(p) -> list[str]:
    """The substitution of the first divergent layer (local or carried in, with its figures)
    and a link to the repro written for a layer found local."""
    found, repro = getattr(p, "substitution", ""), getattr(p, "repro", "")
    lines = []
    if isinstance(found, str) and found:
        lines.append(f"<p><b>Substitution:</b> {_e(found)}</p>")
    if isinstance(repro, str) and repro:
        lines.append(f'<p>Standalone repro: <a href="{_e(repro)}"><code>{_e(repro)}</code></a> '
                     f"(with its values.npz; <code>python -m verify repro DIR</code> runs it)</p>")
    return lines


def worst_tensors(rows: pd.DataFrame, limit: int | None = MAX_WORST_TENSORS) -> pd.DataFrame:
    """The tensors furthest from agreement in one pair's rows: failing ones first, then by how
    far past the tolerance (`times_tolerance`), then by max_abs.

    >>> rows = pd.DataFrame({"step": [1, 1, 2], "quantity": ["grad", "grad", "grad"],
    ...     "tensor": ["a", "b", "a"], "max_abs": [1e-7, 1e-3, 2e-7], "rel_l2": [0.0, 0.1, 0.0],
    ...     "times_tolerance": [0.1, 9.0, 0.2], "passed": [True, False, True],
    ...     "reason": ["", "Mismatched", ""]})
    >>> worst_tensors(rows)[["tensor", "failed_steps", "worst_step"]].values.tolist()
    [['b', 1, 1], ['a', 0, 2]]
    """
    columns = ["quantity", "tensor", "failed_steps", "first_failed_step", "worst_step",
               "max_abs", "rel_l2", "ratio", "reason"]
    if rows.empty:
        return pd.DataFrame(columns=columns)
    failed = ~rows["passed"].astype(bool)
    frame = rows.assign(
        failed=failed, ratio=rows["times_tolerance"].astype(float),
        order=rows["max_abs"].astype(float).fillna(np.inf))
    grouped = frame.groupby(["quantity", "tensor"], sort=False)
    table = grouped.agg(failed_steps=("failed", "sum"), max_abs=("max_abs", "max"),
                        rel_l2=("rel_l2", "max"), ratio=("ratio", "max"))
    table["worst_step"] = frame.loc[grouped["order"].idxmax(), ["quantity", "tensor", "step"]] \
        .set_index(["quantity", "tensor"])["step"]
    first_failures = frame[frame["failed"]].sort_values("step", kind="stable") \
        .groupby(["quantity", "tensor"], sort=False).first()
    table["first_failed_step"] = first_failures["step"]
    table["reason"] = first_failures["reason"]
    table = table.reset_index()
    table["first_failed_step"] = table["first_failed_step"].astype("Int64")
    table["reason"] = table["reason"].fillna("")
    table = table.sort_values(["failed_steps", "ratio", "max_abs"], ascending=False,
                              na_position="last", kind="stable")
    return (table if limit is None else table.head(limit))[columns].reset_index(drop=True)


def _with_first_divergence(worst: pd.DataFrame, p) -> pd.DataFrame:
    """The first MAX_WORST_TENSORS rows, plus the first divergence's tensor if not among them."""
    top = worst.head(MAX_WORST_TENSORS)
    first = (worst["quantity"] == p.first_quantity) & (worst["tensor"] == p.first_tensor)
    if first.any() and not first.head(MAX_WORST_TENSORS).any():
        top = pd.concat([top, worst[first]])
    return top


def _worst_tensors_table(worst: pd.DataFrame, p) -> list[str]:
    if worst.empty:
        return []
    lines = ["<table><tr><th>quantity</th><th>tensor</th><th>failed steps</th>"
             "<th>worst step</th><th>max abs</th><th>rel L2</th><th>× tolerance</th>"
             "<th>first failure</th></tr>"]
    for w in worst.itertuples(index=False):
        first = (w.quantity == p.first_quantity and w.tensor == p.first_tensor)
        failure = (f"step {w.first_failed_step}: {clip(w.reason, 200)}"
                   if w.failed_steps else "")
        lines.append(f'<tr{" class=first" if first else ""}><td>{_e(w.quantity)}</td>'
                     f"<td><code>{_e(w.tensor)}</code></td>"
                     f'<td class="num">{int(w.failed_steps)}</td>'
                     f'<td class="num">{int(w.worst_step)}</td>'
                     f'<td class="num">{_number(w.max_abs)}</td>'
                     f'<td class="num">{_number(w.rel_l2)}</td>'
                     f'<td class="num">{_number(w.ratio)}</td><td>{_e(failure)}</td></tr>')
    lines.append("</table>")
    return lines


def _number(value) -> str:
    return "—" if value is None or not np.isfinite(float(value)) else f"{float(value):.3g}"
