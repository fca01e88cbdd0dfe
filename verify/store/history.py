"""Run records and nightly drift history: what a run found, where, and what changed since.

A run record is a small JSON document: the verdict, every pair's verdict and worst drift per
quantity, the environment and the provenance (git commit, seeds, options, timestamp). Every
session writes one into the history directory (`<report-dir>/history/<run id>.json` unless
`--history-dir` says otherwise) and as `run.json` in the report directory. `compare_runs`
tells what regressed since a previous record: a pair that passed and now fails, a worst drift
grown by more than a factor, and what changed around the numbers (environment, options,
seeds). Nothing here imports TensorFlow.
"""
from __future__ import annotations

import dataclasses
import datetime
import json
import subprocess
from pathlib import Path
from typing import Any

import numpy as np

from verify.core.files import BadFile, json_default, read_json, write_atomic
from verify.judge.verdict import GOOD
from verify.store.results import (ENVIRONMENT_KEYS, PAIR_KEY, RunResults, cell_text,
                            divergence_text, layer_text, numeric_rows, pair_title, sort_pairs,
                            worst_drift)

SCHEMA = "parity-run/1"
DEFAULT_FACTOR = 10.0
# Growth is measured from at least this fraction of the tolerance's atol: a drift going from
# exactly 0 (or from a few ulps) to well under the tolerance is not a regression.
FLOOR_FRACTION = 0.01


