"""`python -m verify`: re-compare kept traces and re-render reports, without TensorFlow."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from synthetic_results import synthetic_results

from verify.__main__ import main
from verify.core.case import Case, Examples, Expectation, Implementation
from verify.judge.compare import compare_traces
from verify.store.history import run_record, write_record
from verify.store.kept_traces import keep_case, keep_trace, recompare
from verify.core.names import NameMap
from verify.render import write_report
from verify.store.results import sort_rows
from verify.store.tolerance_documents import tolerances_to_json
from verify.core.tolerances import Tolerance, Tolerances
from verify.core.trace import SparseRows, Trace

ROOT = Path(__file__).resolve().parents[2]


def make_trace(name, drift=0.0, replicas=1):
    trace = Trace(name, {"replicas": replicas, "case": "tiny", "seed": 1, "steps": 3,
                         "tensorflow": "2.15.1", "numpy": "1.26.4", "python": "3.11.7",
                         "cpu": "Test CPU", "device": "cpu"})
    w = np.linspace(-1, 1, 6, dtype=np.float32).reshape(3, 2)
    trace.record(0, "weight", "w", w)
    for step in (1, 2, 3):
        trace.record(step, "input", "x", f"digest{step}")
        trace.record(step, "loss", "loss", np.float32(1.0 / step + drift))
        trace.record(step, "grad", "w", w * step + np.float32(drift))
        trace.record(step, "weight", "w", w - np.float32(0.1 * step + drift))
        # a sparse gradient whose shape holds numpy integers, as runners record them
        trace.record(step, "grad", "table", SparseRows(
            np.array([0, 2, 0]), np.full((3, 2), step + drift, np.float32),
            (np.int64(4), np.int64(2))))
    return trace


@pytest.fixture
def kept(tmp_path):
    """A report directory with the kept traces of a tiny case: a faithful pair and a control."""
    names = NameMap({"w": "w"})
    case = Case(name="tiny", examples=Examples({"x": np.zeros((4, 1))}, labels=np.zeros(4)),
                batch_size=2, steps=3, initial_values={"w": np.zeros((3, 2), np.float32)},
                implementations=(
                    Implementation("tf1", runner=None, names=names),
                    Implementation("tf2", runner=None, names=names, replicas=2),
                    Implementation("control", runner=None, names=names,
                                   expect=Expectation(1, "loss", why="adds 0.1"))),
                reference="tf1", seed=1)
    traces = tmp_path / "traces"
    keep_case(traces, case)
    for trace in (make_trace("tf1"), make_trace("tf2", 1e-8, 2), make_trace("control", 0.1)):
        trace.meta.data_digest = case.data_digest()   # as a runner records it
        keep_trace(traces, "tiny", trace)
    return tmp_path


def run_cli_in_subprocess(*commands):
    """Run `python -m verify` commands in one fresh interpreter; their exit codes, and whether
    TensorFlow got imported."""
    code = ("import json, runpy, sys\n"
            "codes = []\n"
            "for argv in json.loads(sys.argv[1]):\n"
            "    sys.argv = ['verify', *argv]\n"
            "    try:\n"
            "        runpy.run_module('verify', run_name='__main__', alter_sys=True)\n"
            "    except SystemExit as e:\n"
            "        codes.append(e.code)\n"
            "print('RESULT', json.dumps({'codes': codes, "
            "'tensorflow': 'tensorflow' in sys.modules}))\n")
    out = subprocess.run([sys.executable, "-c", code, json.dumps(commands)], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert "RESULT" in out.stdout, out.stderr[-2000:]
    return json.loads(out.stdout.split("RESULT", 1)[1]), out.stdout


def test_cli_compares_and_reports_without_importing_tensorflow(kept, tmp_path):
    traces = kept / "traces" / "tiny"
    result, stdout = run_cli_in_subprocess(
        ["compare", str(traces / "tf1.json"), str(traces / "tf2.json")],
        ["compare", str(traces / "tf1"), str(traces / "control.npz")],
        ["report", str(kept), "--recompare", "--out", str(tmp_path / "again")])
    assert result == {"codes": [0, 0, 0], "tensorflow": False}, stdout
    assert "PASS: tiny: tf1 → tf2 (x2)" in stdout
    assert "CAUGHT: tiny: tf1 → control (x1)" in stdout
    assert (tmp_path / "again" / "report.html").is_file()


def test_compare_without_kept_tolerances_uses_defaults_and_fails_a_real_difference(kept, tmp_path,
                                                                                 capsys):
    lone = tmp_path / "lone"
    keep_trace(lone, "x", make_trace("tf1"))
    keep_trace(lone, "x", make_trace("control", 0.1))
    assert main(["compare", str(lone / "x" / "tf1"), str(lone / "x" / "control"),
                 "--out", str(tmp_path / "out")]) == 1
    out = capsys.readouterr().out
    assert "the suite's defaults" in out and "FAIL: tiny: tf1 → control (x1)" in out
    assert "first divergence at step 1, loss loss" in out
    assert "FAIL" in (tmp_path / "out" / "summary.md").read_text().splitlines()[0]


def test_compare_refuses_traces_of_two_cases_even_with_identical_data(tmp_path, capsys):
    other = make_trace("tf2")
    other.meta.case = "another"
    keep_trace(tmp_path, "x", make_trace("tf1"))
    keep_trace(tmp_path, "x", other)
    assert main(["compare", str(tmp_path / "x" / "tf1"), str(tmp_path / "x" / "tf2")]) == 2
    assert "the traces are of different cases" in capsys.readouterr().err


def test_recompare_gives_the_rows_of_an_in_process_comparison(kept):
    results = recompare(kept / "traces")
    expected = compare_traces(make_trace("tf1"), make_trace("tf2", 1e-8, 2), case="tiny",
                              replicas=2)
    got = results.rows[results.rows["candidate"] == "tf2"].reset_index(drop=True)
    pd.testing.assert_frame_equal(sort_rows(got), sort_rows(expected), check_dtype=False)
    assert dict(zip(results.pairs["candidate"], results.pairs["verdict"])) == {
        "tf2": "PASS", "control": "CAUGHT"}
    assert set(results.losses["candidate"]) == {"tf2", "control"}


def test_recompare_with_other_tolerances_rejudges(kept, tmp_path, capsys):
    loose = tmp_path / "loose.json"
    loose.write_text(json.dumps(tolerances_to_json(Tolerances(
        {q: Tolerance(1.0, 1.0) for q in ("input", "loss", "grad", "slot", "weight", "metric",
                                           "run")}))))
    assert main(["report", str(kept), "--recompare", "--tolerances", str(loose),
                 "--out", str(tmp_path / "loose")]) == 1
    summary = (tmp_path / "loose" / "summary.csv").read_text()
    assert "MISSED" in summary   # the control is not caught with loose tolerances


def test_report_rerenders_the_same_summary_and_page(tmp_path, capsys):
    results = synthetic_results(pairs=3, failing=1)
    record = run_record(results, run_id="r1", timestamp="2024-01-01T00:00:00+00:00")
    write_report(tmp_path / "run", results, record)
    assert main(["report", str(tmp_path / "run"), "--out", str(tmp_path / "again")]) == 1
    for name in ("summary.md", "report.html", "drift.csv.gz", "summary.csv", "losses.csv"):
        assert ((tmp_path / "run" / name).read_bytes() == (tmp_path / "again" / name).read_bytes()
                ), name
    assert "parity: FAIL" in capsys.readouterr().out


def test_report_with_compare_to_writes_the_regressions(tmp_path, capsys):
    before = synthetic_results(pairs=2, failing=0)
    write_record(tmp_path / "history", run_record(before, run_id="night-1",
                                                  timestamp="2024-01-01T00:00:00+00:00"))
    after = synthetic_results(pairs=2, failing=1)
    write_report(tmp_path / "run", after, run_record(after, run_id="night-2"))
    assert main(["report", str(tmp_path / "run"), "--compare-to",
                 str(tmp_path / "history")]) == 1
    summary = (tmp_path / "run" / "summary.md").read_text()
    assert summary.splitlines()[0].endswith("· 2 regressions")
    assert "PASS → FAIL" in summary and "Since run night-1" in summary


def test_history_list_and_compare(tmp_path, capsys):
    history = tmp_path / "history"
    for n, failing in enumerate((0, 0, 1)):
        write_record(history, run_record(synthetic_results(pairs=2, failing=failing),
                                         run_id=f"night-{n}",
                                         timestamp=f"2024-01-0{n + 1}T03:00:00+00:00"))
    assert main(["history", "list", str(history)]) == 0
    listing = capsys.readouterr().out.splitlines()
    assert len(listing) == 4 and listing[3].startswith("night-2") and "FAIL" in listing[3]
    assert main(["history", "compare", str(history)]) == 1      # night-2 vs night-1
    assert "REGRESSION case_0: tf1 → tf2-variant-000 (x1): PASS → FAIL" in capsys.readouterr().out
    assert main(["history", "compare", str(history / "night-1.json")]) == 0   # vs night-0
    assert "no regression" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["report", "/nonexistent/dir"], "is not a directory"),
    (["compare", "/nonexistent/a.json", "/nonexistent/b.json"], "no kept trace there"),
    (["history", "list", "/nonexistent"], "holds no run records"),
    (["history", "compare", "/nonexistent.json"], "does not exist"),
])
def test_bad_input_exits_2_saying_what_is_wrong(argv, message, capsys):
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_report_of_a_directory_without_a_report_says_so(tmp_path, capsys):
    assert main(["report", str(tmp_path)]) == 2
    assert "holds no drift.csv.gz" in capsys.readouterr().err
    assert main(["report", str(tmp_path), "--recompare"]) == 2
    assert "holds no kept traces" in capsys.readouterr().err
