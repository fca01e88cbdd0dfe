"""Kept traces (`--keep-traces`): a run's traces on disk, with what re-comparing them needs.

Layout under `<report-dir>/traces/`::

    <case>/<implementation>.npz + .json   one Trace each (Trace.save)
    <case>/case.json                      the case's tolerances, reference and pairs (with
                                          each negative control's expectation)

`recompare` compares every kept pair again from these files alone: no case module, no
TensorFlow. So traces written on a TPU VM can be re-compared, and re-judged with other
tolerances, on a laptop:

    python -m verify report reports/ --recompare --out /tmp/again

Nothing kept is trusted blindly: case.json lists exactly the pairs the run judged and the
digest of the case's data, and every trace must be the one case.json stores under its file
name (its implementation, its case, its data digest). A pair whose trace is missing, cannot be
read or is another's fails, saying which file and why; it is never skipped.
"""
from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

from verify.core.case import Case, PairSpec
from verify.core.files import BadFile, read_json, write_atomic
from verify.core.noise_floor import Calibration
from verify.core.tolerances import Tolerances
from verify.core.trace import Trace, trace_files
from verify.explain import explain_pair
from verify.judge.pair import judge_pair, unjudged
from verify.store.results import RunResults
from verify.core.sensitivity import base_candidate, is_mutant, resolve_spec
from verify.store.tolerance_documents import (TOLERANCES_FORMAT, tolerances_from_json,
                                        tolerances_to_json)

TRACES_DIR = "traces"
MANIFEST = "case.json"


def file_stem(name: str) -> str:
    """A file name for a case or implementation name: unsafe characters become '_'.

    >>> file_stem("tf2/mirrored x2")
    'tf2_mirrored_x2'

    A long name is cut to MAX_STEM characters, ending in a digest of the whole name so that
    two long names never share a file (file systems refuse names over 255 bytes):

    >>> stem = file_stem("x" * 300)
    >>> len(stem), stem[-13:-12]
    (96, '-')
    """
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._")
    if not stem:
        raise ValueError(f"cannot make a file name from {name!r}; use letters or digits in it")
    if len(stem) > MAX_STEM:
        digest = hashlib.sha256(name.encode()).hexdigest()[:12]
        stem = f"{stem[:MAX_STEM - 13]}-{digest}"
    return stem


MAX_STEM = 96   # room for the suffixes a trace's files add (.npz, .json, _ids.npy, ...)


def read_tolerances(path: str | Path) -> Tolerances:
    """Tolerances from a JSON file: a kept case.json or a tolerances document
    (`tolerances_from_json`); a `BadFile` naming the file and the entry when it is neither."""
    doc = read_json(path, TOLERANCES_FORMAT)
    if isinstance(doc, dict) and "pairs" in doc and "tolerances" in doc:
        doc = doc["tolerances"]
    return tolerances_from_json(doc, str(path))


def case_manifest(case: Case, pairs: list[PairSpec] | None = None) -> dict[str, Any]:
    """What re-comparing the case's kept traces needs, as JSON-able data: the data digest, the
    tolerances and the `PairSpec` of every pair kept (`pairs`, default all of the case's)."""
    pairs = case.pair_specs() if pairs is None else pairs
    return {"case": case.name, "reference": case.reference, "seed": case.seed,
            "data_digest": case.data_digest(), "oracle": case.oracle,
            "calibration": (json.loads(case.calibration.to_json())
                            if case.calibration is not None else None),
            "tolerances": tolerances_to_json(case.tolerances),
            "pairs": [spec.to_json() for spec in pairs]}


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


def manifest_calibration(manifest: dict[str, Any]) -> Calibration | None:
    """The case's calibration kept in its manifest, if it had one."""
    doc = manifest.get("calibration")
    return None if not doc else Calibration.from_json(json.dumps(doc), "case.json calibration")


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


# In every traces directory the suite writes: only a directory that holds it is ever replaced or
# removed by a later run (a user's own traces/ in the report directory stays untouched).
TRACES_MARKER = ".parity-traces"


def keep_case(traces_dir: Path, case: Case, pairs: list[PairSpec] | None = None) -> Path:
    """Write the case's manifest (`case_manifest`) beside its kept traces; return its path."""
    Path(traces_dir).mkdir(parents=True, exist_ok=True)
    (Path(traces_dir) / TRACES_MARKER).touch()
    path = Path(traces_dir) / file_stem(case.name) / MANIFEST
    write_atomic(path, json.dumps(case_manifest(case, pairs), indent=1))
    return path


