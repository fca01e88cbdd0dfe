"""Faults of a parity session that must never turn into a PASS for work that was not checked,
nor lose the results of other cases: an interrupted or partial run, two runs into one report
directory, a run that raises or hangs, a case module that fails to import, outputs that cannot
be written, a selection that selects nothing.

End-to-end tests run a throwaway numpy case through pytest in a subprocess (as
tests/session/test_plugin.py does); the rest call the session's parts directly.
"""
import gzip
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from toy_training import NUMPY_CONFTEST, write_toy_project

ROOT = Path(__file__).resolve().parents[2]
# the project and tests/ (the throwaway case modules import toy_training)
PYTHONPATH = os.pathsep.join((str(ROOT), str(ROOT / "tests")))

CASES = '''
"""A throwaway case: a quadratic trained by numpy. TINY_SLEEP makes every run sleep first
(seconds); `explodes` raises at step 5, `hangs` sleeps at step 3, `drifting` is far off."""
import os
import time

import numpy as np

from verify.core.case import Case, Examples, Implementation
from verify.core.names import NameMap
from verify.core.tolerances import Tolerance, Tolerances

from toy_training import record_toy_steps

EXPLOSION = ("weights exploded: max 1e9\\n"
             "  w grew 10x per step since step 2\\n"
             "  last finite loss 3.2e7 at step 4")


class NumpyRunner:
    uses_tensorflow = False   # numpy only: no TensorFlow state to start fresh

    def __init__(self, behaviour=""):
        self.behaviour = behaviour

    def run(self, request):
        time.sleep(float(os.environ.get("TINY_SLEEP", "0")))
        drift = 0.5 if self.behaviour == "drift" else 0.0
        return record_toy_steps(request.trace, request.initial_values["w"], request.steps,
                                drift, self.misbehave)

    def misbehave(self, step):
        if self.behaviour == "explode" and step == 5:
            raise AssertionError(EXPLOSION)
        if self.behaviour == "hang" and step == 3:
            time.sleep(600)

    def describe(self):
        return {"runner": "numpy"}

    def declared_config(self, case, implementation):
        return {}


def implementation(name, behaviour="", replicas=1):
    return Implementation(name, NumpyRunner(behaviour), NameMap({"w": "w"}), replicas=replicas)


CASE = Case(
    name="tiny", examples=Examples({"x": np.zeros((4, 1))}, labels=np.zeros(4)),
    batch_size=2, steps=6, initial_values={"w": np.linspace(1, 2, 4, dtype=np.float32)},
    implementations=(implementation("ref"), implementation("drifting", "drift"),
                     *(implementation(f"good{n}") for n in range(1, 9)),
                     implementation("good-x2", replicas=2), implementation("explodes", "explode"),
                     implementation("hangs", "hang")),
    reference="ref", seed=11,
    tolerances=Tolerances.default().override(loss=Tolerance(1e-2, 1e-2),
                                             grad=Tolerance(1e-2, 1e-2),
                                             weight=Tolerance(1e-2, 1e-2)))
'''

BROKEN = "import numpy as np\nraise ImportError('no module named tensorflow_rs')\n"

GOOD = "good1 or good2 or good3"     # -k: three faithful pairs that pass


@pytest.fixture
def project(tmp_path):
    return write_toy_project(tmp_path, CASES)


def suite_command(*args) -> list[str]:
    return [sys.executable, "-m", "pytest", "test_tiny.py", "-p", "verify.session.plugin",
            "-p", "no:cacheprovider", "-p", "no:benchmark", "-p", "no:randomly", *args]


def suite_env(**env) -> dict:
    return {**os.environ, "PYTHONPATH": PYTHONPATH, **env}


def run_suite(project, *args, **env) -> subprocess.CompletedProcess:
    return subprocess.run(suite_command(*args), cwd=project, env=suite_env(**env),
                          capture_output=True, text=True, timeout=300)


def output(result) -> str:
    return result.stdout[-4000:] + result.stderr[-3000:]


