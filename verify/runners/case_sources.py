"""Where cases come from: the project's `cases/` directory, or any directory, file or module.

A case source is one of:
- a directory that is a package (has `__init__.py`), e.g. `cases/` or `my_repo/parity_cases/`:
  every module and package in it that does not start with `_`;
- a directory that is not a package: every `.py` module and package directly in it;
- a `.py` file: that module;
- a dotted module name importable from `sys.path` (e.g. `my_migration.parity_cases`): that
  module, and its submodules when it is a package, except for a case package inside a package
  of cases (`cases.tpu_embedding`, or the directory `cases/tpu_embedding/`): it is that case
  alone, its submodules being the case's own code.

A case module defines `CASE` (a `verify.Case`), `CASES` (a list of them) or `cases(options)`
(a function of the session's `SuiteOptions` returning a list). Sources given as paths are
imported under their own names with their parent directory on `sys.path`, so a case package
imports its own modules as usual (`from parity_cases.my_case import model`).

`load_cases(..., broken={})` keeps going past a module that fails to import or to declare its
cases: the dict gets the module's name and the error, and every other module still loads.

>>> sources = resolve_sources(["cases"], root=Path(__file__).parents[2])
>>> [s.kind for s in sources]
['package']
"""
from __future__ import annotations

import dataclasses
import importlib
import os
import pkgutil
import sys
import traceback
from pathlib import Path
from types import ModuleType

from verify.core.case import Case, SuiteOptions
from verify.core.runner import RunSpec
from verify.core.trace import Trace


class CaseSourceError(ValueError):
    """A case source that cannot be found or imported; the message says what to do."""


@dataclasses.dataclass(frozen=True)
class CaseSource:
    """One resolved source: `module` is the importable name, `path` the directory to put on
    `sys.path` first (None for a module already importable), `kind` package/directory/file/
    module."""

    given: str
    kind: str
    module: str | None = None
    path: Path | None = None

    def modules(self, broken: dict[str, str] | None = None) -> list[ModuleType]:
        """Import the source and every case module in it (a package itself first, then its
        modules sorted by name). A module that fails raises CaseSourceError, or with `broken`
        is put there (name -> error) and the others still load."""
        if self.kind == "directory":
            _on_path(self.path)
            names = sorted(m.name for m in pkgutil.iter_modules([str(self.path)])
                           if not m.name.startswith("_"))
            return [m for m in (self._import(name, broken) for name in names) if m is not None]
        if self.path is not None:
            _on_path(self.path)
        top = self._import(self.module, broken)
        if top is None or not hasattr(top, "__path__") or (self.nested() and declares_cases(top)):
            # one case package of a package of cases (`cases.tpu_embedding`): its submodules are
            # the case's own code, some only importable in another environment (keras-rs, tfrs)
            return [top] if top is not None else []
        subs = (self._import(f"{self.module}.{m.name}", broken)
                for m in sorted(pkgutil.iter_modules(top.__path__), key=lambda m: m.name)
                if not m.name.startswith("_"))
        return [top] + [m for m in subs if m is not None]

    def nested(self) -> bool:
        """Whether the source is a package inside another package (`cases.tpu_embedding`, or
        the directory `cases/tpu_embedding/`), not a top-level package of cases."""
        return "." in (self.module or "") or (
            self.kind == "package" and (self.path / "__init__.py").is_file())

    def _import(self, name: str, broken: dict[str, str] | None) -> ModuleType | None:
        try:
            return _import(name, self)
        except CaseSourceError as e:
            if broken is None:
                raise
            broken[name] = str(e)
            return None


def resolve_sources(given: list[str], root: Path | None = None) -> list[CaseSource]:
    """Resolve case sources (paths relative to `root`, else the working directory)."""
    root = Path(root or Path.cwd())
    out = []
    for text in given:
        path = Path(text).expanduser()
        path = path if path.is_absolute() else root / path
        if path.is_dir():
            if (path / "__init__.py").is_file():
                out.append(CaseSource(text, "package", path.name, path.parent.resolve()))
            else:
                out.append(CaseSource(text, "directory", None, path.resolve()))
        elif path.is_file() and path.suffix == ".py":
            out.append(CaseSource(text, "file", path.stem, path.parent.resolve()))
        elif "/" not in text and not text.endswith(".py") and all(
                part.isidentifier() for part in text.split(".")):
            out.append(CaseSource(text, "module", text))
        else:
            raise CaseSourceError(f"--cases {text}: no such directory, .py file or module name; "
                                  f"pass a directory of case modules, a case module's .py file "
                                  f"or an importable module name")
    return out


def load_cases(sources: list[CaseSource], options: SuiteOptions | None = None,
               names: list[str] | None = None, *,
               broken: dict[str, str] | None = None) -> dict[str, Case]:
    """Every case the sources declare, by name (only `names` when given).

    A module that fails to import or to declare its cases raises CaseSourceError; with
    `broken` it is put there instead (module name -> error) and the other modules still load.
    """
    options = options or SuiteOptions()
    found: dict[str, Case] = {}
    for source in sources:
        for module in source.modules(broken):
            try:
                declared = _unique(declared_cases(module, options), found, module)
            except Exception as e:  # noqa: BLE001 - one broken module must not stop the others
                if broken is None:
                    raise
                broken[module.__name__] = (str(e) if isinstance(e, CaseSourceError) else
                                           f"{module.__name__}: declaring its cases failed: "
                                           f"{_error_text(e)}")
                continue
            found.update(declared)
    if names:
        unknown = sorted(set(names) - set(found))
        if unknown:
            raise CaseSourceError(f"unknown case(s) {unknown}; known: {sorted(found)}")
        found = {n: c for n, c in found.items() if n in names}
    return found


