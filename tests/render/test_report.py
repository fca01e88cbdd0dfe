"""The report stage: parts, merged tables, summary.md. No TensorFlow; milliseconds each.
The runs of any size come from `synthetic_results` (tests/synthetic_results.py)."""
import dataclasses
import io
import json

import numpy as np
import pandas as pd
import pytest

from verify.judge.compare import COLUMNS
from verify.judge.pair import LOSS_COLUMNS, PairResult, compare_pair
from verify.judge.records import PairRecord
from verify.render import write_report
from verify.render.markdown import summary_markdown
from verify.render.terminal import terminal_lines
from verify.store.results import read_parts, read_report, sort_rows, write_part
from verify.core.trace import Trace

from synthetic_results import ENVIRONMENT, synthetic_results


def small_traces(drift=0.0):
    reference, candidate = Trace("tf1", {"seed": 3, "steps": 2}), Trace("tf2", {"seconds": 0.5})
    for step in (1, 2):
        w = np.arange(4, dtype=np.float32) * step
        reference.record(step, "loss", "loss", np.float32(1.0 / step))
        candidate.record(step, "loss", "loss", np.float32(1.0 / step + drift))
        reference.record(step, "weight", "w", w)
        candidate.record(step, "weight", "w", w + np.float32(drift))
    reference.record(3, "loss", "loss", np.float32(0.25))   # captured on one side only
    return reference, candidate


def test_compare_pair_records_verdict_seed_and_both_loss_curves():
    reference, candidate = small_traces(drift=0.5)
    result = compare_pair(reference, candidate, None, case="demo", replicas=1)
    assert result.record.verdict == "FAIL" and result.verdict.status == "FAIL"
    assert (result.record.first_step, result.record.first_quantity) == (1, "loss")
    assert result.record.seed == 3 and result.record.steps == 2
    assert list(result.losses.columns) == LOSS_COLUMNS
    assert result.losses["reference_loss"].tolist() == [1.0, 0.5, 0.25]
    assert result.losses["candidate_loss"].tolist()[:2] == [1.5, 1.0]
    assert np.isnan(result.losses["candidate_loss"].iloc[2])


def test_parts_round_trip_rows_losses_and_records(tmp_path):
    reference, candidate = small_traces(drift=0.5)
    result = compare_pair(reference, candidate, None, case="demo", replicas=1)
    result.environment = ENVIRONMENT
    write_part(tmp_path, "demo:tf1-vs-tf2", result)
    merged = read_parts(tmp_path)
    pd.testing.assert_frame_equal(merged.rows, result.rows, check_dtype=False)
    pd.testing.assert_frame_equal(merged.losses, result.losses, check_dtype=False)
    assert merged.pairs["verdict"].tolist() == ["FAIL"]
    assert merged.environment == ENVIRONMENT


def test_a_part_without_its_record_is_not_merged(tmp_path):
    """A test killed between writing its rows and its record leaves no half result."""
    reference, candidate = small_traces()
    write_part(tmp_path, "a", compare_pair(reference, candidate, None, case="d", replicas=1))
    (tmp_path / "orphan.rows.csv").write_text(pd.DataFrame(columns=COLUMNS).to_csv(index=False))
    assert len(read_parts(tmp_path).pairs) == 1


def test_failed_pair_result_carries_the_harness_error(tmp_path):
    result = PairResult.failed(PairRecord("d", "a", "b", 1,
                                          message="harness error: KeyError: 'x'"))
    write_part(tmp_path, "d:a-vs-b", result)
    merged = read_parts(tmp_path)
    assert merged.pairs[["verdict", "message"]].values.tolist() == [
        ["FAIL", "harness error: KeyError: 'x'"]]
    assert merged.rows.empty and merged.verdict == "FAIL"


