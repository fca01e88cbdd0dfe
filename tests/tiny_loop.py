"""The custom-loop case on a tiny synthetic set, shared by the tests that train it: 64
training and 32 test examples, 8 per replica (8 steps an epoch at 1 replica, 4 at 2 workers).

`CASE_SOURCE` is a case module holding it, for a subprocess that loads its cases from a file
(with `tests/` on its path).

>>> TINY.train_examples, TINY.batch_per_replica
(64, 8)
"""
import dataclasses

from cases.custom_loop import QUICK, build_case
from cases.custom_loop.data import synthetic_fashion_mnist

TINY = dataclasses.replace(QUICK, name="tiny", train_examples=64, test_examples=32,
                           batch_per_replica=8)
CASE_SOURCE = "from tiny_loop import tiny_loop_case\nCASE = tiny_loop_case()\n"


def tiny_loop_case(train_examples: int = 64):
    """The tiny custom-loop case (its data from seed 3), on `train_examples` examples."""
    data = synthetic_fashion_mnist(train_examples, 32, seed=3)
    return build_case(data, dataclasses.replace(TINY, train_examples=train_examples))


def differing_values(a, b) -> list:
    """Every key of either trace (step 0, as loaded, too) whose values are not bitwise equal
    (or that one lacks)."""
    import numpy as np

    keys = set(a.values) | set(b.values)
    return sorted((key for key in keys if key not in a.values or key not in b.values
                   or not np.array_equal(a.values[key], b.values[key])),
                  key=lambda key: (key.step, key.quantity, key.tensor))