def _unique(declared: list[Case], found: dict[str, Case], module: ModuleType) -> dict[str, Case]:
    out: dict[str, Case] = {}
    for case in declared:
        if case.name in found or case.name in out:
            raise CaseSourceError(f"two cases are named {case.name!r} (the second in "
                                  f"{module.__name__}); case names must be unique")
        out[case.name] = case
    return out


def declares_cases(module: ModuleType) -> bool:
    """Whether `module` declares cases itself (CASE, CASES or cases(options))."""
    return any(hasattr(module, name) for name in ("CASE", "CASES", "cases"))


def declared_cases(module: ModuleType, options: SuiteOptions) -> list[Case]:
    """The cases one module declares through CASE, CASES or cases(options)."""
    declared = list(getattr(module, "CASES", []))
    if hasattr(module, "CASE"):
        declared.append(module.CASE)
    if hasattr(module, "cases"):
        declared.extend(module.cases(options))
    for case in declared:
        if not isinstance(case, Case):
            raise CaseSourceError(f"{module.__name__}: CASE/CASES/cases() must give verify.Case "
                                  f"objects, got {type(case).__name__}")
    return declared


def _on_path(directory: Path) -> None:
    if str(directory) not in sys.path:
        sys.path.insert(0, str(directory))


def _import(name: str, source: CaseSource) -> ModuleType:
    """Import `name`; refuse a module of that name already imported from somewhere else."""
    top = name.split(".")[0]
    loaded = sys.modules.get(top)
    if loaded is not None and source.path is not None:
        where = Path(getattr(loaded, "__file__", "") or "").resolve()
        if where and source.path not in where.parents:
            raise CaseSourceError(
                f"--cases {source.given}: a module named {top!r} is already imported from "
                f"{where}; rename the case package or directory so its name is unique")
    from verify.runners.run import RunTimeout, TimeLimit

    limit = import_timeout()
    try:
        with TimeLimit(limit):
            return importlib.import_module(name)
    except CaseSourceError:
        raise
    except RunTimeout:
        sys.modules.pop(name, None)   # half-imported: never used
        raise CaseSourceError(
            f"--cases {source.given}: importing {name} did not finish within {limit:g} s "
            f"(it hangs, or waits for something: a download, a device, a lock); fix the module, "
            f"or raise {IMPORT_TIMEOUT} (seconds) if it is only slow") from None
    except Exception as e:
        raise CaseSourceError(f"--cases {source.given}: importing {name} failed: "
                              f"{_error_text(e)}") from e


IMPORT_TIMEOUT = "PARITY_IMPORT_TIMEOUT"
DEFAULT_IMPORT_TIMEOUT = 300.0


def import_timeout() -> float:
    """Seconds a case module may take to import (`PARITY_IMPORT_TIMEOUT`, default 300)."""
    text = os.environ.get(IMPORT_TIMEOUT, "").strip()
    try:
        return float(text) if text else DEFAULT_IMPORT_TIMEOUT
    except ValueError:
        raise CaseSourceError(f"{IMPORT_TIMEOUT}={text!r} is not a number of seconds") from None


def _error_text(error: Exception) -> str:
    """'ImportError: no module named x (at broken.py:2)': the error and where it was raised."""
    frames = [f for f in traceback.extract_tb(error.__traceback__)
              if not f.filename.startswith("<frozen")]
    where = f" (at {Path(frames[-1].filename).name}:{frames[-1].lineno})" if frames else ""
    return f"{type(error).__name__}: {error}{where}"


def run_spec(spec: RunSpec, root: Path | None = None,
             timeout: float | None = None) -> Trace:
    """Load the case a `RunSpec` names from its sources and run the implementation it names:
    what an environment process does when another process asks it for a run. `timeout` overrides
    the default run time limit.

    >>> spec = RunSpec(sources=("cases",), case="tpu_embedding", implementation="tf2", steps=4)
    >>> trace = run_spec(spec)  # doctest: +SKIP
    """
    from verify.runners.run import run_implementation

    options = spec.options()
    if options.device == "cpu":
        from verify.runners.capture.devices import MAX_CPU_REPLICAS, configure_cpu_replicas

        configure_cpu_replicas(max(MAX_CPU_REPLICAS, max(options.replicas)))
    case = load_cases(resolve_sources(list(spec.sources), root), options, [spec.case])[spec.case]
    return run_implementation(case, case.implementation(spec.implementation), steps=spec.steps,
                              device=spec.device, tpu_name=spec.tpu_name,
                              timeout=timeout if timeout is not None else options.run_timeout,
                              tables_every=spec.tpu_tables_every)
