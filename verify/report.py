"""Drift rows -> files people read: drift.csv, summary.csv, losses.csv, summary.md, report.html.

Every finished test persists its results as part files right away (atomically), and the
session merges all parts at the end, so a crash, a raising case or a dead xdist worker loses
nothing that finished. Nothing here imports TensorFlow.

A report directory holds one run:

- `drift.csv`: every drift row (see `verify.compare.COLUMNS`), in a stable order: two identical
  runs write identical files.
- `summary.csv`: one record per compared pair (`PAIR_COLUMNS`), failures first.
- `losses.csv`: per-step loss values of both sides of every pair (`LOSS_COLUMNS`).
- `summary.md`: the pull-request summary; `report.html`: the page with plots.
- `run.json`: the run record (summary and provenance), also kept in the history directory.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

import numpy as np
import pandas as pd

from verify.compare import COLUMNS, compare_traces
from verify.preflight import COLUMNS as PREFLIGHT_COLUMNS
from verify.preflight import blocking as preflight_blocking
from verify.trace import QUANTITIES, Trace, as_dense, write_atomic
from verify.verdict import CAUGHT, FAIL, MISSED, PASS, Verdict, judge

if TYPE_CHECKING:
    from verify.case import Expectation
    from verify.history import RunComparison
    from verify.tolerances import Tolerances

PAIR_COLUMNS = ["case", "reference", "candidate", "replicas", "role", "verdict", "first_step",
                "first_quantity", "first_tensor", "margin", "message", "expected", "seed",
                "steps", "seconds", "preflight", "attribution", "tables_trained_by"]
LOSS_COLUMNS = ["case", "reference", "candidate", "replicas", "step", "tensor", "reference_loss",
                "candidate_loss"]
PAIR_KEY = ["case", "reference", "candidate", "replicas"]
# The facts of a run's machine and software that a drift figure depends on (trace meta keys).
ENVIRONMENT_KEYS = ("tensorflow", "numpy", "python", "platform", "cpu", "device")
NUMERIC_QUANTITIES = ("loss", "grad", "slot", "weight", "metric")
QUANTITY_ORDER = {q: n for n, q in enumerate(QUANTITIES)}
MAX_PAIR_LINES = 40       # summary.md stays pasteable whatever the number of pairs
MAX_FAILING_DETAIL = 10
MAX_NAME = 80             # longest tensor or pair name printed in summary.md


@dataclasses.dataclass
class RunResults:
    """Everything one run produced, as tables: what every report file is rendered from.

    >>> results = RunResults.empty()
    >>> overall(results.pairs), list(results.losses.columns) == LOSS_COLUMNS
    ('NO RESULTS', True)
    """

    rows: pd.DataFrame                       # drift rows, verify.compare.COLUMNS
    pairs: pd.DataFrame                      # one record per pair, PAIR_COLUMNS
    losses: pd.DataFrame                     # per-step loss values, LOSS_COLUMNS
    environment: dict[str, Any] = dataclasses.field(default_factory=dict)
    options: dict[str, Any] = dataclasses.field(default_factory=dict)
    # Preflight findings of every pair, verify.preflight.COLUMNS.
    preflight: pd.DataFrame = dataclasses.field(
        default_factory=lambda: pd.DataFrame(columns=PREFLIGHT_COLUMNS))
    # Tests that ended without persisting a result (e.g. their xdist worker died): id -> why.
    lost: dict[str, str] = dataclasses.field(default_factory=dict)

    @classmethod
    def empty(cls) -> "RunResults":
        return cls(pd.DataFrame(columns=COLUMNS), pd.DataFrame(columns=PAIR_COLUMNS),
                   pd.DataFrame(columns=LOSS_COLUMNS))

    @property
    def verdict(self) -> str:
        return "FAIL" if self.lost else overall(self.pairs)


@dataclasses.dataclass
class PairResult:
    """One compared pair: its drift rows, its record (a summary.csv line), its losses and its
    verdict."""

    rows: pd.DataFrame
    record: dict[str, Any]
    losses: pd.DataFrame
    verdict: Verdict | None = None
    preflight: pd.DataFrame = dataclasses.field(
        default_factory=lambda: pd.DataFrame(columns=PREFLIGHT_COLUMNS))

    @classmethod
    def failed(cls, record: dict[str, Any]) -> "PairResult":
        """A pair that produced no rows (the harness raised): its record only, FAIL."""
        return cls(pd.DataFrame(columns=COLUMNS), {**record, "verdict": FAIL},
                   pd.DataFrame(columns=LOSS_COLUMNS))


def compare_pair(reference: Trace, candidate: Trace, tolerances: "Tolerances | None", *,
                 case: str, replicas: int, expect: "Expectation | None" = None,
                 control: bool | None = None) -> PairResult:
    """Compare two traces and judge them: the rows, the pair record and the loss curves.

    >>> ref, cand = Trace("tf1", {"seed": 3}), Trace("tf2", {"seconds": 1.5})
    >>> for t in (ref, cand):
    ...     t.record(1, "loss", "loss", np.float32(0.5))
    >>> result = compare_pair(ref, cand, None, case="demo", replicas=1)
    >>> result.record["verdict"], result.record["seed"], len(result.losses)
    ('PASS', 3, 1)
    """
    rows = compare_traces(reference, candidate, tolerances, case=case, replicas=replicas)
    verdict = judge(rows, expect)
    d = verdict.divergence
    record = {"case": case, "reference": reference.implementation,
              "candidate": candidate.implementation, "replicas": replicas,
              "role": "control" if (expect is not None if control is None else control)
              else "faithful",
              "verdict": verdict.status, "first_step": d.step if d else None,
              "first_quantity": d.quantity if d else "", "first_tensor": d.tensor if d else "",
              "margin": verdict.margin, "message": verdict.message,
              "expected": f"step {expect.step} {expect.quantity}" if expect else "",
              "seed": reference.meta.get("seed", candidate.meta.get("seed")),
              "steps": candidate.meta.get("steps", reference.meta.get("steps")),
              "seconds": candidate.meta.get("seconds")}
    return PairResult(rows, record, loss_curves(reference, candidate, case=case,
                                                replicas=replicas), verdict)


def add_preflight(result: PairResult, reference_config: dict[str, Any],
                  candidate_config: dict[str, Any], *, expect: "Expectation | None",
                  preflight_expect: tuple[str, ...], device: str) -> None:
    """Diff what both sides declare and fold blocking findings into the pair's verdict and
    record (see `verify.verdict.judge_with_preflight`). Configurations are plain dicts
    (`declared_config`), so this runs without TensorFlow, also on kept traces."""
    from verify.preflight import preflight, tables_trained_by
    from verify.verdict import judge_with_preflight

    record = result.record
    reference, candidate = record["reference"], record["candidate"]
    if reference_config and candidate_config:
        result.preflight = preflight(record["case"], reference, reference_config, candidate,
                                     candidate_config)
    result.verdict = judge_with_preflight(result.verdict, result.preflight, expect,
                                          preflight_expect)
    counts = result.preflight["severity"].value_counts().to_dict()
    record.update(
        verdict=result.verdict.status, message=result.verdict.message,
        preflight=", ".join(f"{n} {s}" for s, n in sorted(counts.items())) or (
            "not declared" if not (reference_config and candidate_config) else "no difference"),
        tables_trained_by="; ".join(
            tables_trained_by(n, c, device)
            for n, c in ((reference, reference_config), (candidate, candidate_config))
            if any(k.startswith("optimizer/embedding/") for k in c)))
    if preflight_expect and not record.get("expected"):
        record["expected"] = "preflight " + ", ".join(preflight_expect)


def trace_environment(trace: Trace) -> dict[str, Any]:
    """The ENVIRONMENT_KEYS facts a trace recorded about where it ran."""
    return {key: trace.meta.get(key) for key in ENVIRONMENT_KEYS}


def loss_curves(reference: Trace, candidate: Trace, *, case: str, replicas: int) -> pd.DataFrame:
    """Per-step loss values of both sides (NaN where a side captured none), LOSS_COLUMNS.

    >>> ref, cand = Trace("tf1"), Trace("tf2")
    >>> ref.record(1, "loss", "loss", np.float32(0.5))
    >>> loss_curves(ref, cand, case="demo", replicas=1)[["step", "reference_loss"]].values.tolist()
    [[1.0, 0.5]]
    """
    values: dict[tuple[int, str], list[float]] = {}
    for column, trace in enumerate((reference, candidate)):
        for key, value in trace.values.items():
            if key.quantity == "loss" and not isinstance(value, str):
                array = as_dense(value).astype(np.float64)
                point = values.setdefault((key.step, key.tensor), [np.nan, np.nan])
                point[column] = float(array.mean()) if array.size else np.nan
    records = [{"case": case, "reference": reference.implementation,
                "candidate": candidate.implementation, "replicas": replicas, "step": step,
                "tensor": tensor, "reference_loss": ref, "candidate_loss": cand}
               for (step, tensor), (ref, cand) in sorted(values.items())]
    return pd.DataFrame(records, columns=LOSS_COLUMNS)


def write_part(parts_dir: Path, test_id: str, result: PairResult,
               environment: dict[str, Any]) -> None:
    """Persist one finished test: its drift rows, its loss curves and its pair record.

    The record is written last: a part counts once its `.pair.json` exists.
    """
    stem = hashlib.sha256(test_id.encode()).hexdigest()[:20]
    write_atomic(parts_dir / f"{stem}.rows.csv", result.rows.to_csv(index=False))
    write_atomic(parts_dir / f"{stem}.losses.csv", result.losses.to_csv(index=False))
    write_atomic(parts_dir / f"{stem}.preflight.csv", result.preflight.to_csv(index=False))
    write_atomic(parts_dir / f"{stem}.pair.json",
                 json.dumps({"test_id": test_id, "pair": result.record,
                             "environment": environment}, default=json_default, indent=1))


def json_default(value):
    """`json.dumps(default=...)` for numpy scalars and paths; NaN floats stay NaN."""
    if isinstance(value, (np.floating, np.integer, np.bool_)):
        return value.item()
    return str(value)


def read_rows(path: Path) -> pd.DataFrame:
    """Read drift rows written by this module (NaN stays NaN, empty reasons stay '')."""
    return pd.read_csv(path, keep_default_na=False, float_precision="round_trip",
                       na_values={c: ["", "nan", "NaN"] for c in
                                  ("max_abs", "max_rel", "rel_l2", "tightest_rtol",
                                   "times_tolerance")})


def read_losses(path: Path) -> pd.DataFrame:
    return pd.read_csv(path, float_precision="round_trip")


def read_parts(parts_dir: Path) -> RunResults:
    """Merge every persisted part: drift rows, pair records, losses, and the environment."""
    frames, losses, pairs, environment, preflight = [], [], [], {}, []
    for path in sorted(parts_dir.glob("*.pair.json")):
        doc = json.loads(path.read_text())
        stem = path.name.removesuffix(".pair.json")
        frames.append(read_rows(parts_dir / f"{stem}.rows.csv"))
        if (parts_dir / f"{stem}.losses.csv").exists():
            losses.append(read_losses(parts_dir / f"{stem}.losses.csv"))
        if (parts_dir / f"{stem}.preflight.csv").exists():
            preflight.append(read_preflight(parts_dir / f"{stem}.preflight.csv"))
        pairs.append(doc["pair"])
        environment = environment or doc.get("environment", {})
    return RunResults(rows=concat_frames(frames, COLUMNS),
                      pairs=pd.DataFrame(pairs, columns=PAIR_COLUMNS),
                      losses=concat_frames(losses, LOSS_COLUMNS), environment=environment,
                      preflight=sort_preflight(concat_frames(preflight, PREFLIGHT_COLUMNS)))


def read_preflight(path: Path) -> pd.DataFrame:
    """Preflight findings as written by `write_part` (every value kept as text)."""
    return pd.read_csv(path, dtype=str, keep_default_na=False)


def sort_preflight(findings: pd.DataFrame) -> pd.DataFrame:
    """Blocking first, then by pair and key: a stable order for identical runs."""
    if findings.empty:
        return findings
    return findings.sort_values(["severity", "case", "reference", "candidate", "side", "key"],
                                kind="stable").reset_index(drop=True)


def concat_frames(frames: list[pd.DataFrame], columns: list[str]) -> pd.DataFrame:
    """Stack frames of the same columns; an empty frame of `columns` when there are none."""
    frames = [f for f in frames if not f.empty]
    return pd.concat(frames, ignore_index=True)[columns] if frames else pd.DataFrame(
        columns=columns)


def read_report(report_dir: Path) -> RunResults:
    """The tables of a written report directory (drift.csv, summary.csv, losses.csv,
    preflight.csv, run.json).

    Raises FileNotFoundError naming the missing file when the directory holds no report.
    """
    report_dir = Path(report_dir)
    for name in ("drift.csv", "summary.csv"):
        if not (report_dir / name).is_file():
            raise FileNotFoundError(f"{report_dir} holds no {name}: pass a directory written by "
                                    f"`pytest verify/ --report-dir DIR` (or re-compare kept "
                                    f"traces with `python -m verify report DIR --recompare`)")
    record = {}
    if (report_dir / "run.json").is_file():
        record = json.loads((report_dir / "run.json").read_text())
    losses = (read_losses(report_dir / "losses.csv") if (report_dir / "losses.csv").is_file()
              else pd.DataFrame(columns=LOSS_COLUMNS))
    pairs = pd.read_csv(report_dir / "summary.csv", keep_default_na=False,
                        float_precision="round_trip",
                        na_values={c: ["", "nan"] for c in ("first_step", "margin", "seed",
                                                            "steps", "seconds")})
    preflight = (read_preflight(report_dir / "preflight.csv")
                 if (report_dir / "preflight.csv").is_file()
                 else pd.DataFrame(columns=PREFLIGHT_COLUMNS))
    return RunResults(rows=read_rows(report_dir / "drift.csv"),
                      pairs=pairs.reindex(columns=PAIR_COLUMNS), losses=losses,
                      environment=record.get("environment", {}),
                      options=record.get("options", {}), lost=record.get("lost", {}),
                      preflight=preflight)


def sort_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """A stable order so that two identical runs write identical files."""
    if rows.empty:
        return rows.reindex(columns=COLUMNS)
    rows = rows.assign(_q=rows["quantity"].map(QUANTITY_ORDER))
    rows = rows.sort_values(["case", "reference", "candidate", "replicas", "step", "_q", "tensor"],
                            kind="stable")
    return rows.drop(columns="_q").reset_index(drop=True)[COLUMNS]


def sort_pairs(pairs: pd.DataFrame) -> pd.DataFrame:
    """Failures first (FAIL, MISSED), then PASS, then CAUGHT; by case and pair within."""
    rank = {FAIL: 0, MISSED: 1, PASS: 2, CAUGHT: 3}
    pairs = pairs.assign(_r=pairs["verdict"].map(lambda v: rank.get(v, -1)))
    return pairs.sort_values(["_r", "case", "reference", "candidate", "replicas"],
                             kind="stable").drop(columns="_r").reset_index(drop=True)


def sort_losses(losses: pd.DataFrame) -> pd.DataFrame:
    return losses.sort_values(PAIR_KEY + ["step", "tensor"], kind="stable").reset_index(
        drop=True)[LOSS_COLUMNS]


def overall(pairs: pd.DataFrame) -> str:
    if pairs.empty:
        return "NO RESULTS"
    return "PASS" if pairs["verdict"].isin([PASS, CAUGHT]).all() else "FAIL"


def numeric_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """Rows with a measured drift: numeric quantities whose max_abs is a number."""
    return rows[rows["quantity"].isin(NUMERIC_QUANTITIES) & rows["max_abs"].notna()]


def worst_drift(rows: pd.DataFrame, pairs: pd.DataFrame) -> pd.DataFrame:
    """Per quantity, the worst drift over the faithful pairs (controls excluded) and where."""
    faithful = pairs.loc[pairs["role"] == "faithful", ["case", "reference", "candidate"]]
    numeric = numeric_rows(rows.merge(faithful.drop_duplicates(),
                                      on=["case", "reference", "candidate"]))
    out = []
    present = set(numeric["quantity"].unique())
    for quantity in [q for q in QUANTITIES if q in present]:
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


def pair_title(p) -> str:
    """'case: reference → candidate (xN)' for a pair record (row tuple or dict-like)."""
    get = p.get if isinstance(p, dict) else lambda k: getattr(p, k)
    return f"{get('case')}: {get('reference')} → {get('candidate')} (x{get('replicas')})"


def divergence_text(p) -> str:
    """'step 3 grad dense/kernel' for a pair record, '' when it has no divergence."""
    if not (isinstance(p.first_quantity, str) and p.first_quantity):
        return ""
    return f"step {int(p.first_step)} {p.first_quantity} {p.first_tensor}"


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
    record = record or {}
    pairs = sort_pairs(results.pairs)
    counts = pairs["verdict"].value_counts().to_dict()
    tally = ", ".join(f"{counts[v]} {v.lower()}" for v in (FAIL, MISSED, PASS, CAUGHT)
                      if v in counts)
    headline = f"## Parity: {results.verdict} ({plural(len(pairs), 'pair')}: {tally or 'none'})"
    if comparison is not None:
        headline += f" · {comparison.headline()}"
    lines = [headline, ""]
    environment, options = results.environment, results.options
    env = ", ".join(f"{k} {environment[k]}" for k in ("tensorflow", "numpy", "python")
                    if environment.get(k))
    provenance = record.get("provenance", {})
    commit = provenance.get("git_commit")
    lines.append(f"Environment: {env or 'unknown'}; device {options.get('device', 'cpu')}; "
                 f"CPU {environment.get('cpu', '?')}"
                 + (f"; commit `{commit[:12]}`" if commit else "") + ".")
    if options:
        lines.append("Options: " + ", ".join(f"{k}={v}" for k, v in sorted(options.items())
                                             if k != "device") + ".")
    if comparison is not None:
        lines += ["", *comparison.markdown_lines()]
    if results.lost:
        lines += ["", f"### {plural(len(results.lost), 'test')} left no result"]
        for test_id, why in list(results.lost.items())[:MAX_FAILING_DETAIL]:
            lines.append(f"- `{_clip(test_id, MAX_NAME)}`: {_clip(why, 300)}")
    bad = pairs[pairs["verdict"].isin([FAIL, MISSED])]
    if not bad.empty:
        lines += ["", "### What failed"]
        for p in bad.head(MAX_FAILING_DETAIL).itertuples(index=False):
            where = divergence_text(p)
            lines.append(f"- **{_clip(pair_title(p), MAX_NAME)}** {p.verdict}"
                         + (f" at {_clip(where, MAX_NAME + 20)}" if where else "")
                         + f": {_clip(p.message, 400)}")
        if len(bad) > MAX_FAILING_DETAIL:
            lines.append(f"- … {len(bad) - MAX_FAILING_DETAIL} more failing pairs in summary.csv")
    lines += preflight_lines(results.preflight, pairs)
    worst = worst_drift(results.rows, pairs)
    if not worst.empty:
        lines += ["", "### Worst drift per quantity (faithful pairs)", "",
                  "| quantity | max abs | max rel | rel L2 | tightest rtol | rtol used | where |",
                  "|---|---|---|---|---|---|---|"]
        for w in worst.itertuples(index=False):
            lines.append(f"| {w.quantity} | {w.max_abs:.3g} | {w.max_rel:.3g} | {w.rel_l2:.3g} "
                         f"| {w.tightest_rtol:.3g} | {w.rtol:.3g} | {_clip(w.where, MAX_NAME)} |")
    lines += ["", f"<details><summary>All {len(pairs)} pairs</summary>", "",
              "| verdict | pair | first divergence |", "|---|---|---|"]
    for p in pairs.head(MAX_PAIR_LINES).itertuples(index=False):
        where = divergence_text(p)
        lines.append(f"| {p.verdict} | {_clip(pair_title(p), MAX_NAME)} "
                     f"| {_clip(where, MAX_NAME + 20) or '—'} |")
    if len(pairs) > MAX_PAIR_LINES:
        lines.append(f"| … | {len(pairs) - MAX_PAIR_LINES} more pairs in summary.csv | |")
    lines += ["", "</details>", "",
              f"{len(results.rows)} drift rows in drift.csv; plots in report.html."]
    return "\n".join(lines) + "\n"


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
        lines.append(f"- tables trained by {_clip(text, 240)}")
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
                     f"{_clip(f.case, MAX_NAME)}: {f.reference} → {_clip(f.candidate, MAX_NAME)} "
                     f"`{_clip(f.key, MAX_NAME)}` ({_clip(values, 120)}): {_clip(f.rule, 160)}")
    if len(blocking) > MAX_FAILING_DETAIL:
        lines.append(f"- … {len(blocking) - MAX_FAILING_DETAIL} more in preflight.csv")
    return lines


def plural(count: int, noun: str) -> str:
    """'1 pair', '3 pairs'."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


