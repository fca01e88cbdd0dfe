"""Tolerances documents: a case's tolerances as plain JSON, written into a kept case.json and
read back from it or from a file given with `--tolerances`
(`verify.store.kept_traces.read_tolerances`).

The form is {"by_quantity": {quantity: [atol, rtol]}, "by_tensor": {pattern: [atol, rtol]}},
optionally with "base": "defaults"; reading checks every entry and names the wrong one.
"""
from __future__ import annotations

import json
import math
from typing import Any

from verify.core.files import BadFile
from verify.core.quantities import NUMERIC
from verify.core.tolerances import DEFAULTS, Tolerance, Tolerances


def tolerances_to_json(tolerances: Tolerances) -> dict[str, Any]:
    """Tolerances as plain JSON: {"by_quantity": {q: [atol, rtol]}, "by_tensor": {...}}.

    >>> doc = tolerances_to_json(Tolerances.default().override(loss=Tolerance(1e-6, 1e-5)))
    >>> doc["by_quantity"]["loss"], tolerances_from_json(doc).lookup("loss", "loss").atol
    ([1e-06, 1e-05], 1e-06)
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
