"""compare_traces and compare_arrays: every verdict rule, pass and fail."""
import numpy as np
import pandas as pd
import pytest

from verify.judge.compare import COLUMNS, compare_traces, first_divergence
from verify.judge.arrays import compare_arrays
from verify.core.tolerances import Tolerance, Tolerances
from verify.core.trace import SparseRows, Trace

TOL = Tolerance(atol=1e-6, rtol=1e-5)


def make_trace(name, steps=3, scale=1.0, **meta):
    t = Trace(name, dict(meta))
    w = np.arange(6, dtype=np.float32).reshape(3, 2)
    t.record(0, "weight", "w", w)
    for s in range(1, steps + 1):
        t.record(s, "input", "x", f"digest{s}")
        t.record(s, "loss", "loss", np.float32(0.5 / s))
        t.record(s, "grad", "w", (w * 0.1 * s).astype(np.float32))
        t.record(s, "weight", "w", (w - 0.01 * s * scale).astype(np.float32))
    return t


def test_equal_arrays_pass_with_zero_drift():
    d = compare_arrays(np.ones(4, np.float32), np.ones(4, np.float32), TOL)
    assert d.passed and d.max_abs == 0 and d.reason == ""


def test_difference_within_rtol_passes_and_reports_tightest_rtol():
    ref = np.array([100.0, 1.0], np.float32)
    d = compare_arrays(ref * np.float32(1 + 5e-6), ref, Tolerance(0.0, 1e-5))
    assert d.passed
    assert 4e-6 < d.tightest_rtol < 6e-6


def test_failure_message_names_count_and_worst_index():
    ref = np.zeros((2, 3), np.float32)
    cand = ref.copy()
    cand[1, 2] = 0.5
    d = compare_arrays(cand, ref, TOL)
    assert not d.passed
    assert d.worst_index == "(1, 2)"
    assert "Mismatched elements: 1 / 6 (16.7%)" in d.reason
    assert "Greatest absolute difference: 0.5 at index (1, 2)" in d.reason
    assert d.max_rel == np.inf  # reference is 0 there


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_values_never_pass_even_when_identical(bad):
    a = np.array([1.0, bad], np.float32)
    d = compare_arrays(a, a.copy(), Tolerance(1.0, 1.0))
    assert not d.passed and "Non-finite" in d.reason and d.worst_index == "(1,)"


def test_shape_and_dtype_mismatch_fail_with_reason():
    assert "Shape mismatch" in compare_arrays(np.zeros(3), np.zeros(4), TOL).reason
    d = compare_arrays(np.zeros(3, np.float64), np.zeros(3, np.float32), TOL)
    assert not d.passed and "Dtype mismatch" in d.reason


def test_sparse_rows_compare_as_their_dense_sum():
    ref = SparseRows(np.array([0, 2, 0]), np.ones((3, 2), np.float32), (4, 2))
    same = SparseRows(np.array([2, 0]), np.array([[1, 1], [2, 2]], np.float32), (4, 2))
    t1, t2 = Trace("a"), Trace("b")
    t1.record(1, "grad", "table", ref)
    t2.record(1, "grad", "table", same)
    assert compare_traces(t1, t2)["passed"].all()
    other = SparseRows(np.array([1, 2]), np.array([[1, 1], [2, 2]], np.float32), (4, 2))
    t2.record(1, "grad", "table", other)
    assert not compare_traces(t1, t2)["passed"].any()


def test_identical_traces_pass_every_row_with_expected_columns():
    rows = compare_traces(make_trace("ref"), make_trace("cand"), case="demo", replicas=2)
    assert list(rows.columns) == COLUMNS
    assert rows["passed"].all()
    assert set(rows["quantity"]) == {"input", "loss", "grad", "weight"}
    assert (rows["replicas"] == 2).all() and (rows["case"] == "demo").all()
    assert first_divergence(rows) is None


def test_weight_drift_is_found_at_first_step_in_quantity_order():
    rows = compare_traces(make_trace("ref"), make_trace("cand", scale=1.5))
    d = first_divergence(rows)
    assert (d.step, d.quantity, d.tensor) == (1, "weight", "w")


