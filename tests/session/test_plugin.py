"""The plugin end to end, on a throwaway case trained by numpy (no TensorFlow): progress lines,
nothing lost when a case raises or an xdist worker dies, identical drift.csv for identical
runs, the run history and --compare-to, --keep-traces re-compared by the CLI."""
import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from verify.__main__ import main

from toy_training import write_toy_project

pytestmark = pytest.mark.slow   # runs pytest sessions in subprocesses

ROOT = Path(__file__).resolve().parents[2]
# the project and tests/ (the throwaway case modules import toy_training)
PYTHONPATH = os.pathsep.join((str(ROOT), str(ROOT / "tests")))

CASES = '''
"""A throwaway case: a quadratic trained by numpy, with a drifting, a raising and a crashing
candidate. TINY_DRIFT sets the drifting candidate's offset; TINY_CRASH=1 makes the crashing
candidate kill its process."""
import os

import numpy as np

from verify.core.case import Case, Examples, Implementation
from verify.core.names import NameMap
from verify.core.tolerances import Tolerance, Tolerances
from verify.core.trace import Trace

from toy_training import record_toy_steps


class NumpyRunner:
    uses_tensorflow = False   # numpy only: no TensorFlow state to start fresh

    def __init__(self, behaviour=""):
        self.behaviour = behaviour

    def run(self, request):
        if self.behaviour == "crash" and os.environ.get("TINY_CRASH") == "1":
            os._exit(3)
        if self.behaviour == "raise":
            raise RuntimeError("the throwaway runner fails on purpose")
        drift = float(os.environ.get("TINY_DRIFT", "0")) if self.behaviour == "drift" else 0.0
        trace = Trace(request.implementation.name, {"replicas": 1})
        return record_toy_steps(trace, request.initial_values["w"], request.steps, drift)

    def describe(self):
        return {"runner": "numpy"}

    def declared_config(self, case, implementation):
        return {}


def implementation(name, behaviour=""):
    return Implementation(name, NumpyRunner(behaviour), NameMap({"w": "w"}))


CASE = Case(
    name="tiny", examples=Examples({"x": np.zeros((4, 1))}, labels=np.zeros(4)),
    batch_size=2, steps=4, initial_values={"w": np.linspace(1, 2, 4, dtype=np.float32)},
    implementations=(implementation("ref"), implementation("good"),
                     implementation("drifting", "drift"), implementation("raises", "raise"),
                     implementation("crashes", "crash")),
    reference="ref", seed=11,
    tolerances=Tolerances.default().override(loss=Tolerance(1e-2, 1e-2),
                                             grad=Tolerance(1e-2, 1e-2),
                                             weight=Tolerance(1e-2, 1e-2)))


def load_cases(names=None, options=None):
    return {CASE.name: CASE}
'''



@pytest.fixture
def project(tmp_path):
    return write_toy_project(tmp_path, CASES)


def run_suite(project, *args, **env) -> subprocess.CompletedProcess:
    environment = {**os.environ, "PYTHONPATH": PYTHONPATH, **env}
    return subprocess.run([sys.executable, "-m", "pytest", "test_tiny.py", "-p", "verify.session.plugin",
                           "-p", "no:cacheprovider", "-p", "no:benchmark", "-p", "no:randomly",
                           *args], cwd=project, env=environment, capture_output=True, text=True,
                          timeout=300)


def test_a_dead_worker_and_a_raising_case_still_give_a_report(project):
    result = run_suite(project, "-n", "2", TINY_CRASH="1", TINY_DRIFT="1e-6")
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-2000:]
    assert "crashed while running" in result.stdout
    reports = project / "reports"
    summary = (reports / "summary.md").read_text()
    assert summary.startswith("## Parity: INCOMPLETE (3 of 4 pairs judged: 1 fail, 2 pass)")
    assert "### 1 test left no result" in summary and "ref-vs-crashes" in summary
    assert "raises" in summary and "RuntimeError: the throwaway runner fails on purpose" in summary
    drift = gzip.decompress((reports / "drift.csv.gz").read_bytes()).decode()
    assert ",good," in drift and ",drifting," in drift
    assert (reports / "report.html").stat().st_size > 10_000
    assert [p.name for p in (reports / "history").iterdir()] == [
        json.loads((reports / "run.json").read_text())["run_id"] + ".json"]
    # the progress lines: one per finished pair, with the elapsed time
    progress = [line for line in result.stdout.splitlines() if line.startswith("parity ")]
    assert sum(" PASS " in line for line in progress) == 2, progress
    assert any(line.startswith("parity LOST") for line in progress)


def test_history_compare_to_and_kept_traces(project, capsys):
    reports = project / "reports"
    first = run_suite(project, "-k", "good or drifting", "--keep-traces", TINY_DRIFT="1e-7")
    assert first.returncode == 0, first.stdout[-3000:]
    progress = [line for line in first.stdout.splitlines() if line.startswith("parity ")]
    assert len(progress) == 2 and progress[0].startswith("parity   1 [")
    assert "; ran ref " in progress[0] and "; ran ref " not in progress[1]   # ref runs once
    drift_first = (reports / "drift.csv.gz").read_bytes()
    record_first = json.loads((reports / "run.json").read_text())
    assert record_first["provenance"]["seeds"] == {"tiny": 11}
    assert record_first["provenance"]["git_commit"] is None   # not a git checkout

    # kept traces re-compared without the case module give the same rows
    assert main(["report", str(reports), "--recompare", "--out", str(project / "again")]) == 0
    assert (project / "again" / "drift.csv.gz").read_bytes() == drift_first

    second = run_suite(project, "-k", "good or drifting", "--compare-to", "reports/history",
                       TINY_DRIFT="1e-7")
    assert second.returncode == 0
    assert (reports / "drift.csv.gz").read_bytes() == drift_first     # identical runs, same file
    assert not (reports / "traces").exists()    # traces of the earlier run are not left behind
    summary = (reports / "summary.md").read_text()
    assert summary.splitlines()[0].endswith("· no regression"), summary
    assert f"Since run {record_first['run_id']}" in summary

    third = run_suite(project, "-k", "good or drifting", "--compare-to", "reports/history",
                      TINY_DRIFT="5e-3")
    assert third.returncode == 0       # still within the case's tolerance...
    summary = (reports / "summary.md").read_text()
    assert "regression" in summary.splitlines()[0] and "worst max abs" in summary  # ...but grown
    assert "REGRESSION tiny: ref → drifting (x1): loss worst max abs" in third.stdout

    fourth = run_suite(project, "-k", "good or drifting", "--compare-to", "reports/history",
                       TINY_DRIFT="0.5")
    assert fourth.returncode == 1
    assert "tiny: ref → drifting (x1): PASS → FAIL at step 1 loss loss" in (
        reports / "summary.md").read_text()
    assert len(list((reports / "history").glob("*.json"))) == 4


def test_bad_compare_to_is_a_usage_error(project):
    result = run_suite(project, "--compare-to", "nowhere.json")
    assert result.returncode == 4
    assert "--compare-to" in result.stderr and "does not exist" in result.stderr
