"""Cases from anywhere (`--cases`), a run asked for by name from another process
(`python -m verify run`), and one judge: `python -m verify compare` on kept traces gives the
verdict, preflight findings and attribution of the pytest run that kept them."""
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest

from verify.__main__ import main
from verify.runners.case_sources import CaseSourceError, load_cases, resolve_sources
from verify.core.case import SuiteOptions
from verify.core.trace import Trace

ROOT = Path(__file__).resolve().parents[2]

# A migration repository's own case, outside this project: a quadratic trained by numpy, an
# oracle, sides that declare their configuration (one declares a different learning rate and
# trains with it), and a control that a step-1 gradient mistake must be caught by.
CASE_MODULE = '''
import numpy as np

from verify import Case, Examples, Expectation, Implementation, NameMap, Tolerance, Tolerances
from parity_cases.quadratic_model import train


class QuadraticRunner:
    def __init__(self, lr=0.1, grad_offset=0.0):
        self.lr, self.grad_offset = lr, grad_offset

    def run(self, request):
        return train(request, self.lr, self.grad_offset)

    def describe(self):
        return {"api": "numpy"}

    def declared_config(self, case, implementation):
        return {"optimizer/model/kind": "sgd", "optimizer/model/learning_rate": self.lr}


def side(name, expect=None, **kw):
    return Implementation(name, QuadraticRunner(**kw), NameMap({"w": "w"}), expect=expect)


CASE = Case(
    name="quadratic", examples=Examples({"x": np.zeros((4, 1))}, labels=np.zeros(4)),
    batch_size=2, steps=3, initial_values={"w": np.linspace(1, 2, 4, dtype=np.float32)},
    implementations=(side("old"), side("new"), side("oracle"), side("new-lr", lr=0.100001),
                     side("control-grad", Expectation(1, "grad", why="offset"), grad_offset=0.5)),
    reference="old", oracle="oracle", seed=5,
    pairs=(("old", "new"), ("old", "new-lr"), ("old", "control-grad")),
    tolerances=Tolerances.default().override(weight=Tolerance(1e-5, 1e-5)))
'''

MODEL_MODULE = '''
import numpy as np


def train(request, lr, grad_offset):
    trace = request.trace
    w = np.asarray(request.initial_values["w"], np.float32)
    trace.record(0, "weight", "w", w)
    for step in range(1, request.steps + 1):
        grad = (w + grad_offset).astype(np.float32)
        trace.record(step, "loss", "loss", np.float32((w ** 2).sum() / 2))
        trace.record(step, "grad", "w", grad)
        w = (w - np.float32(lr) * grad).astype(np.float32)
        trace.record(step, "weight", "w", w)
    return trace
'''


@pytest.fixture
def outside(tmp_path):
    """A directory outside the project holding a case package, as a migration repo would."""
    package = tmp_path / "migration_repo" / "parity_cases"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "quadratic.py").write_text(textwrap.dedent(CASE_MODULE))
    (package / "quadratic_model.py").write_text(textwrap.dedent(MODEL_MODULE))
    return package


def test_sources_resolve_by_kind_and_bad_ones_say_what_to_pass(tmp_path, outside):
    kinds = [s.kind for s in resolve_sources(
        [str(outside), str(outside / "quadratic.py"), "cases", "json"], root=ROOT)]
    assert kinds == ["package", "file", "package", "module"]
    plain = tmp_path / "plain"
    plain.mkdir()
    assert resolve_sources([str(plain)])[0].kind == "directory"
    with pytest.raises(CaseSourceError, match="no such directory, .py file or module name"):
        resolve_sources([str(tmp_path / "missing")])


def test_a_module_that_fails_to_import_names_the_source(tmp_path):
    broken = tmp_path / "broken_cases"
    broken.mkdir()
    (broken / "bad.py").write_text("raise ImportError('no module named tensorflow_rs')\n")
    with pytest.raises(CaseSourceError, match="importing bad failed: ImportError: no module"):
        load_cases(resolve_sources([str(broken)]))


def test_a_case_package_is_that_case_alone_and_a_package_of_cases_is_every_module(tmp_path):
    # a case package declares its case in __init__; its submodules are its code, some of them
    # importable only in another environment (keras-rs): `--cases pkg.case_a` must not import
    # them (it did, and every pair of the case failed at import)
    package = tmp_path / "cases_pkg_under_test"
    (package / "case_a").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "case_a" / "__init__.py").write_text("CASES = []\n")
    (package / "case_a" / "keras_rs_side.py").write_text(
        "raise ImportError('No module named keras_rs')\n")
    (package / "case_b.py").write_text("CASES = []\n")
    sys.path.insert(0, str(tmp_path))
    try:
        broken = {}
        [source] = resolve_sources(["cases_pkg_under_test.case_a"], root=tmp_path)
        assert [m.__name__ for m in source.modules(broken)] == ["cases_pkg_under_test.case_a"]
        assert broken == {}
        [source] = resolve_sources([str(package)])
        names = [m.__name__ for m in source.modules(broken)]
        assert names == ["cases_pkg_under_test", "cases_pkg_under_test.case_a",
                         "cases_pkg_under_test.case_b"] and broken == {}
    finally:
        sys.path.remove(str(tmp_path))
        for name in [n for n in sys.modules if n.startswith("cases_pkg_under_test")]:
            del sys.modules[name]