def keep_trace(traces_dir: Path, case_name: str, trace: Trace) -> Path:
    """Save `trace` as `<traces_dir>/<case>/<implementation>.npz/.json`; return the json path."""
    return trace.save(Path(traces_dir) / file_stem(case_name) / file_stem(trace.implementation))


def suite_traces(directory: Path) -> bool:
    """Whether `directory` is a traces directory the suite wrote (a real directory, not a
    link, holding its marker)."""
    directory = Path(directory)
    return (directory.is_dir() and not directory.is_symlink()
            and (directory / TRACES_MARKER).is_file())


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


def identity_problem(trace: Trace, json_path: Path, manifest: dict[str, Any],
                     expected: str | None = None) -> str | None:
    """Why `trace`, read from `json_path`, is not the trace `manifest` (its case's kept
    case.json) stores there: another implementation's, another case's, or run on other data.
    `expected` is the implementation the file must hold (default: the one the manifest
    stores under that file name). None when it is the expected trace.

    >>> trace = Trace("tf2", {"case": "demo", "data_digest": "d1"})
    >>> manifest = {"case": "demo", "data_digest": "d1", "reference": "tf1",
    ...             "pairs": [{"reference": "tf1", "candidate": "tf2"}]}
    >>> identity_problem(trace, Path("demo/tf2.json"), manifest) is None
    True
    >>> identity_problem(trace, Path("demo/tf1.json"), manifest)
    "tf1.json holds the trace of implementation 'tf2', not of 'tf1' (copied over it?)"
    """
    name, case = json_path.name, manifest["case"]
    if expected is None:
        stored = {file_stem(n): n for n in manifest_implementations(manifest)}
        expected = stored.get(json_path.name.removesuffix(".json"))
        if expected is None:
            return (f"the {MANIFEST} beside {name} stores no implementation under that name "
                    f"(it lists {sorted(stored.values())})")
    if trace.implementation != trace.meta.implementation:
        return (f"{name} says it is implementation {trace.implementation!r} and its meta says "
                f"{trace.meta.implementation!r}")
    if trace.implementation != expected:
        return (f"{name} holds the trace of implementation {trace.implementation!r}, not of "
                f"{expected!r} (copied over it?)")
    if trace.meta.case != case:
        return (f"{name} was run for case {trace.meta.case!r}, not {case!r}" if trace.meta.case
                else f"{name} records no case; the traces of {case!r} do")
    if not trace.meta.data_digest:
        return (f"{name} records no data digest, so nothing shows it was run on the data of "
                f"case {case!r} (kept before traces carried one?)")
    if trace.meta.data_digest != manifest["data_digest"]:
        return (f"{name} was run on other data than the {MANIFEST} beside it was kept with "
                f"(data digest {trace.meta.data_digest}, case {manifest['data_digest']}): the "
                f"case's examples, initial values, batch size or seed differ")
    return None


def manifest_implementations(manifest: dict[str, Any]) -> list[str]:
    """Every implementation a kept manifest's pairs name (reference, candidates, oracle)."""
    names = [manifest["reference"]] + ([manifest["oracle"]] if manifest.get("oracle") else [])
    for pair in manifest["pairs"]:
        names += [pair["reference"], pair["candidate"]]
    return list(dict.fromkeys(names))


def check_beside_manifest(path: str | Path, trace: Trace) -> str | None:
    """Why the trace loaded from `path` is not what the case.json beside it (if any) stores
    there; None when it is, or when no case.json is beside it."""
    json_path = trace_files(path)[0]
    manifest_path = json_path.parent / MANIFEST
    if not manifest_path.is_file():
        return None
    manifest, _, _ = read_manifest(manifest_path)
    return identity_problem(trace, json_path, manifest)


def mark_unfinished(traces_dir: Path, judged: set[tuple[str, str, str]], stopped: str) -> None:
    """After a run that stopped early (`stopped` says why): each kept case.json lists under
    "pairs" only the pairs the run judged, keyed (case, reference, candidate); the others move
    to "not_run", so that re-comparing reports them as not run, never as failing for want of
    a trace.

    >>> import tempfile
    >>> case_dir = Path(tempfile.mkdtemp()) / "demo"
    >>> case_dir.mkdir()
    >>> _ = (case_dir / MANIFEST).write_text(json.dumps({"case": "demo", "pairs": [
    ...     {"reference": "a", "candidate": "b"}, {"reference": "a", "candidate": "c"}]}))
    >>> mark_unfinished(case_dir.parent, {("demo", "a", "b")}, "interrupted: stopped by SIGINT")
    >>> doc = json.loads((case_dir / MANIFEST).read_text())
    >>> [p["candidate"] for p in doc["pairs"]], [p["candidate"] for p in doc["not_run"]]
    (['b'], ['c'])
    """
    for path in Path(traces_dir).glob(f"*/{MANIFEST}"):
        manifest = json.loads(path.read_text())
        pairs = manifest["pairs"] + manifest.get("not_run", [])
        ran = [p for p in pairs if (manifest["case"], p["reference"], p["candidate"]) in judged]
        manifest.update(pairs=ran, not_run=[p for p in pairs if p not in ran], stopped=stopped)
        write_atomic(path, json.dumps(manifest, indent=1))


