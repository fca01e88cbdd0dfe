"""A TPU run's preflight: the embedding optimizer (what trains the tables on a TPU) against
TF1's `optimization_parameters`, every difference blocking, the engine's own parameters
included."""
import pytest

from verify.judge.preflight import BLOCKING, INFORMATIONAL, check_alone, preflight

NO_EPSILON = "none (no epsilon term)"


def severities(reference, candidate, device):
    findings = preflight("c", "tf1", reference, "tf2", candidate, device)
    return {(r.side, r.key): r.severity for r in findings.itertuples(index=False)}


def test_an_embedding_optimizer_difference_is_blocking_on_a_tpu():
    tf1 = {"optimizer/embedding/kind": "adagrad", "optimizer/embedding/learning_rate": 0.05,
           "optimizer/embedding/clip_weight_max": "none"}
    tf2 = {**tf1, "optimizer/embedding/clip_weight_max": 1.0}
    found = severities(tf1, tf2, "tpu")
    assert found == {("both", "optimizer/embedding/clip_weight_max"): BLOCKING}
    rule = preflight("c", "tf1", tf1, "tf2", tf2, "tpu")["rule"].iloc[0]
    assert rule.startswith("on a TPU this optimizer trains the tables")
    assert severities(tf1, dict(tf1), "tpu") == {}


def test_an_embedding_epsilon_is_blocking_on_a_tpu_only():
    """Keras' minimum epsilon against none is below float32 noise for the CPU's model
    optimizer; on a TPU the engine's own math runs, so it blocks."""
    tf1 = {"optimizer/embedding/epsilon": NO_EPSILON}
    tf2 = {"optimizer/embedding/epsilon": 1e-7}
    assert severities(tf1, tf2, "cpu") == {("both", "optimizer/embedding/epsilon"): INFORMATIONAL}
    assert severities(tf1, tf2, "tpu") == {("both", "optimizer/embedding/epsilon"): BLOCKING}


def test_embedding_against_model_optimizer_within_a_side():
    """On CPU the run cannot vouch for the embedding optimizer (blocking); a TPU run exercised
    both (informational)."""
    config = {"optimizer/embedding/kind": "adagrad", "optimizer/embedding/learning_rate": 0.5,
              "optimizer/model/kind": "adagrad", "optimizer/model/learning_rate": 0.05}
    assert [r["severity"] for r in check_alone(config, "cpu")] == [BLOCKING]
    on_tpu = check_alone(config, "tpu")
    assert [r["severity"] for r in on_tpu] == [INFORMATIONAL]
    assert "this TPU run exercised both" in on_tpu[0]["rule"]


@pytest.mark.slow   # builds TensorFlow optimizer objects
def test_engine_parameters_of_tf1_and_tf2_embedding_optimizers_line_up(tf_devices):
    import tensorflow as tf

    from verify.runners.capture.static_config import describe_optimizer

    tf1 = tf.compat.v1.tpu.experimental
    engine = tf.tpu.experimental.embedding

    def described(optimizer):
        return describe_optimizer(optimizer, "optimizer/embedding")

    pairs = [(tf1.AdagradParameters(0.05), engine.Adagrad(0.05)),
             (tf1.FtrlParameters(0.05), engine.FTRL(0.05)),
             (tf1.AdamParameters(0.05, epsilon=1e-7), engine.Adam(0.05)),
             (tf1.StochasticGradientDescentParameters(0.05), engine.SGD(0.05))]
    for old, new in pairs:
        assert severities(described(old), described(new), "tpu") == {}, type(old).__name__
        assert described(old)["optimizer/embedding/clip_weight_min"] == "none"
    ftrl = described(tf1.FtrlParameters(0.05))   # TF1 keeps it fixed at 0.0, as TF2's engine
    assert ftrl["optimizer/embedding/initial_linear_value"] == 0.0
    assert ftrl["optimizer/embedding/allow_zero_accumulator"] is False
    # every engine parameter a migration can get wrong shows as blocking
    wrong = [(tf1.AdagradParameters(0.05, clip_weight_max=1.0), "clip_weight_max"),
             (tf1.AdagradParameters(0.05, weight_decay_factor=0.1), "weight_decay_factor"),
             (tf1.AdagradParameters(0.05, clip_gradient_min=-1.0, clip_gradient_max=1.0),
              "clip_gradient_max"),
             (tf1.FtrlParameters(0.05, multiply_linear_by_learning_rate=True),
              "multiply_linear_by_learning_rate"),
             (tf1.AdamParameters(0.05, epsilon=1e-7, lazy_adam=False), "lazy_adam")]
    for old, key in wrong:
        new = {tf1.AdagradParameters: engine.Adagrad(0.05), tf1.FtrlParameters: engine.FTRL(0.05),
               tf1.AdamParameters: engine.Adam(0.05)}[type(old)]
        found = severities(described(old), described(new), "tpu")
        assert found.get(("both", f"optimizer/embedding/{key}")) == BLOCKING, key
