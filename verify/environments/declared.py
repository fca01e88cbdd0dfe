"""The Python environments implementations run in, declared in one place and built on first use.

A project declares each environment once, in its `pyproject.toml`::

    [tool.parity.environments.tf221]
    description = "TF 2.21 + tf_keras + tensorflow-recommenders 0.7.7"
    python = "3.11"
    requirements = ["tensorflow==2.21.0", "tf-keras==2.21.0", "tensorflow-recommenders==0.7.7",
                    "numpy==2.4.6", "pandas==3.1.1"]
    variables = { TF_USE_LEGACY_KERAS = "1" }

(`inherit = true` builds an environment that also sees the suite's own packages: the suite's
TensorFlow under other variables, say.) An implementation names it: `Implementation(..., environment="tf221")`. "local" is the
suite's own environment (the one running it) and is never declared.

Each environment is created on first use under a cache directory (`PARITY_ENV_DIR`, default
`~/.cache/tf-migration-parity/environments`) with `uv` where it is on PATH, else `venv` + pip,
in a directory named by a digest of its Python and requirements: it is reused while they are
unchanged, and a changed pin builds a new one (the old one stays until `envs remove`). Declarations that differ only in `variables`
(e.g. `KERAS_BACKEND`) share one directory. A build is locked against other processes (pytest
workers) building the same directory; a directory counts only once its stamp is written last.
Its packages' bytecode is compiled once, when it is built (`verify.environments.bytecode`);
an environment built before that is compiled on first use.

>>> env = DeclaredEnvironment("demo", requirements=("numpy==2.4.6",), python="3.11")
>>> env.key == DeclaredEnvironment("other", requirements=("numpy==2.4.6",), python="3.11").key
True
"""
from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import tomllib
from pathlib import Path
from typing import Iterator, Mapping

from verify.core.meta import SUITE_ENVIRONMENT
from verify.environments import bytecode

STAMP = ".parity-environment.json"   # written last: the directory is complete
PROGRESS_EVERY = 20.0                 # seconds between progress lines while a build runs
MAX_LOG = 3000                        # characters of a failed install's output kept


class EnvironmentUnavailable(RuntimeError):
    """An environment an implementation needs cannot be used; the message says why."""


class UnknownEnvironment(EnvironmentUnavailable):
    """An implementation names an environment nobody declared."""


class EnvironmentBuildError(EnvironmentUnavailable):
    """An environment could not be created (a pin that does not resolve, no network, no such
    Python); the message holds the installer's own words."""


@dataclasses.dataclass(frozen=True)
class DeclaredEnvironment:
    """One environment as a project declares it."""

    name: str
    requirements: tuple[str, ...] = ()
    python: str = f"{sys.version_info.major}.{sys.version_info.minor}"
    variables: Mapping[str, str] = dataclasses.field(default_factory=dict)
    description: str = ""
    # True: the environment also sees the suite's own packages (a venv with system site
    # packages): the suite's TensorFlow with other variables, or a few packages on top.
    inherit: bool = False

    @property
    def key(self) -> str:
        """What the directory is named by: Python, requirements, inherit (not variables)."""
        doc = json.dumps({"python": self.python, "requirements": sorted(self.requirements),
                          **({"inherit": sys.prefix} if self.inherit else {})})
        return hashlib.sha256(doc.encode()).hexdigest()[:12]

    def directory(self, cache: Path) -> Path:
        """Named by `key` alone: declarations with the same Python and requirements share it."""
        return cache / f"python{self.python}-{self.key}"

    @classmethod
    def from_toml(cls, name: str, doc: Mapping) -> "DeclaredEnvironment":
        where = f"[tool.parity.environments.{name}]"
        if name == SUITE_ENVIRONMENT:
            raise ValueError(f"{where}: '{SUITE_ENVIRONMENT}' is the suite's own environment "
                             f"and cannot be declared; choose another name")
        unknown = set(doc) - {"requirements", "python", "variables", "description", "inherit"}
        if unknown:
            raise ValueError(f"{where}: unknown keys {sorted(unknown)}; an environment has "
                             f"requirements, python, variables, description and inherit")
        requirements = doc.get("requirements", [])
        if not isinstance(requirements, list) or not all(isinstance(r, str) for r in requirements):
            raise ValueError(f"{where}: requirements is a list of pip requirement strings, "
                             f"e.g. [\"tensorflow==2.21.0\"]")
        variables = doc.get("variables", {})
        if not isinstance(variables, dict):
            raise ValueError(f"{where}: variables is a table of NAME = \"value\"")
        if not isinstance(doc.get("inherit", False), bool):
            raise ValueError(f"{where}: inherit is true or false")
        return cls(name, tuple(requirements), str(doc.get("python", cls.python)),
                   {str(k): str(v) for k, v in variables.items()}, str(doc.get("description", "")),
                   doc.get("inherit", False))


