"""A run's results as tables, on disk and back: what every report file is rendered from.

Every finished test persists its judged pair as part files right away (atomically), and the
session merges all parts at the end, so a crash, a raising case or a dead xdist worker loses
nothing that finished. Nothing here imports TensorFlow.

A report directory holds one run:

- `drift.csv.gz`: every drift row (`verify.judge.records.DriftRow`), in a stable order: two
  identical runs write identical files.
- `summary.csv`: one record per compared pair (`verify.judge.records.PairRecord`), failures first.
- `losses.csv`: per-step loss values of both sides of every pair (`LOSS_COLUMNS`).
- `preflight.csv`: every configuration difference with its severity.
- `layers.csv`: the layer replay of every replayed pair, a row per observed value forward and
  backward (`verify.judge.layers.LAYER_COLUMNS`; see `verify.session.layer_replay`).
- `run.json`: the run record (summary and provenance), also kept in the history directory.

A run's verdict covers exactly what it judged: PASS only when every selected pair was judged
and every pair is good; INCOMPLETE when a selected pair was not judged (interrupted, stopped
early, a lost worker), whatever the judged pairs say; NO RESULTS when nothing was judged.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any

import pandas as pd

from verify.core.meta import SUITE_ENVIRONMENT
from verify.core.files import BadFile, json_default, read_json, write_atomic
from verify.core.meta import Environment
from verify.core.quantities import NAMES as QUANTITIES
from verify.core.quantities import NUMERIC as NUMERIC_QUANTITIES
from verify.core.quantities import ORDER as QUANTITY_ORDER
from verify.judge.pair import LOSS_COLUMNS, PairResult
from verify.judge.records import COLUMNS, NUMERIC_COLUMNS, PAIR_COLUMNS, pairs_frame
from verify.judge.layers import LAYER_COLUMNS
from verify.judge.preflight import COLUMNS as PREFLIGHT_COLUMNS
from verify.judge.verdict import CAUGHT, FAIL, MISSED, PASS

PAIR_KEY = ["case", "reference", "candidate", "replicas"]
INCOMPLETE, NO_RESULTS = "INCOMPLETE", "NO RESULTS"
NOTHING_SELECTED = "nothing_selected.json"   # a part: why the selection held no pair
# The facts of a run's machine and software that a drift figure depends on.
ENVIRONMENT_KEYS = (*Environment.KEYS, "device")


@dataclasses.dataclass
class RunResults:
    """Everything one run produced, as tables: what every report file is rendered from.

    >>> results = RunResults.empty()
    >>> overall(results.pairs), list(results.losses.columns) == LOSS_COLUMNS
    ('NO RESULTS', True)
    >>> results.not_run = {"t.py::test_pair[c:a-vs-b]": "not run: interrupted"}
    >>> results.verdict
    'INCOMPLETE'
    """

    rows: pd.DataFrame                       # drift rows, verify.judge.records.COLUMNS
    pairs: pd.DataFrame                      # one record per pair, PAIR_COLUMNS
    losses: pd.DataFrame                     # per-step loss values, LOSS_COLUMNS
    environment: dict[str, Any] = dataclasses.field(default_factory=dict)
    options: dict[str, Any] = dataclasses.field(default_factory=dict)
    # Preflight findings of every pair, verify.judge.preflight.COLUMNS.
    preflight: pd.DataFrame = dataclasses.field(
        default_factory=lambda: pd.DataFrame(columns=PREFLIGHT_COLUMNS))
    # Tests that ended without persisting a result (e.g. their xdist worker died): id -> why.
    lost: dict[str, str] = dataclasses.field(default_factory=dict)
    # Selected tests that never ran to a result (interrupted, -x, ...): id -> why.
    not_run: dict[str, str] = dataclasses.field(default_factory=dict)
    # Why the session ended before its end ('' when it ran to the end), e.g. a KeyboardInterrupt.
    stopped: str = ""
    # Why the selection held no pair at all ('' when it held some).
    nothing_selected: str = ""
    # The layer replays' rows (verify.judge.layers.LAYER_COLUMNS), for the pairs replayed.
    layers: pd.DataFrame = dataclasses.field(
        default_factory=lambda: pd.DataFrame(columns=LAYER_COLUMNS))

    @classmethod
    def empty(cls) -> "RunResults":
        return cls(pd.DataFrame(columns=COLUMNS), pd.DataFrame(columns=PAIR_COLUMNS),
                   pd.DataFrame(columns=LOSS_COLUMNS))

    @classmethod
    def of(cls, judged: list[PairResult]) -> "RunResults":
        """The tables of judged pairs; the environment is the suite's own (`suite_environment`)."""
        return cls(rows=concat_frames([r.rows for r in judged], COLUMNS),
                   pairs=pairs_frame(r.record for r in judged),
                   losses=concat_frames([r.losses for r in judged], LOSS_COLUMNS),
                   environment=suite_environment([r.environment for r in judged]),
                   preflight=sort_preflight(concat_frames([r.preflight for r in judged],
                                                          PREFLIGHT_COLUMNS)),
                   layers=concat_frames([r.layers for r in judged], LAYER_COLUMNS))

    @property
    def complete(self) -> bool:
        """Every selected pair was judged and the session ran to its end."""
        return not (self.lost or self.not_run or self.stopped)

    @property
    def verdict(self) -> str:
        return INCOMPLETE if not self.complete else overall(self.pairs)


