"""The training of the throwaway cases that tests write as modules and run in subprocesses
(they import it with the project root on PYTHONPATH): a quadratic trained by numpy; and the
throwaway project such a subprocess session runs in (`write_toy_project`)."""
import os
import textwrap
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
# the project and tests/ (the throwaway case modules import toy_training)
PYTHONPATH = os.pathsep.join((str(ROOT), str(ROOT / "tests")))


def record_toy_steps(trace, w, steps: int, drift: float = 0.0, before_step=None):
    """Record step 0's weight, then each step's loss, gradient and weight of `w` trained by
    gradient descent on a quadratic (off by `drift`); `before_step(step)` runs before each
    step (a behaviour that raises or hangs there). Returns `trace`."""
    w = np.asarray(w, np.float32)
    trace.record(0, "weight", "w", w)
    for step in range(1, steps + 1):
        if before_step is not None:
            before_step(step)
        grad = (w * 0.5 + drift).astype(np.float32)
        trace.record(step, "loss", "loss", np.float32((w ** 2).sum() + drift))
        trace.record(step, "grad", "w", grad)
        w = (w - 0.1 * grad).astype(np.float32)
        trace.record(step, "weight", "w", w)
    return trace


# a throwaway `cases` module of one case: a reference and five candidates trained by
# `record_toy_steps`, two of them ('c' and 'd') off by 0.5
CASES = '''
import numpy as np
from verify import Case, Examples, Implementation, NameMap
from verify.core.tolerances import Tolerance, Tolerances
from verify.core.trace import Trace

from toy_training import record_toy_steps


class NumpyRunner:
    uses_tensorflow = False

    def __init__(self, drift=0.0):
        self.drift = drift

    def run(self, request):
        return record_toy_steps(Trace(request.implementation.name, {"replicas": 1}),
                                request.initial_values["w"], request.steps, self.drift)

    def describe(self):
        return {"runner": "numpy"}

    def declared_config(self, case, implementation):
        return {}


def side(name, drift=0.0):
    return Implementation(name, NumpyRunner(drift), NameMap({"w": "w"}))


CASE = Case(name="tiny", examples=Examples({"x": np.zeros((4, 1))}, labels=np.zeros(4)),
            batch_size=2, steps=3, initial_values={"w": np.linspace(1, 2, 4, dtype=np.float32)},
            implementations=(side("ref"), side("a"), side("b"), side("c", 0.5), side("close"),
                             side("d", 0.5)),
            reference="ref", seed=3)
'''


# the throwaway project's conftest: the case trains with numpy, no TensorFlow devices to set up
NUMPY_CONFTEST = '''
import verify.runners.capture.devices

# The throwaway case trains with numpy: no logical TensorFlow devices to configure.
verify.runners.capture.devices.configure_cpu_replicas = lambda count=8: count
'''
PARITY_TESTS = "from verify.test_parity import pytest_generate_tests, test_pair  # noqa: F401\n"


def write_toy_project(directory: Path, cases: str, conftest: str = NUMPY_CONFTEST) -> Path:
    """A project whose `pytest test_tiny.py -p verify.session.plugin` runs the parity suite on
    the `cases` module source (dedented), with `conftest`; returns `directory`."""
    (directory / "cases").mkdir()
    (directory / "cases" / "__init__.py").write_text(textwrap.dedent(cases))
    (directory / "conftest.py").write_text(conftest)
    (directory / "test_tiny.py").write_text(PARITY_TESTS)
    return directory
