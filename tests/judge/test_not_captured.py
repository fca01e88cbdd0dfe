"""What a device does not let a run see is said, listed and never counted as agreement.

On a TPU, table gradients never exist as tensors and tables are read back every K steps. A
trace says so in its meta (`not_captured`, `read_every`); the comparison turns a declared
value into an informational row "not captured on TPU", and a value missing without a
declaration still fails.
"""
import numpy as np
import pandas as pd
import pytest

from verify.core.case import Case, Examples, Expectation, Implementation, PairSpec
from verify.core.names import NameMap
from verify.core.trace import SparseRows, Trace
from verify.judge import judge_pair
from verify.judge.compare import compare_traces, not_captured_rows
from verify.judge.records import PAIR_COLUMNS
from verify.render.markdown import summary_markdown
from verify.store.results import RunResults
from verify.runners.run import canonicalize

WHY = "the engine applies it"


def tpu_trace(name: str, steps: int = 3, *, declare: bool = True, every: int | None = None,
              table_grads: bool = False) -> Trace:
    trace = Trace(name, {"device": "tpu", "steps": steps})
    for step in range(steps + 1):
        if not every or step % every == 0 or step == steps:
            trace.record(step, "weight", "table", np.full((4, 2), step, np.float32))
        trace.record(step, "weight", "w", np.full(3, step, np.float32))
        if step:
            trace.record(step, "loss", "loss", np.float32(0.5 / step))
            trace.record(step, "grad", "w", np.ones(3, np.float32))
            if table_grads:
                trace.record(step, "grad", "table", SparseRows(np.array([1]),
                                                               np.ones((1, 2), np.float32), (4, 2)))
    if declare:
        trace.meta.not_captured = {"grad": {"table": WHY}}
    if every:
        trace.meta.read_every = {"weight": {"table": every}}
    return trace


def test_declared_values_become_passing_rows_that_say_not_captured():
    rows = compare_traces(tpu_trace("tf1"), tpu_trace("tf2"), case="c")
    unseen = rows[not_captured_rows(rows)]
    assert list(unseen["step"]) == [1, 2, 3] and set(unseen["tensor"]) == {"table"}
    assert unseen["passed"].all() and unseen["max_abs"].isna().all()
    assert unseen["reason"].iloc[0] == f"not captured on TPU by tf1 and tf2: {WHY}"
    assert rows[~not_captured_rows(rows)]["passed"].all()


def test_a_missing_value_not_declared_still_fails():
    """Negative control: the same gap without a declaration is a failing row."""
    rows = compare_traces(tpu_trace("tf1", table_grads=True), tpu_trace("tf2", declare=False),
                          case="c")
    failing = rows[~rows["passed"]]
    assert set(failing["tensor"]) == {"table"} and set(failing["quantity"]) == {"grad"}
    assert failing["reason"].str.startswith("Missing in candidate").all()
    assert not not_captured_rows(rows).any()


def test_a_cpu_reference_with_table_gradients_against_a_tpu_candidate():
    """An oracle or CPU reference has the table gradients; the TPU side declares it cannot."""
    rows = compare_traces(tpu_trace("oracle", declare=False, table_grads=True),
                          tpu_trace("tf2"), case="c")
    unseen = rows[not_captured_rows(rows)]
    assert len(unseen) == 3 and unseen["reason"].str.contains("by tf2: ").all()
    assert rows["passed"].all()


def test_verdict_counts_only_compared_values_and_names_the_rest():
    spec = PairSpec("c", "tf1", "tf2")
    traces = {"tf1": tpu_trace("tf1"), "tf2": tpu_trace("tf2")}
    result = judge_pair(spec, traces.__getitem__, None)
    compared = int((~not_captured_rows(result.rows)).sum())
    assert result.record.verdict == "PASS"
    assert result.verdict.message == (f"{compared} values agree within tolerance; 3 values not "
                                      f"captured on the device (listed apart, not compared)")
    assert result.record.not_captured == "grad table (3 steps): not captured on TPU by tf1 and tf2"
    assert "not_captured" in PAIR_COLUMNS