def write_part(parts_dir: Path, test_id: str, result: PairResult) -> None:
    """Persist one finished test: its drift rows, its loss curves and its pair record.

    The record is written last: a part counts once its `.pair.json` exists.
    """
    stem = hashlib.sha256(test_id.encode()).hexdigest()[:20]
    write_atomic(parts_dir / f"{stem}.rows.csv", result.rows.to_csv(index=False))
    write_atomic(parts_dir / f"{stem}.losses.csv", result.losses.to_csv(index=False))
    write_atomic(parts_dir / f"{stem}.preflight.csv", result.preflight.to_csv(index=False))
    if not result.layers.empty:
        write_atomic(parts_dir / f"{stem}.layers.csv", result.layers.to_csv(index=False))
    write_atomic(parts_dir / f"{stem}.pair.json",
                 json.dumps({"test_id": test_id, "pair": result.record.as_dict(),
                             "environment": result.environment}, default=json_default, indent=1))


def write_nothing_selected(parts_dir: Path, test_id: str, why: str) -> None:
    """Persist why the selection held no pair (the stand-in test's result)."""
    write_atomic(parts_dir / NOTHING_SELECTED, json.dumps({"test_id": test_id, "why": why}))


def judged_tests(parts_dir: Path) -> set[str]:
    """The ids of the tests that persisted a result under `parts_dir`.

    >>> import tempfile
    >>> judged_tests(Path(tempfile.mkdtemp()) / "none")
    set()
    """
    paths = [*Path(parts_dir).glob("*.pair.json"), Path(parts_dir) / NOTHING_SELECTED]
    return {json.loads(p.read_text()).get("test_id", "") for p in paths if p.is_file()}


def read_rows(path: Path) -> pd.DataFrame:
    """Read drift rows written by this module (NaN stays NaN, empty reasons stay '')."""
    rows = pd.read_csv(path, keep_default_na=False, float_precision="round_trip",
                       na_values={c: ["", "nan", "NaN"] for c in NUMERIC_COLUMNS})
    if "status" not in rows and {"passed", "reason"} <= set(rows.columns):
        rows["status"] = _status_of_older_rows(rows)
    return rows


def _status_of_older_rows(rows: pd.DataFrame) -> pd.Series:
    """The status of rows written before `drift.csv` had the column: the only time a reason
    is read for it (a not-captured row's reason began 'not captured on ')."""
    passed = rows["passed"].astype(str).str.lower() == "true"
    not_captured = passed & rows["reason"].astype(str).str.startswith("not captured on ")
    return pd.Series(["not captured" if n else "passed" if p else "failed"
                      for p, n in zip(passed, not_captured)], index=rows.index, dtype=object)


def read_losses(path: Path) -> pd.DataFrame:
    return pd.read_csv(path, float_precision="round_trip")


