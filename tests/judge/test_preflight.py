"""Preflight: the classing rules, and what the real pipelines declare."""
import pytest

from verify.judge.preflight import BLOCKING, INFORMATIONAL, check_alone, diff_configs, preflight
from verify.runners.capture.static_config import NO_EPSILON


def test_every_difference_is_classed_and_explained():
    rows = diff_configs(
        {"table/t/combiner": "mean", "loop/steps_per_call": "iterations_per_loop=10",
         "optimizer/model/epsilon": NO_EPSILON, "optimizer/model/learning_rate": 0.05},
        {"table/t/combiner": "sqrtn", "loop/steps_per_call": "steps_per_execution=10",
         "optimizer/model/epsilon": 1e-7, "optimizer/model/learning_rate": 0.05000001,
         "loss/reduction": "sum_over_batch_size"})
    by_key = {r["key"]: r for r in rows}
    assert by_key["table/t/combiner"]["severity"] == BLOCKING
    assert by_key["loop/steps_per_call"]["severity"] == INFORMATIONAL
    assert by_key["optimizer/model/epsilon"]["severity"] == INFORMATIONAL
    assert by_key["loss/reduction"]["severity"] == INFORMATIONAL   # one side does not expose it
    assert "optimizer/model/learning_rate" not in by_key            # equal within 1e-6 relative
    assert all(r["rule"] for r in rows)


def test_a_real_epsilon_difference_blocks():
    rows = diff_configs({"optimizer/model/epsilon": 1e-8}, {"optimizer/model/epsilon": 1e-7})
    assert rows[0]["severity"] == BLOCKING


def test_alone_unseeded_shuffle_and_layer_optimizer_mismatch_block():
    findings = check_alone({"data/shuffle": "unseeded", "optimizer/model/learning_rate": 0.05,
                            "optimizer/embedding/learning_rate": 0.5,
                            "optimizer/model/epsilon": 1e-7,
                            "optimizer/embedding/epsilon": NO_EPSILON})
    assert {(f["key"], f["severity"]) for f in findings} == {
        ("data/shuffle", BLOCKING), ("optimizer/embedding/learning_rate", BLOCKING),
        ("optimizer/embedding/epsilon", INFORMATIONAL)}


@pytest.fixture(scope="module")
def declared(tf_devices):
    from cases.tpu_embedding import CASE

    from verify.core.meta import SUITE_ENVIRONMENT

    case = CASE   # the sides of this environment (keras3 ones: tests/runners/keras3/test_keras3_runner.py)
    configs = {i.name: i.runner.declared_config(case, i) for i in case.implementations
               if i.environment == SUITE_ENVIRONMENT}
    return case, configs


@pytest.mark.slow
def test_faithful_pair_declares_the_same_training(declared):
    case, configs = declared
    assert configs["tf1"]["table/embedding/sparse_feature/combiner"] == "mean"
    assert configs["tf1"]["optimizer/embedding/kind"] == "adagrad"
    for name in ("tf2", "tf2-mirrored", "tf2-spe10"):
        findings = preflight(case.name, "tf1", configs["tf1"], name, configs[name])
        assert not (findings["severity"] == BLOCKING).any(), findings.to_string()
        assert set(findings["key"]) >= {"loop/steps_per_call", "optimizer/model/epsilon"}


@pytest.mark.slow
@pytest.mark.parametrize("control, key", [
    ("control-combiner-sum", "table/embedding/sparse_feature/combiner"),
    ("control-adagrad-accumulator", "optimizer/model/initial_accumulator_value"),
    ("control-unseeded-shuffle", "data/shuffle"),
    ("control-initializer", "table/embedding/sparse_feature/initializer"),
    ("control-layer-optimizer", "optimizer/embedding/learning_rate"),
])
def test_each_config_mistake_is_flagged_blocking(declared, control, key):
    case, configs = declared
    findings = preflight(case.name, "tf1", configs["tf1"], control, configs[control])
    assert key in set(findings.loc[findings["severity"] == BLOCKING, "key"])


def test_recomparing_kept_traces_reapplies_preflight(tmp_path):
    """A preflight-only control stays CAUGHT and a faithful pair with a blocking difference
    stays FAIL when kept traces are compared again, without TensorFlow or the case."""
    import json

    import numpy as np

    from verify.store.kept_traces import MANIFEST, keep_trace, recompare
    from verify.store.tolerance_documents import tolerances_to_json
    from verify.core.tolerances import Tolerances
    from verify.core.trace import Trace

    declared = {"tf1": {"table/t/initializer": "TruncatedNormal(stddev=0.4)"},
                "control": {"table/t/initializer": "TruncatedNormal(stddev=1)"},
                "faithful-but-blocked": {"table/t/initializer": "TruncatedNormal(stddev=1)"}}
    for name, config in declared.items():
        trace = Trace(name, {"declared_config": config, "device": "cpu", "case": "demo",
                             "data_digest": "d1"})
        trace.record(1, "loss", "loss", np.float32(0.5))
        keep_trace(tmp_path, "demo", trace)
    pairs = [{"reference": "tf1", "candidate": "control", "replicas": 1, "control": True,
              "preflight_expect": ["table/*/initializer"], "expect": None},
             {"reference": "tf1", "candidate": "faithful-but-blocked", "replicas": 1,
              "control": False, "preflight_expect": [], "expect": None}]
    (tmp_path / "demo" / MANIFEST).write_text(json.dumps(
        {"case": "demo", "reference": "tf1", "seed": 0, "data_digest": "d1", "pairs": pairs,
         "tolerances": tolerances_to_json(Tolerances.default())}))
    results = recompare(tmp_path)
    verdicts = dict(zip(results.pairs["candidate"], results.pairs["verdict"]))
    assert verdicts == {"control": "CAUGHT", "faithful-but-blocked": "FAIL"}
    assert set(results.preflight["key"]) == {"table/t/initializer"}


@pytest.mark.slow
def test_optimizer_descriptions_include_clipping_weight_decay_ema_and_loss_scaling(tf_devices):
    import tensorflow as tf

    from verify.runners.capture.static_config import describe_optimizer

    plain = describe_optimizer(tf.keras.optimizers.Adam(), "optimizer/model")
    for changed, key in ((tf.keras.optimizers.Adam(clipnorm=1.0), "clipnorm"),
                         (tf.keras.optimizers.Adam(global_clipnorm=0.5), "global_clipnorm"),
                         (tf.keras.optimizers.legacy.Adam(clipvalue=0.1), "clipvalue"),
                         (tf.keras.optimizers.AdamW(weight_decay=0.01), "weight_decay"),
                         (tf.keras.optimizers.Adam(use_ema=True), "use_ema"),
                         (tf.keras.mixed_precision.LossScaleOptimizer(
                             tf.keras.optimizers.Adam()), "loss_scale")):
        other = describe_optimizer(changed, "optimizer/model")
        findings = diff_configs(plain, other)
        flagged = {f["key"]: f["severity"] for f in findings}
        assert flagged.get(f"optimizer/model/{key}") == BLOCKING, (key, flagged)
    assert plain["optimizer/model/clipnorm"] == "none"
