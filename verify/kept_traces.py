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

import pandas as pd

from verify.case import Case, Expectation
from verify.compare import COLUMNS
from verify.report import (LOSS_COLUMNS, PAIR_COLUMNS, PREFLIGHT_COLUMNS, RunResults,
                           add_preflight, compare_pair, concat_frames, sort_preflight,
                           trace_environment, write_atomic)
from verify.tolerances import Tolerance, Tolerances
from verify.trace import Trace

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
    >>> doc, tolerances_from_json(doc).lookup("loss", "loss")
    ({'by_quantity': {'loss': [1e-06, 1e-05]}, 'by_tensor': {}}, Tolerance(atol=1e-06, rtol=1e-05))
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
    """What re-comparing the case's kept traces needs, as JSON-able data."""
    pairs = []
    for reference, candidate in case.all_pairs():
        implementation = case.implementation(candidate)
        expect = implementation.expect
        pairs.append({"reference": reference, "candidate": candidate,
                      "replicas": implementation.replicas,
                      "control": implementation.is_control,
                      "preflight_expect": list(implementation.preflight_expect),
                      "expect": None if expect is None else {
                          "step": expect.step, "quantity": expect.quantity, "why": expect.why,
                          "tensor": expect.tensor, "min_ratio": expect.min_ratio}})
    return {"case": case.name, "reference": case.reference, "seed": case.seed,
            "tolerances": tolerances_to_json(case.tolerances), "pairs": pairs}


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
    """Compare every pair of every kept case again, with the tolerances kept beside the traces
    (or `tolerances`, for all cases). Pairs whose traces were not kept are skipped.
    """
    traces_dir = Path(traces_dir)
    manifests = sorted(traces_dir.glob(f"*/{MANIFEST}"))
    if not manifests:
        raise FileNotFoundError(f"{traces_dir} holds no kept traces (no */{MANIFEST}); run "
                                f"`pytest verify/ --keep-traces` to keep them")
    rows, records, losses, findings, environment = [], [], [], [], {}
    for manifest_path in manifests:
        manifest = json.loads(manifest_path.read_text())
        case_tolerances = tolerances or tolerances_from_json(manifest["tolerances"])
        cache: dict[str, Trace | None] = {}

        def trace(name: str) -> Trace | None:
            if name not in cache:
                stem = manifest_path.parent / file_stem(name)
                cache[name] = load_trace(stem) if stem.with_suffix(".json").is_file() else None
            return cache[name]

        for pair in manifest["pairs"]:
            reference, candidate = trace(pair["reference"]), trace(pair["candidate"])
            if reference is None or candidate is None:
                continue
            expect = Expectation(**pair["expect"]) if pair.get("expect") else None
            result = compare_pair(reference, candidate, case_tolerances, case=manifest["case"],
                                  replicas=int(pair["replicas"]), expect=expect,
                                  control=pair.get("control"))
            add_preflight(result, reference.meta.get("declared_config") or {},
                          candidate.meta.get("declared_config") or {}, expect=expect,
                          preflight_expect=tuple(pair.get("preflight_expect", ())),
                          device=str(candidate.meta.get("device", "cpu")))
            findings.append(result.preflight)
            rows.append(result.rows)
            records.append(result.record)
            losses.append(result.losses)
            environment = environment or trace_environment(candidate)
    return RunResults(rows=concat_frames(rows, COLUMNS),
                      pairs=pd.DataFrame(records, columns=PAIR_COLUMNS),
                      losses=concat_frames(losses, LOSS_COLUMNS), environment=environment,
                      preflight=sort_preflight(concat_frames(findings, PREFLIGHT_COLUMNS)))
