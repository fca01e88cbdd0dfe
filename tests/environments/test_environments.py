"""Environments, environment processes, lazily named runners and golden references.

The environments here inherit the suite's own packages (`inherit = true`), so building one
takes a second and needs no network; the destination environments (TF 2.21, Keras 3) are
exercised by the parity suite itself.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from processes import alive

from verify.core.case import Case, Examples, Implementation
from verify.core.names import NameMap
from verify.core.trace import Trace
from verify.store.golden import golden_trace, publish_goldens, stage_golden
from verify.environments import declared as envs
from verify.runners.lazy import LazyRunnerError, lazy_runner
from verify.core.runner import RunSpec
from verify.environments.pool import EnvironmentPool

ROOT = Path(__file__).resolve().parents[2]
needs_venv_tool = pytest.mark.skipif(
    not envs.uv_binary() and not shutil.which(f"python{sys.version_info.major}."
                                              f"{sys.version_info.minor}"),
    reason="neither uv nor this Python's venv on PATH")

# A case package outside the project whose sides train a quadratic in numpy; one side kills
# its process, one hangs with the run's time limit blocked, and one reports the environment.
CASE_MODULE = '''
import os, signal, time
import numpy as np
from verify import Case, Examples, Implementation, NameMap
from verify.core.meta import current_environment


class Quadratic:
    def __init__(self, mode="train"):
        self.mode = mode

    def run(self, request):
        trace = request.trace
        w = np.asarray(request.initial_values["w"], np.float32)
        trace.record(0, "weight", "w", w.copy())
        if self.mode == "die":
            os._exit(3)
        if self.mode == "hang":
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
            time.sleep(600)
        for step in range(1, request.steps + 1):
            grad = np.float32(2) * w
            trace.record(step, "loss", "loss", np.float32((w * w).sum()))
            trace.record(step, "grad", "w", grad)
            w = w - np.float32(0.1) * grad
            trace.record(step, "weight", "w", w.copy())
        trace.meta.details["ran_in"] = current_environment()
        return trace

    def describe(self):
        return {"api": "numpy", "pid": os.getpid()}

    def declared_config(self, case, implementation):
        return {}


def side(name, environment="local", mode="train"):
    return Implementation(name, Quadratic(mode), NameMap({"w": "w"}), environment=environment)


CASE = Case(
    name="quadratic", examples=Examples({"x": np.zeros((4, 1))}, labels=np.zeros(4)),
    batch_size=2, steps=3, initial_values={"w": np.linspace(1, 2, 4, dtype=np.float32)},
    implementations=(side("old"), side("new", "sidecar"), side("dies", "sidecar", "die"),
                     side("hangs", "sidecar", "hang"), side("lost", "nowhere")),
    reference="old", pairs=(("old", "new"), ("old", "dies"), ("old", "lost")))
'''

PYPROJECT = '''
[tool.parity.environments.sidecar]
description = "the suite's packages in a process of their own"
inherit = true
variables = { PARITY_SIDECAR = "yes" }
'''


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A migration project: a case package and a pyproject.toml declaring `sidecar`; the
    environments are built under tmp_path."""
    package = tmp_path / "parity_cases"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "quadratic.py").write_text(CASE_MODULE)
    (tmp_path / "pyproject.toml").write_text(PYPROJECT)
    monkeypatch.setenv("PARITY_ENV_DIR", str(tmp_path / "envs"))
    return tmp_path


def spec(project: Path, implementation: str) -> RunSpec:
    return RunSpec(sources=(str(project / "parity_cases"),), case="quadratic",
                   implementation=implementation)


# ---- declarations ----

def test_declarations_are_read_from_pyproject(project):
    declared = envs.declared_environments(project / "pyproject.toml")
    sidecar = declared["sidecar"]
    assert sidecar.inherit and sidecar.variables == {"PARITY_SIDECAR": "yes"}
    assert sidecar.requirements == ()


@pytest.mark.parametrize("table, message", [
    ("[tool.parity.environments.local]\n", "suite's own environment"),
    ("[tool.parity.environments.x]\nrequirement = ['a']\n", "unknown keys \\['requirement'\\]"),
    ("[tool.parity.environments.x]\nrequirements = 'tensorflow'\n", "list of pip requirement"),
    ("[tool.parity.environments.x]\ninherit = 'yes'\n", "inherit is true or false"),
])
def test_a_bad_declaration_says_what_is_wrong(tmp_path, table, message):
    path = tmp_path / "pyproject.toml"
    path.write_text(table)
    with pytest.raises(ValueError, match=message):
        envs.declared_environments(path)


