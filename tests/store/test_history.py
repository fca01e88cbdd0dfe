"""Run records and regressions between runs. No TensorFlow; milliseconds each."""
import dataclasses
import json
import shutil
import subprocess
from pathlib import Path

import pytest
from synthetic_results import synthetic_results

from verify.render.markdown import MAX_LISTED
from verify.store.history import (compare_runs, git_commit, history, load_record,
                            run_record, write_record)
from verify.render.markdown import comparison_lines, summary_markdown

ROOT = Path(__file__).resolve().parents[2]


def record(run_id="r1", timestamp="2024-01-01T00:00:00+00:00", **kwargs):
    return run_record(synthetic_results(**kwargs), run_id=run_id, timestamp=timestamp,
                      provenance={"git_commit": "a" * 40, "seeds": {"case_0": 7}})


def test_record_holds_verdicts_worst_drift_per_pair_and_provenance():
    r = record(pairs=2, tensors=3, failing=1)
    assert r["verdict"] == "FAIL" and r["counts"] == {"FAIL": 1, "PASS": 1}
    failing = r["pairs"][0]
    assert failing["verdict"] == "FAIL"
    assert failing["first_divergence"] == "step 2 grad layer_0000/kkkkkkkkkk"
    assert failing["worst"]["grad"]["max_abs"] == pytest.approx(0.05)
    assert failing["worst"]["grad"]["step"] == 5
    assert set(failing["worst"]) == {"loss", "grad", "slot", "weight"}
    assert r["environment"]["tensorflow"] == "2.15.1"
    assert r["provenance"]["git_commit"] == "a" * 40
    json.dumps(r)   # plain JSON


def test_record_size_does_not_grow_with_tensors():
    small, large = record(pairs=3, tensors=2), record(pairs=3, tensors=400)
    assert len(json.dumps(large)) < 1.3 * len(json.dumps(small))


def test_same_run_twice_is_no_regression():
    comparison = compare_runs(record(run_id="b"), record(run_id="a"))
    assert comparison.ok and comparison.regressions == [] and comparison.changes == []
    assert comparison.headline() == "no regression"
    assert "No regression" in "\n".join(comparison_lines(comparison))


def test_pass_that_became_a_fail_is_a_regression():
    comparison = compare_runs(record(failing=1), record(failing=0))
    assert not comparison.ok
    assert comparison.regressions[0] == (
        "case_0: tf1 → tf2-variant-000 (x1): PASS → FAIL at step 2 grad layer_0000/kkkkkkkkkk")


def test_drift_grown_past_the_factor_is_a_regression_and_below_it_is_not():
    before = record(failing=0, drift_scale=1.0)
    assert compare_runs(record(failing=0, drift_scale=5.0), before, factor=10).ok
    grown = compare_runs(record(failing=0, drift_scale=200.0), before, factor=10)
    assert not grown.ok
    assert all("worst max abs" in r and "limit 10x" in r for r in grown.regressions)
    assert compare_runs(record(failing=0, drift_scale=200.0), before, factor=1000).ok


def test_drift_from_zero_to_a_few_ulps_is_not_a_regression():
    before, after = record(failing=0), record(failing=0)
    for pair in before["pairs"]:
        for worst in pair["worst"].values():
            worst["max_abs"] = 0.0
    for pair in after["pairs"]:
        for worst in pair["worst"].values():
            worst["max_abs"] = 6e-8   # atol 1e-6: the floor is 1e-8, 10x of it is 1e-7
    assert compare_runs(after, before).ok


def test_a_controls_drift_growth_is_not_a_regression():
    before, after = record(failing=0), record(failing=0, drift_scale=1e4)
    for r in (before, after):
        for pair in r["pairs"]:
            pair["role"] = "control"
    assert compare_runs(after, before).ok


def test_environment_options_seeds_and_pairs_changes_are_listed_but_not_regressions():
    before, after = record(pairs=2), record(pairs=3)
    after["environment"]["tensorflow"] = "2.16.1"
    after["options"]["steps"] = 50
    after["provenance"]["seeds"] = {"case_0": 8}
    comparison = compare_runs(after, before)
    assert comparison.ok
    assert "environment tensorflow 2.15.1 → 2.16.1" in comparison.changes
    assert "option steps 5 → 50" in comparison.changes
    assert "seed of case_0 7 → 8" in comparison.changes
    assert "new pair case_2: tf1 → tf2-variant-002 (x1)" in comparison.changes
    assert comparison.headline() == "no regression (environment changed)"


def test_a_lost_test_is_a_regression():
    after = record()
    after["lost"] = {"verify/test_parity.py::test_pair[x]": "worker crashed"}
    assert compare_runs(after, record()).regressions == [
        "verify/test_parity.py::test_pair[x] left no result"]


def test_factor_must_exceed_one():
    with pytest.raises(ValueError, match="must be > 1"):
        compare_runs(record(), record(), factor=1)