def read_parts(parts_dir: Path) -> RunResults:
    """Merge every persisted part: drift rows, pair records, losses, and the environment."""
    frames, losses, pairs, environment, preflight, layers = [], [], [], {}, [], []
    for path in sorted(parts_dir.glob("*.pair.json")):
        doc = json.loads(path.read_text())
        stem = path.name.removesuffix(".pair.json")
        frames.append(read_rows(parts_dir / f"{stem}.rows.csv"))
        if (parts_dir / f"{stem}.losses.csv").exists():
            losses.append(read_losses(parts_dir / f"{stem}.losses.csv"))
        if (parts_dir / f"{stem}.preflight.csv").exists():
            preflight.append(read_preflight(parts_dir / f"{stem}.preflight.csv"))
        if (parts_dir / f"{stem}.layers.csv").exists():
            layers.append(read_layers(parts_dir / f"{stem}.layers.csv"))
        pairs.append(doc["pair"])
        environment = suite_environment([environment, doc.get("environment", {})])
    nothing = parts_dir / NOTHING_SELECTED
    return RunResults(rows=concat_frames(frames, COLUMNS),
                      pairs=pd.DataFrame(pairs, columns=PAIR_COLUMNS),
                      losses=concat_frames(losses, LOSS_COLUMNS), environment=environment,
                      preflight=sort_preflight(concat_frames(preflight, PREFLIGHT_COLUMNS)),
                      nothing_selected=json.loads(nothing.read_text())["why"]
                      if nothing.is_file() else "",
                      layers=concat_frames(layers, LAYER_COLUMNS))


def read_layers(path: Path) -> pd.DataFrame:
    """Layer replay rows as written by `write_part` or the report (layers.csv)."""
    return pd.read_csv(path, keep_default_na=False, float_precision="round_trip",
                       na_values={c: ["", "nan"] for c in ("max_abs", "max_rel",
                                                           "times_tolerance")})


def sort_layers(layers: pd.DataFrame) -> pd.DataFrame:
    """By pair, then forward before backward, each in its order."""
    if layers.empty:
        return layers
    return layers.sort_values(PAIR_KEY + ["direction", "order"], ascending=[True] * 4 + [False, True],
                              kind="stable").reset_index(drop=True)


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
    return pd.concat(frames, ignore_index=True).reindex(columns=columns) if frames else \
        pd.DataFrame(columns=columns)


DRIFT_FILE = "drift.csv.gz"   # every drift row, gzip-compressed
OLD_DRIFT_FILE = "drift.csv"  # as reports wrote it before, still read


def drift_file(report_dir: Path) -> Path:
    """The drift table of a report directory: drift.csv.gz, or an older report's drift.csv."""
    report_dir = Path(report_dir)
    compressed = report_dir / DRIFT_FILE
    return compressed if compressed.is_file() or not (report_dir / OLD_DRIFT_FILE).is_file() \
        else report_dir / OLD_DRIFT_FILE


REPORT_REMEDY = ("re-render it from its run (`python -m verify report DIR --recompare` with kept "
                 "traces) or run the suite again")


def read_report(report_dir: Path) -> RunResults:
    """The tables of a written report directory (drift.csv.gz, or an older report's drift.csv;
    summary.csv, losses.csv, preflight.csv, run.json).

    Raises FileNotFoundError naming the missing file when the directory holds no report, and
    `BadFile` naming a file that cannot be read or lacks columns.
    """
    report_dir = Path(report_dir)
    for path in (drift_file(report_dir), report_dir / "summary.csv"):
        if not path.is_file():
            raise FileNotFoundError(f"{report_dir} holds no {path.name}: pass a directory "
                                    f"written by "
                                    f"`pytest verify/ --report-dir DIR` (or re-compare kept "
                                    f"traces with `python -m verify report DIR --recompare`)")
    record = {}
    if (report_dir / "run.json").is_file():
        record = read_json(report_dir / "run.json", REPORT_REMEDY)
        if not isinstance(record, dict):
            raise BadFile(report_dir / "run.json", "not a run record (not a JSON object)",
                          REPORT_REMEDY)
    losses = (_read_table(report_dir / "losses.csv", read_losses, LOSS_COLUMNS)
              if (report_dir / "losses.csv").is_file() else pd.DataFrame(columns=LOSS_COLUMNS))
    pairs = _read_table(report_dir / "summary.csv", _read_pairs, PAIR_KEY + ["role", "verdict"])
    preflight = (_read_table(report_dir / "preflight.csv", read_preflight, PREFLIGHT_COLUMNS)
                 if (report_dir / "preflight.csv").is_file()
                 else pd.DataFrame(columns=PREFLIGHT_COLUMNS))
    layers = (_read_table(report_dir / "layers.csv", read_layers, LAYER_COLUMNS)
              if (report_dir / "layers.csv").is_file() else pd.DataFrame(columns=LAYER_COLUMNS))
    pairs = pairs.reindex(columns=PAIR_COLUMNS)
    for column in ("first_layer", "layer_replay", "substitution", "repro"):   # older reports
        pairs[column] = pairs[column].fillna("")
    return RunResults(rows=_read_table(drift_file(report_dir), read_rows, COLUMNS),
                      pairs=pairs, losses=losses, layers=layers,
                      environment=record.get("environment", {}),
                      options=record.get("options", {}), lost=record.get("lost", {}),
                      not_run=record.get("not_run", {}), stopped=record.get("stopped", ""),
                      nothing_selected=record.get("nothing_selected", ""), preflight=preflight)


