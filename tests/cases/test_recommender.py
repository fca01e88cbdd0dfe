"""The recommender cases: their declarations, the kernel layout map, and every negative control
caught where it declares, against tf1 and against the oracle, with the control named."""
import numpy as np
import pytest

from verify.judge.attribution import attribute
from verify.judge.compare import compare_traces
from verify.runners.run import run_implementation
from verify.judge.verdict import judge

pytestmark = pytest.mark.slow   # trains TensorFlow

OPTIMIZERS = ("sgd", "adagrad", "adam", "ftrl")


@pytest.fixture(scope="module")
def recommender(tf_devices):
    import cases.recommender as recommender

    return recommender


def test_one_case_per_optimizer_each_with_an_oracle_compared_to_both_sides(recommender):
    from verify import ResumeRunner

    cases = {c.name: c for c in recommender.cases(None)}
    assert sorted(cases) == sorted(f"recommender_{o}" for o in OPTIMIZERS)
    for case in cases.values():
        assert case.oracle == "oracle" and case.steps >= 20
        pairs = case.all_pairs()
        assert {("tf1", "tf2"), ("oracle", "tf1"), ("oracle", "tf2")} <= set(pairs)
        for control in (i for i in case.implementations if i.is_control):
            if isinstance(control.runner, ResumeRunner):   # resumes: no oracle from there
                assert ("tf1-resume", control.name) in pairs
            elif control.expect.quantity == "input":   # an input pipeline's: against TF1 only
                assert ("tf1", control.name) in pairs
            else:
                assert {("tf1", control.name), ("oracle", control.name)} <= set(pairs)
        assert ("tf1-resume", "tf2-resume") in pairs
        # the shared item table is one canonical variable, mapped once on each side
        assert "embedding/item" in case.initial_values
        for name in ("tf1", "tf2", "oracle"):
            natives = case.implementation(name).names.entries
            assert sum(c.startswith("embedding/item") for c in natives) == 1


def test_tf2_kernel_rows_map_onto_the_tf1_concatenation_order(recommender):
    from cases.recommender.data import DENSE_FEATURES, TABLE_OF
    from cases.recommender.tf2_keras import TF2_FEATURE_ORDER

    rng = np.random.default_rng(0)
    blocks = {f: rng.normal(size=(2, TABLE_OF[f].dim)) for f in TABLE_OF}
    blocks["dense"] = rng.normal(size=(2, DENSE_FEATURES))
    x_tf1 = np.concatenate([blocks[f] for f in sorted(TABLE_OF)] + [blocks["dense"]], axis=1)
    x_tf2 = np.concatenate([blocks["dense"]] + [blocks[f] for f in TF2_FEATURE_ORDER], axis=1)
    canonical = rng.normal(size=(x_tf1.shape[1], 3))
    native = recommender.TF2_NAMES.native("dense0/kernel").transform.to_native(canonical)
    np.testing.assert_allclose(x_tf2 @ native, x_tf1 @ canonical)


CONTROLS = [("adagrad", "control-combiner-category-mean", 1, "loss"),
            ("adagrad", "control-split-item-table", 0, "weight"),
            ("adam", "control-adam-keras-epsilon", 1, "weight"),
            ("ftrl", "control-ftrl-beta-dropped", 1, "weight")]


@pytest.fixture(scope="module")
def short_traces(recommender):
    """tf1, the oracle and the controls below of each optimizer, 2 steps (controls show at
    step <= 1): only the sides the tests compare."""
    traces = {}
    for optimizer in sorted({c[0] for c in CONTROLS}):
        case = recommender.make_case(optimizer, steps=2)
        needed = {"tf1", "oracle"} | {c[1] for c in CONTROLS if c[0] == optimizer}
        for name in sorted(needed):
            impl = case.implementation(name)
            assert impl.environment == "local", impl   # this environment's sides
            traces[optimizer, name] = (case, run_implementation(case, impl))
    return traces


@pytest.mark.parametrize("optimizer, control, step, quantity", CONTROLS,
                         ids=[c[1] for c in CONTROLS])
def test_control_is_caught_where_declared_and_attributed_to_the_control(
        short_traces, optimizer, control, step, quantity):
    case, tf1 = short_traces[optimizer, "tf1"]
    _, oracle = short_traces[optimizer, "oracle"]
    _, wrong = short_traces[optimizer, control]
    expect = case.implementation(control).expect
    assert (expect.step, expect.quantity) == (step, quantity)
    compared = {}
    for ref, cand in (("tf1", "control"), ("oracle", "tf1"), ("oracle", "control")):
        traces = {"tf1": tf1, "oracle": oracle, "control": wrong}
        compared[ref, cand] = compare_traces(traces[ref], traces[cand], case.tolerances,
                                             case=case.name)
    for ref in ("tf1", "oracle"):
        verdict = judge(compared[ref, "control"], expect)
        assert verdict.status == "CAUGHT", verdict.message
    assert judge(compared["oracle", "tf1"], None).status == "PASS"
    sentence = attribute(compared["tf1", "control"], compared["oracle", "tf1"],
                         compared["oracle", "control"])
    assert sentence.startswith(f"{control} departs from the oracle at step {step} ({quantity}")
    assert sentence.endswith("tf1 matches.")


def test_case_oracle_must_name_one_of_its_implementations(recommender):
    import dataclasses

    case = recommender.make_case("sgd")
    with pytest.raises(ValueError, match="oracle 'numpy' is not one of"):
        dataclasses.replace(case, oracle="numpy")