def test_regressions_section_in_the_summary_is_bounded():
    before = record(pairs=60, tensors=2, failing=0)
    after = record(pairs=60, tensors=2, failing=60)
    comparison = compare_runs(after, before)
    assert len(comparison.regressions) >= 60
    text = summary_markdown(synthetic_results(pairs=60, tensors=2, failing=60), after, comparison)
    assert text.splitlines()[0].endswith("· 120 regressions")
    assert text.count("PASS → FAIL") == MAX_LISTED
    assert f"… {len(comparison.regressions) - MAX_LISTED} more regressions" in text


def test_history_directory_round_trip_and_latest(tmp_path):
    first = record(run_id="night-1", timestamp="2024-01-01T03:00:00+00:00")
    second = record(run_id="night-2", timestamp="2024-01-02T03:00:00+00:00")
    write_record(tmp_path, second)
    write_record(tmp_path, first)
    (tmp_path / "notes.json").write_text('{"not": "a record"}')
    assert [r["run_id"] for r in history(tmp_path)] == ["night-1", "night-2"]
    assert load_record(tmp_path)["run_id"] == "night-2"
    assert load_record(tmp_path, exclude_run_id="night-2")["run_id"] == "night-1"
    assert load_record(tmp_path / "night-1.json")["run_id"] == "night-1"


def test_runs_of_disjoint_case_sets_are_not_called_free_of_regressions():
    current = record(run_id="now")
    other = json.loads(json.dumps(current))
    for pair in other["pairs"]:
        pair["case"] = "another_case"
    comparison = compare_runs(current, other)
    assert not comparison.ok
    assert any("nothing was compared" in r for r in comparison.regressions)


def test_a_damaged_history_record_is_skipped_by_name_not_a_blocker(tmp_path):
    write_record(tmp_path, record(run_id="night-1", timestamp="2024-01-01T03:00:00+00:00"))
    (tmp_path / "night-2.json").write_text('{"schema": "parity-run/1", "run_id": "night-2", ')
    with pytest.raises(ValueError, match="night-2.json"):
        load_record(tmp_path)                      # asked plainly: the damage is an error
    damaged = []
    assert load_record(tmp_path, damaged=damaged)["run_id"] == "night-1"
    assert len(damaged) == 1 and "night-2.json" in damaged[0]


def test_an_unfinished_runs_report_directory_is_not_a_record(tmp_path):
    from verify.store.report_dir import mark_in_progress

    mark_in_progress(tmp_path, "run-9")
    state = json.loads((tmp_path / "run.json").read_text())
    state["pid"] = 999999999      # its process is gone
    (tmp_path / "run.json").write_text(json.dumps(state))
    with pytest.raises(ValueError, match="did not finish"):
        load_record(tmp_path)


def test_load_record_from_a_report_directory_uses_its_run_json(tmp_path):
    (tmp_path / "run.json").write_text(json.dumps(record(run_id="in-report")))
    write_record(tmp_path / "history", record(run_id="older"))
    assert load_record(tmp_path)["run_id"] == "in-report"


def test_load_record_errors_say_what_to_pass(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist: pass a run record"):
        load_record(tmp_path / "missing.json")
    (tmp_path / "other.json").write_text('{"a": 1}')
    with pytest.raises(ValueError, match="not a parity run record"):
        load_record(tmp_path / "other.json")
    (tmp_path / "broken.json").write_text("{")
    with pytest.raises(ValueError, match="not JSON"):
        load_record(tmp_path / "broken.json")
    empty = tmp_path / "empty"
    empty.mkdir()
    assert load_record(empty) is None


def test_git_commit_inside_and_outside_a_checkout(tmp_path):
    assert git_commit(tmp_path) is None
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("the project is not a git checkout here")
    expected = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True).stdout.strip()
    assert git_commit(ROOT) == expected and len(expected) == 40


def test_record_of_results_with_lost_tests_is_incomplete():
    results = dataclasses.replace(synthetic_results(failing=0), lost={"t": "crashed"})
    r = run_record(results, run_id="x")
    assert r["verdict"] == "INCOMPLETE" and r["lost"] == {"t": "crashed"}


def test_pairs_left_out_of_a_narrower_run_are_one_line():
    comparison = compare_runs(record(pairs=2), record(pairs=8))
    assert comparison.ok
    assert len(comparison.changes) == 1
    assert comparison.changes[0].startswith("6 pairs: pair not run this time (e.g. case_")


def test_a_pair_that_regressed_with_its_environment_names_it_as_the_likely_cause():
    before, after = record(failing=0), record(failing=1)
    for pair in before["pairs"]:
        pair["environments"] = "local (TF 2.15.1) → tf221 (TF 2.21.0)"
    for pair in after["pairs"]:
        pair["environments"] = "local (TF 2.15.1) → tf221 (TF 2.22.0)"
    flip = compare_runs(after, before).regressions[0]
    assert flip.endswith("; likely cause: its environments changed (local (TF 2.15.1) → "
                         "tf221 (TF 2.21.0) ⇒ local (TF 2.15.1) → tf221 (TF 2.22.0))")
    for pair in after["pairs"]:
        pair["environments"] = "local (TF 2.15.1) → tf221 (TF 2.21.0)"
    assert "likely cause" not in compare_runs(after, before).regressions[0]
