"""Every variable the model keeps is captured: BatchNormalization's moving mean and variance
(not trainable, updated by the layer in its training forward pass) are `weight` rows, read
after the step like every other variable, in the Keras, the custom-loop and the TF1 Estimator
runners (Keras 3: `tests/runners/keras3/test_keras3_model_state.py`)."""
import numpy as np
import pytest

from verify.runners.run import run_implementation

from bn_model import (BATCH, FEATURES, HIDDEN, NATIVE_NAMES, assert_moving_statistics,
                      examples_and_initial_values)

MOMENTUM = 0.9


def _keras_case():
    import tensorflow as tf

    from verify import Case, Examples, Implementation, KerasRunner, NameMap

    x, y, initial = examples_and_initial_values()

    def build_model(steps_per_execution):
        model = tf.keras.Sequential([tf.keras.layers.Dense(HIDDEN),
                                     tf.keras.layers.BatchNormalization(momentum=MOMENTUM),
                                     tf.keras.layers.Dense(1)])
        model.build((None, FEATURES))
        model.compile(tf.keras.optimizers.SGD(0.1), "mse",
                      steps_per_execution=steps_per_execution)
        return model

    def dataset_fn(examples, context, global_batch_size):
        return tf.data.Dataset.from_tensor_slices(
            (examples.features["x"], examples.labels)).repeat().batch(global_batch_size)

    keras = Implementation("keras", KerasRunner(build_model=build_model, dataset_fn=dataset_fn),
                           NameMap(NATIVE_NAMES))
    return Case("bn-keras", Examples({"x": x}, labels=y), BATCH, 2, initial, (keras,), "keras")


@pytest.mark.slow
def test_keras_moving_statistics_are_weight_rows_after_each_step_capture_on_or_off():
    case = _keras_case()
    keras = case.implementation("keras")
    captured = run_implementation(case, keras, steps=2)
    plain = run_implementation(case, keras, steps=2, capture_steps=False)
    assert captured.error is None and plain.error is None, (captured.error, plain.error)
    assert_moving_statistics(captured, 2, case.examples.features["x"][:BATCH],
                             case.initial_values["d1/kernel"], case.initial_values["d1/bias"],
                             MOMENTUM, atol=1e-6)
    # observing them changes nothing: the run without capture ends bitwise where it does
    for name in ("bn/moving_mean", "bn/moving_variance", "d1/kernel"):
        assert np.array_equal(plain.get(2, "weight", name), captured.get(2, "weight", name))


@pytest.mark.slow
def test_loop_moving_statistics_are_weight_rows_after_each_step_capture_on_or_off():
    from cases.batch_norm import BATCH as LOOP_BATCH, TF1_MOMENTUM, make_case

    case = make_case()
    reference = case.implementation("reference-x1")
    captured = run_implementation(case, reference)
    plain = run_implementation(case, reference, capture_steps=False)
    assert captured.error is None and plain.error is None, (captured.error, plain.error)
    last = case.steps
    # the loop's dataset is unshuffled: its first batch is the first examples
    assert_moving_statistics(captured, last, case.examples.features["x"][:LOOP_BATCH],
                             case.initial_values["dense1/kernel"],
                             case.initial_values["dense1/bias"], TF1_MOMENTUM, atol=1e-7)
    for name in ("bn/moving_mean", "bn/moving_variance"):
        assert np.array_equal(plain.get(last, "weight", name), captured.get(last, "weight", name))


@pytest.fixture(scope="module")
def tf1_runs(tf_devices):
    """The batch_norm case's TF1 model_fn (tf.compat.v1.layers.batch_normalization, its
    UPDATE_OPS before the train op): captured by the hook, uncaptured, captured through
    host_call on CPU, and the control with momentum 0.99."""
    from cases.batch_norm import NAMES, TF1_MOMENTUM, make_case, tf1_runner
    from verify import Implementation

    case = make_case()
    host_call = Implementation("tf1-host-call", tf1_runner(TF1_MOMENTUM, capture="host_call"),
                               NAMES)
    tf1 = case.implementation("tf1")
    return case, {"captured": run_implementation(case, tf1),
                  "plain": run_implementation(case, tf1, capture_steps=False),
                  "host_call": run_implementation(case, host_call),
                  "control": run_implementation(case,
                                                case.implementation("control-tf1-bn-momentum"))}


