"""The tutorial's "Choosing tolerances" (docs/tutorial.md), followed as written: start from the defaults,
calibrate, set the atol `calibrate` prints for each quantity it names, calibrate again (it then
names none), and the faithful pair passes while a control is caught by far more than its
tolerance. Once for a loop case, once for an embedding case."""
import dataclasses

import pytest

from verify.core.tolerances import Tolerance, Tolerances
from verify.judge.compare import compare_traces
from verify.judge.verdict import CAUGHT, PASS, judge

pytestmark = pytest.mark.slow   # trains TensorFlow


def follow_the_guide(case, reference):
    """Calibrate `reference` from the suite's default tolerances and apply what calibrate
    says; return the case with its new tolerances and the calibration."""
    from verify.tools.calibration import calibrate_case, ceiling_advice

    case = dataclasses.replace(case, tolerances=Tolerances.default(), calibration_file=None)
    plains = {}
    calibration = calibrate_case(case, references=[reference], plains=plains,
                                 log=lambda line: None)
    advice = ceiling_advice(case, calibration, plains)
    assert all(not item.tensors for item in advice)    # per quantity: defaults have no patterns
    tolerances = case.tolerances.override(**{
        item.quantity: Tolerance(item.suggested_atol, item.rtol) for item in advice})
    case = dataclasses.replace(case, tolerances=tolerances)
    assert ceiling_advice(case, calibration, plains) == []
    return case, calibration, advice


def verdict(case, calibration, traces, reference, candidate):
    from verify.runners.run import run_implementation

    for name in (reference, candidate):
        if name not in traces:
            traces[name] = run_implementation(case, case.implementation(name))
    rows = compare_traces(traces[reference], traces[candidate], case.tolerances,
                          floor=calibration.floor_of(reference), multiple=case.tolerance_multiple)
    return judge(rows, case.implementation(candidate).expect)


def assert_judged_right(case, calibration, reference, faithful, control):
    """The faithful candidate passes; the control is caught by at least 10x its tolerance."""
    traces = {}
    passed = verdict(case, calibration, traces, reference, faithful)
    assert passed.status == PASS, passed.message
    caught = verdict(case, calibration, traces, reference, control)
    assert caught.status == CAUGHT, caught.message
    assert caught.margin >= 10


def test_the_guide_works_for_a_loop_case(tf_devices):
    from cases.custom_loop import QUICK, build_case
    from cases.custom_loop.data import synthetic_fashion_mnist

    tier = dataclasses.replace(QUICK, name="tiny", train_examples=64, test_examples=32,
                               batch_per_replica=8)
    case = build_case(synthetic_fashion_mnist(64, 32, seed=3), tier)
    case, calibration, advice = follow_the_guide(case, "reference-x2")
    # the loop parts chaotically from a one-ulp difference: the defaults sit below its floors
    assert advice
    assert_judged_right(case, calibration, "reference-x2", "mirrored-x2",
                        "control-adam-epsilon-x2")


def test_the_guide_works_for_an_embedding_case(tf_devices):
    from cases.tpu_embedding import CASE

    case, calibration, _ = follow_the_guide(dataclasses.replace(CASE, steps=6), "tf1")
    assert_judged_right(case, calibration, "tf1", "tf2", "control-adagrad-accumulator")
