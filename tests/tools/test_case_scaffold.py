"""`python -m verify init`: a case package scaffolded from a migration's entry points, written
whole or not at all; and, end to end, a user's own small TF1 -> Keras migration scaffolded and
judged (the faithful rewrite passes; a wrong learning rate and a momentum the TF1 side does not
have fail)."""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest

from verify.tools.case_scaffold import (Inferred, ScaffoldError, Side, case_code, sides_of,
                                        write_package)
from verify.tools.name_proposals import propose

ROOT = Path(__file__).resolve().parents[2]


def test_a_side_is_its_entry_points_and_bad_ones_are_refused_saying_what_to_give():
    side = Side.parse("keras", ["pipe.train:build", "pipe.data:dataset"])
    assert side.runner_code() == "KerasRunner(build_model=keras_build_model, dataset_fn=keras_dataset_fn)"
    with pytest.raises(ScaffoldError, match="--tf1 takes MODEL_FN INPUT_FN EMBEDDING_CONFIG_SPEC"):
        Side.parse("tf1", ["pipe.train:model_fn"])
    with pytest.raises(ScaffoldError, match="'pipe.train.model_fn' is not module:function"):
        Side.parse("tf1", ["pipe.train.model_fn", "pipe.train:input_fn"])
    with pytest.raises(ScaffoldError, match="a migration has two sides"):
        sides_of(None, ["a:b", "a:c"], None)
    loop = sides_of(None, None, ["pipe.loop:build_loop"])
    assert [(s.name, s.replicas) for s in loop] == [("reference-x1", 1), ("mirrored-x2", 2)]
    assert loop[0].runner_code() == "LoopRunner(build_loop=loop_build_loop, strategy='default')"


def test_the_written_case_compiles_and_marks_guesses_and_what_is_undecided(tmp_path):
    sides = sides_of(["p.tf1:model_fn", "p.tf1:input_fn"], ["p.tf2:build", "p.tf2:data"], None)
    shapes = {"a/kernel": (3, 4), "b/kernel": (3, 4), "c/bias": (2,)}
    proposal = propose({"x/kernel": ((3, 4), "float32"), "y/kernel": ((3, 4), "float32"),
                        "z": ((5,), "float32")}, shapes)
    code = case_code("my_case", sides, "p.data:examples", Inferred(shapes, {"tf2": proposal}),
                     batch_size=4, steps=10)
    compile(code, "my_case/__init__.py", "exec")
    assert "'a/kernel': 'x/kernel',  # shape and creation order: check it" in code
    assert "z" in code and "undecided" in code.lower()
    assert "from p.data import examples as make_examples" in code
    written = write_package(tmp_path / "my_case", code)
    assert written.read_text() == code
    with pytest.raises(ScaffoldError, match="exists"):
        write_package(tmp_path / "my_case", code)
    with pytest.raises(ScaffoldError, match="not a Python package name"):
        write_package(tmp_path / "my-case", code)
    with pytest.raises(ScaffoldError, match="'json' is already importable"):
        write_package(tmp_path / "json", code)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["my_case"]   # nothing half-written



