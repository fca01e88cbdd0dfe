"""Verdicts: faithful pairs pass or fail; controls are caught only where they declare."""
import numpy as np

from verify.core.case import Expectation
from verify.judge.compare import compare_traces
from verify.core.trace import Trace
from verify.judge.verdict import CAUGHT, FAIL, MISSED, PASS, judge


def traces(loss_delta=0.0, weight_delta=0.0):
    ref, cand = Trace("ref"), Trace("cand")
    for t, dl, dw in ((ref, 0, 0), (cand, loss_delta, weight_delta)):
        t.record(0, "weight", "w", np.ones(3, np.float32))
        for s in (1, 2):
            t.record(s, "loss", "loss", np.float32(1.0 + dl * s))
            t.record(s, "weight", "w", np.ones(3, np.float32) * np.float32(1 - 0.1 * s + dw * s))
    return ref, cand


def test_faithful_pair():
    assert judge(compare_traces(*traces()), None).status == PASS
    v = judge(compare_traces(*traces(weight_delta=1e-3)), None)
    assert v.status == FAIL and "first divergence at step 1, weight w" in v.message


def test_control_caught_where_expected_with_margin():
    rows = compare_traces(*traces(loss_delta=0.1))
    v = judge(rows, Expectation(1, "loss", why="test"))
    assert v.status == CAUGHT and v.margin > 1000


def test_control_caught_elsewhere_is_missed():
    rows = compare_traces(*traces(weight_delta=0.1))
    v = judge(rows, Expectation(1, "loss", why="test"))
    assert v.status == MISSED and "expected at step 1 loss" in v.message


def test_control_that_passes_is_missed():
    v = judge(compare_traces(*traces()), Expectation(1, "loss", why="test"))
    assert v.status == MISSED and "passed every check" in v.message


def test_control_barely_past_tolerance_is_missed():
    rows = compare_traces(*traces(loss_delta=3e-5))   # ~3x the 1e-5 rtol
    v = judge(rows, Expectation(1, "loss", why="test", min_ratio=10))
    assert v.status == MISSED and "beyond the tolerance" in v.message


def test_raising_control_is_caught_as_a_run_failure():
    ref, cand = traces()
    cand.values.clear()
    cand.error = "ValueError: reduction SUM_OVER_BATCH_SIZE is not allowed"
    v = judge(compare_traces(ref, cand), Expectation(1, "run", why="TF refuses it"))
    assert v.status == CAUGHT and np.isinf(v.margin)


def test_a_control_whose_run_raised_for_another_reason_is_not_judged_and_fails():
    """A full disk or a crash stops the control's run: the suite did not miss the mistake, it
    never got to look, and the verdict says so (FAIL with the run's error, not MISSED)."""
    ref, _ = traces()
    cand = Trace("cand")      # the disk filled before its first step was kept
    cand.record(0, "weight", "w", np.ones(3, np.float32))
    cand.error = "OSError: [Errno 28] No space left on device"
    v = judge(compare_traces(ref, cand), Expectation(1, "loss", why="test"))
    assert v.status == FAIL and v.message.startswith("negative control not judged: a run raised")
    assert "No space left on device" in v.message
    # negative control: the same control caught where it declares
    assert judge(compare_traces(*traces(loss_delta=0.1)),
                 Expectation(1, "loss", why="test")).status == CAUGHT


def findings(*keys, severity="blocking"):
    import pandas as pd

    return pd.DataFrame({"key": list(keys), "severity": [severity] * len(keys),
                         "reference_value": ["a"] * len(keys), "candidate_value": ["b"] * len(keys),
                         "side": ["both"] * len(keys), "rule": ["r"] * len(keys)})


def test_faithful_numbers_with_a_blocking_config_difference_fail():
    from verify.judge.verdict import Verdict, judge_with_preflight

    v = judge_with_preflight(Verdict(PASS, "agree"), findings("table/t/initializer"), None, ())
    assert v.status == FAIL and "table/t/initializer" in v.message
    info = judge_with_preflight(Verdict(PASS, "agree"), findings("loop/x", severity="informational"),
                                None, ())
    assert info.status == PASS


def test_preflight_control_needs_its_key_flagged_and_the_declared_numbers():
    from verify.judge.verdict import Verdict, judge_with_preflight

    wanted = ("optimizer/embedding/learning_rate",)
    hit = findings("optimizer/embedding/learning_rate")
    assert judge_with_preflight(Verdict(PASS, "ok"), hit, None, wanted).status == CAUGHT
    assert judge_with_preflight(Verdict(PASS, "ok"), findings("data/shuffle"), None,
                                wanted).status == MISSED
    # flagged, but the numbers did not agree although nothing numeric was expected
    assert judge_with_preflight(Verdict(FAIL, "differs"), hit, None, wanted).status == MISSED


def test_a_control_that_barely_fails_at_a_zero_reference_is_not_caught():
    ref, cand = Trace("ref"), Trace("cand")
    ref.record(1, "weight", "w", np.array([0.0, 1.0], np.float32))
    cand.record(1, "weight", "w", np.array([2e-6, 1.0], np.float32))  # 2x its allowance
    v = judge(compare_traces(ref, cand), Expectation(1, "weight", why="test"))
    assert v.status == MISSED and 1.9 < v.margin < 2.1


def test_a_raising_reference_does_not_catch_a_run_control():
    ref, cand = traces()
    ref.values.clear()
    ref.error = "RuntimeError: reference broke"
    v = judge(compare_traces(ref, cand), Expectation(1, "run", why="candidate should raise"))
    assert v.status == MISSED
