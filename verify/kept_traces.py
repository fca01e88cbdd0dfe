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
import re
from pathlib import Path
from typing import Any

from verify.core.case import Case, PairSpec
from verify.core.files import write_atomic
from verify.core.noise_floor import Calibration
from verify.core.tolerances import Tolerance, Tolerances
from verify.core.trace import Trace
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

    >>> doc = tolerances_to_json(Tolerances({"loss": Tolerance(1e-6, 1e-5)}))
    >>> doc, tolerances_from_json(doc).lookup("loss", "loss") == Tolerance(1e-6, 1e-5)
    ({'by_quantity': {'loss': [1e-06, 1e-05]}, 'by_tensor': {}}, True)
    """
    return {"by_quantity": {q: [t.atol, t.rtol] for q, t in tolerances.by_quantity.items()},
            "by_tensor": {p: [t.atol, t.rtol] for p, t in tolerances.by_tensor.items()}}


def tolerances_from_json(doc: dict[str, Any]) -> Tolerances:
    try:
        return Tolerances({q: Tolerance(*v) for q, v in doc["by_quantity"].items()},
                          {p: Tolerance(*v) for p, v in doc.get("by_tensor", {}).items()})
    except (KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"tolerances must look like {{\"by_quantity\": {{\"grad\": [atol, rtol]"
                         f", ...}}, \"by_tensor\": {{\"pattern\": [atol, rtol]}}}}; "
                         f"got {str(doc)[:200]} ({e})") from None


def read_tolerances(path: str | Path) -> Tolerances:
    """Tolerances from a JSON file: a kept case.json or a bare tolerances document."""
    doc = json.loads(Path(path).read_text())
    return tolerances_from_json(doc.get("tolerances", doc))


def case_manifest(case: Case) -> dict[str, Any]:
    """What re-comparing the case's kept traces needs, as JSON-able data: the tolerances and
    every pair's `PairSpec`."""
    return {"case": case.name, "reference": case.reference, "seed": case.seed,
            "data_digest": case.data_digest(), "oracle": case.oracle,
            "calibration": (json.loads(case.calibration.to_json())
                            if case.calibration is not None else None), "tolerances": tolerances_to_json(case.tolerances),
            "pairs": [spec.to_json() for spec in case.pair_specs()]}


def read_manifest(path: Path) -> tuple[dict[str, Any], list[PairSpec], Tolerances]:
    """A kept case.json: the document, its pair specs and its tolerances."""
    manifest = json.loads(Path(path).read_text())
    specs = [PairSpec.from_json({"case": manifest["case"], "oracle": manifest.get("oracle"),
                                 **pair}) for pair in manifest["pairs"]]
    return manifest, specs, tolerances_from_json(manifest["tolerances"])


def manifest_calibration(manifest: dict[str, Any]) -> Calibration | None:
    """The case's calibration kept in its manifest, if it had one."""
    doc = manifest.get("calibration")
    return None if not doc else Calibration.from_json(json.dumps(doc), "case.json calibration")


def keep_case(traces_dir: Path, case: Case) -> Path:
    path = Path(traces_dir) / file_stem(case.name) / MANIFEST
    write_atomic(path, json.dumps(case_manifest(case), indent=1))
    return path


def keep_trace(traces_dir: Path, case_name: str, trace: Trace) -> Path:
    """Save `trace` as `<traces_dir>/<case>/<implementation>.npz/.json`; return the json path."""
    return trace.save(Path(traces_dir) / file_stem(case_name) / file_stem(trace.implementation))


def trace_stem(path: str | Path) -> Path:
    """The common stem of a trace's .json and .npz, from either file or the stem itself."""
    path = Path(path)
    return path.with_suffix("") if path.suffix in (".json", ".npz") else path


def load_trace(path: str | Path) -> Trace:
    """A kept trace from its .json, its .npz or their common stem; a clear error if absent."""
    path = Path(path)
    stem = trace_stem(path)
    missing = [p.name for p in (stem.with_name(stem.name + ".json"),
                                stem.with_name(stem.name + ".npz")) if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"{path}: no kept trace there (missing {', '.join(missing)}); a "
                                f"trace is a .json + .npz pair written by Trace.save or "
                                f"--keep-traces, e.g. reports/traces/<case>/<implementation>.json")
    return Trace.load(stem.with_name(stem.name + ".json"))


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
        manifest, specs, kept_tolerances = read_manifest(manifest_path)
        calibration = manifest_calibration(manifest)
        traces = KeptTraces(manifest_path.parent)
        oracle_rows: dict = {}
        for spec in specs:
            needed = [spec.reference, spec.candidate] + ([spec.oracle] if spec.oracle else [])
            if not all(traces.has(name) for name in needed):
                continue
            results.append(judge_pair(spec, traces, tolerances or kept_tolerances,
                                      oracle_rows=oracle_rows, calibration=calibration))
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
