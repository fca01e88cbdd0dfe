"""Faults in what the suite reads and writes: kept traces that are not what they claim, files
that are cut short or malformed, values the comparison used to mis-measure, and names that
used to break the reports. Each test reproduces one fault. No TensorFlow."""
import html.parser
import json
import re
import shutil
import warnings

import numpy as np
import pytest
from synthetic_results import synthetic_results

from verify.__main__ import main
from verify.core.case import Case, Examples, Expectation, Implementation, SuiteOptions
from verify.core.files import BadFile
from verify.core.names import NameMap
from verify.core.tolerances import DEFAULTS, Tolerance
from verify.core.trace import SparseRows, Trace
from verify.store.history import history, load_record, run_record, write_record
from verify.judge.compare import compare_traces
from verify.judge.arrays import compare_arrays
from verify.store.kept_traces import (MANIFEST, keep_case, keep_trace, read_manifest,
                                read_tolerances, recompare)
from verify.render.html import render_html
from verify.render.markdown import summary_markdown
from verify.render.terminal import terminal_lines

NAMES = NameMap({"w": "w"})


def tiny_case(**changes) -> Case:
    fields = dict(
        name="tiny", examples=Examples({"x": np.zeros((4, 1))}, labels=np.zeros(4)),
        batch_size=2, steps=3, initial_values={"w": np.zeros((3, 2), np.float32)},
        implementations=(Implementation("tf1", runner=None, names=NAMES),
                         Implementation("tf2", runner=None, names=NAMES),
                         Implementation("control", runner=None, names=NAMES,
                                        expect=Expectation(1, "loss", why="adds 0.1"))),
        reference="tf1", seed=1)
    return Case(**{**fields, **changes})


def tiny_trace(name: str, case: Case, drift: float = 0.0) -> Trace:
    trace = Trace(name, {"case": case.name, "replicas": 1, "seed": case.seed, "steps": 3,
                         "data_digest": case.data_digest()})
    w = np.linspace(-1, 1, 6, dtype=np.float32).reshape(3, 2)
    trace.record(0, "weight", "w", w)
    for step in (1, 2, 3):
        trace.record(step, "input", "x", f"digest{step}")
        trace.record(step, "loss", "loss", np.float32(1.0 / step + drift))
        trace.record(step, "grad", "w", w * step + np.float32(drift))
        trace.record(step, "weight", "w", w - np.float32(0.1 * step + drift))
    return trace


@pytest.fixture
def kept(tmp_path):
    """A report directory with the kept traces of `tiny_case`: tf1, tf2 (faithful), control."""
    case = tiny_case()
    traces = tmp_path / "traces"
    keep_case(traces, case)
    for name, drift in (("tf1", 0.0), ("tf2", 1e-8), ("control", 0.1)):
        keep_trace(traces, case.name, tiny_trace(name, case, drift))
    return tmp_path


def case_dir(kept):
    return kept / "traces" / "tiny"


def verdicts(results) -> dict:
    return dict(zip(results.pairs["candidate"], results.pairs["verdict"]))


def reasons(results, candidate) -> str:
    rows = results.rows
    return " ".join(rows.loc[(rows["candidate"] == candidate) & ~rows["passed"], "reason"])


def truncate(path, keep=0.5):
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


# ---- 1. kept traces are checked against their manifest, never trusted or skipped ----

def test_kept_traces_as_written_still_pass(kept):
    assert verdicts(recompare(kept / "traces")) == {"tf2": "PASS", "control": "CAUGHT"}


def test_a_deleted_reference_trace_fails_every_pair_that_needs_it(kept, capsys):
    for path in case_dir(kept).glob("tf1.*"):
        path.unlink()
    results = recompare(kept / "traces")
    assert verdicts(results) == {"tf2": "FAIL", "control": "FAIL"}
    assert "tf1.json" in reasons(results, "tf2") and "missing" in reasons(results, "tf2")
    assert main(["report", str(kept), "--recompare", "--out", str(kept / "again")]) == 1
    assert "FAIL (2 pairs: 2 fail)" in (kept / "again" / "summary.md").read_text()