def wait_for(predicate, timeout=120.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def parts(reports: Path) -> list[Path]:
    return list(reports.glob("parts/*/*.pair.json"))


def headline(reports: Path) -> str:
    return (reports / "summary.md").read_text().splitlines()[0]


# ---- 1. an interrupted or partial run is INCOMPLETE, never PASS ----

def default_signals():
    """In the child: SIGINT and SIGTERM as a fresh process has them, whatever this test runner
    inherited (a background job starts with SIGINT ignored, and Python then never raises
    KeyboardInterrupt)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def start_suite(project, *args, **env) -> subprocess.Popen:
    return subprocess.Popen(suite_command(*args), cwd=project, env=suite_env(**env),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=default_signals)


@pytest.mark.slow
@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_an_interrupted_run_is_incomplete_and_lists_the_pairs_not_run(project, stop):
    """SIGINT (GitHub's cancel, a timeout) and SIGTERM (GitLab, Jenkins, Kubernetes, GitHub's
    second signal) both end the run with the pairs judged so far reported INCOMPLETE."""
    reports = project / "reports"
    # 9 faithful pairs that pass; TINY_SLEEP makes each run take a second
    process = start_suite(project, "-n", "2", "-k", "good", TINY_SLEEP="1")
    try:
        wait_for(lambda: len(parts(reports)) >= 3, what="3 judged pairs")
        process.send_signal(stop)
        stdout, stderr = process.communicate(timeout=120)
    finally:
        process.kill()
    assert process.returncode != 0, stdout[-3000:]
    record = json.loads((reports / "run.json").read_text())
    assert record["verdict"] == "INCOMPLETE", (record["verdict"], stdout[-3000:], stderr[-2000:])
    judged = len(record["pairs"])
    assert 3 <= judged < 9 and {p["verdict"] for p in record["pairs"]} == {"PASS"}
    assert len(record["not_run"]) + len(record["lost"]) == 9 - judged
    assert "interrupted" in record["stopped"].lower()
    history = json.loads((reports / "history" / f"{record['run_id']}.json").read_text())
    assert history["verdict"] == "INCOMPLETE"
    summary = (reports / "summary.md").read_text()
    assert summary.startswith(f"## Parity: INCOMPLETE ({judged} of 9 pairs judged")
    not_run = next(iter(record["not_run"]))
    assert not_run.split("[")[-1].rstrip("]") in summary     # the pairs not run are listed
    assert "parity: INCOMPLETE" in stdout


@pytest.mark.slow
def test_recomparing_the_kept_traces_of_a_stopped_run_lists_the_pairs_it_never_ran(project):
    """The traces a run kept before it stopped re-compare to what it judged, and the pairs it
    never ran are listed as not run (INCOMPLETE), not failed for want of a trace."""
    reports, again = project / "reports", project / "again"
    result = run_suite(project, "-x", "--keep-traces", "-k", "drifting or good1 or good2")
    assert result.returncode == 1, output(result)
    recompared = subprocess.run(
        [sys.executable, "-m", "verify", "report", str(reports), "--recompare", "--out",
         str(again)], cwd=project, env=suite_env(), capture_output=True, text=True, timeout=300)
    assert recompared.returncode == 1, output(recompared)
    record = json.loads((again / "run.json").read_text())
    assert record["verdict"] == "INCOMPLETE", record["verdict"]
    assert [(p["candidate"], p["verdict"]) for p in record["pairs"]] == [("drifting", "FAIL")]
    assert sorted(record["not_run"]) == ["tiny:ref-vs-good1", "tiny:ref-vs-good2"]
    assert "stopped before it" in record["not_run"]["tiny:ref-vs-good1"]
    assert headline(again).startswith("## Parity: INCOMPLETE (1 of 3 pairs judged")


@pytest.mark.slow
def test_stopping_at_the_first_failure_is_incomplete(project):
    reports = project / "reports"
    result = run_suite(project, "-x", "-k", "drifting or good1 or good2")
    assert result.returncode == 1, output(result)
    record = json.loads((reports / "run.json").read_text())
    assert record["verdict"] == "INCOMPLETE"
    assert [p["candidate"] for p in record["pairs"]] == ["drifting"]
    assert sorted(record["not_run"]) == ["test_tiny.py::test_pair[tiny:ref-vs-good1]",
                                         "test_tiny.py::test_pair[tiny:ref-vs-good2]"]
    assert headline(reports).startswith("## Parity: INCOMPLETE (1 of 3 pairs judged: 1 fail")


def test_an_incomplete_run_is_a_regression_in_history_compare():
    from verify.store.history import compare_runs

    pair = {"case": "c", "reference": "a", "candidate": "b", "replicas": 1, "role": "faithful",
            "verdict": "PASS", "first_divergence": "", "worst": {}}
    previous = {"run_id": "r1", "verdict": "PASS", "pairs": [pair, {**pair, "candidate": "d"}]}
    current = {"run_id": "r2", "verdict": "INCOMPLETE", "pairs": [pair],
               "not_run": {"t.py::test_pair[c:a-vs-d]": "not run: interrupted"},
               "stopped": "interrupted (KeyboardInterrupt)"}
    comparison = compare_runs(current, previous)
    assert not comparison.ok
    assert any("INCOMPLETE" in r and "1 selected pair" in r for r in comparison.regressions), (
        comparison.regressions)


def test_incomplete_results_are_never_pass():
    from verify.store.results import INCOMPLETE, RunResults

    results = RunResults.empty()
    results.not_run = {"t.py::test_pair[c:a-vs-b]": "not run"}
    assert results.verdict == INCOMPLETE
    results.not_run, results.stopped = {}, "interrupted (KeyboardInterrupt)"
    assert results.verdict == INCOMPLETE
    results.stopped, results.lost = "", {"t.py::test_pair[c:a-vs-b]": "worker crashed"}
    assert results.verdict == INCOMPLETE


# ---- 2. two runs into one report directory ----

@pytest.mark.slow
def test_a_second_run_into_a_busy_report_dir_refuses_and_loses_nothing(project):
    reports = project / "reports"
    first = subprocess.Popen(suite_command("-k", GOOD), cwd=project, env=suite_env(TINY_SLEEP="1"),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: len(parts(reports)) >= 1, what="the first run's first pair")
        second = run_suite(project, "-k", "good4 or good5")
        out, err = first.communicate(timeout=120)
    finally:
        first.kill()
    assert second.returncode == 4, output(second)
    refusal = second.stdout + second.stderr
    assert "another parity run" in refusal and f"pid {first.pid}" in refusal
    assert "--report-dir" in refusal                # what to do about it
    assert " PASS " not in second.stdout            # nothing ran
    assert first.returncode == 0, out[-3000:] + err[-2000:]
    record = json.loads((reports / "run.json").read_text())
    assert record["verdict"] == "PASS"
    assert sorted(p["candidate"] for p in record["pairs"]) == ["good1", "good2", "good3"]
    assert len(list((reports / "history").glob("*.json"))) == 1
    assert not (reports / ".parity.lock").exists()      # released at the end


@pytest.mark.slow
def test_a_stale_lock_of_a_dead_process_is_taken_over(project):
    reports = project / "reports"
    reports.mkdir()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()
    (reports / ".parity.lock").write_text(json.dumps({"pid": int(dead), "run_id": "old"}))
    result = run_suite(project, "-k", "good1")
    assert result.returncode == 0, output(result)
    assert headline(reports).startswith("## Parity: PASS")


def test_the_report_lock_refuses_a_second_holder_and_takes_over_a_dead_ones(tmp_path):
    from verify.store.report_dir import ReportDirBusy, ReportLock

    first = ReportLock(tmp_path)
    first.acquire("run-1")
    with pytest.raises(ReportDirBusy, match=f"pid {os.getpid()}.*run-1"):
        ReportLock(tmp_path).acquire("run-2")
    first.release()
    assert not (tmp_path / ".parity.lock").exists()
    (tmp_path / ".parity.lock").write_text(json.dumps({"pid": 2 ** 22 + 1, "run_id": "gone"}))
    second = ReportLock(tmp_path)
    second.acquire("run-3")      # the holder is dead: taken over
    assert json.loads((tmp_path / ".parity.lock").read_text())["run_id"] == "run-3"
    second.release()


def test_writing_a_report_never_deletes_another_live_runs_parts(tmp_path):
    from verify.core.case import SuiteOptions
    from verify.session.parity_session import ParitySession

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()
    live = tmp_path / "parts" / f"20240101-000000-{os.getpid()}"
    stale = tmp_path / "parts" / f"20240101-000000-{dead}"
    for folder in (live, stale):
        folder.mkdir(parents=True)
        (folder / "x.pair.json").write_text("{}")
    session = ParitySession(SuiteOptions(), tmp_path, "20240102-000000-1", lambda broken: {},
                            history_dir=None)
    session.lost = {"t.py::test_pair[c:a-vs-b]": "crashed"}
    session.write_report()
    assert (live / "x.pair.json").exists()
    assert not stale.exists()


# ---- 3. a run that raises keeps its full error, the step, and its captured steps ----

def raising_case(steps=6):
    from verify.core.case import Case, Examples, Implementation
    from verify.core.names import NameMap

    class Explodes:
        def run(self, request):
            trace = request.trace
            for step in range(1, request.steps + 1):
                if step == 5:
                    raise AssertionError("weights exploded: max 1e9\n  w grew 10x per step\n"
                                         "  last finite loss 3.2e7 at step 4")
                trace.record(step, "loss", "loss", np.float32(step))
            return trace

        def describe(self):
            return {}

        def declared_config(self, case, implementation):
            return {}

    side = Implementation("explodes", Explodes(), NameMap({}))
    return Case("boom", Examples({"x": np.zeros((2, 1))}, labels=np.zeros(2)), 1, steps, {},
                (side,), "explodes"), side


def test_a_raising_run_records_the_whole_error_its_location_and_step():
    from verify.runners.run import run_implementation

    case, side = raising_case()
    trace = run_implementation(case, side)
    assert trace.steps() == [1, 2, 3, 4]
    assert trace.error.startswith("AssertionError: weights exploded: max 1e9")
    assert "w grew 10x per step" in trace.error and "last finite loss 3.2e7" in trace.error
    assert "test_faults_session.py:" in trace.error      # where it was raised
    assert "step 5" in trace.error


def test_a_long_error_is_bounded():
    from verify.runners.run import MAX_ERROR, describe_error

    try:
        raise RuntimeError("x" * 20_000)
    except RuntimeError as e:
        text = describe_error(e, step=3)
    assert len(text) <= MAX_ERROR and "step 3" in text and "characters more" in text


@pytest.mark.slow
def test_a_raising_run_shows_its_step_full_message_and_earlier_rows(project):
    reports = project / "reports"
    result = run_suite(project, "-k", "explodes")
    assert result.returncode == 1, output(result)
    summary = (reports / "summary.md").read_text()
    assert "at step 5 run explodes" in summary
    assert "AssertionError: weights exploded: max 1e9" in summary
    drift = gzip.decompress((reports / "drift.csv.gz").read_bytes()).decode()
    assert "w grew 10x per step since step 2" in drift
    assert "last finite loss 3.2e7 at step 4" in drift
    import pandas as pd

    rows = pd.read_csv(reports / "drift.csv.gz")
    compared = rows[rows["quantity"] != "run"]
    assert sorted(compared["step"].unique()) == [0, 1, 2, 3, 4]
    assert compared["passed"].all()
    run_row = rows[rows["quantity"] == "run"].iloc[0]
    assert run_row["step"] == 5 and "step 5" in run_row["reason"]


# ---- 4. a case module that fails to import is a failing row, the others run ----

@pytest.mark.slow
def test_a_case_module_that_fails_to_import_fails_its_row_and_the_others_run(project):
    reports = project / "reports"
    first = run_suite(project, "-k", GOOD)
    assert first.returncode == 0 and headline(reports).startswith("## Parity: PASS")
    (project / "cases" / "broken.py").write_text(BROKEN)
    result = run_suite(project, "-k", f"{GOOD} or import")
    assert result.returncode == 1, output(result)
    summary = (reports / "summary.md").read_text()
    assert summary.startswith("## Parity: FAIL (4 pairs: 1 fail, 3 pass)"), summary
    assert "cases.broken" in summary and "ImportError: no module named tensorflow_rs" in summary
    record = json.loads((reports / "run.json").read_text())
    broken = [p for p in record["pairs"] if p["candidate"] == "(import)"]
    assert [p["case"] for p in broken] == ["cases.broken"] and broken[0]["verdict"] == "FAIL"
    assert "importing cases.broken failed" in result.stdout


@pytest.mark.slow
def test_a_case_module_that_hangs_at_import_fails_its_row_by_name_and_the_others_run(project):
    (project / "cases" / "hanging.py").write_text("import time\ntime.sleep(600)\n")
    started = time.monotonic()
    result = run_suite(project, "-k", f"{GOOD} or import", PARITY_IMPORT_TIMEOUT="3")
    assert result.returncode == 1, output(result)
    assert time.monotonic() - started < 120
    record = json.loads((project / "reports" / "run.json").read_text())
    hung = [p for p in record["pairs"] if p["candidate"] == "(import)"]
    assert [p["case"] for p in hung] == ["cases.hanging"], record["pairs"]
    assert "importing cases.hanging did not finish within 3 s" in hung[0]["message"]
    assert {p["verdict"] for p in record["pairs"] if p["candidate"] != "(import)"} == {"PASS"}


def test_load_cases_reports_a_broken_module_and_keeps_the_others(tmp_path):
    from verify.runners.case_sources import load_cases, resolve_sources

    source = tmp_path / "mixed_cases"
    source.mkdir()
    (source / "bad.py").write_text(BROKEN)
    (source / "good.py").write_text(textwrap.dedent('''
        import numpy as np
        from verify import Case, Examples, Implementation, NameMap

        CASE = Case(name="fine", steps=1, examples=Examples({"x": np.zeros(2)}, labels=np.zeros(2)),
                    batch_size=1, initial_values={}, reference="a",
                    implementations=(Implementation("a", None, NameMap({})),))
    '''))
    broken = {}
    found = load_cases(resolve_sources([str(source)]), broken=broken)
    assert list(found) == ["fine"]
    assert list(broken) == ["bad"]
    assert "ImportError: no module named tensorflow_rs" in broken["bad"]


# ---- 5. bad outputs and option files fail before training; nothing deleted early ----

@pytest.mark.slow
def test_unwritable_outputs_and_bad_option_files_fail_before_training(project):
    blocker = project / "a_file"
    blocker.write_text("not a directory")
    marker = {"TINY_SLEEP": "90"}    # a run that trained would take 90 s per pair
    for option, value in (("--report-dir", "a_file/reports"), ("--history-dir", "a_file/h")):
        started = time.monotonic()
        result = run_suite(project, "-k", "good1", option, value, **marker)
        assert result.returncode == 4, output(result)
        assert option in result.stderr and "a_file" in result.stderr
        assert time.monotonic() - started < 60
    for variable in ("PARITY_SPILL_DIR", "PARITY_ENV_DIR"):   # scratch, environments
        result = run_suite(project, "-k", "good1", **{**marker, variable: str(blocker / "x")})
        assert result.returncode == 4, output(result)
        assert f"{variable}={blocker / 'x'}: cannot create or write there" in result.stderr
    assert not (project / "reports").exists()
    bad = project / "baseline.json"
    for pairs, why in (({"not": "a list"}, "'pairs' must be a list"),
                       ([{"case": "tiny", "candidate": "good1"}], "pair 1 has no 'reference'")):
        bad.write_text(json.dumps({"schema": "parity-run/1", "run_id": "b", "pairs": pairs}))
        result = run_suite(project, "-k", "good1", "--compare-to", "baseline.json", **marker)
        assert result.returncode == 4, output(result)
        assert "--compare-to" in result.stderr and why in result.stderr


@pytest.mark.slow
def test_kept_traces_are_replaced_only_by_a_run_that_keeps_new_ones(project):
    reports = project / "reports"
    first = run_suite(project, "-k", "good1", "--keep-traces")
    assert first.returncode == 0, output(first)
    kept = sorted(p.name for p in (reports / "traces" / "tiny").iterdir())
    assert kept == ["case.json", "good1.json", "good1.npz", "ref.json", "ref.npz"]
    nothing = run_suite(project, "-k", "good1", "--keep-traces", "--collect-only")
    assert nothing.returncode == 0, output(nothing)
    assert sorted(p.name for p in (reports / "traces" / "tiny").iterdir()) == kept
    second = run_suite(project, "-k", "good2", "--keep-traces")
    assert second.returncode == 0, output(second)
    assert sorted(p.name for p in (reports / "traces" / "tiny").iterdir()) == [
        "case.json", "good2.json", "good2.npz", "ref.json", "ref.npz"]   # this run's only


def test_a_run_record_with_a_bad_pair_list_is_refused():
    from verify.store.history import check_record

    good = {"schema": "parity-run/1", "run_id": "r", "pairs": [
        {"case": "c", "reference": "a", "candidate": "b", "replicas": 1, "verdict": "PASS",
         "worst": {"grad": {"max_abs": 1e-7, "atol": 1e-6}}}]}
    check_record(good)
    with pytest.raises(ValueError, match="pair 1: 'replicas' must be a whole number"):
        check_record({**good, "pairs": [{**good["pairs"][0], "replicas": "two"}]})
    with pytest.raises(ValueError, match="'max_abs'"):
        check_record({**good, "pairs": [{**good["pairs"][0], "worst": {"grad": {}}}]})


# ---- 6. a selection that selects nothing is an error that says why ----

@pytest.mark.slow
def test_selecting_no_pair_fails_and_says_which_filter_and_what_exists(project):
    reports = project / "reports"
    result = run_suite(project, "--replicas", "3")
    assert result.returncode not in (0, 5), output(result)
    assert "no pair selected" in result.stdout and "--replicas 3" in result.stdout
    assert "tiny: 1, 2" in result.stdout        # the replica counts that exist
    assert headline(reports).startswith("## Parity: NO RESULTS")
    assert "--replicas 3" in (reports / "summary.md").read_text()
    unknown = run_suite(project, "--case", "nope")
    assert unknown.returncode not in (0, 5), output(unknown)
    assert "unknown case(s) ['nope']" in unknown.stdout and "tiny" in unknown.stdout
    deselected = run_suite(project, "-k", "no_such_pair")
    assert deselected.returncode == 5, output(deselected)
    assert "no pair selected" in deselected.stdout and "-k no_such_pair" in deselected.stdout


# ---- 7. a run that hangs is stopped by --run-timeout ----

def test_a_hanging_run_is_stopped_with_the_steps_it_captured():
    from verify.core.case import Case, Examples, Implementation
    from verify.core.names import NameMap
    from verify.runners.run import run_implementation

    class Hangs:
        def run(self, request):
            for step in range(1, request.steps + 1):
                if step == 3:
                    time.sleep(60)
                request.trace.record(step, "loss", "loss", np.float32(step))
            return request.trace

        def describe(self):
            return {}

        def declared_config(self, case, implementation):
            return {}

    side = Implementation("hangs", Hangs(), NameMap({}))
    case = Case("slow", Examples({"x": np.zeros((2, 1))}, labels=np.zeros(2)), 1, 5, {},
                (side,), "hangs")
    started = time.monotonic()
    trace = run_implementation(case, side, timeout=0.5)
    assert time.monotonic() - started < 10
    assert trace.steps() == [1, 2]
    assert trace.error.startswith("RunTimeout: timed out after 0.5 s at step 3")
    assert signal.getsignal(signal.SIGALRM) in (signal.SIG_DFL, None, signal.default_int_handler)
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def busy_seconds_per_item() -> float:
    started = time.perf_counter()
    sum(range(10**6))
    return (time.perf_counter() - started) / 10**6


@pytest.mark.slow
def test_an_interrupt_that_arrives_while_a_timed_out_run_is_stuck_stops_the_session():
    """A run stuck inside one C call (a TensorFlow op) when its time limit passes and the user
    presses ^C: both signals wait for the call to return, then Python runs SIGINT's handler
    first and the time limit's during the unwinding. The interrupt wins: the session stops
    instead of recording a RunTimeout row and moving on."""
    from verify.core.case import Case, Examples, Implementation
    from verify.core.names import NameMap
    from verify.runners.run import run_implementation

    from tensorflow.python.data.ops import multi_device_iterator_ops as per_device

    builder = per_device._create_device_dataset   # TensorFlow's own
    per_item = busy_seconds_per_item()

    class StuckInC:
        def __init__(self, interrupt: bool):
            self.interrupt = interrupt

        def run(self, request):
            request.trace.record(1, "loss", "loss", np.float32(1))
            if self.interrupt:   # ^C from outside at 0.5 s, while the call below still runs
                subprocess.Popen(["sh", "-c", f"sleep 0.5; kill -INT {os.getpid()}"])
            # one C call holding the interpreter for about 2 s, as a TensorFlow op can: the
            # 0.2 s limit and the ^C both wait for it to return
            sum(range(int(2.0 / per_item)))
            return request.trace

        def describe(self):
            return {}

        def declared_config(self, case, implementation):
            return {}

    def run(interrupt):
        side = Implementation("stuck", StuckInC(interrupt), NameMap({}))
        case = Case("stuck", Examples({"x": np.zeros((2, 1))}, labels=np.zeros(2)), 1, 2, {},
                    (side,), "stuck")
        return run_implementation(case, side, timeout=0.2)

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            run(interrupt=True)
        # negative control: the time limit alone is a failing row, and the session goes on
        trace = run(interrupt=False)
        assert trace.error.startswith("RunTimeout: timed out after 0.2 s")
    finally:
        signal.signal(signal.SIGINT, previous)
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    # what the run changed in the process is back although the time limit's RunTimeout was
    # raised while the interrupt unwound it (the next test in this process builds pipelines)
    assert per_device._create_device_dataset is builder


@pytest.mark.slow
def test_run_timeout_fails_a_hanging_pair_and_the_others_still_pass(project):
    reports = project / "reports"
    started = time.monotonic()
    # under xdist: workers run tests in their main thread, where the alarm can interrupt
    result = run_suite(project, "-n", "2", "-k", "hangs or good1", "--run-timeout", "2")
    assert time.monotonic() - started < 120
    assert result.returncode == 1, output(result)
    record = json.loads((reports / "run.json").read_text())
    verdicts = {p["candidate"]: p["verdict"] for p in record["pairs"]}
    assert verdicts == {"hangs": "FAIL", "good1": "PASS"}
    assert "timed out after 2 s at step 3" in (reports / "summary.md").read_text()
    bad = run_suite(project, "--run-timeout", "-1")
    assert bad.returncode == 4 and "--run-timeout" in bad.stderr


@pytest.mark.slow
def test_a_report_directory_never_shows_an_earlier_verdict_and_a_killed_run_says_so(project):
    from verify.store.report_dir import unfinished_run

    reports = project / "reports"
    first = run_suite(project, "-k", "good1")
    assert headline(reports).startswith("## Parity: PASS"), output(first)
    assert (reports / "drift.csv.gz").is_file()
    process = start_suite(project, "-k", "good", TINY_SLEEP="2")
    try:
        wait_for(lambda: "IN PROGRESS" in headline(reports), what="the run in progress")
        # from its start, nothing in the directory holds the earlier run's verdict
        assert json.loads((reports / "run.json").read_text())["verdict"] == "IN PROGRESS"
        assert "IN PROGRESS" in (reports / "report.html").read_text()
        assert not (reports / "drift.csv.gz").exists() and not (reports / "summary.csv").exists()
        assert "still in progress" in unfinished_run(reports)
        process.send_signal(signal.SIGKILL)   # no handler can run
        process.communicate(timeout=60)
    finally:
        process.kill()
    assert headline(reports) == "## Parity: IN PROGRESS"
    assert "did not finish" in unfinished_run(reports)
    shown = subprocess.run([sys.executable, "-m", "verify", "report", str(reports)],
                           cwd=project, env=suite_env(), capture_output=True, text=True,
                           timeout=120)
    assert shown.returncode != 0 and "did not finish" in shown.stderr, output(shown)
    # the next run takes the directory over and writes its own report
    again = run_suite(project, "-k", "good1")
    assert headline(reports).startswith("## Parity: PASS"), output(again)
    assert unfinished_run(reports) is None


@pytest.mark.slow
def test_the_suite_deletes_only_what_it_wrote(project, tmp_path_factory):
    """A user's own traces/ in the report directory, and a parts/ that links elsewhere, lose
    nothing; the suite's own kept traces are still replaced."""
    reports = project / "reports"
    users = reports / "traces"
    users.mkdir(parents=True)
    (users / "notes.txt").write_text("mine")
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    (elsewhere / "20200101-000000-999999999").mkdir()       # looks like a dead run's parts
    (elsewhere / "20200101-000000-999999999" / "keep.txt").write_text("mine too")
    (reports / "parts").symlink_to(elsewhere, target_is_directory=True)
    result = run_suite(project, "-k", "good1")
    assert result.returncode == 0, output(result)
    assert (users / "notes.txt").read_text() == "mine"
    assert (elsewhere / "20200101-000000-999999999" / "keep.txt").is_file()
    kept = run_suite(project, "-k", "good1", "--keep-traces")
    assert kept.returncode == 0, output(kept)
    assert (users / "notes.txt").read_text() == "mine"          # not replaced: not the suite's
    assert "is not a traces directory the suite wrote" in kept.stdout


def test_scratch_of_dead_runs_is_removed_and_nothing_else(tmp_path):
    from verify.core.scratch import make_scratch, remove_stale

    live = make_scratch("run", tmp_path)
    dead = tmp_path / "parity-999999999-trace-abc"
    dead.mkdir()
    (dead / "table.npy").write_bytes(b"0" * 1024)
    other = tmp_path / "parity-trace-old"          # not named by the suite's rule: kept
    other.mkdir()
    link = tmp_path / "parity-999999998-run-x"
    link.symlink_to(other, target_is_directory=True)
    assert remove_stale([tmp_path]) == [dead]
    assert live.is_dir() and other.is_dir() and link.is_symlink()


@pytest.mark.slow
def test_a_cancelled_run_writes_its_report_before_waiting_for_its_workers(project):
    """GitHub cancels with SIGINT, SIGTERM 7.5 s later, then SIGKILL: the INCOMPLETE report
    is written as soon as the first signal arrives, so a kill right after it still leaves one
    (here the process is killed the moment the report is there)."""
    reports = project / "reports"
    process = start_suite(project, "-n", "2", "-k", "good", TINY_SLEEP="6")
    try:
        wait_for(lambda: len(parts(reports)) >= 1, what="a judged pair")
        process.send_signal(signal.SIGINT)
        wait_for(lambda: json.loads((reports / "run.json").read_text()).get("verdict")
                 == "INCOMPLETE", timeout=60, what="the INCOMPLETE report")
        process.send_signal(signal.SIGKILL)
        process.communicate(timeout=60)
    finally:
        process.kill()
    record = json.loads((reports / "run.json").read_text())
    assert record["verdict"] == "INCOMPLETE" and record["pairs"]
    assert record["stopped"] == "interrupted: stopped by SIGINT"
    assert headline(reports).startswith("## Parity: INCOMPLETE")
    assert (reports / "history" / f"{record['run_id']}.json").is_file()


@pytest.mark.slow
def test_a_run_cancelled_while_a_case_module_imports_never_leaves_the_earlier_verdict(tmp_path):
    """`python -m verify suite` (the installed parity test's own path): the report directory
    says IN PROGRESS before any case module is imported, so a cancel during a hanging import
    leaves no earlier PASS standing."""
    package = tmp_path / "tinycases"
    package.mkdir()
    (package / "__init__.py").write_text(textwrap.dedent(CASES))
    (tmp_path / "conftest.py").write_text(NUMPY_CONFTEST)
    reports = tmp_path / "reports"
    command = [sys.executable, "-m", "verify", "suite", "--cases", str(package),
               "--report-dir", str(reports), "-p", "no:cacheprovider", "-k", "good1"]
    first = subprocess.run(command, cwd=tmp_path, env=suite_env(), capture_output=True,
                           text=True, timeout=300)
    assert headline(reports).startswith("## Parity: PASS"), output(first)
    (package / "hanging.py").write_text("import time\ntime.sleep(600)\n")
    process = subprocess.Popen(command, cwd=tmp_path, env=suite_env(), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, preexec_fn=default_signals)
    try:
        wait_for(lambda: "IN PROGRESS" in headline(reports), timeout=120,
                 what="the run in progress")
        process.send_signal(signal.SIGINT)
        process.communicate(timeout=60)
    finally:
        process.kill()
    assert not headline(reports).startswith("## Parity: PASS")


def test_a_finished_run_leaves_no_parts_and_keeps_another_runs(tmp_path):
    """Once the final report holds this run's parts they are removed, and `parts/` with them
    when nothing else is there; a live run's parts stay (and so does `parts/`)."""
    from verify.core.case import SuiteOptions
    from verify.judge import PairRecord, PairResult
    from verify.store.results import write_part
    from verify.session.parity_session import ParitySession

    def finished(run_id):
        session = ParitySession(SuiteOptions(), tmp_path, run_id, lambda broken: {},
                                history_dir=None)
        session.selected = ["t.py::test_pair[c:a-vs-b]"]
        write_part(session.parts_dir, "t.py::test_pair[c:a-vs-b]", PairResult.failed(
            PairRecord("c", "a", "b", 1, role="faithful", message="b raised")))
        assert session.parts_dir.is_dir()
        session.write_report()
        return session

    live = tmp_path / "parts" / f"20240101-000000-{os.getpid()}"
    live.mkdir(parents=True)
    first = finished("20240102-000000-1")
    assert not first.parts_dir.exists() and live.is_dir()
    assert (tmp_path / "summary.md").read_text().startswith("## Parity: FAIL")
    assert "b raised" in (tmp_path / "summary.md").read_text()   # the report holds the part
    live.rmdir()
    second = finished("20240103-000000-1")
    assert not second.parts_dir.exists() and not (tmp_path / "parts").exists()
