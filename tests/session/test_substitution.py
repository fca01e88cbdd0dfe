"""Layer substitution on replayed steps: a mistake inside a layer is local at that layer, and
its repro (run alone with the suite not importable) exits non-zero; a difference fed to a layer
from upstream is carried in; the same repro built from a faithful pair's layer exits zero.

A combiner control's first divergent layer, its embedding lookup, is local there (its
declared combiner against the reference's, on the same ids and table) and its repro fails
alone; a faithful pair's lookup computes alike and its repro passes alone.

The sides are shared with the layer replay's tests (`tests/session/conftest.py`): the custom
loop runs on a tiny synthetic set; the layer-local mistake is a test-only side of that loop
whose hidden Dense layer uses `elu` where the seed uses `relu` (one activation, nothing else)."""
import subprocess
import sys

import pytest

from verify.core.case import PairSpec, SuiteOptions
from verify.session.layer_replay import LayerReplay

pytestmark = pytest.mark.slow   # trains TensorFlow

# the test-only controls `tests/session/conftest.py` adds to the custom loop
ACTIVATION_CONTROL = "test-control-dense-elu-x1"
GRADIENT_CONTROL = "test-control-half-relu-gradient-x1"


@pytest.fixture(scope="module")
def suite(replay_suite):
    """The sides shared with the layer replay's tests (`tests/session/conftest.py`)."""
    return replay_suite


def replayed(suite, case_name, reference, candidate, mode="diverging"):
    return suite.replayed(case_name, reference, candidate, mode=mode)


def run_alone(script, tmp_path):
    """The repro in a fresh, isolated interpreter from another directory, `verify` and
    `cases` made unimportable."""
    guard = ("import runpy, sys; sys.modules['verify'] = sys.modules['cases'] = None; "
             f"sys.argv = [{str(script)!r}]; runpy.run_path(sys.argv[0], run_name='__main__')")
    return subprocess.run([sys.executable, "-I", "-c", guard], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)


def test_a_mistake_inside_a_layer_is_local_there_and_its_repro_fails_alone(suite, tmp_path):
    result = replayed(suite, "custom_loop", "reference-x1", ACTIVATION_CONTROL)
    record = result.record
    assert record.first_layer.startswith("`dense1` output (Dense)"), record.first_layer
    assert record.substitution.startswith(
        "substitution at step 1: local to layer `dense1` (Dense): with identical inputs and "
        "weights its outputs differ by"), record.substitution
    assert "the layer before, layer `conv2` (Conv2D) computes alike" in record.substitution
    assert record.repro == "repro/custom_loop/reference-x1--test-control-dense-elu-x1/repro.py"
    assert record.substitution in record.likely_cause and record.repro in record.likely_cause
    done = run_alone(suite.report / record.repro, tmp_path)
    assert done.returncode == 1, done.stderr[-2000:]
    assert "`dense1` outputs differ by" in done.stdout
    assert "the layer computes differently" in done.stdout


def test_a_difference_fed_in_from_upstream_is_carried_in(suite):
    """control-concat-order concatenates [dense, embedding] where the Dense kernel's rows are
    TF1's [embedding, dense]: the Dense layer itself computes alike."""
    record = replayed(suite, "tpu_embedding", "tf1", "control-concat-order").record
    assert record.first_layer.startswith("the input of `dense` (the Concatenate feeding it)")
    assert record.substitution.startswith(
        "substitution at step 1: layer `dense` (Dense) computes alike"), record.substitution
    assert ("the difference at `dense` is carried in: its input already differs (the "
            "Concatenate feeding it") in record.substitution
    assert record.repro == ""


def test_a_layer_whose_backward_pass_is_wrong_is_local_there(suite):
    record = replayed(suite, "custom_loop", "reference-x1", GRADIENT_CONTROL).record
    assert record.first_layer.startswith("backward: the gradient at the input of `dense1`"), \
        record.first_layer
    assert record.substitution.startswith(
        "backward substitution at step 1: local to the backward pass of layer `dense1` (Dense "
        "| HalfGradientDense): given identical upstream gradients, inputs and weights its "
        "gradient with respect to "), record.substitution
    assert record.substitution in record.likely_cause and record.repro == ""


def test_the_repro_of_a_faithful_pairs_layer_passes_alone(suite, tmp_path):
    from verify.explain.repro import write_layer_repro
    from verify.session.substitution import _substituted
    from verify.session.substitution_values import Side

    case = suite.cases["custom_loop"]
    replay = suite.replay()
    sides = [Side(name, replay._capture(case, name, 1)[0], case.implementation(name).names,
                  "local") for name in ("reference-x1", "mirrored-x1")]
    substitution, runs = _substituted("dense1", *sides, suite.cache.trace(case, "reference-x1"),
                                      1)
    assert substitution.verdict == "alike" and substitution.floor > 0
    script = write_layer_repro(tmp_path / "repro", substitution, *runs, step=1,
                               sides=("reference-x1", "mirrored-x1"), environment="local")
    done = run_alone(script, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]
    assert "the layer computes alike" in done.stdout


