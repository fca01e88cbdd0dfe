"""Migrations under test. Each module or package here that defines `CASE` (a `verify.Case`),
`CASES` (a list of them) or `cases(options)` (a function of the session's `SuiteOptions`
returning a list) is picked up by `pytest verify/`; nothing in `verify/` names them.

>>> sorted(load_cases())  # doctest: +SKIP
['tpu_embedding']
"""
from __future__ import annotations

import importlib
import pkgutil

from verify.case import Case, SuiteOptions


def load_cases(names: list[str] | None = None,
               options: SuiteOptions | None = None) -> dict[str, Case]:
    """Import every case module under `cases/` and return its cases by name."""
    options = options or SuiteOptions()
    found: dict[str, Case] = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        declared = list(getattr(module, "CASES", []))
        if hasattr(module, "CASE"):
            declared.append(module.CASE)
        if hasattr(module, "cases"):
            declared.extend(module.cases(options))
        for case in declared:
            if not isinstance(case, Case):
                raise TypeError(f"cases/{info.name}: CASE/CASES must hold verify.Case objects, "
                                f"got {type(case).__name__}")
            if case.name in found:
                raise ValueError(f"two cases are named {case.name!r}; case names must be unique")
            found[case.name] = case
    if names:
        unknown = sorted(set(names) - set(found))
        if unknown:
            raise ValueError(f"unknown case(s) {unknown}; known: {sorted(found)}")
        found = {n: c for n, c in found.items() if n in names}
    return found
