"""The layer taps observe and change nothing: a step run under them computes bitwise the same
numbers, and what they send is each layer's real input, output and gradient (checked against
the same values computed without them), in a TF2 step and in a TF1 graph."""
import numpy as np
import pytest

from verify.core.layer_capture import LayerRecorder
from verify.core.names import NameMap

pytestmark = pytest.mark.slow   # TensorFlow


def build_model(tf):
    tf.keras.utils.set_random_seed(0)
    inputs = tf.keras.Input((3,))
    hidden = tf.keras.layers.Dense(4, activation="relu", name="hidden")(inputs)
    joined = tf.keras.layers.Concatenate(name="join")([hidden, inputs])
    output = tf.keras.layers.Dense(1, name="out")(joined)
    return tf.keras.Model(inputs, output)


def one_step(tf, model, x, y):
    loss_object = tf.keras.losses.MeanSquaredError()
    with tf.GradientTape() as tape:
        prediction = model(x, training=True)
        loss = loss_object(y, prediction)
    grads = tape.gradient(loss, model.trainable_variables)
    return prediction, loss, grads


def test_a_tf2_step_under_the_taps_is_bitwise_unchanged_and_they_send_its_real_values():
    import tensorflow as tf

    from verify.runners.capture.layer_taps import observing_layers

    rng = np.random.default_rng(0)
    x = tf.constant(rng.normal(size=(5, 3)), tf.float32)
    y = tf.constant(rng.normal(size=(5, 1)), tf.float32)
    model = build_model(tf)
    plain = one_step(tf, model, x, y)
    sent = {}
    recorder = LayerRecorder(1)
    with observing_layers(recorder, lambda values: sent.update(
            {k: np.asarray(v) for k, v in values.items()})):
        observed = one_step(tf, model, x, y)
    for a, b in zip(tf.nest.flatten(plain), tf.nest.flatten(observed)):
        assert np.array_equal(np.asarray(a), np.asarray(b))   # bitwise: nothing changed

    # what a step computes, without the taps: every intermediate and its gradient
    hidden_layer, out_layer = model.get_layer("hidden"), model.get_layer("out")
    with tf.GradientTape(persistent=True) as tape:
        hidden = hidden_layer(x)
        tape.watch(hidden)
        joined = tf.concat([hidden, x], axis=1)
        tape.watch(joined)
        prediction = out_layer(joined)
        tape.watch(prediction)
        per_example = tf.reduce_mean(tf.square(prediction - y), axis=-1)
        tape.watch(per_example)
        loss = tf.reduce_mean(per_example)
    calls = {c.layer_name: i for i, c in recorder.calls.items()}
    h, o = calls["hidden"], calls["out"]
    (loss_index,) = [i for i, c in recorder.calls.items() if c.loss]
    expected = {f"{h}:output": hidden, f"{o}:input": joined, f"{o}:output": prediction,
                f"{loss_index}:per-example loss": per_example}
    for name, value in expected.items():
        np.testing.assert_allclose(sent[name], value.numpy(), rtol=1e-6, err_msg=name)
        np.testing.assert_allclose(sent[name + ":grad"], tape.gradient(loss, value).numpy(),
                                   rtol=1e-5, atol=1e-8, err_msg=name)
    assert recorder.calls[o].fed_by == "Concatenate"     # the layer feeding `out`
    assert recorder.calls[h].variables == ("hidden/kernel", "hidden/bias")


def test_in_a_tf1_graph_the_taps_keep_tensors_for_the_session_to_fetch():
    import tensorflow as tf

    from verify.runners.capture.layer_taps import GraphSink, observing_layers

    tf1 = tf.compat.v1
    graph = tf.Graph()
    with graph.as_default():
        recorder, sink = LayerRecorder(1), GraphSink()
        x = tf.constant(np.arange(6, dtype=np.float32).reshape(2, 3))
        y = tf.constant([[1.0], [2.0]])
        with observing_layers(recorder, sink):
            layer = tf1.layers.Dense(2, name="hidden")
            hidden = layer(x)
            loss = tf1.losses.mean_squared_error(labels=y, predictions=tf.reduce_sum(
                hidden, axis=1, keepdims=True))
            # the variables' gradients, as an optimizer asks: they pass through the taps
            grads = tf1.gradients(loss, [hidden] + layer.trainable_weights)
        with tf1.Session() as session:
            session.run(tf1.global_variables_initializer())
            got, want = session.run([sink.tensors, {"hidden": hidden, "grad": grads[0]}])
    (index,) = [i for i, c in recorder.calls.items() if c.layer_name == "hidden"]
    np.testing.assert_array_equal(got[f"{index}:output"], want["hidden"])
    np.testing.assert_array_equal(got[f"{index}:output:grad"], want["grad"])
    recorder.take(1, {0: got})
    capture = recorder.capture(NameMap({"hidden/kernel": "hidden/kernel",
                                        "hidden/bias": "hidden/bias"}))
    assert [(e.layer, e.kind) for e in capture.entries] == [
        ("hidden", "input"), ("hidden", "output"), ("loss", "per-example loss")]


def test_the_wrapped_methods_are_restored():
    from keras.src import losses
    from keras.src.engine import base_layer, base_layer_v1
    from tensorflow.python.ops.losses import losses_impl

    from verify.runners.capture.layer_taps import observing_layers

    before = (base_layer.Layer.__call__, base_layer_v1.Layer.__call__, losses.Loss.__call__,
              losses_impl.compute_weighted_loss)
    with pytest.raises(RuntimeError):
        with observing_layers(LayerRecorder(1), lambda values: None):
            assert base_layer.Layer.__call__ is not before[0]
            raise RuntimeError("the step failed")
    assert (base_layer.Layer.__call__, base_layer_v1.Layer.__call__, losses.Loss.__call__,
            losses_impl.compute_weighted_loss) == before