def declared_environments(pyproject: Path) -> dict[str, DeclaredEnvironment]:
    """The environments `pyproject` declares under [tool.parity.environments] ({} if none or
    no such file).

    >>> declared_environments(Path("/nonexistent/pyproject.toml"))
    {}
    """
    if not pyproject.is_file():
        return {}
    try:
        doc = tomllib.loads(pyproject.read_text())
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"{pyproject} is not valid TOML: {e}") from None
    tables = doc.get("tool", {}).get("parity", {}).get("environments", {})
    return {name: DeclaredEnvironment.from_toml(name, table) for name, table in tables.items()}


def default_cache() -> Path:
    """Where environments are built: `PARITY_ENV_DIR`, else the user's cache directory."""
    given = os.environ.get("PARITY_ENV_DIR")
    if given:
        return Path(given).expanduser()
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "tf-migration-parity" / "environments"


@dataclasses.dataclass
class BuiltEnvironment:
    """An environment ready to run: its declaration, directory and interpreter."""

    declared: DeclaredEnvironment
    directory: Path
    python: Path
    built_now: bool = False
    seconds: float = 0.0


def python_of(directory: Path) -> Path:
    return directory / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def is_ready(declared: DeclaredEnvironment, cache: Path) -> bool:
    directory = declared.directory(cache)
    return (directory / STAMP).is_file() and python_of(directory).exists()


def ensure(declared: DeclaredEnvironment, cache: Path | None = None,
           progress=None) -> BuiltEnvironment:
    """The environment, built now if it is not there yet (see the module docstring).

    `progress(line)` receives progress lines (default: stderr). Raises EnvironmentBuildError
    with the installer's output when it cannot be built; nothing half-built is left to reuse.
    """
    cache = Path(cache or default_cache())
    progress = progress or _stderr
    directory = declared.directory(cache)
    if is_ready(declared, cache):
        if not bytecode.is_marked(directory / STAMP):
            _compile_built(declared, cache, directory, progress)
        return BuiltEnvironment(declared, directory, python_of(directory))
    cache.mkdir(parents=True, exist_ok=True)
    with _locked(cache / f"{directory.name}.lock", declared.name, progress):
        if is_ready(declared, cache):   # another process built it while we waited
            return BuiltEnvironment(declared, directory, python_of(directory))
        started = time.perf_counter()
        shutil.rmtree(directory, ignore_errors=True)   # an earlier, interrupted build
        installer = "uv" if uv_binary() else "venv + pip"
        progress(f"parity: building environment {declared.name} with {installer} in "
                 f"{directory} ({len(declared.requirements)} requirements; the first build "
                 f"downloads them)")
        try:
            with _ticking(progress, f"parity: still building environment {declared.name}"):
                _create(declared, directory)
            with _ticking(progress, f"parity: still compiling environment {declared.name}"):
                failed = bytecode.compile_packages(python_of(directory), directory / "lib")
            if failed:
                raise EnvironmentBuildError(f"environment {declared.name} could not be built: "
                                            f"compiling its bytecode failed ({failed})")
        except BaseException:
            shutil.rmtree(directory, ignore_errors=True)
            raise
        seconds = time.perf_counter() - started
        stamp = {"name": declared.name, "python": declared.python,
                 "requirements": list(declared.requirements), "installer": installer,
                 "seconds": round(seconds, 1), "built": time.strftime("%Y-%m-%d %H:%M:%S"),
                 "frozen": _frozen(python_of(directory)), bytecode.KEY: True}
        (directory / STAMP).write_text(json.dumps(stamp, indent=1))
        progress(f"parity: environment {declared.name} built in {seconds:.0f} s "
                 f"({_size(directory) / 1e9:.1f} GB on disk)")
        return BuiltEnvironment(declared, directory, python_of(directory), True, seconds)


def _compile_built(declared: DeclaredEnvironment, cache: Path, directory: Path,
                   progress) -> None:
    """An environment built before builds compiled its bytecode: compiled once now, under its
    build lock (another process may be doing it), its stamp marked. Where that fails (a
    shared cache this user cannot write) it is used as it is, saying why."""
    try:
        with _locked(cache / f"{directory.name}.lock", declared.name, progress):
            if bytecode.is_marked(directory / STAMP):
                return
            progress(f"parity: compiling the bytecode of environment {declared.name} once "
                     f"(built without it, each of its processes compiled every module again)")
            with _ticking(progress, f"parity: still compiling environment {declared.name}"):
                failed = bytecode.compile_packages(python_of(directory), directory / "lib")
            if not failed:
                bytecode.mark(directory / STAMP)
    except OSError as e:
        failed = str(e)
    if failed:
        progress(f"parity: environment {declared.name}: its bytecode could not be compiled "
                 f"({failed}); it is used as it is")


