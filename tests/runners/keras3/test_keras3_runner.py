"""The Keras 3 runner, inside the keras3 environments (JAX and TensorFlow backends): capturing
every step changes no trained number, and what the keras-rs rewrite declares lines up with
TF1's declaration key by key, while its preflight controls are flagged where they must be.

Each backend runs `tests/keras3_checks.py` once in a subprocess of its environment (built on
first use, see `python -m verify envs`).
"""
import json
import os
import subprocess
from pathlib import Path

import pytest

from verify.judge.preflight import BLOCKING, preflight
from verify.environments.declared import EnvironmentUnavailable, declared_environments, ensure

pytestmark = pytest.mark.slow   # builds an environment, trains Keras 3 and TensorFlow

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module", params=["jax", "tf"])
def checks(request):
    """The JSON report of `keras3_checks.py` run in the keras3-<backend> environment."""
    declared = declared_environments(ROOT / "pyproject.toml")[f"keras3-{request.param}"]
    try:
        built = ensure(declared)
    except EnvironmentUnavailable as e:
        pytest.skip(f"the {declared.name} environment cannot be built here: {e}")
    env = {**os.environ, **declared.variables, "PYTHONPATH": str(ROOT),
           "PARITY_ENVIRONMENT": declared.name, "TF_CPP_MIN_LOG_LEVEL": "2"}
    env.pop("VIRTUAL_ENV", None)
    done = subprocess.run([str(built.python), str(ROOT / "tests" / "keras3_checks.py"),
                           request.param], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=1200)
    lines = [line for line in done.stdout.splitlines() if line.startswith("KERAS3-CHECKS ")]
    assert done.returncode == 0 and lines, done.stderr[-4000:]
    return request.param, json.loads(lines[-1][len("KERAS3-CHECKS "):])


@pytest.mark.parametrize("case", ["tpu_embedding", "recommender_adam"])
def test_capture_leaves_every_trained_number_bitwise_unchanged(checks, case):
    """The model's own fit step with and without the taps: weights and slots after every step
    (the uncaptured run reads them after each execution) are bitwise equal."""
    backend, report = checks
    found = report["capture"][case]
    assert found["errors"] == [None, None]
    assert found["captured_steps"] == list(range(1, 21))
    assert set(found["quantities"]) >= {"input", "loss", "grad", "weight", "slot"}
    assert found["compared"] >= 20 * 6, found["compared"]     # every step, weights and slots
    assert found["different"] == [], (backend, found["different"][:5])
    assert found["moved"], "training did not move the weights: nothing was compared"


@pytest.fixture(scope="module")
def tf1_declared(tf_devices):
    from cases.tpu_embedding import CASE
    from verify.runners.run import declared_config

    return declared_config(CASE, CASE.implementation("tf1"))


def test_the_keras_rs_rewrite_declares_what_tf1_declares(checks, tf1_declared):
    backend, report = checks
    declared = report["declared"][f"keras3-{backend}"]
    assert declared["table/embedding/sparse_feature/vocabulary_size"] == 10
    assert declared["table/embedding/sparse_feature/dim"] == 5
    assert declared["optimizer/model/kind"] == declared["optimizer/embedding/kind"] == "adagrad"
    for key in ("table/embedding/sparse_feature/initializer", "table/embedding/sparse_feature/"
                "combiner", "optimizer/model/learning_rate", "optimizer/embedding/learning_rate",
                "optimizer/embedding/initial_accumulator_value", "data/global_batch_size"):
        assert declared[key] == tf1_declared[key], key
    findings = preflight("tpu_embedding", "tf1", tf1_declared, f"keras3-{backend}", declared)
    assert findings[findings["severity"] == BLOCKING].empty, findings.to_string()


def test_preflight_flags_the_keras_rs_defaults_that_cpu_numbers_cannot_show(checks, tf1_declared):
    """keras-rs' default table optimizer ("adam") and its code's initializer default
    (VarianceScaling, not the docstring's truncated normal 1/sqrt(dim)); and a table optimizer
    the TPU engine refuses is declared as such."""
    _, report = checks
    for control, key in (("control-keras-rs-table-optimizer", "optimizer/embedding/kind"),
                         ("control-keras-rs-initializer",
                          "table/embedding/sparse_feature/initializer")):
        findings = preflight("tpu_embedding", "tf1", tf1_declared, control,
                             report["declared"][control])
        assert key in set(findings[findings["severity"] == BLOCKING]["key"]), control
    assert report["declared"]["control-keras-rs-initializer"][
        "table/embedding/sparse_feature/initializer"].startswith("VarianceScaling(")
    unsupported = report["unsupported"]["optimizer/embedding/unsupported"]
    assert "epsilon" in unsupported, unsupported


def test_the_tpu_path_with_stand_ins_trains_and_captures_what_the_cpu_run_does(checks):
    """`--tpu` with the stand-ins (the default strategy for TPUStrategy on TensorFlow, CPU
    devices for JAX's TPU ones): every value of the CPU run, bitwise, and nothing more; on
    TensorFlow a send that never reaches the host (a broken outside compilation) fails the
    run (negative control)."""
    backend, report = checks
    standin = report["tpu"]["standin"]
    assert standin["errors"] == [None, None]
    assert standin["compared"] >= 20 * 6 and standin["different"] == [] and standin["extra"] == []
    if backend == "tf":
        assert standin["strategy"] == "_DefaultDistributionStrategy"
        assert "capture saw 0 of 20 steps" in standin["lost_sends_error"]
    else:
        assert standin["strategy"] == "jax default device"


def test_tables_in_the_engine_are_loaded_and_read_back_by_their_cpu_path(checks):
    """`EngineTables` on a table as if on a SparseCore: what it loads reads back, a change in
    the engine object shows in the next read (TensorFlow: a CPU mid-level `TPUEmbedding` through
    checkpoints and `TPUEmbeddingForServing`, its Adagrad accumulator as Keras 3's
    `accumulator`; JAX: keras-rs' setter and getter by table name). A twin that was never
    restored holds other values (the read-back is not vacuous)."""
    backend, report = checks
    engine = report["tpu"]["engine"]
    assert engine["loaded_read_back"] and engine["trained_read_back"]
    if backend == "tf":
        assert engine["slots"] == ["distributed_embedding/t/embeddings::accumulator"]
        assert engine["slot_read_back"] and engine["stale_twin_differs"] and engine["reads_slots"]
        assert engine["reads"] == 2
        # read inside a strategy's scope (as inside fit): the twin is built outside it
        assert engine["strategy_inside"] is True and engine["strategy_outside"] is False
        # a v1 engine is pushed to the TPU after a load (its restore hook does not, for a
        # checkpoint another object wrote); saving it retrieves from the TPU by itself
        assert engine["hooks"] == {"load": 1, "retrieve": 2}
    else:
        assert engine["slots"] == [] and not engine["reads_slots"]