def test_a_trace_copied_over_another_implementations_file_fails(kept):
    for suffix in (".json", ".npz"):
        shutil.copy(case_dir(kept) / f"control{suffix}", case_dir(kept) / f"tf2{suffix}")
    results = recompare(kept / "traces")
    assert verdicts(results) == {"tf2": "FAIL", "control": "CAUGHT"}
    assert "tf2.json holds the trace of implementation 'control'" in reasons(results, "tf2")


def test_an_npz_copied_under_another_traces_json_fails(kept):
    shutil.copy(case_dir(kept) / "control.npz", case_dir(kept) / "tf2.npz")
    results = recompare(kept / "traces")
    assert verdicts(results)["tf2"] == "FAIL"
    assert "tf2.npz" in reasons(results, "tf2") and "not the one" in reasons(results, "tf2")


@pytest.mark.parametrize("field, value, expected", [
    ("data_digest", "0123456789abcdef", "was run on other data"),
    ("data_digest", "", "records no data digest"),
    ("case", "other", "was run for case 'other'"),
])
def test_a_trace_of_another_case_or_other_data_fails(kept, field, value, expected):
    path = case_dir(kept) / "tf2.json"
    doc = json.loads(path.read_text())
    doc["meta"][field] = value
    path.write_text(json.dumps(doc))
    results = recompare(kept / "traces")
    assert verdicts(results)["tf2"] == "FAIL"
    assert expected in reasons(results, "tf2")


def test_two_saves_of_one_trace_write_the_same_npz(tmp_path, monkeypatch):
    """Under -n 2 a reference may run, and be kept, in both workers: one save's json beside
    the other's npz must still be a consistent trace."""
    import time

    case = tiny_case()
    keep_trace(tmp_path / "a", case.name, tiny_trace("tf1", case))
    later = time.time() + 3600
    monkeypatch.setattr(time, "time", lambda: later)
    keep_trace(tmp_path / "b", case.name, tiny_trace("tf1", case))
    first, second = (tmp_path / side / "tiny" / "tf1.npz" for side in ("a", "b"))
    assert first.read_bytes() == second.read_bytes()


def test_compare_checks_each_trace_against_the_manifest_beside_it(kept, capsys):
    for suffix in (".json", ".npz"):
        shutil.copy(case_dir(kept) / f"control{suffix}", case_dir(kept) / f"tf2{suffix}")
    assert main(["compare", str(case_dir(kept) / "tf1"), str(case_dir(kept) / "tf2")]) == 1
    out = capsys.readouterr().out
    assert "FAIL" in out and "tf2.json holds the trace of implementation 'control'" in out
    assert "CAUGHT" not in out


def test_the_manifest_lists_only_the_pairs_the_session_judges(tmp_path, monkeypatch):
    """A session that runs a subset of the pairs (--replicas, -k) keeps a manifest of that
    subset, so re-comparing it neither skips nor invents pairs."""
    import verify.runners.capture.devices
    from verify.session.parity_session import ParitySession

    monkeypatch.setattr(verify.runners.capture.devices, "configure_cpu_replicas", lambda count=8: count)

    class Runner:
        def run(self, request):
            trace = Trace(request.implementation.name, {"replicas": 1})
            trace.record(1, "loss", "loss", np.float32(0.5))
            return trace

        def describe(self):
            return {}

        def declared_config(self, case, implementation):
            return {}

    case = tiny_case(implementations=tuple(
        Implementation(n, Runner(), NAMES) for n in ("tf1", "tf2", "tf2-x4")))
    session = ParitySession(SuiteOptions(), tmp_path, "run-1", lambda broken: {"tiny": case},
                            keep_traces=True)
    selected = [spec for spec in session.pairs() if spec.candidate == "tf2"]
    session.kept_pairs = selected
    assert session.check(selected[0]).verdict.ok
    session.write_report()   # kept traces replace the earlier ones when the report is written
    manifest, specs, _ = read_manifest(tmp_path / "traces" / "tiny" / MANIFEST)
    assert [(s.reference, s.candidate) for s in specs] == [("tf1", "tf2")]
    assert verdicts(recompare(tmp_path / "traces")) == {"tf2": "PASS"}