def test_a_case_package_named_like_an_imported_module_is_refused(tmp_path):
    clash = tmp_path / "json"
    clash.mkdir()
    (clash / "__init__.py").write_text("")
    with pytest.raises(CaseSourceError, match="already imported"):
        load_cases(resolve_sources([str(clash)]))


@pytest.mark.slow
def test_cases_outside_the_project_run_and_compare_gives_the_runs_judgement(outside, tmp_path):
    reports = tmp_path / "reports"
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "verify/", "--cases", str(outside), "--keep-traces",
         "--report-dir", str(reports), "-p", "no:cacheprovider", "-p", "no:benchmark", "-q"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-2000:]
    summary = pd.read_csv(reports / "summary.csv", keep_default_na=False)
    verdicts = dict(zip(summary["candidate"], summary["verdict"]))
    # new-lr trains within float noise of old but declares another learning rate: FAIL
    assert verdicts == {"new": "PASS", "new-lr": "FAIL", "control-grad": "CAUGHT"}
    kept = reports / "traces" / "quadratic"
    preflight = pd.read_csv(reports / "preflight.csv", dtype=str, keep_default_na=False)
    for pair in summary.itertuples(index=False):
        out = tmp_path / f"compare-{pair.candidate}"
        code = main(["compare", str(kept / pair.reference), str(kept / pair.candidate),
                     "--out", str(out)])
        again = pd.read_csv(out / "summary.csv", keep_default_na=False).iloc[0]
        assert code == (0 if pair.verdict in ("PASS", "CAUGHT") else 1)
        for column in ("verdict", "message", "preflight", "attribution", "first_quantity"):
            assert again[column] == getattr(pair, column), (pair.candidate, column)
        for column in ("first_step", "margin"):   # numbers; '' where there is none
            mine, theirs = again[column], getattr(pair, column)
            assert (mine == theirs == "") or float(mine) == float(theirs), (column, mine, theirs)
        mine = pd.read_csv(out / "preflight.csv", dtype=str, keep_default_na=False)
        theirs = preflight[preflight["candidate"] == pair.candidate].reset_index(drop=True)
        pd.testing.assert_frame_equal(mine, theirs)
    assert "learning_rate" in summary.set_index("candidate").loc["new-lr", "message"]
    assert "control-grad departs from the oracle at step 1" in summary.set_index(
        "candidate").loc["control-grad", "attribution"]


@pytest.mark.slow
def test_a_run_asked_for_by_name_in_another_process(outside, tmp_path):
    spec = {"sources": [str(outside)], "case": "quadratic", "implementation": "new", "steps": 2}
    result = subprocess.run(
        [sys.executable, "-m", "verify", "run", "-", "--out", str(tmp_path / "new")],
        input=json.dumps(spec), cwd=tmp_path, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT), "PARITY_MAX_CPU_REPLICAS": "1",
             "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert result.returncode == 0, result.stderr[-2000:]
    trace = Trace.load(tmp_path / "new.json")
    assert trace.meta.case == "quadratic" and trace.meta.steps == 2
    assert trace.meta.declared_config["optimizer/model/learning_rate"] == 0.1
    assert sorted(trace.steps()) == [1, 2]
    bad = subprocess.run([sys.executable, "-m", "verify", "run", "-", "--out", "x"],
                         input=json.dumps({**spec, "case": "nope"}), cwd=tmp_path,
                         capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert bad.returncode == 2 and "unknown case(s) ['nope']" in bad.stderr


def test_suite_options_reach_a_case_function(tmp_path):
    source = tmp_path / "optioned.py"
    source.write_text(textwrap.dedent('''
        import numpy as np
        from verify import Case, Examples, Implementation, NameMap

        def cases(options):
            return [Case(name=f"steps{options.steps}", steps=options.steps or 1,
                         examples=Examples({"x": np.zeros(2)}, labels=np.zeros(2)),
                         batch_size=1, initial_values={}, reference="a",
                         implementations=(Implementation("a", None, NameMap({})),))]
    '''))
    found = load_cases(resolve_sources([str(source)]), SuiteOptions(steps=7))
    assert list(found) == ["steps7"]


@pytest.mark.slow   # pytest in a subprocess (it stops before any case loads: a few seconds)
def test_the_suite_without_cases_where_there_are_none_stops_and_says_to_pass_them(tmp_path):
    # run from a repository with no cases/ (an editable install can make the suite's own
    # shipped `cases` importable, which then ran its 179 pairs instead)
    done = subprocess.run([sys.executable, "-m", "verify", "suite", "-p", "no:cacheprovider"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 4, done.stdout + done.stderr
    assert "no --cases given" in done.stderr and "--cases parity_cases" in done.stderr
    assert not (tmp_path / "reports").exists()
