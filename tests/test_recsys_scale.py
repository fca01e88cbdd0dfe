"""The scale case: its module imports no TensorFlow, and capturing its tables by touched rows
changes no number and records exactly the rows a whole-table capture holds."""
import dataclasses
import subprocess
import sys

import numpy as np
import pytest

from verify.core.trace import SparseRows, TouchedRows
from verify.runners.run import run_implementation

STEPS = 3


def test_the_case_module_imports_no_tensorflow():
    code = ("import sys, cases.recsys_scale as m; c = m.make_case(); "
            "assert 'tensorflow' not in sys.modules, 'tensorflow imported'; print(c.steps)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.fixture(scope="module")
def case(tf_devices):
    from cases.recsys_scale import make_case

    return make_case(steps=STEPS)


def with_capture(impl, capture_tables):
    module = "tf1_estimator" if impl.name == "tf1" else "tf2_keras"
    runner = __import__(f"cases.recsys_scale.{module}", fromlist=["runner"]).runner
    from cases.recsys_scale.data import DEFAULT_USER_ROWS

    return dataclasses.replace(impl, runner=runner(DEFAULT_USER_ROWS,
                                                   capture_tables=capture_tables))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["tf1", "tf2"])
def test_touched_row_capture_is_inert_and_holds_the_rows_whole_capture_holds(case, name):
    touched = run_implementation(case, with_capture(case.implementation(name), "touched_rows"))
    whole = run_implementation(case, with_capture(case.implementation(name), "whole"))
    plain = run_implementation(case, case.implementation(name), capture_steps=False)
    assert touched.error is None and whole.error is None and plain.error is None
    last = plain.steps()[-1]
    assert last == STEPS
    # uninstrumented: the trained weights at the end (Keras: after every step, spe=1)
    for key, value in plain.values.items():
        if key.quantity == "weight":
            captured = touched.values[key]
            if isinstance(captured, TouchedRows):
                assert np.array_equal(captured.rows, value[captured.ids]), key
            else:
                assert np.array_equal(captured, value), key
            assert np.array_equal(whole.values[key], value), key
    rows = 0
    for key, value in touched.values.items():
        if isinstance(value, TouchedRows):
            full = whole.values[key]
            assert np.array_equal(value.rows, full[value.ids]), key
            rows += 1
            grad = touched.get(key.step, "grad", key.tensor.rsplit("/accumulator", 1)[0])
            assert np.array_equal(value.ids, np.unique(grad.ids)), key
        elif isinstance(value, SparseRows):   # gradients: as the whole capture has them
            other = whole.values[key]
            assert np.array_equal(value.ids, other.ids), key
            assert np.array_equal(value.rows, other.rows), key
        elif isinstance(value, str):
            assert value == whole.values[key], key
        else:
            assert np.array_equal(value, whole.values[key]), key
    # step 2 holds the four tables and the accumulators by touched rows (steps 1 and 3 whole)
    assert rows == 4 + 4 + 4, rows
