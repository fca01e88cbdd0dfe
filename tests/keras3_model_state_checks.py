"""What `tests/runners/keras3/test_keras3_model_state.py` runs inside a keras3 environment
(with that environment's Python and KERAS_BACKEND): a Keras 3 model with BatchNormalization
trained by its own `fit`, captured and not, and again with another momentum; the traces are
saved under the directory given, and the test judges them in the suite's own process.

    python tests/keras3_model_state_checks.py OUT_DIR
"""
import sys
from pathlib import Path

from bn_model import BATCH, FEATURES, HIDDEN, NATIVE_NAMES, examples_and_initial_values

MOMENTUM, CONTROL_MOMENTUM = 0.9, 0.99
STEPS = 3


def make_case():
    """Dense, BatchNormalization, Dense; SGD on the mean squared error; unshuffled batches."""
    from verify import Case, Examples, Implementation, Keras3Runner, NameMap

    x, y, initial = examples_and_initial_values()

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

    names = NameMap({c: f"sequential/{n}" for c, n in NATIVE_NAMES.items()})
    sides = tuple(Implementation(name, Keras3Runner(build_model=build(m), dataset_fn=dataset_fn),
                                 names) for name, m in (("keras3", MOMENTUM),
                                                        ("control-momentum", CONTROL_MOMENTUM)))
    return Case("bn-keras3", Examples({"x": x}, labels=y), BATCH, STEPS, initial, sides, "keras3")


def main(out: str) -> None:
    from verify.runners.run import run_implementation

    import keras

    if keras.backend.backend() == "tensorflow":
        # Grappler's arithmetic optimizer reorders a product chain only where its middle value
        # has one consumer: the tap on the applied gradient is a second one, so SGD's
        # `gradient * learning_rate` is computed as written when captured and reordered when
        # not (bn/gamma one ulp apart from step 2: docs/limitations.md). Both runs here go
        # without that rewrite, so what is tested is that the taps themselves change nothing.
        import tensorflow as tf

        tf.config.optimizer.set_experimental_options({"arithmetic_optimization": False})
    case = make_case()
    runs = {"captured": ("keras3", True), "plain": ("keras3", False),
            "control": ("control-momentum", True)}
    for label, (name, capture) in runs.items():
        trace = run_implementation(case, case.implementation(name), capture_steps=capture)
        trace.save(Path(out) / label)
    print("KERAS3-MODEL-STATE done")


if __name__ == "__main__":
    main(sys.argv[1])
