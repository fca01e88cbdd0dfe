"""Kept traces (`--keep-traces`): a run's traces on disk, with what re-comparing them needs.

Layout under `<report-dir>/traces/`::

    <case>/<implementation>.npz + .json   one Trace each (Trace.save)
    <case>/case.json                      the case's tolerances, reference and pairs (with
                                          each negative control's expectation)

`recompare` compares every kept pair again from these files alone: no case module, no
TensorFlow. So traces written on a TPU VM can be re-compared, and re-judged with other
tolerances, on a laptop:

    python -m verify report reports/ --recompare --out /tmp/again
"""
from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from verify.core.case import Case, PairSpec
from verify.core.files import BadFile, read_json, write_atomic
from verify.core.quantities import NUMERIC
from verify.core.tolerances import DEFAULTS, Tolerance, Tolerances
from verify.core.trace import Trace, trace_files
from verify.judge.pair import judge_pair
from verify.results import RunResults

TRACES_DIR = "traces"
MANIFEST = "case.json"


def file_stem(name: str) -> str:
    """A file name for a case or implementation name: unsafe characters become '_'.

    >>> file_stem("tf2/mirrored x2")
    'tf2_mirrored_x2'
    """
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._")
    if not stem:
        raise ValueError(f"cannot make a file name from {name!r}; use letters or digits in it")
    return stem


def tolerances_to_json(tolerances: Tolerances) -> dict[str, Any]:
    """Tolerances as plain JSON: {"by_quantity": {q: [atol, rtol]}, "by_tensor": {...}}.

    >>> doc = tolerances_to_json(Tolerances.default().override(loss=Tolerance(1e-6, 1e-5)))
    >>> doc["by_quantity"]["loss"], tolerances_from_json(doc).lookup("loss", "loss")
    ([1e-06, 1e-05], Tolerance(atol=1e-06, rtol=1e-05))
    """
    return {"by_quantity": {q: [t.atol, t.rtol] for q, t in tolerances.by_quantity.items()},
            "by_tensor": {p: [t.atol, t.rtol] for p, t in tolerances.by_tensor.items()}}


TOLERANCES_FORMAT = ('a tolerances document is {"by_quantity": {"loss": [atol, rtol], "grad": '
                     '[atol, rtol], ...}, "by_tensor": {"pattern": [atol, rtol]}} with every one '
                     f'of {", ".join(NUMERIC)} in by_quantity, or has "base": "defaults" to take '
                     f'the quantities it does not list from the suite\'s defaults '
                     f'(verify/core/quantities.py)')


def tolerances_from_json(doc: Any, source: str = "tolerances document") -> Tolerances:
    """Tolerances from their JSON form, checked; `source` names the file in errors.

    Every numeric quantity needs its `[atol, rtol]`, unless `"base": "defaults"` says the
    ones not listed keep the suite's defaults; `run` and `input` are compared exactly and
    default to 0. Anything else (a missing quantity, an unknown one, a value that is not two
    finite numbers >= 0) is a `BadFile` naming the entry.

    >>> partial = {"base": "defaults", "by_quantity": {"grad": [1e-5, 1e-3]}}
    >>> t = tolerances_from_json(partial)
    >>> t.lookup("grad", "w"), t.lookup("weight", "w") == DEFAULTS["weight"]
    (Tolerance(atol=1e-05, rtol=0.001), True)
    >>> tolerances_from_json({"by_quantity": {"grad": [1e-5, 1e-3]}})
    Traceback (most recent call last):
    ...
    verify.core.files.BadFile: tolerances document: by_quantity lacks loss, slot, weight, ...
    """
    if not isinstance(doc, dict):
        raise BadFile(source, "not a tolerances document (not a JSON object)", TOLERANCES_FORMAT)
    unknown = sorted(set(doc) - {"base", "by_quantity", "by_tensor"})
    if unknown:
        raise BadFile(source, f"unknown keys {unknown}", TOLERANCES_FORMAT)
    if doc.get("base", "defaults") != "defaults":
        raise BadFile(source, f"base {doc['base']!r} is not \"defaults\"", TOLERANCES_FORMAT)
    by_quantity = _tolerance_table(source, doc, "by_quantity")
    unknown = sorted(set(by_quantity) - set(DEFAULTS))
    if unknown:
        raise BadFile(source, f"by_quantity names unknown quantities {unknown} (the "
                              f"quantities are {', '.join(DEFAULTS)})", TOLERANCES_FORMAT)
    missing = [q for q in NUMERIC if q not in by_quantity]
    if missing and "base" not in doc:
        raise BadFile(source, f"by_quantity lacks {', '.join(missing)}", TOLERANCES_FORMAT)
    base = DEFAULTS if "base" in doc else {q: DEFAULTS[q] for q in DEFAULTS if q not in NUMERIC}
    return Tolerances({**base, **by_quantity}, _tolerance_table(source, doc, "by_tensor"))


def _tolerance_table(source: str, doc: dict[str, Any], key: str) -> dict[str, Tolerance]:
    """`doc[key]` ({name: [atol, rtol]}, may be absent) as Tolerance objects."""
    table = doc.get(key, {})
    if not isinstance(table, dict):
        raise BadFile(source, f"{key} is not a JSON object", TOLERANCES_FORMAT)
    return {name: _tolerance(source, f"{key} {name!r}", value) for name, value in table.items()}


def _tolerance(source: str, where: str, value: Any) -> Tolerance:
    numbers = (isinstance(value, list) and len(value) == 2
               and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value))
    if not (numbers and all(math.isfinite(v) and v >= 0 for v in value)):
        raise BadFile(source, f"{where} is {json.dumps(value)}, not [atol, rtol] (two finite "
                              f"numbers >= 0)", TOLERANCES_FORMAT)
    return Tolerance(float(value[0]), float(value[1]))