def stamp_of(declared: DeclaredEnvironment, cache: Path | None = None) -> dict | None:
    """What a built environment recorded when it was built (None if it is not built)."""
    path = declared.directory(Path(cache or default_cache())) / STAMP
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def remove(declared: DeclaredEnvironment, cache: Path | None = None) -> Path | None:
    """Remove the built directory of `declared` (shared with any declaration of the same
    Python and requirements); return it, or None when it was not built."""
    directory = declared.directory(Path(cache or default_cache()))
    if not directory.exists():
        return None
    shutil.rmtree(directory)
    return directory


def _create(declared: DeclaredEnvironment, directory: Path) -> None:
    interpreter = _interpreter(declared.python)
    uv = uv_binary()
    inherit = ["--system-site-packages"] if declared.inherit else []
    if declared.inherit and interpreter != sys.executable:
        raise EnvironmentBuildError(
            f"environment {declared.name} inherits the suite's packages, so it needs the "
            f"suite's Python {sys.version_info.major}.{sys.version_info.minor}, not "
            f"{declared.python}")
    if uv:
        _call([uv, "venv", "--quiet", *inherit, "--python", interpreter or declared.python,
               str(directory)], declared)
        if declared.inherit:
            _see_suite_packages(directory)
        if declared.requirements:
            _call([uv, "pip", "install", "--quiet", "--python", str(python_of(directory)),
                   *declared.requirements], declared)
        return
    if interpreter is None:
        raise EnvironmentBuildError(
            f"environment {declared.name} needs Python {declared.python}, which is not on "
            f"PATH (python{declared.python}), and uv is not installed to fetch one: install "
            f"either, or declare python = \"{sys.version_info.major}.{sys.version_info.minor}\"")
    _call([interpreter, "-m", "venv", *inherit, str(directory)], declared)
    if declared.inherit:
        _see_suite_packages(directory)
    if declared.requirements:
        _call([str(python_of(directory)), "-m", "pip", "install", "--quiet",
               "--disable-pip-version-check", *declared.requirements], declared)


def _see_suite_packages(directory: Path) -> None:
    """Let an inheriting environment see the packages of the interpreter running the suite.
    `--system-site-packages` gives the base interpreter's only: when the suite itself runs in
    a virtual environment, its site-packages are added by a `.pth` file."""
    import site

    if sys.prefix == sys.base_prefix:
        return   # not a virtual environment: the system site-packages are the suite's
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    target = directory / "lib" / version / "site-packages"
    target.mkdir(parents=True, exist_ok=True)
    (target / "parity-suite-packages.pth").write_text(
        "".join(f"{path}\n" for path in site.getsitepackages()))


def uv_binary() -> str | None:
    """uv on PATH, else the one the `uv` package installed with the suite; None without."""
    found = shutil.which("uv")
    if found:
        return found
    try:
        from uv import find_uv_bin

        return find_uv_bin()
    except (ImportError, FileNotFoundError):
        return None


def _interpreter(version: str) -> str | None:
    if version == f"{sys.version_info.major}.{sys.version_info.minor}":
        return sys.executable
    return shutil.which(f"python{version}")


def _call(command: list[str], declared: DeclaredEnvironment) -> None:
    try:
        done = subprocess.run(command, capture_output=True, text=True)
    except OSError as e:
        raise EnvironmentBuildError(f"environment {declared.name} could not be built: "
                                    f"{command[0]} failed to start: {e}") from None
    if done.returncode != 0:
        output = (done.stderr or done.stdout or "").strip()
        if len(output) > MAX_LOG:
            output = "… " + output[-MAX_LOG:]
        raise EnvironmentBuildError(
            f"environment {declared.name} could not be built: "
            f"`{' '.join([Path(command[0]).name, *command[1:3]])} …` "
            f"exited with {done.returncode}:\n{output}")


def _frozen(python: Path) -> list[str]:
    """The exact versions installed (what a report cites), best effort."""
    uv = uv_binary()
    command = ([uv, "pip", "freeze", "--python", str(python)] if uv
               else [str(python), "-m", "pip", "freeze", "--disable-pip-version-check"])
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
        return done.stdout.split() if done.returncode == 0 else []
    except (OSError, subprocess.TimeoutExpired):
        return []


def _size(directory: Path) -> int:
    return sum(f.stat().st_size for f in directory.rglob("*") if f.is_file() and not f.is_symlink())


@contextlib.contextmanager
def _locked(path: Path, name: str, progress) -> Iterator[None]:
    with open(path, "w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            progress(f"parity: waiting for another process building environment {name}")
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextlib.contextmanager
def _ticking(progress, line: str) -> Iterator[None]:
    """Say every PROGRESS_EVERY seconds that the build is still running."""
    done = threading.Event()
    started = time.perf_counter()

    def tick():
        while not done.wait(PROGRESS_EVERY):
            progress(f"{line} ({time.perf_counter() - started:.0f} s)")

    thread = threading.Thread(target=tick, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def _stderr(line: str) -> None:
    print(line, file=sys.__stderr__, flush=True)