def _read_pairs(path: Path) -> pd.DataFrame:
    return pd.read_csv(path, keep_default_na=False, float_precision="round_trip",
                       na_values={c: ["", "nan"] for c in ("first_step", "margin", "seed",
                                                           "steps", "seconds",
                                                           "first_layer_drift")})


def _read_table(path: Path, reader, columns: list[str]) -> pd.DataFrame:
    """`reader(path)`, or a `BadFile` when it cannot be parsed or lacks one of `columns`."""
    try:
        frame = reader(path)
    except (ValueError, OSError, EOFError) as e:   # pandas' parser and empty-data errors are
        # ValueErrors; a truncated drift.csv.gz (a half-downloaded artifact) is an EOFError
        raise BadFile(path, f"not a readable CSV table ({type(e).__name__}: {e})",
                      REPORT_REMEDY) from None
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise BadFile(path, f"lacks the columns {missing}", REPORT_REMEDY)
    return frame


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
    """The verdict of judged pairs alone (see `RunResults.verdict` for a whole run)."""
    if pairs.empty:
        return NO_RESULTS
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


def suite_environment(environments: list[dict[str, Any]]) -> dict[str, Any]:
    """The environment a report's header names: the first that is the suite's own (a pair's
    candidate may have run in a destination environment), else the first known.

    >>> suite_environment([{}, {"name": "tf221", "tensorflow": "2.21.0"},
    ...                    {"name": "local", "tensorflow": "2.15.1"}])["tensorflow"]
    '2.15.1'
    """
    known = [e for e in environments if e]
    own = [e for e in known if e.get("name", SUITE_ENVIRONMENT) == SUITE_ENVIRONMENT]
    return dict((own or known or [{}])[0])


def pair_title(p) -> str:
    """'case: reference → candidate (xN)' for a pair record (row tuple or dict-like)."""
    get = p.get if isinstance(p, dict) else lambda k: getattr(p, k)
    return f"{get('case')}: {get('reference')} → {get('candidate')} (x{get('replicas')})"


def pair_of_test(test_id: str) -> str:
    """The pair id inside a parity test's node id, else the id as it is.

    >>> pair_of_test("verify/test_parity.py::test_pair[tiny:ref-vs-good]")
    'tiny:ref-vs-good'
    """
    head, bracket, rest = test_id.partition("::test_pair[")
    return rest[:-1] if bracket and rest.endswith("]") else test_id


def cell_text(value) -> str:
    """A pair record's text field as written; '' for None or NaN (an empty CSV cell)."""
    return "" if value is None or (isinstance(value, float) and value != value) else str(value)


def layer_text(p) -> str:
    """The first divergent layer a layer replay named for a pair record ('' when none)."""
    layer = getattr(p, "first_layer", "")
    return layer if isinstance(layer, str) else ""


def divergence_text(p) -> str:
    """'step 3 grad dense/kernel' for a pair record, '' when it has no divergence."""
    if not (isinstance(p.first_quantity, str) and p.first_quantity):
        return ""
    return f"step {int(p.first_step)} {p.first_quantity} {p.first_tensor}"