@pytest.mark.slow
def test_tf1_moving_statistics_are_weight_rows_after_each_step_capture_on_or_off(tf1_runs):
    from cases.batch_norm import BATCH as TF1_BATCH, TF1_MOMENTUM

    case, runs = tf1_runs
    assert all(trace.error is None for trace in runs.values()), {
        label: trace.error for label, trace in runs.items()}
    captured, last = runs["captured"], case.steps
    assert_moving_statistics(captured, last, case.examples.features["x"][:TF1_BATCH],
                             case.initial_values["dense1/kernel"],
                             case.initial_values["dense1/bias"], TF1_MOMENTUM, atol=1e-7)
    # the run without capture ends bitwise where it does; the host_call capture (what a TPU
    # run uses) reads the same values (from the checkpoints) at every step
    for name in case.initial_values:
        assert np.array_equal(runs["plain"].get(last, "weight", name),
                              captured.get(last, "weight", name)), name
        for step in range(last + 1):
            assert np.array_equal(runs["host_call"].get(step, "weight", name),
                                  captured.get(step, "weight", name)), (step, name)


@pytest.mark.slow
def test_tf1_another_momentum_is_caught_at_the_moving_mean_alone(tf1_runs):
    from verify.judge.compare import compare_traces, first_divergence

    case, runs = tf1_runs
    rows = compare_traces(runs["captured"], runs["control"], case.tolerances)
    divergence = first_divergence(rows)
    assert (divergence.step, divergence.quantity, divergence.tensor) == (
        1, "weight", "bn/moving_mean"), divergence
    failing = rows[~rows["passed"].astype(bool)]
    assert set(failing["tensor"]) == {"bn/moving_mean", "bn/moving_variance"}
    assert rows[rows["quantity"].isin(["loss", "grad"])]["passed"].all()


@pytest.mark.slow
def test_tf1_native_variables_list_what_the_model_keeps_not_the_optimizer_or_step(tf_devices):
    """What `names` and `init` read of a TF1 model_fn: the moving statistics with the trainable
    variables, in creation order; not the global step."""
    from cases.batch_norm import make_case

    case = make_case()
    tf1 = case.implementation("tf1")
    native = tf1.runner.native_variables(case, tf1)
    assert list(native) == ["dense/kernel", "dense/bias", "batch_normalization/gamma",
                            "batch_normalization/beta", "batch_normalization/moving_mean",
                            "batch_normalization/moving_variance", "dense_1/kernel",
                            "dense_1/bias"]


@pytest.mark.slow
def test_tf1_model_variables_leave_out_the_global_step_and_what_the_optimizer_owns():
    """A Keras BatchNormalization layer and a tf.compat.v1 non-trainable variable inside a TF1
    graph are the model's; Adam's slots, beta powers and the global step are not."""
    import tensorflow as tf

    from verify.runners.capture.host_call import model_variables
    from verify.runners.capture.tf_internals import recording_tf1_apply_gradients

    tf1 = tf.compat.v1
    with tf.Graph().as_default():
        step = tf1.train.get_or_create_global_step()
        x = tf.ones((4, 3))
        h = tf1.layers.dense(x, 2, name="dense")
        layer = tf.keras.layers.BatchNormalization(name="bn")
        h = layer(h, training=True)
        seen = tf1.get_variable("seen", shape=(), initializer=tf1.zeros_initializer(),
                                trainable=False)
        with recording_tf1_apply_gradients() as calls:
            with tf.control_dependencies(layer.updates + [seen.assign_add(1.0)]):
                tf1.train.AdamOptimizer(0.1).minimize(tf.reduce_sum(h), global_step=step)
        names = list(model_variables(calls))
        everything = {v.op.name for v in tf1.global_variables()}
    assert names == ["dense/kernel", "dense/bias", "bn/gamma", "bn/beta", "bn/moving_mean",
                     "bn/moving_variance", "seen"]
    # the control: the graph does hold what was left out
    assert {"global_step", "beta1_power", "beta2_power", "dense/kernel/Adam"} <= everything
