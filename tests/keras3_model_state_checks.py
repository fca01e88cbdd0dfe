"""What `tests/runners/keras3/test_keras3_model_state.py` runs inside a keras3 environment
(with that environment's Python and KERAS_BACKEND): a Keras 3 model with BatchNormalization
trained by its own `fit`, captured and not, and again with another momentum; the traces are
saved under the directory given, and the test judges them in the suite's own process.

    python tests/keras3_model_state_checks.py OUT_DIR
"""
import sys
from pathlib import Path

import numpy as np

MOMENTUM, CONTROL_MOMENTUM = 0.9, 0.99
FEATURES, HIDDEN, BATCH, STEPS = 3, 4, 8, 3


def make_case():
    """Dense, BatchNormalization, Dense; SGD on the mean squared error; unshuffled batches."""
    from verify import Case, Examples, Implementation, Keras3Runner, NameMap

    rng = np.random.default_rng(3)
    x = (rng.normal(size=(32, FEATURES)) * 2 + 1).astype(np.float32)
    y = rng.normal(size=(32, 1)).astype(np.float32)

    def build(momentum):
        def build_model(steps_per_execution):
            import keras

            model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(HIDDEN),
                                      keras.layers.BatchNormalization(momentum=momentum),
                                      keras.layers.Dense(1)])
            model.compile(keras.optimizers.SGD(0.1), "mse",
                          steps_per_execution=steps_per_execution)
            return model
        return build_model

    def dataset_fn(examples, global_batch_size):
        import tensorflow as tf

        return tf.data.Dataset.from_tensor_slices(
            (examples.features["x"], examples.labels)).repeat().batch(global_batch_size)

    names = NameMap({f"{c}": f"sequential/{n}" for c, n in {
        "d1/kernel": "dense/kernel", "d1/bias": "dense/bias",
        "bn/gamma": "batch_normalization/gamma", "bn/beta": "batch_normalization/beta",
        "bn/moving_mean": "batch_normalization/moving_mean",
        "bn/moving_variance": "batch_normalization/moving_variance",
        "d2/kernel": "dense_1/kernel", "d2/bias": "dense_1/bias"}.items()})
    initial = {"d1/kernel": rng.normal(size=(FEATURES, HIDDEN)).astype(np.float32),
               "d1/bias": np.full(HIDDEN, 0.5, np.float32),
               "bn/gamma": np.ones(HIDDEN, np.float32), "bn/beta": np.zeros(HIDDEN, np.float32),
               "bn/moving_mean": np.zeros(HIDDEN, np.float32),
               "bn/moving_variance": np.ones(HIDDEN, np.float32),
               "d2/kernel": rng.normal(size=(HIDDEN, 1)).astype(np.float32),
               "d2/bias": np.zeros(1, np.float32)}
    sides = tuple(Implementation(name, Keras3Runner(build_model=build(m), dataset_fn=dataset_fn),
                                 names) for name, m in (("keras3", MOMENTUM),
                                                        ("control-momentum", CONTROL_MOMENTUM)))
    return Case("bn-keras3", Examples({"x": x}, labels=y), BATCH, STEPS, initial, sides, "keras3")


def main(out: str) -> None:
    from verify.runners.run import run_implementation

    case = make_case()
    runs = {"captured": ("keras3", True), "plain": ("keras3", False),
            "control": ("control-momentum", True)}
    for label, (name, capture) in runs.items():
        trace = run_implementation(case, case.implementation(name), capture_steps=capture)
        trace.save(Path(out) / label)
    print("KERAS3-MODEL-STATE done")


if __name__ == "__main__":
    main(sys.argv[1])
