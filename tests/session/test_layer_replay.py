"""The layer replay on the shipped cases: every negative control whose first divergence is its
loss or its gradients names the layer responsible; faithful pairs agree at every layer when a
replay is asked for; the replay is inert (the pair's verdict, drift rows and traces are the
same with it and without it, and each replayed run reproduces its losses to the bit); sides
it cannot replay say why.

The custom-loop pairs run on the tiny synthetic set of `tests/cases/test_custom_loop_runs.py`;
the pairs are judged with the quantity table's default tolerances (what the replay needs of
them is whether the step's loss and gradients failed)."""
import dataclasses

import pytest

from verify.core.case import PairSpec, SuiteOptions
from verify.session.layer_replay import LayerReplay

pytestmark = pytest.mark.slow   # trains TensorFlow


@pytest.fixture(scope="module")
def suite(replay_suite):
    """The sides shared with the substitution's tests (`tests/session/conftest.py`): the
    custom-loop pairs run on the tiny synthetic set of `tests/cases/test_custom_loop_runs.py`."""
    return replay_suite


def replayed(suite, case_name, reference, candidate, replicas=1, mode="diverging"):
    return suite.replayed(case_name, reference, candidate, replicas, mode)


CONTROLS = [
    ("tpu_embedding", "tf1", "control-combiner-sum", 1,
     "embedding lookup `embedding/sparse_feature` (after its combiner"),
    ("tpu_embedding", "tf1", "control-concat-order", 1,
     "the input of `dense` (the Concatenate feeding it)"),
    ("recommender_adagrad", "tf1", "control-combiner-category-mean", 1,
     "embedding lookup `embedding` (feature `categories`, after its combiner"),
    ("custom_loop", "reference-x2", "control-reduce-mean-x2", 2, "the loss's reduction"),
    ("custom_loop", "reference-x4", "control-per-replica-divisor-x4", 4, "the loss's reduction"),
    ("custom_loop", "clipped-reference-x1", "control-clip-one-side-x1", 1,
     "after the backward pass"),
    ("custom_loop", "clipped-reference-x2", "control-clip-one-side-x2", 2,
     "after the backward pass"),
    ("custom_loop", "clipped-reference-x2", "control-clip-per-replica-x2", 2,
     "after the backward pass"),
]


@pytest.mark.parametrize("case, reference, candidate, replicas, layer", CONTROLS,
                         ids=[c[2] for c in CONTROLS])
def test_each_control_names_the_layer_responsible(suite, case, reference, candidate, replicas,
                                                  layer):
    result = replayed(suite, case, reference, candidate, replicas)
    record = result.record
    assert record.first_quantity in ("loss", "grad") and record.first_step == 1
    assert record.first_layer.startswith(layer), record.first_layer
    assert record.layer_replay.count("reproducing its losses to the bit") == 2
    assert not result.layers.empty and set(result.layers["step"]) == {1}
    if layer == "the loss's reduction":   # substitution: nothing of a layer to substitute
        assert record.substitution == ("backward substitution at step 1: the gradient arriving "
                                       "at the per-example loss already differs: it comes from "
                                       "the loss's reduction; not substituted")


FAITHFUL = [("tpu_embedding", "tf1", "tf2", 1), ("tpu_embedding", "tf1", "tf2-mirrored", 2),
            ("recommender_adagrad", "tf1", "tf2", 1),
            ("custom_loop", "reference-x2", "mirrored-x2", 2),
            ("custom_loop", "summed-reference-x2", "mirrored-x2", 2)]


@pytest.mark.parametrize("case, reference, candidate, replicas", FAITHFUL,
                         ids=[f"{c[0]}-{c[2]}" for c in FAITHFUL])
def test_faithful_pairs_agree_at_every_layer_when_asked(suite, case, reference, candidate,
                                                        replicas):
    result = replayed(suite, case, reference, candidate, replicas, mode="all")
    assert result.record.verdict == "PASS"
    assert result.record.first_layer == "none: every layer of step 1 agrees"
    compared = result.layers[result.layers["status"].isin(["passed", "failed"])]
    assert len(compared) >= 6 and set(compared["status"]) == {"passed"}


