"""A verdict never depends on what it judges: a user's candidate with a small bug, present in
the case while it is calibrated, changes nothing of the calibration and fails where its bug
first acts, by far more than the tolerance."""
import dataclasses

import pytest

from verify.core.case import Implementation
from verify.judge import judge_pair

STEPS = 4
BUG = 1e-4   # the candidate's learning rate, relative


def cases():
    from cases.tpu_embedding import CASE
    from cases.tpu_embedding.tf2_keras import LEARNING_RATE
    from verify import lazy_runner

    tf1, tf2 = CASE.implementation("tf1"), CASE.implementation("tf2")
    buggy = Implementation("user-migration", lazy_runner(
        "cases.tpu_embedding.tf2_keras:runner", learning_rate=LEARNING_RATE * (1 + BUG)),
        tf2.names, description=f"the user's rewrite, its learning rate {BUG:g} relative off")
    base = dataclasses.replace(CASE, steps=STEPS, implementations=(tf1, tf2),
                               pairs=(("tf1", "tf2"),), calibration_file=None)
    with_candidate = dataclasses.replace(base, implementations=(tf1, tf2, buggy),
                                         pairs=(("tf1", "tf2"), ("tf1", "user-migration")))
    return base, with_candidate


@pytest.mark.slow
def test_a_candidate_present_while_calibrating_neither_changes_the_calibration_nor_passes():
    from verify.tools.calibration import calibrate_case
    from verify.runners.run import run_implementation

    without, with_candidate = cases()
    quiet = dict(log=lambda line: None)
    alone = calibrate_case(without, **quiet)
    present = calibrate_case(with_candidate, **quiet)
    assert present.to_json() == alone.to_json()
    assert sorted(present.references) == ["tf1"]

    traces = {name: run_implementation(with_candidate, with_candidate.implementation(name))
              for name in ("tf1", "tf2", "user-migration")}
    specs = {spec.candidate: spec for spec in with_candidate.pair_specs()}
    faithful = judge_pair(specs["tf2"], traces.__getitem__, with_candidate.tolerances,
                          calibration=present)
    assert faithful.verdict.ok, faithful.record.message
    assert faithful.record.calibration.startswith("10x the floor of tf1")
    buggy = judge_pair(specs["user-migration"], traces.__getitem__, with_candidate.tolerances,
                       calibration=present)
    assert not buggy.verdict.ok
    first = buggy.verdict.divergence
    # the learning rate acts in the first update: the weights after step 1
    assert (first.step, first.quantity) == (1, "weight"), buggy.record.message
    rows = buggy.rows[(buggy.rows["step"] == 1) & (buggy.rows["quantity"] == "weight")]
    assert rows["times_tolerance"].astype(float).max() >= 10, rows.to_string()