def read_tolerances(path: str | Path) -> Tolerances:
    """Tolerances from a JSON file: a kept case.json or a tolerances document
    (`tolerances_from_json`); a `BadFile` naming the file and the entry when it is neither."""
    doc = read_json(path, TOLERANCES_FORMAT)
    if isinstance(doc, dict) and "pairs" in doc and "tolerances" in doc:
        doc = doc["tolerances"]
    return tolerances_from_json(doc, str(path))


def case_manifest(case: Case) -> dict[str, Any]:
    """What re-comparing the case's kept traces needs, as JSON-able data: the tolerances and
    every pair's `PairSpec`."""
    return {"case": case.name, "reference": case.reference, "seed": case.seed,
            "data_digest": case.data_digest(), "oracle": case.oracle, "tolerances": tolerances_to_json(case.tolerances),
            "pairs": [spec.to_json() for spec in case.pair_specs()]}


KEEP_AGAIN = ("keep the traces again, all from one run (`pytest verify/ --keep-traces`): a "
              f"case's {MANIFEST} and its traces are written together")


def read_manifest(path: Path) -> tuple[dict[str, Any], list[PairSpec], Tolerances]:
    """A kept case.json: the document, its pair specs and its tolerances; a `BadFile` naming
    the file and the field when it is not one."""
    manifest = read_json(path, KEEP_AGAIN)
    _check_manifest(path, manifest)
    specs = []
    for n, pair in enumerate(manifest["pairs"]):
        try:
            specs.append(PairSpec.from_json({"case": manifest["case"],
                                             "oracle": manifest.get("oracle"), **pair}))
        except (TypeError, ValueError) as e:
            raise BadFile(path, f"pair {n} is not a pair spec ({e})", KEEP_AGAIN) from None
    return manifest, specs, tolerances_from_json(manifest["tolerances"], f"{path} (tolerances)")


def _check_manifest(path: Path, manifest: Any) -> None:
    if not isinstance(manifest, dict):
        raise BadFile(path, f"not a kept {MANIFEST} (not a JSON object)", KEEP_AGAIN)
    for field in ("case", "reference", "data_digest"):
        if not (isinstance(manifest.get(field), str) and manifest[field]):
            raise BadFile(path, f"no {field!r} (a kept {MANIFEST} names its case and reference "
                                f"and the digest of the data its traces were run on)",
                          KEEP_AGAIN)
    if not isinstance(manifest.get("pairs"), list) or "tolerances" not in manifest:
        raise BadFile(path, "no 'pairs' list or no 'tolerances'", KEEP_AGAIN)
    for n, pair in enumerate(manifest["pairs"]):
        if not (isinstance(pair, dict) and isinstance(pair.get("reference"), str)
                and isinstance(pair.get("candidate"), str)):
            raise BadFile(path, f"pair {n} names no reference and candidate: {pair!r}",
                          KEEP_AGAIN)


def keep_case(traces_dir: Path, case: Case) -> Path:
    path = Path(traces_dir) / file_stem(case.name) / MANIFEST
    write_atomic(path, json.dumps(case_manifest(case), indent=1))
    return path


def keep_trace(traces_dir: Path, case_name: str, trace: Trace) -> Path:
    """Save `trace` as `<traces_dir>/<case>/<implementation>.npz/.json`; return the json path."""
    return trace.save(Path(traces_dir) / file_stem(case_name) / file_stem(trace.implementation))


def trace_stem(path: str | Path) -> Path:
    """The common stem of a trace's .json and .npz, from either file or the stem itself."""
    return trace_files(path)[0].with_suffix("")


def load_trace(path: str | Path) -> Trace:
    """A kept trace from its .json, its .npz or their common stem; a `BadFile` naming what is
    missing or wrong."""
    missing = [p.name for p in trace_files(path) if not p.is_file()]
    if missing:
        raise BadFile(path, f"no kept trace there (missing {', '.join(missing)})",
                      "a trace is a .json + .npz pair written by Trace.save or --keep-traces, "
                      "e.g. reports/traces/<case>/<implementation>.json")
    return Trace.load(path)


def recompare(traces_dir: str | Path, tolerances: Tolerances | None = None) -> RunResults:
    """Judge every pair of every kept case again (`verify.judge.judge_pair`, as the run that
    kept them did), with the tolerances kept beside the traces (or `tolerances`, for all
    cases). Pairs whose traces were not kept are skipped.
    """
    traces_dir = Path(traces_dir)
    manifests = sorted(traces_dir.glob(f"*/{MANIFEST}"))
    if not manifests:
        raise FileNotFoundError(f"{traces_dir} holds no kept traces (no */{MANIFEST}); run "
                                f"`pytest verify/ --keep-traces` to keep them")
    results = []
    for manifest_path in manifests:
        _, specs, kept_tolerances = read_manifest(manifest_path)
        traces = KeptTraces(manifest_path.parent)
        oracle_rows: dict = {}
        for spec in specs:
            needed = [spec.reference, spec.candidate] + ([spec.oracle] if spec.oracle else [])
            if not all(traces.has(name) for name in needed):
                continue
            results.append(judge_pair(spec, traces, tolerances or kept_tolerances,
                                      oracle_rows=oracle_rows))
    return RunResults.of(results)


class KeptTraces:
    """The kept traces of one case directory, loaded once each: `traces(name)`."""

    def __init__(self, directory: Path):
        self.directory, self._loaded = Path(directory), {}

    def has(self, name: str) -> bool:
        return (self.directory / f"{file_stem(name)}.json").is_file()

    def __call__(self, name: str) -> Trace:
        if name not in self._loaded:
            self._loaded[name] = load_trace(self.directory / file_stem(name))
        return self._loaded[name]