# ---- 2. bad files are explained, with the file, the problem and what to do ----

def test_a_truncated_npz_is_a_bad_file_naming_it(kept):
    truncate(case_dir(kept) / "tf2.npz")
    with pytest.raises(BadFile) as error:
        Trace.load(case_dir(kept) / "tf2.json")
    message = str(error.value)
    assert str(case_dir(kept) / "tf2.npz") in message and "again" in message


@pytest.mark.parametrize("edit, expected", [
    (lambda text: text[: len(text) // 2], "not JSON"),
    (lambda text: json.dumps({**json.loads(text), "index": None}), "'index'"),
    (lambda text: text.replace("|loss|", "|losss|"), "losss"),
    (lambda text: re.sub(r'"slot": 0\b', '"slot": 99', text), "holds no array a99"),
])
def test_a_malformed_trace_json_is_a_bad_file_naming_it(kept, edit, expected):
    path = case_dir(kept) / "tf2.json"
    path.write_text(edit(path.read_text()))
    with pytest.raises(BadFile, match=re.escape(expected)) as error:
        Trace.load(path)
    assert str(path.parent) in str(error.value) and "tf2.json" in str(error.value)


def test_one_unreadable_trace_fails_only_the_pairs_that_need_it(kept, capsys):
    truncate(case_dir(kept) / "control.npz")
    results = recompare(kept / "traces")
    assert verdicts(results) == {"tf2": "PASS", "control": "FAIL"}
    assert "control.npz" in reasons(results, "control")
    assert main(["report", str(kept), "--recompare", "--out", str(kept / "again")]) == 1
    assert "control.npz" in capsys.readouterr().out


def test_compare_of_an_unreadable_trace_exits_2_naming_it(kept, capsys):
    truncate(case_dir(kept) / "tf2.npz")
    assert main(["compare", str(case_dir(kept) / "tf1"), str(case_dir(kept) / "tf2")]) == 2
    assert "tf2.npz" in capsys.readouterr().err


def test_tolerances_missing_a_quantity_are_rejected_saying_how_to_override_some(tmp_path,
                                                                                capsys, kept):
    partial = tmp_path / "partial.json"
    partial.write_text(json.dumps({"by_quantity": {"loss": [1, 1], "grad": [1, 1]}}))
    with pytest.raises(ValueError) as error:
        read_tolerances(partial)
    message = str(error.value)
    assert str(partial) in message and "slot, weight, metric" in message
    assert '"base": "defaults"' in message
    assert main(["report", str(kept), "--recompare", "--tolerances", str(partial)]) == 2
    assert "slot, weight, metric" in capsys.readouterr().err
    partial.write_text(json.dumps({"base": "defaults", "by_quantity": {"grad": [1, 1]}}))
    tolerances = read_tolerances(partial)
    assert tolerances.lookup("grad", "w") == Tolerance(1, 1)
    assert tolerances.lookup("weight", "w") == DEFAULTS["weight"]


@pytest.mark.parametrize("by_quantity, expected", [
    ({"grad": [1e-6]}, "grad"),
    ({"grad": [-1, 0]}, "grad"),
    ({"grad": ["1e-6", 0]}, "grad"),
    ({"grad": [float("inf"), 0]}, "grad"),
    ({"grads": [1, 1]}, "grads"),
])
def test_malformed_tolerances_are_rejected_naming_the_entry(tmp_path, by_quantity, expected):
    path = tmp_path / "tolerances.json"
    path.write_text(json.dumps({"base": "defaults", "by_quantity": by_quantity}))
    with pytest.raises(ValueError, match=re.escape(expected)) as error:
        read_tolerances(path)
    assert str(path) in str(error.value)


@pytest.mark.parametrize("edit, expected", [
    (lambda doc: "{", "not JSON"),
    (lambda doc: json.dumps({k: v for k, v in doc.items() if k != "data_digest"}),
     "data_digest"),
    (lambda doc: json.dumps({**doc, "pairs": [{"reference": "tf1"}]}), "candidate"),
])
def test_a_bad_manifest_exits_2_naming_it(kept, capsys, edit, expected):
    path = case_dir(kept) / MANIFEST
    path.write_text(edit(json.loads(path.read_text())))
    assert main(["report", str(kept), "--recompare"]) == 2
    err = capsys.readouterr().err
    assert str(path) in err and expected in err


def test_a_broken_run_record_in_a_history_is_an_error_not_skipped(tmp_path, capsys):
    for n, failing in enumerate((0, 1)):
        write_record(tmp_path, run_record(synthetic_results(pairs=2, failing=failing),
                                          run_id=f"night-{n}",
                                          timestamp=f"2024-01-0{n + 1}T03:00:00+00:00"))
    truncate(tmp_path / "night-1.json")
    with pytest.raises(BadFile, match="night-1.json"):
        history(tmp_path)
    assert main(["history", "compare", str(tmp_path)]) == 2
    assert "night-1.json" in capsys.readouterr().err


def test_a_run_record_without_its_pairs_is_a_bad_file(tmp_path):
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"schema": "parity-run/1", "run_id": "r", "verdict": "PASS",
                                "timestamp": "2024-01-01T00:00:00+00:00",
                                "pairs": [{"case": "c"}]}))
    with pytest.raises(ValueError, match="pair 1 has no .reference.") as error:
        load_record(path)
    assert str(path) in str(error.value)