def test_write_report_is_byte_identical_for_the_same_results_in_any_order(tmp_path):
    results = synthetic_results(pairs=4, tensors=5, failing=2)
    shuffled = dataclasses.replace(
        results, rows=results.rows.sample(frac=1.0, random_state=1),
        pairs=results.pairs.sample(frac=1.0, random_state=2),
        losses=results.losses.sample(frac=1.0, random_state=3))
    write_report(tmp_path / "a", results)
    write_report(tmp_path / "b", shuffled)
    for name in ("drift.csv.gz", "summary.csv", "losses.csv", "summary.md", "report.html"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name


def test_read_report_reads_back_what_write_report_wrote(tmp_path):
    results = synthetic_results(pairs=2, tensors=3, failing=1)
    record = {"schema": "parity-run/1", "run_id": "r", "environment": ENVIRONMENT,
              "options": results.options, "lost": {"t::x": "crashed"}}
    write_report(tmp_path, results, record)
    again = read_report(tmp_path)
    pd.testing.assert_frame_equal(again.rows, sort_rows(results.rows), check_dtype=False)
    assert sorted(again.pairs["candidate"]) == sorted(results.pairs["candidate"])
    assert again.lost == {"t::x": "crashed"} and again.environment == ENVIRONMENT
    assert json.loads((tmp_path / "run.json").read_text())["run_id"] == "r"


def test_read_report_says_what_is_missing(tmp_path):
    with pytest.raises(FileNotFoundError, match="holds no drift.csv.gz"):
        read_report(tmp_path)


def test_summary_puts_verdict_environment_failures_then_worst_drift():
    results = synthetic_results(pairs=3, tensors=4, failing=1)
    text = summary_markdown(results, {"provenance": {"git_commit": "abcdef1234567890"}})
    lines = text.splitlines()
    assert lines[0] == "## Parity: FAIL (3 pairs: 1 fail, 2 pass)"
    assert lines[2].startswith("Environment: tensorflow 2.15.1, numpy 1.26.4, python 3.11.7")
    assert "commit `abcdef123456`" in lines[2]
    failed, worst = text.index("### What failed"), text.index("### Worst drift per quantity")
    assert failed < worst < text.index("All 3 pairs")
    assert "at step 2 grad layer_0000/kkkkkkkkkk" in text[failed:worst]


def test_summary_stays_short_for_hundreds_of_tensors_and_many_pairs():
    results = synthetic_results(pairs=120, tensors=300, steps=2, failing=40, name_length=150)
    assert len(results.rows) > 200_000
    text = summary_markdown(results)
    assert len(text) < 16_000, len(text)
    assert len(text.splitlines()) < 100
    assert "… 30 more failing pairs in summary.csv" in text
    assert text.count("\n  - likely cause: gradients x0.5: ccc") == 10
    assert len(text.splitlines()) <= 60
    assert text.splitlines()[-1].startswith("All 120 pairs with their first divergence: "
                                            "summary.csv")
    assert max(len(line) for line in text.splitlines()) < 800


def test_a_thousand_pairs_over_many_cases_fit_a_github_comment():
    """GitHub refuses a comment over 65,536 characters: 1,000 pairs, 300 failing, over 200
    cases, with long names, stay within it (the case overview lists 30 cases, the failures
    10, the rest is counted)."""
    results = synthetic_results(pairs=1000, tensors=3, steps=2, failing=300, name_length=150,
                                cases=200)
    text = summary_markdown(results)
    assert len(text) < 65_536, len(text)
    assert "| … | 170 more cases in summary.csv | | |" in text
    assert "… 290 more failing pairs in summary.csv" in text


def test_the_summary_leads_with_what_a_reviewer_acts_on():
    """Verdict, environment, what failed, the migration's own blocking findings and the case
    overview come before the collapsed details; the details hold the rest."""
    results = synthetic_results(pairs=6, tensors=3, failing=2)
    text = summary_markdown(results)
    details = text.index("<details>")
    for heading in ("### What failed", "### Per case"):
        assert text.index(heading) < details, heading
    assert text.index("### Worst drift per quantity") > details
    overview = text.split("### Per case")[1].split("<details>")[0]
    assert "| case_0 | 1 fail, 1 pass |" in overview
    assert "no mutants run" in overview


def test_lost_tests_make_the_run_incomplete_and_are_listed():
    results = dataclasses.replace(synthetic_results(pairs=1, failing=0),
                                  lost={"verify/test_parity.py::test_pair[x]": "worker crashed"})
    assert results.verdict == "INCOMPLETE"
    assert "### 1 test left no result" in summary_markdown(results)
    assert any(line.startswith("  LOST") for line in terminal_lines(results, []))


def test_preflight_findings_round_trip_and_summary_section_is_bounded(tmp_path):
    from verify.judge.preflight import preflight

    results = synthetic_results(pairs=2, failing=0)
    found = [preflight("case_0", "tf1", {"table/t/combiner": "mean", "loop/steps_per_call": "a"},
                       f"tf2-variant-{n:03d}", {"table/t/combiner": "sum",
                                                "loop/steps_per_call": "b"}) for n in range(40)]
    results = dataclasses.replace(results, preflight=pd.concat(found, ignore_index=True))
    write_report(tmp_path, results)
    written = pd.read_csv(tmp_path / "preflight.csv", dtype=str, keep_default_na=False)
    assert len(written) == 80
    assert list(written["severity"][:40]) == ["blocking"] * 40   # blocking first
    section = (tmp_path / "summary.md").read_text().split("### Preflight")[1].split("###")[0]
    assert section.count("**blocking**") == 10 and "30 more in preflight.csv" in section
    assert "`table/t/combiner` (mean → sum)" in section


def replayed_results():
    """Two pairs, the failing one with a layer replay: its first divergent layer and rows."""
    from verify.core.layer_capture import LayerCapture, ObservedLayer
    from verify.judge.layers import compare_layers, layer_rows

    def side(scale):
        value = np.linspace(0.5, 1.5, 8).reshape(4, 2)
        return LayerCapture(1, (
            ObservedLayer("embedding/items", "output", 0, "TPUEmbedding", "", value * scale,
                          value),
            ObservedLayer("dense", "output", 1, "Dense", "", value, value)))

    results = synthetic_results(pairs=2, tensors=3, failing=1)
    found = compare_layers(side(1.0), side(2.0))
    failing = results.pairs.iloc[0]
    layers = layer_rows(found, failing["case"], failing["reference"], failing["candidate"],
                        int(failing["replicas"]), 1)
    pairs = results.pairs.copy()
    pairs["first_layer"], pairs["layer_replay"] = "", ""
    pairs.loc[0, ["first_layer", "layer_replay"]] = [found.first, "step 1 replayed layer by layer"]
    pairs.loc[0, "first_layer_drift"] = found.first_drift
    pairs["substitution"], pairs["repro"] = "", ""
    pairs.loc[0, ["substitution", "repro"]] = [SUBSTITUTION, "repro/c/tf1--tf2/repro.py"]
    return dataclasses.replace(results, pairs=pairs, layers=layers), found


SUBSTITUTION = ("substitution at step 1: local to layer `dense` (Dense): with identical inputs "
                "and weights its outputs differ by 0.5 (beyond 10 x its one-ulp floor 1e-07 = "
                "1e-06)")


def test_a_layer_replay_is_written_read_back_and_shown_where_its_pair_is(tmp_path):
    results, found = replayed_results()
    assert found.first.startswith("embedding lookup `embedding/items`")
    write_report(tmp_path, results)
    again = read_report(tmp_path)
    assert len(again.layers) == len(results.layers) == 4
    assert again.layers["status"].tolist() == ["failed", "passed", "passed", "passed"]
    replayed = again.pairs[again.pairs["first_layer"] != ""]
    assert replayed["first_layer"].tolist() == [found.first]
    assert replayed["first_layer_drift"].tolist() == [found.first_drift]
    summary = (tmp_path / "summary.md").read_text()
    assert f"(first divergent layer: {found.first[:30]}" in summary.replace("\\", "")
    page = (tmp_path / "report.html").read_text()
    assert "<b>First divergent layer:</b>" in page and "drift per layer of the replayed" in page
    assert f"<b>Substitution:</b> {SUBSTITUTION}" in page
    assert '<a href="repro/c/tf1--tf2/repro.py">' in page
    assert again.pairs["repro"].tolist().count("repro/c/tf1--tf2/repro.py") == 1
    assert any("layer: embedding lookup" in line for line in terminal_lines(again, []))
    from verify.store.history import run_record

    pairs = {p["candidate"]: p for p in run_record(again, run_id="r")["pairs"]}   # run.json
    replayed = pairs[results.pairs.iloc[0]["candidate"]]
    assert (replayed["first_layer"], replayed["first_layer_drift"]) == (found.first,
                                                                        found.first_drift)
    assert {p["first_layer_drift"] for c, p in pairs.items() if c != replayed["candidate"]} \
        == {None}


def test_a_report_written_before_layer_replays_reads_with_none(tmp_path):
    results = synthetic_results(pairs=2, tensors=3, failing=1)
    write_report(tmp_path, results)
    (tmp_path / "layers.csv").unlink()
    older = pd.read_csv(tmp_path / "summary.csv").drop(
        columns=["first_layer", "first_layer_drift", "layer_replay", "substitution", "repro"])
    older.to_csv(tmp_path / "summary.csv", index=False)
    again = read_report(tmp_path)
    assert again.layers.empty and set(again.pairs["first_layer"]) == {""}
    assert set(again.pairs["substitution"]) == set(again.pairs["repro"]) == {""}
    assert "First divergent layer" not in summary_markdown(again)


def test_parts_carry_a_pairs_layer_rows(tmp_path):
    results, _ = replayed_results()
    reference, candidate = small_traces(drift=0.5)
    result = compare_pair(reference, candidate, None, case="demo", replicas=1)
    result.layers = results.layers
    write_part(tmp_path, "demo:tf1-vs-tf2", result)
    write_part(tmp_path, "demo:tf1-vs-tf3", compare_pair(reference, candidate, None,
                                                         case="demo", replicas=1))
    merged = read_parts(tmp_path)
    assert len(merged.layers) == 4 and merged.layers["layer"].tolist()[0] == "embedding/items"


def test_drift_rows_are_written_compressed_and_an_older_reports_csv_still_reads(tmp_path):
    """drift.csv.gz: gzip without a timestamp (identical rows, identical bytes) that pandas
    reads as it is; a report written before, with drift.csv, reads the same."""
    import gzip

    results = synthetic_results(pairs=3, tensors=20, failing=1)
    write_report(tmp_path / "new", results)
    compressed = tmp_path / "new" / "drift.csv.gz"
    text = gzip.decompress(compressed.read_bytes())
    assert len(compressed.read_bytes()) < len(text) / 3
    assert not (tmp_path / "new" / "drift.csv").exists()
    pd.testing.assert_frame_equal(pd.read_csv(compressed), pd.read_csv(io.BytesIO(text)))
    old = tmp_path / "old"
    old.mkdir()
    for name in ("summary.csv", "losses.csv"):
        (old / name).write_bytes((tmp_path / "new" / name).read_bytes())
    (old / "drift.csv").write_bytes(text)
    pd.testing.assert_frame_equal(read_report(old).rows, read_report(tmp_path / "new").rows)


def test_a_rewritten_report_removes_the_drift_csv_its_suite_wrote_before(tmp_path):
    """An older report's drift.csv, listed in the suite's manifest, gives way to drift.csv.gz;
    a drift.csv the manifest does not list (not the suite's) stays."""
    from verify.store.report_dir import MANIFEST, record_report_files

    results = synthetic_results(pairs=2)
    for name, listed in (("ours", True), ("theirs", False)):
        directory = tmp_path / name
        directory.mkdir()
        (directory / "drift.csv").write_text("old")
        (directory / MANIFEST).write_text(json.dumps({"files": ["drift.csv"] if listed else []}))
        record_report_files(directory, write_report(directory, results))
        assert (directory / "drift.csv").exists() is not listed, name
        assert (directory / "drift.csv.gz").is_file()


def test_a_truncated_drift_table_is_a_bad_file_naming_it(tmp_path):
    """A half-downloaded drift.csv.gz says which file and what to do, not a traceback."""
    from verify.core.files import BadFile

    write_report(tmp_path, synthetic_results(pairs=2, tensors=20))
    whole = (tmp_path / "drift.csv.gz").read_bytes()
    (tmp_path / "drift.csv.gz").write_bytes(whole[:len(whole) // 2])
    with pytest.raises(BadFile, match="drift.csv.gz.*EOFError"):
        read_report(tmp_path)
