"""Capturing every step changes no number, and a wrong name map fails with the names."""
import dataclasses

import numpy as np
import pytest

from verify.core.names import Mapped, NameMap
from verify.runners.run import run_implementation

pytestmark = pytest.mark.slow   # trains TensorFlow


@pytest.fixture(scope="module")
def case(tf_devices):
    from cases.tpu_embedding import CASE

    return CASE


def final_weights(trace, step):
    return {k.tensor: v for k, v in trace.values.items() if k.quantity == "weight" and k.step == step}


@pytest.mark.parametrize("name", ["tf1", "tf2", "tf2-mirrored"])
def test_capturing_every_step_leaves_the_trained_weights_bitwise_unchanged(case, name):
    """The implementation's own step and steps_per_execution (10 for tf2) with and without
    the taps: the weights and slots read at every execution boundary are bitwise equal."""
    impl = case.implementation(name)
    captured = run_implementation(case, impl, steps=20, capture_steps=True)
    plain = run_implementation(case, impl, steps=20, capture_steps=False)
    assert captured.error is None and plain.error is None
    assert captured.steps() == list(range(1, 21))      # every step captured
    boundaries = plain.steps()
    assert boundaries == ([20] if name == "tf1" else [10, 20])
    for step in boundaries:
        a, b = final_weights(captured, step), final_weights(plain, step)
        assert set(a) == set(b) == set(case.initial_values)
        for tensor in a:
            assert np.array_equal(a[tensor], b[tensor]), (step, tensor)
    # and training really moved them away from the initial values
    assert not np.array_equal(final_weights(captured, 20)["dense/kernel"],
                              case.initial_values["dense/kernel"])


def test_initial_values_load_into_both_sides(case):
    for name in ("tf1", "tf2"):
        trace = run_implementation(case, case.implementation(name), steps=1)
        for tensor, value in case.initial_values.items():
            assert np.array_equal(trace.get(0, "weight", tensor), value), (name, tensor)


def test_a_wrong_name_map_fails_the_run_listing_unmatched_names(case):
    impl = case.implementation("tf2")
    wrong = NameMap({"embedding/sparse_feature": "tpu_embedding/table_0",
                     "dense/kernel": Mapped("dense/kernal"), "dense/bias": "dense/bias"})
    trace = run_implementation(case, dataclasses.replace(impl, names=wrong), steps=1)
    assert trace.error is not None and trace.error.startswith("NameMapError")
    assert "mapped but not variables of tf2: ['dense/kernal']" in trace.error
    assert "no canonical name maps to: ['dense/kernel']" in trace.error


def test_a_dataset_that_runs_out_before_the_steps_says_so(case):
    """An input pipeline without repeat() stops fit early; the run fails naming how many
    steps ran, not with a missing value at a later step."""
    from cases.tpu_embedding.tf2_keras import make_build_model, make_dataset_fn
    from verify import KerasRunner

    repeating = make_dataset_fn()

    def two_batches(examples, context, global_batch_size):
        return repeating(examples, context, global_batch_size).take(2)

    impl = dataclasses.replace(case.implementation("tf2"), runner=KerasRunner(
        build_model=make_build_model(), dataset_fn=two_batches))
    trace = run_implementation(case, impl, steps=4)
    assert trace.error is not None
    assert "the input ran out after 2 step(s) of the 4 asked for" in trace.error


def test_a_model_without_trainable_variables_says_so(case):
    from cases.tpu_embedding.tf2_keras import make_build_model, make_dataset_fn
    from verify import KerasRunner

    build = make_build_model()

    def frozen(steps_per_execution):
        model = build(steps_per_execution)
        model.trainable = False
        return model

    impl = dataclasses.replace(case.implementation("tf2"), runner=KerasRunner(
        build_model=frozen, dataset_fn=make_dataset_fn()))
    trace = run_implementation(case, impl, steps=1)
    assert trace.error is not None and "has no trainable variables" in trace.error