def test_input_difference_is_the_first_divergence_within_a_step():
    cand = make_trace("cand", scale=1.5)
    cand.record(2, "input", "x", "something-else")
    rows = compare_traces(make_trace("ref"), cand)
    bad = rows[~rows["passed"]]
    assert set(bad[bad["step"] == 2]["quantity"]) == {"input", "weight"}
    # step 1 weight fails first: steps order before quantities
    assert first_divergence(rows).step == 1
    assert "Input differs" in bad[bad["quantity"] == "input"]["reason"].iloc[0]


def test_missing_tensor_is_a_failing_row_not_an_exception():
    cand = make_trace("cand")
    del cand.values[next(k for k in cand.values if k.step == 2 and k.quantity == "grad")]
    rows = compare_traces(make_trace("ref"), cand)
    missing = rows[~rows["passed"]]
    assert len(missing) == 1
    assert "Missing in candidate" in missing["reason"].iloc[0]


def test_a_run_that_raised_is_a_failing_run_row_after_its_last_step():
    cand = make_trace("cand", steps=2)
    cand.error = "ValueError: boom"
    rows = compare_traces(make_trace("ref"), cand)
    run = rows[rows["quantity"] == "run"]
    assert len(run) == 1 and run["step"].iloc[0] == 3 and "boom" in run["reason"].iloc[0]
    assert first_divergence(rows).quantity == "run"


def test_a_step_the_candidate_should_have_captured_fails():
    cand = make_trace("cand")
    for k in [k for k in cand.values if k.step == 3]:
        del cand.values[k]
    rows = compare_traces(make_trace("ref"), cand)
    assert "captured no value at step 3" in rows[~rows["passed"]]["reason"].iloc[0]


def test_boundary_capture_compares_only_its_steps_and_quantities():
    sparse = Trace("spe", {"capture_every": 2})
    ref = make_trace("ref", steps=4)
    for k, v in ref.values.items():
        if k.quantity == "weight" and k.step % 2 == 0:
            sparse.values[k] = v
    rows = compare_traces(ref, sparse)
    assert rows["passed"].all()
    assert set(rows["quantity"]) == {"weight"} and set(rows["step"]) == {0, 2, 4}
    # ... and still fails when its values are wrong
    sparse.record(4, "weight", "w", np.zeros((3, 2), np.float32))
    assert first_divergence(compare_traces(ref, sparse)).step == 4


def test_per_tensor_tolerance_override_is_used_and_reported():
    ref, cand = make_trace("ref"), make_trace("cand", scale=1.001)
    loose = Tolerances.default().override(tensors={"weight:w": Tolerance(1e-3, 1e-2)})
    rows = compare_traces(ref, cand, loose)
    assert rows["passed"].all()
    assert set(rows.loc[rows["quantity"] == "weight", "rtol"]) == {1e-2}
    assert not compare_traces(ref, cand)["passed"].all()


def test_first_divergence_orders_by_step_then_quantity():
    rows = pd.DataFrame({"step": [3, 2, 2, 2], "quantity": ["input", "weight", "slot", "grad"],
                         "tensor": ["x", "w", "w/m", "w"], "passed": [False] * 4,
                         "reason": list("abcd")})
    d = first_divergence(rows)
    assert (d.step, d.quantity) == (2, "grad")


def test_a_step_captured_run_missing_a_whole_quantity_fails_once():
    ref = make_trace("ref")
    for s in (1, 2):
        ref.record(s, "slot", "w/m", np.ones((3, 2), np.float32))
    rows = compare_traces(ref, make_trace("cand"))
    bad = rows[~rows["passed"]]
    assert list(bad["quantity"]) == ["slot"] and list(bad["tensor"]) == ["(all)"]
    assert "captured no slot value at all" in bad["reason"].iloc[0]
    # a boundary capture is allowed to lack it
    assert compare_traces(ref, make_trace("cand", capture_every=3)).query(
        "quantity == 'slot'").empty


def test_times_tolerance_measures_the_worst_element_against_what_it_was_allowed():
    tol = Tolerance(atol=1e-6, rtol=1e-5)
    ref = np.array([0.0, 1.0], np.float32)
    just_over = compare_arrays(np.array([2e-6, 1.0], np.float32), ref, tol)
    assert not just_over.passed and 1.9 < just_over.times_tolerance < 2.1
    assert just_over.tightest_rtol == np.inf      # why tightest_rtol is no margin
    assert compare_arrays(ref, ref, tol).times_tolerance == 0.0