def test_nothing_compared_is_not_a_pass():
    """Rows that are all 'not captured' are no evidence: the pair FAILs, saying so."""
    from verify.judge.verdict import judge

    rows = pd.DataFrame({"step": [1], "quantity": ["grad"], "tensor": ["table"],
                         "passed": [True], "reason": [f"not captured on TPU by tf2: {WHY}"],
                         "times_tolerance": [np.nan], "status": ["not captured"]})
    verdict = judge(rows, None)
    assert verdict.status == "FAIL"
    assert verdict.message == ("nothing was compared: the two traces share no step and quantity;"
                               " 1 values not captured on the device (listed apart, not "
                               "compared)")


def test_tables_read_every_k_steps_are_compared_on_those_steps_only():
    reference, candidate = tpu_trace("tf1"), tpu_trace("tf2", steps=3, every=2)
    rows = compare_traces(reference, candidate, case="c")
    table = rows[(rows["quantity"] == "weight") & (rows["tensor"] == "table")]
    assert list(table["step"]) == [0, 2, 3] and table["passed"].all()
    # a read step that holds no table is still a failure
    del candidate.values[next(k for k in candidate.values
                              if k.step == 2 and k.tensor == "table")]
    rows = compare_traces(reference, candidate, case="c")
    assert not rows[(rows["step"] == 2) & (rows["quantity"] == "weight")
                    & (rows["tensor"] == "table")]["passed"].any()


def test_summary_lists_what_was_not_captured_and_why():
    spec = PairSpec("c", "tf1", "tf2")
    traces = {"tf1": tpu_trace("tf1"), "tf2": tpu_trace("tf2")}
    result = judge_pair(spec, traces.__getitem__, None)
    text = summary_markdown(RunResults.of([result]))
    assert "### Not captured on the device (informational, not compared)" in text
    assert "grad table (3 steps): not captured on TPU by tf1 and tf2" in text
    assert f"- not captured on TPU by tf1 and tf2: {WHY}" in text
    assert "Not captured" not in summary_markdown(RunResults.of([judge_pair(
        spec, {"tf1": tpu_trace("tf1", declare=False),
               "tf2": tpu_trace("tf2", declare=False)}.__getitem__, None)]))


def test_declarations_survive_saving_and_loading(tmp_path):
    trace = tpu_trace("tf2", every=2)
    loaded = Trace.load(trace.save(tmp_path / "tf2"))
    assert loaded.meta.not_captured == {"grad": {"table": WHY}}
    assert loaded.meta.read_every == {"weight": {"table": 2}}


def test_canonicalize_names_declarations_as_the_values():
    impl = Implementation("tf2", None, NameMap({"emb/t": "tpu_embedding/table_0"}),
                          slot_names={"accum": "accumulator"})
    native = Trace("tf2")
    native.record(0, "weight", "tpu_embedding/table_0", np.zeros((2, 2), np.float32))
    native.meta.not_captured = {"grad": {"tpu_embedding/table_0": WHY}}
    native.meta.read_every = {"slot": {"tpu_embedding/table_0::accum": 5}}
    out = canonicalize(native, impl)
    assert out.meta.not_captured == {"grad": {"emb/t": WHY}}
    assert out.meta.read_every == {"slot": {"emb/t/accumulator": 5}}


def test_a_control_takes_its_tpu_expectation_on_a_tpu():
    ex = Examples({"x": np.zeros((2, 1))}, labels=np.zeros(2))
    on_cpu, on_tpu = Expectation(1, "loss", "cpu"), Expectation(1, "weight", "tpu")
    case = Case("c", ex, 1, 1, {"w": np.ones(2)},
                (Implementation("r", None, NameMap({})),
                 Implementation("k", None, NameMap({}), expect=on_cpu, expect_on_tpu=on_tpu),
                 Implementation("p", None, NameMap({}), preflight_expect=("a/*",))), "r")
    by_device = {d: {s.candidate: s.expect for s in case.pair_specs(d)} for d in ("cpu", "tpu")}
    assert by_device["cpu"] == {"k": on_cpu, "p": None}
    assert by_device["tpu"] == {"k": on_tpu, "p": None}


def test_tables_every_default_and_bad_values():
    from verify.runners.capture.host_call import tables_every

    assert [tables_every(None, n) for n in (1, 20, 100, 101, 1000)] == [1, 1, 1, 2, 10]
    assert tables_every(7, 20) == 7
    with pytest.raises(ValueError, match="K >= 1"):
        tables_every(0, 20)