def recompare(traces_dir: str | Path, tolerances: Tolerances | None = None) -> RunResults:
    """Judge every pair of every kept case again (`verify.judge.judge_pair`, as the run that
    kept them did), with the tolerances kept beside the traces (or `tolerances`, for all
    cases).

    Every pair a case's manifest lists gives a result: a pair whose traces are missing,
    unreadable, or not what the manifest stores there (`identity_problem`) fails with a
    'run' row per such trace saying why (`verify.judge.unjudged`); it is never skipped. The
    pairs a stopped run never ran (`mark_unfinished`) are reported as not run, which makes the
    re-comparison INCOMPLETE as the run was. A manifest that cannot be read is a `BadFile`.
    """
    traces_dir = Path(traces_dir)
    manifests = sorted(traces_dir.glob(f"*/{MANIFEST}"))
    if not manifests:
        raise FileNotFoundError(f"{traces_dir} holds no kept traces (no */{MANIFEST}); run "
                                f"`pytest verify/ --keep-traces` to keep them")
    results, not_run, stopped = [], {}, ""
    for manifest_path in manifests:
        manifest, specs, kept_tolerances = read_manifest(manifest_path)
        if manifest.get("not_run"):
            stopped = str(manifest.get("stopped") or "stopped early")
            for pair in manifest["not_run"]:
                not_run[f"{manifest['case']}:{pair['reference']}-vs-{pair['candidate']}"] = (
                    f"not run: the run that kept these traces stopped before it ({stopped})")
        calibration = manifest_calibration(manifest)
        traces = KeptTraces(manifest_path.parent, manifest)
        use = tolerances or kept_tolerances
        oracle_rows: dict = {}
        for spec in specs:
            needed = [spec.reference, spec.candidate] + ([spec.oracle] if spec.oracle else [])
            if is_mutant(spec.candidate):   # what it learned from its candidate's faithful run
                needed.append(base_candidate(spec.candidate))
            problems = {name: traces.problem(name) for name in dict.fromkeys(needed)}
            problems = {name: why for name, why in problems.items() if why}
            if problems:
                results.append(unjudged(spec, problems, use))
                continue
            spec = resolve_spec(spec, traces)
            results.append(explain_pair(judge_pair(spec, traces, use, oracle_rows=oracle_rows,
                                                   calibration=calibration), spec, traces))
    out = RunResults.of(results)
    out.not_run, out.stopped = not_run, stopped
    return out


class KeptTraces:
    """The kept traces of one case directory, each loaded once and, given the case's manifest,
    checked against it (`identity_problem`): `traces(name)` returns the trace or raises
    `BadFile`; `problem(name)` says why it cannot be used (None when it can)."""

    def __init__(self, directory: Path, manifest: dict[str, Any] | None = None):
        self.directory, self.manifest = Path(directory), manifest
        self._loaded: dict[str, Trace | BadFile] = {}

    def has(self, name: str) -> bool:
        return trace_files(self.directory / file_stem(name))[0].is_file()

    def problem(self, name: str) -> str | None:
        try:
            self(name)
        except BadFile as e:
            return str(e)
        return None

    def __call__(self, name: str) -> Trace:
        if name not in self._loaded:
            self._loaded[name] = self._load(name)
        found = self._loaded[name]
        if isinstance(found, BadFile):
            raise found
        return found

    def _load(self, name: str) -> Trace | BadFile:
        path = self.directory / file_stem(name)
        missing = [p.name for p in trace_files(path) if not p.is_file()]
        if missing:
            return BadFile(self.directory, f"no kept trace of {name!r} (missing "
                                           f"{', '.join(missing)})", KEEP_AGAIN)
        try:
            trace = Trace.load(path)
        except BadFile as e:
            return e
        problem = (identity_problem(trace, trace_files(path)[0], self.manifest, name)
                   if self.manifest is not None else None)
        return BadFile(self.directory, problem, KEEP_AGAIN) if problem else trace
