"""Golden references: reference traces stored once, so later runs need only the candidates.

`pytest verify/ --save-golden DIR` stores the trace of every implementation that is the
reference of a judged pair, beside the case's manifest (as kept traces are)::

    DIR/<case>/<implementation>.json + .npz   the reference's trace; its meta holds the data
                                              digest, the steps, the environment it ran in and
                                              a digest of its name map
    DIR/<case>/case.json                      the case's manifest (tolerances, pairs, data digest)
    DIR/<case>/.parity-golden                 marks a directory the suite wrote: only such a
                                              directory is ever replaced by a later run

`pytest verify/ --golden DIR` runs the candidates only: an implementation that is no selected
pair's candidate is read from DIR instead of being run, so its environment (TF 1 code on
TF 2.15, say) is not needed. A golden that no longer matches the case fails every pair that
needs it, saying what changed: the data or initial values, the steps, or the name map.

>>> names_digest(Implementation("tf1", None, NameMap({"w": "dense/kernel"})))
'd08e506428a9fb23'
"""
from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

from verify.core.case import Case, Implementation
from verify.core.names import NameMap  # noqa: F401 - used by the doctest
from verify.core.trace import Trace, trace_files
from verify.store.kept_traces import file_stem, keep_case

# In every golden case directory the suite writes: only a directory holding it is replaced.
GOLDEN_MARKER = ".parity-golden"
GOLDEN_KEY = "golden"   # trace.meta.details[GOLDEN_KEY]: what the golden was stored for
RECORD_AGAIN = "Record the golden again with `pytest verify/ --save-golden DIR`"


def names_digest(implementation: Implementation) -> str:
    """A digest of how an implementation's names map to canonical ones (names, transforms,
    slot names): a golden stored under another map would be compared under the wrong one."""
    entries = sorted((canonical, repr(mapped)) for canonical, mapped in
                     ((c, implementation.names.native(c)) for c in implementation.names.entries))
    text = repr((entries, sorted(implementation.slot_names.items())))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def stage_golden(staging: Path, case: Case, implementation: Implementation, trace: Trace,
                 steps: int) -> Path:
    """Write a reference's trace (and its case's manifest) into `staging`, marked with what
    it was stored for; `publish_goldens` moves it into the golden directory at the end."""
    trace.meta.details[GOLDEN_KEY] = {"names": names_digest(implementation), "steps": steps,
                                      "data_digest": case.data_digest()}
    directory = staging / file_stem(case.name)
    if not (directory / "case.json").exists():
        keep_case(staging, case)
        (directory / GOLDEN_MARKER).touch()
    return trace.save(directory / file_stem(implementation.name))


def publish_goldens(staging: Path, destination: Path,
                    refused: list[str] | None = None) -> list[Path]:
    """Replace each case's golden directory under `destination` with the staged one, whole.
    Cases not staged keep their goldens. A directory in the way that the suite did not write
    (`is_golden_dir`) is left as it is, and `refused` says so."""
    published = []
    if not staging.is_dir():
        return published
    destination.mkdir(parents=True, exist_ok=True)
    for case_dir in sorted(p for p in staging.iterdir() if p.is_dir()):
        target = destination / case_dir.name
        old = destination / f".{case_dir.name}-replaced"
        if (target.exists() or target.is_symlink()) and not is_golden_dir(target):
            if refused is not None:
                refused.append(f"{target} is not a golden directory the suite wrote (no "
                               f"{GOLDEN_MARKER}), so it is left as it is and the golden of "
                               f"{case_dir.name} is not stored: pass another --save-golden")
            continue
        if target.exists():
            shutil.rmtree(old, ignore_errors=True)
            target.rename(old)
        shutil.copytree(case_dir, target)
        shutil.rmtree(old, ignore_errors=True)
        published.append(target)
    return published


def is_golden_dir(directory: Path) -> bool:
    """Whether `directory` is a case's golden directory the suite wrote: a real directory with
    its marker, or, written before the marker existed, holding only a case.json manifest and
    trace files.

    >>> import tempfile
    >>> is_golden_dir(Path(tempfile.mkdtemp()))
    False
    """
    directory = Path(directory)
    if not directory.is_dir() or directory.is_symlink():
        return False
    if (directory / GOLDEN_MARKER).is_file():
        return True
    files = list(directory.iterdir())
    return ((directory / "case.json").is_file() and
            all(f.is_file() and f.suffix in (".json", ".npz", ".npy") for f in files))


def golden_trace(directory: Path, case: Case, implementation: Implementation,
                 steps: int) -> Trace:
    """The stored golden of `implementation`, or a failing trace that says why it cannot be
    used (missing, unreadable, or stored for other data, steps or names)."""
    stem = directory / file_stem(case.name) / file_stem(implementation.name)
    json_path = trace_files(stem)[0]
    if not json_path.is_file():
        return _failed(case, implementation,
                       f"GoldenMissing: {directory} holds no golden of {case.name}/"
                       f"{implementation.name} ({json_path} does not exist): {RECORD_AGAIN}, "
                       f"or run without --golden")
    try:
        trace = Trace.load(stem)
    except Exception as e:  # noqa: BLE001 - a failing trace that names the file
        return _failed(case, implementation, f"GoldenUnreadable: {json_path}: {e}")
    changes = golden_changes(trace, case, implementation, steps)
    if changes:
        return _failed(case, implementation,
                       f"GoldenMismatch: the golden {json_path} no longer matches the case: "
                       + "; ".join(changes) + f". {RECORD_AGAIN}")
    trace.meta.details["golden_file"] = str(json_path)
    return trace


def golden_changes(trace: Trace, case: Case, implementation: Implementation,
                   steps: int) -> list[str]:
    """What changed since the golden was stored ([] when nothing did)."""
    stored = trace.meta.details.get(GOLDEN_KEY) or {}
    changes = []
    if trace.implementation != implementation.name or trace.meta.case != case.name:
        changes.append(f"it is the trace of {trace.meta.case}/{trace.implementation}")
    if trace.meta.data_digest != case.data_digest():
        changes.append(f"the case's data or initial values changed (data digest "
                       f"{trace.meta.data_digest} stored, {case.data_digest()} now)")
    if stored.get("steps", trace.meta.steps) != steps:
        changes.append(f"it was stored for {stored.get('steps', trace.meta.steps)} steps, this "
                       f"run trains {steps}")
    if stored.get("names") != names_digest(implementation):
        changes.append(f"the name map of {implementation.name} changed (digest "
                       f"{stored.get('names')} stored, {names_digest(implementation)} now)")
    return changes


def _failed(case: Case, implementation: Implementation, error: str) -> Trace:
    return Trace(implementation.name, {"case": case.name, "implementation": implementation.name,
                                       "replicas": implementation.replicas,
                                       "data_digest": case.data_digest()}, error=error)