UPDATE_CONTROLS = [
    ("custom_loop", "reference-x1", "control-learning-rate-x1", "tf.keras.optimizers.Adam; "
     "learning_rate 0.001 | 0.00101"),
    ("custom_loop", "reference-x1", "control-adam-epsilon-x1", "tf.keras.optimizers.Adam; "
     "epsilon 1e-07 | 1e-08"),
    ("tpu_embedding", "tf1", "control-adagrad-accumulator", "tf.compat.v1.train.AdagradOptimizer"
     " | tf.keras.optimizers.legacy.Adagrad; "),
    # TF1's AdamOptimizer updates as legacy.Adam does (the same kernel): named so
    ("recommender_adam", "tf1", "control-adam-keras-epsilon", "tf.keras.optimizers.legacy.Adam; "
     "epsilon 1e-08 | 1e-07"),
]


@pytest.mark.parametrize("case, reference, control, what", UPDATE_CONTROLS,
                         ids=[c[2] for c in UPDATE_CONTROLS])
def test_an_optimizer_mistake_is_local_to_the_update_and_its_repro_fails_alone(
        suite, tmp_path, case, reference, control, what):
    record = replayed(suite, case, reference, control).record
    assert record.first_quantity in ("weight", "slot") and record.first_step == 1
    assert record.substitution.startswith(
        f"optimizer-update substitution at step 1: local to the optimizer update ({what}"), \
        record.substitution
    assert record.substitution.endswith("the update rule itself differs")
    assert record.repro == f"repro/{case}/{reference}--{control}/repro.py"
    done = run_alone(suite.report / record.repro, tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr[-2000:]
    assert "the update rule differs" in done.stdout


def test_a_faithful_pairs_update_computes_alike_and_its_repro_passes_alone(suite, tmp_path):
    from verify.session.update_substitution import substitute_update

    case, cache = suite.cases["custom_loop"], suite.cache
    outcome = substitute_update(cache.trace(case, "reference-x1"),
                                cache.trace(case, "mirrored-x1"), 1, ("local", "local"),
                                tmp_path / "repro", write_alike=True)
    assert outcome.sentence.startswith("optimizer-update substitution at step 1: the optimizer "
                                       "update computes alike (tf.keras.optimizers.Adam)")
    done = run_alone(outcome.repro, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]
    assert "the update rule computes alike" in done.stdout
    later = substitute_update(cache.trace(case, "reference-x1"), cache.trace(case, "mirrored-x1"),
                              2, ("local", "local"), None)
    assert "not run: only step 1's update is substituted" in later.sentence


def test_an_update_with_a_tensor_it_cannot_reproduce_is_inconclusive(suite, tmp_path,
                                                                      monkeypatch):
    """One variable whose reference update is not reproduced (inconclusive) and the others
    alike: the update is neither local nor alike, no repro is written, and the likely cause
    gains nothing (negative control: ranked by drift alone, the sentence said "computes alike
    ... carried in")."""
    from verify.explain.substitution import Substitution
    from verify.session import update_substitution

    judge = update_substitution.judge_substitution
    first = []

    def one_unreproduced(name, *args):
        if not first:
            first.append(name)
            return Substitution(name, "optimizer update", "inconclusive",
                                why="the reference's update is not reproduced")
        return judge(name, *args)

    monkeypatch.setattr(update_substitution, "judge_substitution", one_unreproduced)
    case, cache = suite.cases["custom_loop"], suite.cache
    outcome = update_substitution.substitute_update(
        cache.trace(case, "reference-x1"), cache.trace(case, "mirrored-x1"), 1,
        ("local", "local"), tmp_path / "repro", write_alike=True)
    assert outcome.sentence.startswith("optimizer-update substitution at step 1: inconclusive "
                                       "for the optimizer update"), outcome.sentence
    assert f"`{first[0]}`: the reference's update is not reproduced" in outcome.sentence
    assert "carried in" not in outcome.sentence and not outcome.conclusive
    assert outcome.repro == "" and not (tmp_path / "repro").exists()


def test_a_tpu_runs_update_is_not_substituted_and_the_row_says_why():
    from verify.judge.pair import PairResult
    from verify.judge.records import PairRecord

    record = PairRecord("c", "tf1", "tf2", 1, verdict="CAUGHT", first_step=1,
                        first_quantity="slot", likely_cause="initial_accumulator x0.1")
    result = PairResult.failed(record)
    result.record = record
    done = LayerReplay(SuiteOptions(device="tpu"), trace_supply=None).apply(
        type("Case", (), {"name": "c"})(), PairSpec("c", "tf1", "tf2"), result)
    assert done.record.substitution.startswith("optimizer-update substitution at step 1: not "
                                               "run: the sides ran on tpu")
    assert done.record.likely_cause == "initial_accumulator x0.1"   # nothing concluded


def test_a_batch_that_differs_is_local_to_the_input_pipeline(suite):
    record = replayed(suite, "tpu_embedding", "tf1", "control-unseeded-shuffle").record
    assert record.first_quantity == "input" and record.first_step == 1
    assert record.substitution.startswith("substitution at step 1: the batch differs before any "
                                          "layer runs ("), record.substitution
    assert "local to the input pipeline" in record.substitution and record.repro == ""


LOOKUP_CONTROLS = [
    ("tpu_embedding", "control-combiner-sum", "local to the embedding lookup "
     "`embedding/sparse_feature`: with identical ids and table, combiner 'mean' vs 'sum' "
     "outputs differ by "),
    ("recommender_adagrad", "control-combiner-category-mean", "local to the embedding lookup "
     "`embedding/category` (feature `categories`): with identical ids and table, combiner "
     "'sqrtn' vs 'mean' outputs differ by "),
]


@pytest.mark.parametrize("case, control, local", LOOKUP_CONTROLS, ids=[c[1] for c in LOOKUP_CONTROLS])
def test_a_combiner_mistake_is_local_to_the_lookup_and_its_repro_fails_alone(
        suite, tmp_path, case, control, local):
    record = replayed(suite, case, "tf1", control).record
    assert record.first_layer.startswith("embedding lookup `embedding"), record.first_layer
    assert record.substitution.startswith(f"substitution at step 1: {local}"), \
        record.substitution
    assert record.repro == f"repro/{case}/tf1--{control}/repro.py"
    assert record.substitution in record.likely_cause
    done = run_alone(suite.report / record.repro, tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr[-2000:]
    assert "the lookup computes differently" in done.stdout


def test_a_faithful_pairs_lookup_computes_alike_and_its_repro_passes_alone(suite, tmp_path):
    from verify.core.trace import Trace
    from verify.explain.repro import write_lookup_repro
    from verify.session.lookup_substitution import _judged, substitute_lookup
    from verify.session.substitution_values import Side

    case = suite.cases["tpu_embedding"]
    replay = suite.replay()
    sides = [Side(name, replay._capture(case, name, 1)[0], case.implementation(name).names,
                  "local") for name in ("tf1", "tf2")]
    traces = [suite.cache.trace(case, name) for name in ("tf1", "tf2")]
    lookup, values = _judged("embedding/sparse_feature", "", *sides, *traces, 1)
    assert lookup.verdict == "alike" and lookup.combiners == ("mean", "mean"), lookup
    assert lookup.drift == 0 and lookup.floor > 0 and lookup.reproduced <= lookup.bound
    script = write_lookup_repro(tmp_path / "repro", lookup, *values, step=1,
                                sides=("tf1", "tf2"), environment="local")
    done = run_alone(script, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]
    assert "the lookup computes alike" in done.stdout
    undeclared = substitute_lookup("embedding/sparse_feature", "", *sides, traces[0],
                                   Trace("tf2"), 1, tmp_path / "none")
    assert undeclared.sentence == (
        "substitution at step 1: the embedding lookup `embedding/sparse_feature` not "
        "substituted: the candidate declares no combiner for table `embedding/sparse_feature` "
        "(`table/embedding/sparse_feature/combiner` in its static config): there is no single "
        "combiner of sum, mean, sqrtn to run")
    assert not undeclared.conclusive and undeclared.repro == ""


def test_an_agreeing_input_at_step_1_is_not_blamed_on_an_earlier_update():
    """A layer that computes alike while its input agrees: at step 1 no update came before
    (both sides start from the case's initial values), so the sentence says the difference is
    not explained; later, the weights an earlier update left (negative control: the later
    step's sentence)."""
    import pandas as pd

    from verify.session.substitution import _carried_in

    forward = pd.DataFrame({"layer": ["dense"], "kind": ["input"], "fed_by": [""],
                            "status": ["passed"]})
    first = _carried_in("dense", "output", forward, 1)
    assert "not explained" in first and "earlier update" not in first
    assert "not the case's initial values as loaded" in first
    later = _carried_in("dense", "output", forward, 3)
    assert "before step 3 already differ (an earlier update, amplified)" in later