def git_commit(directory: Path) -> str | None:
    """The commit checked out at `directory`, or None outside a git checkout (or without git).

    >>> git_commit(Path("/")) is None
    True
    """
    try:
        out = subprocess.run(["git", "rev-parse", "--verify", "--quiet", "HEAD"],
                             cwd=directory, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    commit = out.stdout.strip()
    return commit if out.returncode == 0 and commit else None


def run_record(results: RunResults, *, run_id: str, provenance: dict[str, Any] | None = None,
               timestamp: str | None = None) -> dict[str, Any]:
    """The run record of `results`: plain JSON-able data, bounded by pairs x quantities.

    >>> record = run_record(RunResults.empty(), run_id="r1", timestamp="2024-01-01T00:00:00+00:00")
    >>> record["schema"], record["verdict"], record["pairs"]
    ('parity-run/1', 'NO RESULTS', [])
    """
    pairs = sort_pairs(results.pairs)
    numeric = numeric_rows(results.rows)
    worst_by_pair: dict[tuple, dict[str, dict]] = {}
    if not numeric.empty:
        at = numeric.groupby(PAIR_KEY + ["quantity"], sort=False)["max_abs"].idxmax()
        grouped = numeric.groupby(PAIR_KEY + ["quantity"], sort=False)
        largest = grouped[["rel_l2", "tightest_rtol"]].max()
        for key, index in at.items():
            row = numeric.loc[index]
            worst_by_pair.setdefault(tuple(key[:4]), {})[key[4]] = {
                "max_abs": float(row["max_abs"]), "rel_l2": float(largest.loc[key, "rel_l2"]),
                "tightest_rtol": float(largest.loc[key, "tightest_rtol"]),
                "atol": float(row["atol"]), "rtol": float(row["rtol"]),
                "step": int(row["step"]), "tensor": str(row["tensor"])}
    pair_records = []
    for p in pairs.itertuples(index=False):
        key = (p.case, p.reference, p.candidate, p.replicas)
        pair_records.append({
            "case": p.case, "reference": p.reference, "candidate": p.candidate,
            "replicas": int(p.replicas), "role": p.role, "verdict": p.verdict,
            "first_divergence": divergence_text(p), "message": str(p.message)[:300],
            # the layer replay's first divergent layer and its max abs drift (when replayed)
            "first_layer": layer_text(p), "first_layer_drift": _finite(
                getattr(p, "first_layer_drift", None)),
            "environments": cell_text(getattr(p, "environments", "")),
            "worst": worst_by_pair.get(key, {})})
    return {"schema": SCHEMA, "run_id": run_id,
            "timestamp": timestamp or datetime.datetime.now(datetime.timezone.utc).isoformat(
                timespec="seconds"),
            "verdict": results.verdict,
            "counts": {str(k): int(v) for k, v in pairs["verdict"].value_counts().items()},
            "environment": dict(results.environment), "options": dict(results.options),
            "provenance": dict(provenance or {}), "lost": dict(results.lost),
            "not_run": dict(results.not_run), "stopped": results.stopped,
            "nothing_selected": results.nothing_selected,
            "worst": worst_drift(results.rows, pairs).to_dict("records"),
            "pairs": pair_records}


def write_record(history_dir: Path, record: dict[str, Any]) -> Path:
    """Add `record` to the history directory as `<run id>.json`; return its path."""
    path = Path(history_dir) / f"{record['run_id']}.json"
    write_atomic(path, json.dumps(record, indent=1, default=json_default))
    return path


def load_record(path: str | Path, *, exclude_run_id: str | None = None,
                damaged: list[str] | None = None) -> dict[str, Any] | None:
    """A run record from a record file, a report directory (its run.json) or a history directory
    (its latest record other than `exclude_run_id`; None when it holds none yet).

    Raises FileNotFoundError for a path that does not exist and `BadFile` (a ValueError) for a
    file that is not a run record or a damaged one, naming it.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist: pass a run record (history/<run>.json, "
                                f"a report's run.json or a baseline copied from one), a report "
                                f"directory, or a history directory")
    if path.is_file():
        return _read_record(path)
    if (path / "run.json").is_file() and (path / "run.json").stat().st_size:
        from verify.store.report_dir import unfinished_run

        unfinished = unfinished_run(path)
        if unfinished:
            raise NotARecord(path / "run.json", unfinished, "pass its history directory (the "
                             "records of finished runs) instead")
        record = _read_record(path / "run.json")
        if record.get("run_id") != exclude_run_id:
            return record
    records = [r for r in history(path, damaged) if r.get("run_id") != exclude_run_id]
    return records[-1] if records else None


RECORD_REMEDY = ("pass a history/<run>.json or run.json the suite wrote; a damaged one can be "
                 "moved out of the history directory (its run is then not compared)")


def _read_record(path: Path) -> dict[str, Any]:
    record = read_json(path, RECORD_REMEDY)
    if not isinstance(record, dict) or not str(record.get("schema", "")).startswith("parity-run/"):
        raise NotARecord(path, "not a parity run record (no 'schema': 'parity-run/…')",
                         RECORD_REMEDY)
    problem = _record_problem(record)
    if problem:
        raise BadFile(path, f"a damaged parity run record: {problem}", RECORD_REMEDY)
    return record


class NotARecord(BadFile):
    """A readable JSON file that is not a run record (a history directory may hold others)."""


def _record_problem(record: dict[str, Any]) -> str | None:
    """What a run record lacks that comparing and listing runs read; None when complete."""
    try:
        check_record(record)
    except ValueError as e:
        return str(e)
    for field in ("run_id", "verdict", "timestamp"):
        if not isinstance(record.get(field), str):
            return f"its {field!r} is not a string"
    return None


def check_record(record: dict[str, Any]) -> None:
    """Raise ValueError saying what is wrong when `record` cannot be compared with
    (`compare_runs` reads these fields); checked before a session trains anything, and by
    every read of a run record (which also needs its run id, verdict and timestamp).

    >>> check_record({"pairs": [{"case": "c", "reference": "a", "candidate": "b",
    ...                          "replicas": 1, "verdict": "PASS", "worst": {}}]})
    >>> check_record({"pairs": {"case": "c"}})
    Traceback (most recent call last):
    ...
    ValueError: 'pairs' must be a list of pair records, got dict
    """
    for section in ("environment", "options", "provenance", "lost", "not_run"):
        if not isinstance(record.get(section) or {}, dict):
            raise ValueError(f"{section!r} must be an object, got "
                             f"{type(record[section]).__name__}")
    if not isinstance(record.get("provenance", {}).get("seeds") or {}, dict):
        raise ValueError("'provenance'.'seeds' must be an object of case -> seed")
    pairs = record.get("pairs")
    if not isinstance(pairs, list):
        raise ValueError(f"'pairs' must be a list of pair records, got "
                         f"{type(pairs).__name__}")
    for n, pair in enumerate(pairs, 1):
        _check_pair(n, pair)


def _check_pair(n: int, pair: Any) -> None:
    if not isinstance(pair, dict):
        raise ValueError(f"pair {n} must be an object, got {type(pair).__name__}")
    for key in ("case", "reference", "candidate", "replicas", "verdict"):
        if key not in pair:
            raise ValueError(f"pair {n} has no {key!r} (a pair record has case, reference, "
                             f"candidate, replicas, verdict and worst)")
    try:
        int(pair["replicas"])
    except (TypeError, ValueError):
        raise ValueError(f"pair {n}: 'replicas' must be a whole number, got "
                         f"{pair['replicas']!r}") from None
    worst = pair.get("worst") or {}
    if not isinstance(worst, dict):
        raise ValueError(f"pair {n}: 'worst' must be an object of quantity -> drift")
    for quantity, drift in worst.items():
        numbers = [drift.get(k) for k in ("max_abs", "atol")] if isinstance(drift, dict) else []
        if not numbers or not _is_number(numbers[0]) or not (
                numbers[1] is None or _is_number(numbers[1])):
            raise ValueError(f"pair {n}: 'worst'.{quantity} must hold a number 'max_abs' "
                             f"(and optionally 'atol'), got {drift!r}")


def _finite(value: Any) -> float | None:
    """A float for JSON, None for a missing or NaN one."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return None if number != number else number


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def history(history_dir: Path, damaged: list[str] | None = None) -> list[dict[str, Any]]:
    """Every run record in a history directory, oldest first. JSON files that are not run
    records are skipped; a damaged record (cut short, or lacking what a record holds) is a
    `BadFile`, unless `damaged` is given: it is then skipped and named there ("path: why"),
    so that one bad file never blocks every later comparison and is never skipped silently."""
    records = []
    for path in Path(history_dir).glob("*.json"):
        try:
            records.append(_read_record(path))
        except NotARecord:
            continue
        except BadFile as e:
            if damaged is None:
                raise
            damaged.append(str(e))
    return sorted(records, key=lambda r: (r.get("timestamp", ""), r.get("run_id", "")))


@dataclasses.dataclass
class RunComparison:
    """What changed between a previous run and this one.

    `regressions` fail the comparison (a good pair now fails, a drift grew > `factor` times,
    a test left no result); `changes` explain numbers (environment, options, seeds, pairs).
    """

    previous: dict[str, Any]
    regressions: list[str]
    changes: list[str]
    factor: float = DEFAULT_FACTOR

    @property
    def ok(self) -> bool:
        return not self.regressions

    def since(self) -> str:
        commit = self.previous.get("provenance", {}).get("git_commit")
        return (f"run {self.previous.get('run_id', '?')} ({self.previous.get('timestamp', '?')}"
                + (f", commit {commit[:12]}" if commit else "") + ")")

    def headline(self) -> str:
        n = len(self.regressions)
        text = "no regression" if n == 0 else f"{n} regression{'s' if n > 1 else ''}"
        return text + (" (environment changed)" if any(
            c.startswith("environment") for c in self.changes) else "")


def compare_runs(current: dict[str, Any], previous: dict[str, Any],
                 factor: float = DEFAULT_FACTOR) -> RunComparison:
    """Regressions and changes of run record `current` since run record `previous`.

    >>> def rec(verdict, drift):
    ...     return {"run_id": verdict, "environment": {}, "options": {}, "provenance": {},
    ...             "pairs": [{"case": "c", "reference": "a", "candidate": "b", "replicas": 1,
    ...                        "role": "faithful", "verdict": verdict, "first_divergence": "",
    ...                        "worst": {"grad": {"max_abs": drift, "atol": 1e-6}}}]}
    >>> compare_runs(rec("PASS", 1e-7), rec("PASS", 1e-7)).headline()
    'no regression'
    >>> for regression in compare_runs(rec("FAIL", 5e-6), rec("PASS", 1e-7)).regressions:
    ...     print(regression)
    c: a → b (x1): PASS → FAIL
    c: a → b (x1): grad worst max abs 1e-07 → 5e-06 (50x, limit 10x)
    """
    if not factor > 1:
        raise ValueError(f"the drift growth factor must be > 1 (e.g. 10), got {factor}")
    before = {_pair_key(p): p for p in previous.get("pairs", [])}
    now = {_pair_key(p): p for p in current.get("pairs", [])}
    changes = _pair_set_changes("new pair", [now[k] for k in now if k not in before])
    changes += _pair_set_changes("pair not run this time",
                                 [before[k] for k in before if k not in now])
    flips, grown = _pair_regressions(before, now, factor)
    lost = [f"{test_id} left no result" for test_id in current.get("lost", {})]
    lost += _incomplete(current)
    if now and not set(now) & set(before):   # "no regression" would claim a check never made
        cases = sorted({str(p.get("case")) for p in before.values()})
        lost.append(f"no pair of this run was in the compared run {previous.get('run_id')} "
                    f"(it judged {len(before)} pair(s) of {', '.join(cases) or 'no case'}): "
                    f"nothing was compared; compare with a run of the same cases")
    changes += _run_changes(current, previous)
    return RunComparison(previous={k: previous.get(k) for k in ("run_id", "timestamp",
                                                                  "provenance")},
                         regressions=flips + lost + grown, changes=changes, factor=factor)


def _pair_regressions(before: dict[tuple, dict[str, Any]], now: dict[tuple, dict[str, Any]],
                      factor: float) -> tuple[list[str], list[str]]:
    """The pairs in both runs that turned bad (a good verdict now failing), and the faithful
    pairs whose worst drift of a quantity grew more than `factor` times."""
    flips, grown = [], []
    for key, pair in now.items():
        old = before.get(key)
        title = pair_title(pair)
        if old is None:
            continue
        moved = _environment_change(old, pair)
        if old["verdict"] in GOOD and pair["verdict"] not in GOOD:
            where = f" at {pair['first_divergence']}" if pair.get("first_divergence") else ""
            flips.append(f"{title}: {old['verdict']} → {pair['verdict']}{where}{moved}")
        if pair.get("role") != "faithful":
            continue   # a control's drift is meant to be large
        for quantity, worst in pair.get("worst", {}).items():
            was = old.get("worst", {}).get(quantity)
            if was is None or not np.isfinite(worst["max_abs"]):
                continue
            base = max(was["max_abs"], FLOOR_FRACTION * worst.get("atol", 0.0))
            if worst["max_abs"] > factor * base:
                growth = (f"{worst['max_abs'] / was['max_abs']:.3g}x" if was["max_abs"] > 0
                          else "from exactly 0")
                grown.append(f"{title}: {quantity} worst max abs {was['max_abs']:.3g} → "
                             f"{worst['max_abs']:.3g} ({growth}, limit {factor:g}x){moved}")
    return flips, grown


def _run_changes(current: dict[str, Any], previous: dict[str, Any]) -> list[str]:
    """What changed around the numbers: environment, options and the seeds of the cases."""
    changes = []
    for key in ENVIRONMENT_KEYS:
        old, new = previous.get("environment", {}).get(key), current.get("environment", {}).get(key)
        if old != new:
            changes.append(f"environment {key} {old} → {new}")
    for section in ("options",):
        old, new = previous.get(section, {}), current.get(section, {})
        for key in sorted(set(old) | set(new)):
            if old.get(key) != new.get(key):
                changes.append(f"option {key} {old.get(key)} → {new.get(key)}")
    old_seeds = previous.get("provenance", {}).get("seeds", {})
    new_seeds = current.get("provenance", {}).get("seeds", {})
    for case in sorted(set(old_seeds) & set(new_seeds)):
        if old_seeds[case] != new_seeds[case]:
            changes.append(f"seed of {case} {old_seeds[case]} → {new_seeds[case]}")
    return changes


def _environment_change(old: dict[str, Any], new: dict[str, Any]) -> str:
    """'; likely cause: ...' when the environments a pair's sides ran in changed."""
    before, now = old.get("environments") or "", new.get("environments") or ""
    if not before or not now or before == now:
        return ""
    return f"; likely cause: its environments changed ({before} ⇒ {now})"


def _incomplete(record: dict[str, Any]) -> list[str]:
    """A run that did not judge everything it selected is a regression, whatever it judged."""
    why = record.get("stopped") or record.get("nothing_selected") or ""
    if record.get("verdict") == "NO RESULTS":
        return ["run NO RESULTS: no pair was judged" + (f" ({why})" if why else "")]
    if record.get("verdict") != "INCOMPLETE":
        return []
    missing = len(record.get("not_run") or {}) + len(record.get("lost") or {})
    return [f"run INCOMPLETE: {missing} selected pair{'' if missing == 1 else 's'} not judged"
            + (f" ({why})" if why else "")]


def _pair_set_changes(what: str, pairs: list[dict[str, Any]], listed: int = 3) -> list[str]:
    """One line per pair, or one line for many (a narrower --case/-k selection, say)."""
    if len(pairs) <= listed:
        return [f"{what} {pair_title(p)}" for p in pairs]
    return [f"{len(pairs)} pairs: {what} (e.g. {pair_title(pairs[0])})"]


def _pair_key(pair: dict[str, Any]) -> tuple:
    return (pair["case"], pair["reference"], pair["candidate"], int(pair["replicas"]))
