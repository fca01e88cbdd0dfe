"""Drift rows -> files people read: drift.csv, summary.csv, summary.md.

Every finished test persists its rows as a part file right away (atomically), and the session
merges all parts at the end, so a crash, a raising case or a dead xdist worker loses nothing
that finished. Nothing here imports TensorFlow.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import pandas as pd

from verify.compare import COLUMNS
from verify.trace import QUANTITIES
from verify.verdict import CAUGHT, FAIL, MISSED, PASS

PAIR_COLUMNS = ["case", "reference", "candidate", "replicas", "role", "verdict", "first_step",
                "first_quantity", "first_tensor", "margin", "message", "expected", "seconds"]
MAX_PAIR_LINES = 40       # summary.md stays pasteable whatever the number of pairs
MAX_FAILING_DETAIL = 10


def write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_part(parts_dir: Path, test_id: str, rows: pd.DataFrame, pair: dict[str, Any],
               environment: dict[str, Any]) -> None:
    """Persist one finished test: its drift rows and its pair record."""
    stem = hashlib.sha256(test_id.encode()).hexdigest()[:20]
    write_atomic(parts_dir / f"{stem}.rows.csv", rows.to_csv(index=False))
    write_atomic(parts_dir / f"{stem}.pair.json",
                 json.dumps({"test_id": test_id, "pair": pair, "environment": environment},
                            default=_json_default, indent=1))


def _json_default(value):
    if isinstance(value, (np.floating, np.integer)):
        return value.item()
    return str(value)


def read_parts(parts_dir: Path) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, Any]]:
    """All persisted parts: (drift rows, pair records, environment of the first part)."""
    frames, pairs, environment = [], [], {}
    for path in sorted(parts_dir.glob("*.rows.csv")):
        frames.append(pd.read_csv(path, keep_default_na=False,
                                  na_values={c: ["", "nan", "NaN"] for c in
                                             ("max_abs", "max_rel", "rel_l2", "tightest_rtol")}))
    for path in sorted(parts_dir.glob("*.pair.json")):
        doc = json.loads(path.read_text())
        pairs.append(doc["pair"])
        environment = environment or doc.get("environment", {})
    rows = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=COLUMNS)
    return sort_rows(rows), sort_pairs(pd.DataFrame(pairs, columns=PAIR_COLUMNS)), environment


def sort_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """A stable order so that two identical runs write identical files."""
    if rows.empty:
        return rows.reindex(columns=COLUMNS)
    rows = rows.assign(_q=rows["quantity"].map(QUANTITIES.index))
    rows = rows.sort_values(["case", "reference", "candidate", "replicas", "step", "_q", "tensor"],
                            kind="stable")
    return rows.drop(columns="_q").reset_index(drop=True)[COLUMNS]


def sort_pairs(pairs: pd.DataFrame) -> pd.DataFrame:
    """Failures first (FAIL, MISSED), then PASS, then CAUGHT; by case and pair within."""
    rank = {FAIL: 0, MISSED: 1, PASS: 2, CAUGHT: 3}
    pairs = pairs.assign(_r=pairs["verdict"].map(lambda v: rank.get(v, -1)))
    return pairs.sort_values(["_r", "case", "reference", "candidate", "replicas"],
                             kind="stable").drop(columns="_r").reset_index(drop=True)


def overall(pairs: pd.DataFrame) -> str:
    if pairs.empty:
        return "NO RESULTS"
    return "PASS" if pairs["verdict"].isin([PASS, CAUGHT]).all() else "FAIL"


def worst_drift(rows: pd.DataFrame, pairs: pd.DataFrame) -> pd.DataFrame:
    """Per quantity, the worst drift over the faithful pairs (controls excluded) and where."""
    faithful = pairs.loc[pairs["role"] == "faithful", ["case", "reference", "candidate"]]
    numeric = rows.merge(faithful, on=["case", "reference", "candidate"])
    numeric = numeric[numeric["quantity"].isin(["loss", "grad", "slot", "weight", "metric"])
                      & numeric["max_abs"].notna()]
    out = []
    for quantity in [q for q in QUANTITIES if q in set(numeric["quantity"])]:
        part = numeric[numeric["quantity"] == quantity]
        worst = part.loc[part["max_abs"].astype(float).idxmax()]
        out.append({"quantity": quantity, "max_abs": part["max_abs"].max(),
                    "max_rel": part["max_rel"].max(), "rel_l2": part["rel_l2"].max(),
                    "tightest_rtol": part["tightest_rtol"].max(), "rtol": worst["rtol"],
                    "atol": worst["atol"],
                    "where": f"{worst['case']} {worst['candidate']} step {worst['step']} "
                             f"{worst['tensor']}"})
    return pd.DataFrame(out, columns=["quantity", "max_abs", "max_rel", "rel_l2",
                                      "tightest_rtol", "rtol", "atol", "where"])


def summary_markdown(rows: pd.DataFrame, pairs: pd.DataFrame, environment: dict[str, Any],
                     options: dict[str, Any]) -> str:
    """The pull-request summary: verdict line first, failing pairs first, bounded length."""
    counts = pairs["verdict"].value_counts().to_dict()
    tally = ", ".join(f"{counts[v]} {v.lower()}" for v in (FAIL, MISSED, PASS, CAUGHT) if v in counts)
    lines = [f"## Parity: {overall(pairs)} ({len(pairs)} pairs: {tally or 'none'})", ""]
    env = ", ".join(f"{k} {environment[k]}" for k in ("tensorflow", "numpy", "python")
                    if k in environment)
    lines.append(f"Environment: {env}; device {options.get('device', 'cpu')}; "
                 f"CPU {environment.get('cpu', '?')}.")
    if options:
        lines.append("Options: " + ", ".join(f"{k}={v}" for k, v in sorted(options.items())) + ".")
    lines += ["", "| verdict | case | reference → candidate | replicas | first divergence |",
              "|---|---|---|---|---|"]
    for p in pairs.head(MAX_PAIR_LINES).itertuples(index=False):
        where = (f"step {int(p.first_step)} {p.first_quantity} `{p.first_tensor}`"
                 if isinstance(p.first_quantity, str) and p.first_quantity else "—")
        lines.append(f"| {p.verdict} | {p.case} | {p.reference} → {p.candidate} | {p.replicas} "
                     f"| {where} |")
    if len(pairs) > MAX_PAIR_LINES:
        lines.append(f"| … | {len(pairs) - MAX_PAIR_LINES} more pairs in summary.csv | | | |")
    bad = pairs[pairs["verdict"].isin([FAIL, MISSED])]
    if not bad.empty:
        lines += ["", "### What failed"]
        for p in bad.head(MAX_FAILING_DETAIL).itertuples(index=False):
            lines.append(f"- **{p.case}: {p.reference} → {p.candidate}** ({p.verdict}): "
                         f"{_clip(p.message, 400)}")
        if len(bad) > MAX_FAILING_DETAIL:
            lines.append(f"- … {len(bad) - MAX_FAILING_DETAIL} more in summary.csv")
    worst = worst_drift(rows, pairs)
    if not worst.empty:
        lines += ["", "### Worst drift per quantity (faithful pairs)", "",
                  "| quantity | max abs | max rel | rel L2 | tightest rtol | rtol used | where |",
                  "|---|---|---|---|---|---|---|"]
        for w in worst.itertuples(index=False):
            lines.append(f"| {w.quantity} | {w.max_abs:.3g} | {w.max_rel:.3g} | {w.rel_l2:.3g} "
                         f"| {w.tightest_rtol:.3g} | {w.rtol:.3g} | {w.where} |")
    lines += ["", f"{len(rows)} drift rows in drift.csv."]
    return "\n".join(lines) + "\n"


def _clip(text: str, limit: int) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def write_report(report_dir: Path, rows: pd.DataFrame, pairs: pd.DataFrame,
                 environment: dict[str, Any], options: dict[str, Any]) -> list[Path]:
    """Write drift.csv, summary.csv and summary.md atomically; return their paths."""
    report_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in (("drift.csv", sort_rows(rows).to_csv(index=False)),
                       ("summary.csv", sort_pairs(pairs).to_csv(index=False)),
                       ("summary.md", summary_markdown(rows, sort_pairs(pairs), environment,
                                                       options))):
        write_atomic(report_dir / name, text)
        written.append(report_dir / name)
    return written


def terminal_lines(pairs: pd.DataFrame, written: Iterable[Path]) -> list[str]:
    lines = [f"parity: {overall(pairs)}"]
    for p in pairs.itertuples(index=False):
        where = (f"first divergence step {int(p.first_step)} {p.first_quantity} {p.first_tensor}"
                 if isinstance(p.first_quantity, str) and p.first_quantity else "")
        lines.append(f"  {p.verdict:<6} {p.case}: {p.reference} -> {p.candidate} "
                     f"(x{p.replicas}) {where}")
    lines.append("report: " + ", ".join(str(p) for p in written))
    return lines