def clip(text, limit: int) -> str:
    """`text` on one line, cut to `limit` characters with an ellipsis."""
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _clip(text: str, limit: int) -> str:
    """`clip` for a markdown table cell."""
    return clip(text, limit).replace("|", "\\|")


def write_report(report_dir: Path, results: RunResults, record: dict[str, Any] | None = None,
                 comparison: "RunComparison | None" = None) -> list[Path]:
    """Write drift.csv, summary.csv, losses.csv, summary.md, report.html and run.json.

    Each file is replaced atomically; `record` (see `verify.history.run_record`) becomes
    run.json when given.
    """
    from verify.html_report import render_html

    report_dir = Path(report_dir)
    report_dir.mkdir(parents=True, exist_ok=True)
    ordered = dataclasses.replace(results, rows=sort_rows(results.rows),
                                  pairs=sort_pairs(results.pairs),
                                  losses=sort_losses(results.losses))
    files = {"drift.csv": ordered.rows.to_csv(index=False),
             "summary.csv": ordered.pairs.to_csv(index=False),
             "losses.csv": ordered.losses.to_csv(index=False),
             "preflight.csv": sort_preflight(ordered.preflight).to_csv(index=False),
             "summary.md": summary_markdown(ordered, record, comparison),
             "report.html": render_html(ordered, record, comparison)}
    if record is not None:
        files["run.json"] = json.dumps(record, indent=1, default=json_default)
    written = []
    for name, text in files.items():
        write_atomic(report_dir / name, text)
        written.append(report_dir / name)
    return written


def terminal_lines(results: RunResults, written: Iterable[Path],
                   comparison: "RunComparison | None" = None) -> list[str]:
    """The session's closing lines: verdict, one line per pair, regressions, files."""
    lines = [f"parity: {results.verdict}"]
    for p in sort_pairs(results.pairs).itertuples(index=False):
        where = divergence_text(p)
        lines.append(f"  {p.verdict:<6} {p.case}: {p.reference} -> {p.candidate} "
                     f"(x{p.replicas}) " + (f"first divergence {where}" if where else ""))
    for test_id, why in results.lost.items():
        lines.append(f"  LOST   {test_id}: {_clip(why, 200)}")
    if comparison is not None:
        lines += comparison.terminal_lines()
    folders: dict[Path, list[str]] = {}
    for path in written:
        folders.setdefault(path.parent, []).append(path.name)
    for n, (folder, names) in enumerate(folders.items()):
        lines.append(f"{'report' if n == 0 else 'also'}: {folder}/ ({', '.join(names)})")
    return lines