def test_the_replay_is_inert(suite):
    cases, cache = suite.cases, suite.cache
    case = cases["tpu_embedding"]
    before = {name: dict(cache.trace(case, name).values.items())
              for name in ("tf1", "control-combiner-sum")}
    off = replayed(suite, "tpu_embedding", "tf1", "control-combiner-sum", mode="off")
    on = replayed(suite, "tpu_embedding", "tf1", "control-combiner-sum")
    layer_fields = {"first_layer", "first_layer_drift", "layer_replay", "substitution",
                    "repro", "likely_cause"}
    assert {k: v for k, v in dataclasses.asdict(off.record).items() if k not in layer_fields} \
        == {k: v for k, v in dataclasses.asdict(on.record).items() if k not in layer_fields}
    # the likely cause only gains what the substitution concluded
    assert on.record.likely_cause.startswith(off.record.likely_cause)
    assert on.record.substitution in on.record.likely_cause
    assert off.rows.equals(on.rows) and off.layers.empty and not on.layers.empty
    for name, values in before.items():   # the cached traces were not run again or changed
        after = cache.trace(case, name).values
        assert set(values) == set(after.keys())
        assert all(values[key] is after[key] for key in values)


def test_a_custom_loop_replay_stops_after_its_step(suite):
    """The user's loop runs whole epochs; a replay ends it once its step is observed, so it
    costs the steps up to it, not the epoch (8 steps here)."""
    from verify.core.layer_capture import LayerRecorder
    from verify.runners.run import run_implementation

    case = suite.cases["custom_loop"]
    recorder = LayerRecorder(2)
    trace = run_implementation(case, case.implementation("reference-x1"), steps=2,
                               layers=recorder)
    assert trace.error is None and trace.steps() == [1, 2]   # (and step 0, as loaded)
    assert trace.meta.details["stopped"] == "after step 2 (a layer replay)"
    assert recorder.values is not None and recorder.step == 2


def test_a_side_that_cannot_be_replayed_says_why(suite):
    result = replayed(suite, "recommender_adagrad", "oracle", "control-combiner-category-mean")
    assert result.record.first_layer == ""
    assert result.record.layer_replay.startswith("step 1 not replayed layer by layer: oracle:")
    assert "cannot observe every layer of a step" in result.record.layer_replay


def test_mutants_are_not_replayed_unless_every_pair_is_asked_for():
    replay = LayerReplay(SuiteOptions(), trace_supply=None)
    from verify.judge.records import PairRecord

    record = PairRecord("c", "tf1", "tf2~drop_step", 1, first_step=2, first_quantity="grad")
    assert replay.step_of(PairSpec("c", "tf1", "tf2~drop_step", role="mutant"), record) is None
    every = LayerReplay(SuiteOptions(replay_layers="all"), trace_supply=None)
    assert every.step_of(PairSpec("c", "tf1", "tf2~drop_step", role="mutant"), record) == 2
    with pytest.raises(ValueError, match="--replay-layers is one of"):
        LayerReplay(SuiteOptions(replay_layers="some"), trace_supply=None)


def test_a_replay_that_raises_leaves_the_verdict_and_says_why():
    from verify.judge.pair import PairResult
    from verify.judge.records import PairRecord

    class Broken:
        def implementation(self, case, name):
            raise KeyError("the cache lost it")

    record = PairRecord("c", "tf1", "tf2", 1, verdict="CAUGHT", first_step=1,
                        first_quantity="loss")
    result = PairResult.failed(record)
    result.record = record
    replayed = LayerReplay(SuiteOptions(), Broken()).apply(
        type("Case", (), {"name": "c"})(), PairSpec("c", "tf1", "tf2"), result)
    assert replayed.record.verdict == "CAUGHT" and replayed.record.first_layer == ""
    assert replayed.record.layer_replay == ("step 1 not replayed layer by layer: the replay "
                                            "raised KeyError: 'the cache lost it'")