def test_a_tf1_adam_reference_gets_the_shipped_pow_adam_noise_variant(tmp_path, monkeypatch):
    """init sees the TF1 side's AdamOptimizer and declares TF1's Adam rounded as Keras rounds
    it as noise of the reference (the same formula); an SGD reference gets no variant."""
    (tmp_path / "adam_pipe").mkdir()
    (tmp_path / "adam_pipe" / "__init__.py").write_text("")
    (tmp_path / "adam_pipe" / "tf1.py").write_text(
        "def model_fn(features, labels, mode, params):\n"
        "    return tf1.train.AdamOptimizer(0.01)\n\n\n"
        "def sgd_fn(features, labels, mode, params):\n"
        "    return tf1.train.GradientDescentOptimizer(0.01)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    shapes = {"a/kernel": (3, 4)}
    inferred = Inferred(shapes, {"tf2": propose({"x/kernel": ((3, 4), "float32")}, shapes)})
    sides = sides_of(["adam_pipe.tf1:model_fn", "adam_pipe.tf1:model_fn"], ["p.k:b", "p.k:d"],
                     None)
    code = case_code("c", sides, "p.data:examples", inferred, batch_size=4, steps=3)
    compile(code, "c/__init__.py", "exec")
    assert "from verify.runners.tf1.adam_variants import with_pow_adam" in code
    assert "EstimatorRunner(model_fn=with_pow_adam(tf1_model_fn)" in code
    assert "noise_variants={'tf1': ['tf1-pow-bias-correction']}" in code
    sgd = sides_of(["adam_pipe.tf1:sgd_fn", "adam_pipe.tf1:sgd_fn"], ["p.k:b", "p.k:d"], None)
    assert "pow" not in case_code("c", sgd, "p.data:examples", inferred, batch_size=4, steps=3)


PIPELINE = {
    "__init__.py": "",
    "data.py": """
        import numpy as np

        from verify import Examples


        def examples():
            rng = np.random.default_rng(3)
            x = rng.standard_normal((64, 3)).astype(np.float32)
            w = np.array([[1.0], [-2.0], [0.5]], np.float32)
            return Examples({"x": x}, labels=x @ w)
        """,
    "tf1_train.py": """
        import tensorflow as tf

        tf1 = tf.compat.v1


        def input_fn(examples, params):
            dataset = tf1.data.Dataset.from_tensor_slices(({"x": examples.features["x"]},
                                                           examples.labels))
            return dataset.repeat().batch(params["batch_size"], drop_remainder=True)


        def model_fn(features, labels, mode, params):
            hidden = tf1.layers.Dense(4, activation=tf.nn.relu)(features["x"])
            logits = tf1.layers.Dense(1)(hidden)
            loss = tf1.losses.mean_squared_error(labels=labels, predictions=logits)
            optimizer = tf1.train.GradientDescentOptimizer(0.1)
            train_op = optimizer.minimize(loss, global_step=tf1.train.get_global_step())
            return tf1.estimator.tpu.TPUEstimatorSpec(mode, loss=loss, train_op=train_op)
        """,
    "tf2_train.py": """
        import tensorflow as tf


        def model(optimizer):
            inputs = tf.keras.Input(shape=(3,), name="x")
            hidden = tf.keras.layers.Dense(4, activation="relu")(inputs)
            built = tf.keras.Model(inputs, tf.keras.layers.Dense(1)(hidden))
            return built, optimizer


        def build_model(steps_per_execution, optimizer=None):
            built, optimizer = model(optimizer or tf.keras.optimizers.SGD(0.1))
            built.compile(optimizer, "mse", steps_per_execution=steps_per_execution)
            return built


        def wrong_learning_rate(steps_per_execution):
            return build_model(steps_per_execution, tf.keras.optimizers.SGD(0.11))


        def with_momentum(steps_per_execution):
            return build_model(steps_per_execution, tf.keras.optimizers.SGD(0.1, momentum=0.5))


        def dataset_fn(examples, context, global_batch_size):
            dataset = tf.data.Dataset.from_tensor_slices(({"x": examples.features["x"]},
                                                          examples.labels))
            return dataset.repeat().batch(global_batch_size, drop_remainder=True)
        """,
}


@pytest.mark.slow   # builds and trains TensorFlow in subprocesses
def test_a_users_migration_scaffolded_by_init_is_judged_right(tmp_path):
    package = tmp_path / "my_pipeline"
    package.mkdir()
    for name, text in PIPELINE.items():
        (package / name).write_text(textwrap.dedent(text))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join((str(tmp_path), str(ROOT)))}
    for case, builder in (("faithful", "build_model"), ("wrong_lr", "wrong_learning_rate"),
                          ("momentum", "with_momentum")):
        done = subprocess.run(
            [sys.executable, "-m", "verify", "init", case,
             "--tf1", "my_pipeline.tf1_train:model_fn", "my_pipeline.tf1_train:input_fn",
             "--keras", f"my_pipeline.tf2_train:{builder}", "my_pipeline.tf2_train:dataset_fn",
             "--examples", "my_pipeline.data:examples", "--out", str(tmp_path / "parity")],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
        assert "tf2: 4 variables matched" in done.stdout
    again = subprocess.run([sys.executable, "-m", "verify", "init", "faithful", "--tf1", "a:b",
                            "a:c", "--keras", "a:d", "a:e", "--examples", "a:f", "--out",
                            str(tmp_path / "parity")], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=120)
    assert again.returncode == 2 and "exists" in again.stderr
    clash = subprocess.run([sys.executable, "-m", "verify", "init", "my_pipeline", "--tf1",
                            "a:b", "a:c", "--keras", "a:d", "a:e", "--examples", "a:f", "--out",
                            str(tmp_path / "parity")], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=120)
    assert clash.returncode == 2 and "is already importable" in clash.stderr
    assert not (tmp_path / "parity" / "my_pipeline").exists()
    judged = subprocess.run(
        [sys.executable, "-m", "pytest", "verify/", "--cases", str(tmp_path / "parity"),
         "--report-dir", str(tmp_path / "reports"), "-q", "-p", "no:cacheprovider",
         "-p", "no:benchmark"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    summary = pd.read_csv(tmp_path / "reports" / "summary.csv").set_index("case")
    assert summary.loc["faithful", "verdict"] == "PASS", judged.stdout[-3000:]
    assert summary.loc["wrong_lr", "verdict"] == "FAIL"
    assert (summary.loc["wrong_lr", "first_step"], summary.loc["wrong_lr", "first_quantity"]) == (
        1, "weight")
    # Keras SGD's momentum slot is read once it carries state: TF1 has none, so it fails
    assert summary.loc["momentum", "verdict"] == "FAIL"
    assert summary.loc["momentum", "first_quantity"] == "slot"