def test_an_unexpected_error_is_not_reported_as_a_failing_pair(monkeypatch, capsys, kept):
    import verify.cli.reports as cli

    # a bug of the suite's own: the raising frame is in the suite's file (an exception whose
    # innermost frame is the user's file is the user's error, exit 2: tests/cli/)
    namespace = {}
    exec(compile("def broken(*args, **kwargs):\n    raise RuntimeError('a bug')\n",
                 cli.__file__, "exec"), namespace)
    monkeypatch.setattr(cli, "recompare", namespace["broken"])
    assert main(["report", str(kept), "--recompare"]) == 3
    assert "a bug" in capsys.readouterr().err


# ---- 3. integers, booleans, complex values and sparse ids are compared for what they are ----

def test_large_integers_that_differ_fail_exactly():
    drift = compare_arrays(np.array([2**60 + 1, 5, 7], np.int64),
                           np.array([2**60, 5, 8], np.int64), Tolerance(1e-6, 1e-5))
    assert not drift.passed
    assert "2 / 3" in drift.reason and "first at index (0,)" in drift.reason


def test_equal_integers_and_booleans_pass_and_differing_booleans_fail():
    same = compare_arrays(np.arange(4), np.arange(4), Tolerance(0, 0))
    assert same.passed and same.max_abs == 0.0 and same.worst_index == "(0,)"
    flipped = compare_arrays(np.array([True, False]), np.array([True, True]), Tolerance(1, 1))
    assert not flipped.passed and "1 / 2" in flipped.reason and "(1,)" in flipped.reason


def test_complex_values_keep_their_imaginary_part():
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # numpy's ComplexWarning: the imaginary part dropped
        drift = compare_arrays(np.array([1 + 1j]), np.array([1 + 0j]), Tolerance(1e-6, 1e-5))
    assert not drift.passed and drift.max_abs == pytest.approx(1.0)


@pytest.mark.parametrize("candidate_ids, expected", [([-1], "[-1]"), ([4], "[4]")])
def test_sparse_ids_outside_the_table_are_a_failing_row(candidate_ids, expected):
    reference, candidate = Trace("tf1"), Trace("tf2")
    rows = np.ones((1, 2), np.float32)
    reference.record(1, "grad", "table", SparseRows(np.array([3]), rows, (4, 2)))
    candidate.record(1, "grad", "table", SparseRows(np.array(candidate_ids), rows, (4, 2)))
    result = compare_traces(reference, candidate)
    assert len(result) == 1 and not result["passed"].iloc[0]
    reason = result["reason"].iloc[0]
    assert "out of range" in reason and expected in reason and "4 rows" in reason