def test_the_directory_is_named_by_requirements_not_variables():
    a = envs.DeclaredEnvironment("a", ("numpy==2.4.6",), variables={"KERAS_BACKEND": "jax"})
    b = envs.DeclaredEnvironment("b", ("numpy==2.4.6",), variables={"KERAS_BACKEND": "tf"})
    c = envs.DeclaredEnvironment("c", ("numpy==2.4.5",))
    assert a.directory(Path("/c")) == b.directory(Path("/c")) != c.directory(Path("/c"))


# ---- lazily named runners ----

def test_a_lazy_runner_imports_its_module_only_when_used(tmp_path, monkeypatch):
    (tmp_path / "side_module.py").write_text(
        "import sys\nsys.modules[__name__].imported = True\n"
        "class Runner:\n    def __init__(self, lr): self.lr = lr\n"
        "    def run(self, request): return 'ran'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    runner = lazy_runner("side_module:Runner", lr=0.5)
    assert "side_module" not in sys.modules
    assert repr(runner) == "lazy_runner('side_module:Runner', lr=0.5)"
    assert runner.run(None) == "ran" and runner.lr == 0.5   # built with its arguments
    assert "side_module" in sys.modules


def test_every_shipped_case_imports_without_tensorflow():
    """The parent process and every environment's process load every case module: none may
    import TensorFlow, tfrs or Keras at import time (their sides are named lazily)."""
    code = ("import sys; from verify.runners.case_sources import load_cases, resolve_sources; "
            "from verify.core.case import SuiteOptions; "
            "cases = load_cases(resolve_sources(['cases'], root=__import__('pathlib').Path('.')),"
            " SuiteOptions()); "
            "heavy = sorted(m for m in sys.modules if m.split('.')[0] in "
            "('tensorflow', 'tensorflow_recommenders', 'keras', 'tf_keras', 'keras_rs', 'jax'));"
            "print(len(cases), heavy)")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    count, heavy = done.stdout.strip().split(" ", 1)
    assert int(count) >= 6 and heavy == "[]", done.stdout


def test_a_lazy_runner_that_cannot_be_built_says_where_it_runs():
    with pytest.raises(LazyRunnerError, match="Implementation\\(environment=...\\)"):
        lazy_runner("no_such_module_here:runner").resolve()
    with pytest.raises(LazyRunnerError, match="has no attribute 'nope'"):
        lazy_runner("os.path:nope").resolve()
    with pytest.raises(ValueError, match="module:attribute"):
        lazy_runner("os.path.join")


# ---- building ----

@needs_venv_tool
def test_an_environment_is_built_once_and_reused(project):
    sidecar = envs.declared_environments(project / "pyproject.toml")["sidecar"]
    lines = []
    built = envs.ensure(sidecar, progress=lines.append)
    assert built.built_now and built.python.exists()
    assert any("building environment sidecar" in line for line in lines)
    assert envs.stamp_of(sidecar)["name"] == "sidecar"
    again = envs.ensure(sidecar, progress=lines.append)
    assert not again.built_now and again.directory == built.directory
    assert envs.remove(sidecar) == built.directory and not built.directory.exists()


def tiny_wheel(directory: Path) -> Path:
    """A wheel of one pure-Python package (`parity_tiny`), made here: installed offline."""
    import base64
    import hashlib
    import zipfile

    files = {"parity_tiny/__init__.py": "VALUE = 7\n",
             "parity_tiny-0.1.dist-info/METADATA": "Metadata-Version: 2.1\nName: parity-tiny\n"
                                                   "Version: 0.1\n",
             "parity_tiny-0.1.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: tests\n"
                                                "Root-Is-Purelib: true\nTag: py3-none-any\n"}
    def digest(text: str) -> str:
        raw = hashlib.sha256(text.encode()).digest()
        return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()

    record = [f"{name},sha256={digest(text)},{len(text.encode())}" for name, text in files.items()]
    files["parity_tiny-0.1.dist-info/RECORD"] = "\n".join(
        [*record, "parity_tiny-0.1.dist-info/RECORD,,"]) + "\n"
    wheel = directory / "parity_tiny-0.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for name, text in files.items():
            archive.writestr(name, text)
    return wheel


def compiled(directory: Path, module: str) -> list[Path]:
    """The bytecode files of `module`'s package in an environment's site-packages."""
    return list(directory.glob(f"lib/python*/site-packages/{module}/__pycache__/*.pyc"))


@needs_venv_tool
@pytest.mark.parametrize("installer", ["uv", "venv + pip"])
def test_an_environment_is_built_with_its_packages_bytecode(tmp_path, monkeypatch, installer):
    """Compiled once when it is built: with PYTHONDONTWRITEBYTECODE set, nothing else would
    ever cache it, and each process start would compile every module it imports again."""
    if installer == "venv + pip":
        monkeypatch.setattr(envs, "uv_binary", lambda: None)
    elif not envs.uv_binary():
        pytest.skip("uv is not installed")
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    monkeypatch.setenv("UV_OFFLINE", "1")
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    declared = envs.DeclaredEnvironment("tiny", (str(tiny_wheel(tmp_path)),), inherit=True)
    built = envs.ensure(declared, tmp_path / "envs", progress=lambda line: None)
    assert compiled(built.directory, "parity_tiny"), "the package's bytecode was not compiled"
    assert envs.stamp_of(declared, tmp_path / "envs")["bytecode"] is True
    done = subprocess.run([str(built.python), "-c", "import parity_tiny; print(parity_tiny.VALUE)"],
                          capture_output=True, text=True)
    assert done.stdout.strip() == "7", done.stderr


def test_an_environment_built_without_bytecode_is_compiled_once_on_first_use(project):
    """An environment built before the build compiled bytecode (its stamp does not say so) is
    compiled on its next use, its stamp marked; the use after that compiles nothing."""
    sidecar = envs.declared_environments(project / "pyproject.toml")["sidecar"]
    built = envs.ensure(sidecar, progress=lambda line: None)
    stamp = built.directory / envs.STAMP
    older = {k: v for k, v in envs.stamp_of(sidecar).items() if k != "bytecode"}
    stamp.write_text(json.dumps(older))
    package = next(built.directory.glob("lib/python*/site-packages")) / "parity_older"
    package.mkdir()
    (package / "__init__.py").write_text("VALUE = 1\n")
    lines = []
    again = envs.ensure(sidecar, progress=lines.append)
    assert not again.built_now and again.directory == built.directory
    assert compiled(built.directory, "parity_older") and envs.stamp_of(sidecar)["bytecode"]
    assert [line for line in lines if "compiling the bytecode" in line]
    assert not list(built.directory.glob(envs.STAMP + ".*")), "a partial stamp was left"
    lines.clear()
    envs.ensure(sidecar, progress=lines.append)
    assert lines == [], "a marked environment was compiled again"


def test_an_environment_whose_bytecode_cannot_be_compiled_is_used_as_it_is(project,
                                                                          monkeypatch):
    """A shared cache this user cannot write (its build lock cannot be opened): the environment
    built before still runs, and a progress line says why it was not compiled."""
    sidecar = envs.declared_environments(project / "pyproject.toml")["sidecar"]
    built = envs.ensure(sidecar, progress=lambda line: None)
    stamp = built.directory / envs.STAMP
    stamp.write_text(json.dumps({k: v for k, v in envs.stamp_of(sidecar).items()
                                 if k != "bytecode"}))

    def unwritable(path, name, progress):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(envs, "_locked", unwritable)
    lines = []
    again = envs.ensure(sidecar, progress=lines.append)
    assert again.directory == built.directory and again.python.exists()
    assert any("could not be compiled" in line and "Permission denied" in line
               for line in lines), lines
    assert "bytecode" not in envs.stamp_of(sidecar)


@needs_venv_tool
def test_a_pin_that_does_not_resolve_fails_with_the_installers_words(tmp_path, monkeypatch):
    monkeypatch.setenv("UV_OFFLINE", "1")           # no network needed to fail
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    broken = envs.DeclaredEnvironment("broken", ("parity-no-such-package==0.0.1",))
    with pytest.raises(envs.EnvironmentBuildError, match="(?s)environment broken could not be "
                                                          "built.*parity-no-such-package"):
        envs.ensure(broken, tmp_path, progress=lambda line: None)
    assert not broken.directory(tmp_path).exists()   # nothing half-built is left to reuse


# ---- environment processes ----

def _pool(project: Path, **kw) -> EnvironmentPool:
    return EnvironmentPool(envs.declared_environments(project / "pyproject.toml"),
                      sources=(str(project / "parity_cases"),), progress=lambda line: None,
                      **kw)


@pytest.mark.slow
@needs_venv_tool
def test_an_environment_process_runs_an_implementation_in_its_environment(project):
    pool = _pool(project)
    try:
        first = pool.run(spec(project, "new"), "sidecar", timeout=60)
        second = pool.run(spec(project, "new"), "sidecar", timeout=60)
    finally:
        pool.close()
    assert first.error is None, first.error
    assert first.meta.environment.name == "sidecar" and first.meta.details["ran_in"] == "sidecar"
    assert first.meta.runner["pid"] != os.getpid()
    assert second.meta.runner["pid"] == first.meta.runner["pid"]   # one process, reused
    np.testing.assert_array_equal(first.get(3, "weight", "w"), second.get(3, "weight", "w"))
    assert not alive(first.meta.runner["pid"])                    # closed with the pool
    assert not list((project / "envs" / "logs").glob("environment-sidecar-*.log"))   # ended well


@pytest.mark.slow
@needs_venv_tool
def test_an_environment_process_that_dies_is_reported_and_replaced(project):
    pool = _pool(project)
    try:
        died = pool.run(spec(project, "dies"), "sidecar", timeout=60)
        after = pool.run(spec(project, "new"), "sidecar", timeout=60)
    finally:
        pool.close()
    assert died.error.startswith("EnvironmentProcessDied: the process of environment sidecar "
                                 "exited while running quadratic:dies (exit code 3)")
    assert "the last lines of its log" in died.error
    assert after.error is None


@pytest.mark.slow
@needs_venv_tool
def test_an_environment_process_that_hangs_is_stopped_and_leaves_no_process(project):
    pool = _pool(project, grace=2)
    started = time.monotonic()
    try:
        pool.run(spec(project, "new"), "sidecar", timeout=60)
        pid = pool.processes["sidecar"].process.pid
        hung = pool.run(spec(project, "hangs"), "sidecar", timeout=1)
    finally:
        pool.close()
    assert "stopped answering while running quadratic:hangs for 3 s and was stopped" \
        in hung.error
    assert time.monotonic() - started < 60
    assert not alive(pid)


def test_an_environment_that_is_not_declared_fails_only_its_runs(project):
    pool = _pool(project)
    trace = pool.run(spec(project, "lost"), "nowhere", timeout=60)
    assert trace.error.startswith("UnknownEnvironment: implementation lost of case quadratic "
                                  "runs in environment 'nowhere', which is not declared; "
                                  "declared: sidecar")
    assert trace.meta.environment.name == "nowhere"


@pytest.mark.slow
@needs_venv_tool
def test_the_parity_suite_runs_sides_in_their_environments(project):
    """End to end through pytest: the pair in `sidecar` passes and shows where each side
    ran; the dying environment process and the undeclared environment fail their pairs only; --env
    restricts the run to pairs whose candidate runs in the environments named."""
    command = [sys.executable, "-m", "pytest", "-p", "verify.session.plugin", "-p", "no:cacheprovider",
               "-p", "no:benchmark", str(ROOT / "verify" / "test_parity.py"),
               "--cases", "parity_cases", "--report-dir", "reports", "-q",
               "--rootdir", str(project)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(command, cwd=project, capture_output=True, text=True, env=env)
    assert done.returncode == 1, done.stdout + done.stderr
    summary = (project / "reports" / "summary.md").read_text()
    pairs = pd.read_csv(project / "reports" / "summary.csv").set_index("candidate")
    assert pairs.loc["new", "verdict"] == "PASS"
    assert re.fullmatch(r"local \(TF [\d.]+\) → sidecar \(TF [\d.]+\)",
                        pairs.loc["new", "environments"]), pairs.loc["new", "environments"]
    page = (project / "reports" / "report.html").read_text()
    assert "<th>environments</th>" in page and re.search(r"local \(TF [\d.]+\) → sidecar", page)
    assert "Environment: tensorflow" in summary
    assert "EnvironmentProcessDied" in summary and "UnknownEnvironment" in summary
    assert re.search(r"Other environments \(where each pair's sides ran: summary.csv's "
                     r"environments column, report.html's overview\): nowhere, sidecar "
                     r"\(TF [\d.]+\)\.", summary), summary
    only = subprocess.run(command + ["--env", "sidecar", "-k", "new"], cwd=project,
                          capture_output=True, text=True, env=env)
    assert only.returncode == 0, only.stdout + only.stderr
    assert "1 passed" in only.stdout
    unknown = subprocess.run(command + ["--env", "tf999"], cwd=project, capture_output=True,
                             text=True, env=env)
    assert unknown.returncode == 4 and "--env tf999: not declared" in unknown.stderr


# ---- golden references ----

def _case(initial=1.0, steps=3) -> Case:
    sides = (Implementation("old", None, NameMap({"w": "w"})),
             Implementation("new", None, NameMap({"w": "w"})))
    return Case("demo", Examples({"x": np.zeros((2, 1))}, labels=np.zeros(2)), 1, steps,
                {"w": np.full(2, initial, np.float32)}, sides, "old")


def _trace(case: Case) -> Trace:
    trace = Trace("old", {"case": case.name, "implementation": "old", "steps": case.steps,
                          "data_digest": case.data_digest()})
    trace.record(1, "loss", "loss", np.float32(0.5))
    return trace


def test_a_golden_is_read_back_for_the_case_it_was_stored_for(tmp_path):
    case = _case()
    stage_golden(tmp_path / "staged", case, case.implementation("old"), _trace(case), 3)
    assert publish_goldens(tmp_path / "staged", tmp_path / "golden") == [tmp_path / "golden" /
                                                                         "demo"]
    assert (tmp_path / "golden" / "demo" / "case.json").is_file()
    trace = golden_trace(tmp_path / "golden", case, case.implementation("old"), 3)
    assert trace.error is None and float(trace.get(1, "loss", "loss")) == 0.5


@pytest.mark.parametrize("change, message", [
    (dict(case=_case(initial=2.0)), "the case's data or initial values changed"),
    (dict(steps=5), "it was stored for 3 steps, this run trains 5"),
    (dict(names=NameMap({"w": "dense/w"})), "the name map of old changed"),
])
def test_a_golden_that_no_longer_matches_says_what_changed(tmp_path, change, message):
    case = _case()
    stage_golden(tmp_path / "staged", case, case.implementation("old"), _trace(case), 3)
    publish_goldens(tmp_path / "staged", tmp_path / "golden")
    now = change.get("case", case)
    implementation = now.implementation("old")
    if "names" in change:
        implementation = Implementation("old", None, change["names"])
    trace = golden_trace(tmp_path / "golden", now, implementation, change.get("steps", 3))
    assert trace.error.startswith("GoldenMismatch: the golden") and message in trace.error
    assert "--save-golden" in trace.error


def test_a_missing_golden_fails_saying_how_to_record_it(tmp_path):
    case = _case()
    trace = golden_trace(tmp_path, case, case.implementation("old"), 3)
    assert trace.error.startswith("GoldenMissing:") and "--save-golden" in trace.error


def test_without_uv_an_environment_is_built_with_venv_and_pip(tmp_path, monkeypatch):
    monkeypatch.setattr(envs, "uv_binary", lambda: None)
    lines = []
    built = envs.ensure(envs.DeclaredEnvironment("plain", inherit=True), tmp_path, lines.append)
    assert "with venv + pip" in lines[0] and built.python.exists()
    assert envs.stamp_of(built.declared, tmp_path)["installer"] == "venv + pip"
    done = subprocess.run([str(built.python), "-c", "import numpy, sys; print(sys.prefix)"],
                          capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip() == str(built.directory)


def test_an_environment_process_gets_the_verify_package_alone_on_its_path(project):
    """Not the directory the suite is installed in: for an installed suite that is
    site-packages, whose TensorFlow would shadow the environment's own."""
    import verify

    pool = _pool(project)
    try:
        (suite_dir,) = pool.pythonpath
        entries = list(Path(suite_dir).iterdir())
        assert [e.name for e in entries] == ["verify"]
        assert entries[0].resolve() == Path(verify.__file__).resolve().parent
    finally:
        pool.close()
    assert not Path(suite_dir).exists()
