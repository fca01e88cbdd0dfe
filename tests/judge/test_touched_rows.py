"""Tables captured by the rows each step touched: compared on the union of both sides'
touched rows, against each side's last whole table updated since; saved and loaded whole."""
import numpy as np
import pytest

from verify.core.tolerances import Tolerance, Tolerances
from verify.core.trace import Key, TouchedRows, Trace
from verify.judge.compare import compare_traces
from verify.judge.touched_rows import TouchedComparison
from verify.runners.capture.tables import TableCapture

SHAPE = (50, 4)


def trained(name, seed, touched, steps=6, every=None, skip=None):
    """A table trained by random sparse updates; recorded whole every step, or by touched rows
    (whole at step 0, every `every` steps and the last). `skip` = (step, row): an update that
    row does not get on this side (a dropped row update)."""
    rng = np.random.default_rng(seed)
    table = np.random.default_rng(0).normal(size=SHAPE).astype(np.float32)
    trace = Trace(name)
    trace.record(0, "weight", "t", table.copy())
    for step in range(1, steps + 1):
        ids = np.unique(rng.integers(0, SHAPE[0], 8))
        update = rng.normal(size=(len(ids), SHAPE[1])).astype(np.float32)
        if skip and skip[0] == step:
            update[ids == skip[1]] = 0
        table[ids] += update
        if not touched or step == steps or (every and step % every == 0):
            trace.record(step, "weight", "t", table.copy())
        else:
            trace.record(step, "weight", "t", TouchedRows(ids, table[ids].copy(), SHAPE))
    return trace


def rows_of(frame):
    return frame.sort_values("step").reset_index(drop=True)


def test_touched_rows_pass_where_whole_tables_pass_and_find_the_same_worst_element():
    tol = Tolerances.default()
    whole = compare_traces(trained("a", 1, False), trained("b", 1, False), tol)
    touched = compare_traces(trained("a", 1, True), trained("b", 1, True), tol)
    assert whole["passed"].all() and touched["passed"].all()
    assert (touched["max_abs"] == 0).all()


def test_a_row_only_one_side_updated_is_caught_at_its_step_in_table_coordinates():
    reference = trained("tf1", 1, True)
    ids_at_3 = reference.get(3, "weight", "t").ids
    dropped = int(ids_at_3[0])
    candidate = trained("tf2", 1, True, skip=(3, dropped))
    rows = rows_of(compare_traces(reference, candidate, Tolerances.default()))
    failing = rows[~rows["passed"]]
    first = failing.iloc[0]
    assert (first["step"], first["quantity"], first["tensor"]) == (3, "weight", "t")
    assert first["worst_index"].startswith(f"({dropped}, ")
    assert first["reason"].startswith("On the ")
    assert first["times_tolerance"] > 1e3
    # the candidate's row stays wrong later, whether the steps touch it or not
    assert not failing[failing["step"] == 6].empty


def test_an_update_to_a_row_the_other_side_did_not_touch_is_compared():
    """The candidate touches (and changes) a row the reference's step did not touch: the
    union of ids compares it against the reference's older value of that row."""
    ref, cand = Trace("tf1"), Trace("tf2")
    base = np.zeros((6, 2), np.float32)
    for t in (ref, cand):
        t.record(0, "weight", "t", base)
    ref.record(1, "weight", "t", TouchedRows([1], np.ones((1, 2), np.float32), (6, 2)))
    cand.record(1, "weight", "t", TouchedRows([1, 4], np.ones((2, 2), np.float32), (6, 2)))
    drift = TouchedComparison(ref, cand).compare(Key(1, "weight", "t"), Tolerance(1e-6, 0))
    assert not drift.passed and drift.worst_index == "(4, 0)"
    assert "On the 2 rows either side touched" in drift.reason


def test_rows_nobody_recorded_whole_before_are_unknown_and_fail_saying_so():
    ref, cand = Trace("tf1"), Trace("tf2")
    ref.record(1, "slot", "t/accumulator", TouchedRows([0], np.ones((1, 2), np.float32), (3, 2)))
    cand.record(1, "slot", "t/accumulator", TouchedRows([2], np.ones((1, 2), np.float32), (3, 2)))
    rows = compare_traces(ref, cand)
    assert not rows["passed"].any()
    assert "recorded no whole slot 't/accumulator' before step 1" in rows["reason"].iloc[0]


def test_touched_rows_survive_save_and_load(tmp_path):
    trace = trained("tf2", 3, True, every=2)
    Trace.load(trace.save(tmp_path / "t"))
    loaded = Trace.load(tmp_path / "t")
    for key, value in trace.values.items():
        other = loaded.values[key]
        assert type(other) is type(value)
        if isinstance(value, TouchedRows):
            assert np.array_equal(other.ids, value.ids) and other.dense_shape == value.dense_shape
            assert np.array_equal(other.rows, value.rows)
        else:
            assert np.array_equal(other, value)
    assert compare_traces(trace, loaded)["passed"].all()


def test_table_capture_says_when_tables_are_whole_and_refuses_bad_options():
    capture = TableCapture("touched_rows", every=3)
    assert [s for s in range(0, 8) if capture.whole(s, 7, "weight")] == [0, 3, 6, 7]
    assert [s for s in range(0, 8) if capture.whole(s, 7, "slot")] == [0, 1, 3, 6, 7]
    assert all(TableCapture().whole(s, 7, "weight") for s in range(8))
    with pytest.raises(ValueError, match="capture_tables is one of"):
        TableCapture("rows")
    with pytest.raises(ValueError, match="tables_every"):
        TableCapture("touched_rows", every=0)


@pytest.mark.slow   # starts TensorFlow: the devices are configured first (conftest)
@pytest.mark.parametrize("every", [None, 1, 3])
def test_the_step_function_names_the_whole_steps_the_host_names(every):
    """`whole_at` (in a TensorFlow function, from the optimizer's step counter) and `whole`
    (on the host) agree on every step after an update."""
    import tensorflow as tf

    capture, steps = TableCapture("touched_rows", every=every), 7
    for quantity in ("weight", "slot"):
        decide = tf.function(lambda step: capture.whole_at(step, steps, quantity))
        in_graph = [s for s in range(1, steps + 1) if bool(decide(tf.constant(s, tf.int64)))]
        assert in_graph == [s for s in range(1, steps + 1) if capture.whole(s, steps, quantity)]