def test_float_rows_keep_their_columns_and_message():
    drift = compare_arrays(np.array([1.0, 2.5], np.float32), np.array([1.0, 2.0], np.float32),
                           Tolerance(0, 1e-3))
    assert (drift.max_abs, drift.max_rel, drift.worst_index, drift.times_tolerance) == (
        0.5, 0.25, "(1,)", 250.0)
    assert drift.reason.startswith("Mismatched elements: 1 / 2 (50.0%). Greatest absolute")


# ---- 4. names are text in every output format ----

CASE_NAME = "case|<b>x</b>&amp;_u_"
CANDIDATE = "a|b*<script>alert(1)</script>$x$"
TENSOR = "`tick`_w_[l](http://x)~~s~~$x^$"


def named_results():
    results = synthetic_results(pairs=2, tensors=2, failing=1)
    renames = {"case_0": CASE_NAME, "tf2-variant-000": CANDIDATE,
               "layer_0000/kkkkkkkkkk": TENSOR}
    for table in (results.rows, results.pairs, results.losses):
        for column in ("case", "candidate", "tensor", "first_tensor"):
            if column in table:
                table[column] = table[column].replace(renames)
    results.losses["tensor"] = TENSOR   # a loss tensor named like that too (plot legends)
    results.pairs["message"] = results.pairs["message"].str.replace(
        "layer_0000/kkkkkkkkkk", TENSOR, regex=False)
    return results


def unescape(markdown: str) -> str:
    return re.sub(r"\\(.)", r"\1", markdown)


def test_summary_markdown_escapes_names_in_cells_and_text():
    text = summary_markdown(named_results())
    assert not re.search(r"<(?!/?(details|summary)>)", text.replace("\\<", ""))
    assert not re.search(r"(?<!\\)[$~`]", text)
    assert r"a\|b\*\<script\>alert(1)\</script\>\$x\$" in text
    case_rows = [line for line in text.splitlines()
                 if line.startswith("| ") and "1 fail" in line]   # the case overview's row
    assert len(case_rows) == 1
    assert len(re.findall(r"(?<!\\)\|", case_rows[0])) == 5      # four cells, no more
    assert unescape(case_rows[0]).startswith(f"| {CASE_NAME} | 1 fail")
    failed = text.split("### What failed")[1].split("###")[0]
    assert f"**{CASE_NAME}: tf1 → {CANDIDATE} (x1)**" in unescape(failed)
    assert f"step 2 grad {TENSOR}" in unescape(failed)


def test_terminal_lines_keep_names_as_plain_text():
    lines = terminal_lines(named_results(), [])
    assert any(f"{CASE_NAME}: tf1 -> {CANDIDATE}" in line for line in lines)


class Tags(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags, self.text = [], []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)

    def handle_data(self, data):
        self.text.append(data)


def test_report_html_escapes_names_and_plots_them_literally():
    page = render_html(named_results())
    tags = Tags()
    tags.feed(page)
    assert "script" not in tags.tags and "b" not in tags.tags
    text = "".join(tags.text)
    assert f"{CASE_NAME}: tf1 → {CANDIDATE} (x1)" in text and TENSOR in text


def test_plot_legends_show_names_without_mathtext():
    from verify.render.plots import PairPlotter

    results = named_results()
    losses = results.losses[results.losses["candidate"] == CANDIDATE]
    with PairPlotter() as plotter:
        plotter.pair_png(results.rows.iloc[:0], losses, "tf1", CANDIDATE, None)
        texts = plotter.loss_ax.get_legend().get_texts()
        assert [t.get_text() for t in texts] == [f"tf1 {TENSOR}", f"{CANDIDATE} {TENSOR}"]
        assert not any(t.get_parse_math() for t in texts)
