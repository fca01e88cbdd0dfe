"""The scale case: its module imports no TensorFlow, and capturing its tables by touched rows
changes no number and records exactly the rows a whole-table capture holds."""
import dataclasses
import subprocess
import sys

import numpy as np
import pytest

from verify.core.inputs import InputFeature
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
        elif isinstance(value, (str, InputFeature)):
            assert value == whole.values[key], key
        else:
            assert np.array_equal(value, whole.values[key]), key
    # step 2 holds the four tables and the accumulators by touched rows (steps 1 and 3 whole)
    assert rows == 4 + 4 + 4, rows


@pytest.mark.slow
@pytest.mark.parametrize("options, replicas", [
    ({"steps_per_execution": 2}, 1),          # steps inside one multi-step function
    # two replicas in sync, summed on one device: TF's default collectives cannot gather sparse
    # gradients of different lengths per replica over logical CPUs, and after such a failure
    # every collective of the process fails (see docs/limitations.md)
    ({"strategy": "mirrored", "cross_device_ops": "reduction_to_one_device"}, 2),
], ids=["steps_per_execution=2", "mirrored-x2"])
def test_keras_touched_rows_decide_whole_tables_inside_the_step_function(case, options,
                                                                         replicas):
    """Whole tables at the steps the capture names (here every 2 steps of 3, and the slots at
    step 1) are sent from the step's own function, so they hold where no callback runs between
    steps: the same values a whole-table capture records, rows and tables alike."""
    from cases.recsys_scale.data import DEFAULT_USER_ROWS
    from cases.recsys_scale.tf2_keras import runner

    impl = case.implementation("tf2")

    def side(**capture):
        return dataclasses.replace(impl, replicas=replicas,
                                   runner=runner(DEFAULT_USER_ROWS, **options, **capture))

    touched = run_implementation(case, side(capture_tables="touched_rows", tables_every=2))
    whole = run_implementation(case, side(capture_tables="whole"))
    assert touched.error is None and whole.error is None, (touched.error, whole.error)
    assert touched.meta.replicas == replicas
    kinds: dict[int, set] = {}
    for key, value in touched.values.items():
        expected = whole.values[key]
        if isinstance(value, TouchedRows):
            kinds.setdefault(key.step, set()).add(f"{key.quantity} rows")
            assert np.array_equal(value.rows, expected[value.ids]), key
        elif isinstance(value, SparseRows):
            assert np.array_equal(value.ids, expected.ids), key
            assert np.array_equal(value.rows, expected.rows), key
        elif isinstance(value, (str, InputFeature)):
            assert value == expected, key
        else:
            if key.tensor.startswith("embedding/"):
                kinds.setdefault(key.step, set()).add(f"{key.quantity} whole")
            assert np.array_equal(value, expected), key
    assert kinds == {0: {"weight whole"}, 1: {"weight rows", "slot whole"},
                     2: {"weight whole", "slot whole"}, 3: {"weight whole", "slot whole"}}, kinds


@pytest.mark.slow
def test_a_run_whose_step_function_sends_no_whole_tables_fails_saying_so(case, monkeypatch):
    """Touched rows are compared against the last whole table: a capture that never sent the
    whole tables it names must fail, not pass on the rows alone."""
    import tensorflow as tf

    from verify.runners.capture.tables import TableCapture

    monkeypatch.setattr(TableCapture, "whole_at", lambda self, step, steps, quantity:
                        tf.constant(False))
    trace = run_implementation(case, with_capture(case.implementation("tf2"), "touched_rows"))
    assert trace.error is not None and "capture by touched rows sent no whole slot tables at " \
        "step 1" in trace.error, trace.error
