"""A small model with BatchNormalization for the tests of state capture: Dense, BatchNormalization,
Dense on 32 examples of 3 features, and what its moving mean must hold after one step. Numpy
only: the suite's tests import it, and so does `keras3_model_state_checks.py` inside the keras3
environments."""
import numpy as np

FEATURES, HIDDEN, BATCH = 3, 4, 8
MOVING = ("bn/moving_mean", "bn/moving_variance")
# canonical name -> the Keras native name (Keras 3 prefixes it with the model's path)
NATIVE_NAMES = {"d1/kernel": "dense/kernel", "d1/bias": "dense/bias",
                "bn/gamma": "batch_normalization/gamma", "bn/beta": "batch_normalization/beta",
                "bn/moving_mean": "batch_normalization/moving_mean",
                "bn/moving_variance": "batch_normalization/moving_variance",
                "d2/kernel": "dense_1/kernel", "d2/bias": "dense_1/bias"}


def examples_and_initial_values(seed: int = 3):
    """The examples `x` (32 x FEATURES), labels `y` and every variable's initial value by
    canonical name; moving mean 0 and variance 1, as Keras starts them."""
    rng = np.random.default_rng(seed)
    x = (rng.normal(size=(32, FEATURES)) * 2 + 1).astype(np.float32)
    y = rng.normal(size=(32, 1)).astype(np.float32)
    initial = {"d1/kernel": rng.normal(size=(FEATURES, HIDDEN)).astype(np.float32),
               "d1/bias": np.full(HIDDEN, 0.5, np.float32),
               "bn/gamma": np.ones(HIDDEN, np.float32), "bn/beta": np.zeros(HIDDEN, np.float32),
               "bn/moving_mean": np.zeros(HIDDEN, np.float32),
               "bn/moving_variance": np.ones(HIDDEN, np.float32),
               "d2/kernel": rng.normal(size=(HIDDEN, 1)).astype(np.float32),
               "d2/bias": np.zeros(1, np.float32)}
    return x, y, initial


def first_moving_mean(x, kernel, bias, momentum):
    """What BatchNormalization's moving mean holds after one training step from zero: the
    momentum's share of the batch mean of its input (the Dense layer's output)."""
    h = x.astype(np.float64) @ kernel + bias
    return (1 - momentum) * h.mean(axis=0)


def assert_moving_statistics(trace, steps: int, x, kernel, bias, momentum: float,
                             atol: float) -> None:
    """`trace` holds both moving statistics as weights at every step 0..`steps`, no gradient of
    them, and after step 1 (first batch `x`) the moving mean `first_moving_mean` gives."""
    for step in range(steps + 1):
        for name in MOVING:
            assert trace.get(step, "weight", name) is not None, (step, name)
    assert trace.get(1, "grad", "bn/moving_mean") is None   # no gradient reaches them
    np.testing.assert_allclose(trace.get(1, "weight", "bn/moving_mean"),
                               first_moving_mean(x, kernel, bias, momentum), rtol=1e-5,
                               atol=atol)
