"""The Keras 3 runner captures every variable the model keeps: BatchNormalization's moving mean
and variance (non-trainable weights its forward pass updates) are `weight` rows after every
step, on the JAX and the TensorFlow backends, without changing a trained number; another
momentum is caught there while gradients and trainable weights agree.

`tests/keras3_model_state_checks.py` trains in each keras3 environment (built on first use,
see `python -m verify envs`) and saves the traces; they are judged here.
"""
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from verify.core.trace import Trace
from verify.environments.declared import EnvironmentUnavailable, declared_environments, ensure
from verify.judge.compare import compare_traces, first_divergence

from bn_model import BATCH, MOVING, assert_moving_statistics

pytestmark = pytest.mark.slow   # builds an environment, trains Keras 3

ROOT = Path(__file__).resolve().parents[3]
CHECKS = ROOT / "tests" / "keras3_model_state_checks.py"


@pytest.fixture(scope="module", params=["jax", "tf"])
def traces(request, tmp_path_factory):
    """The captured, uncaptured and control traces trained in the keras3-<backend>
    environment."""
    declared = declared_environments(ROOT / "pyproject.toml")[f"keras3-{request.param}"]
    try:
        built = ensure(declared)
    except EnvironmentUnavailable as e:
        pytest.skip(f"the {declared.name} environment cannot be built here: {e}")
    out = tmp_path_factory.mktemp(f"keras3-{request.param}")
    env = {**os.environ, **declared.variables, "PYTHONPATH": str(ROOT),
           "PARITY_ENVIRONMENT": declared.name, "TF_CPP_MIN_LOG_LEVEL": "2"}
    env.pop("VIRTUAL_ENV", None)
    done = subprocess.run([str(built.python), str(CHECKS), str(out)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0 and "KERAS3-MODEL-STATE done" in done.stdout, \
        done.stderr[-4000:]
    return request.param, {label: Trace.load(out / f"{label}.json")
                           for label in ("captured", "plain", "control")}


def _checks():
    import importlib.util

    spec = importlib.util.spec_from_file_location("keras3_model_state_checks", CHECKS)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_moving_statistics_are_weight_rows_after_each_step_capture_on_or_off(traces):
    backend, got = traces
    checks = _checks()
    captured, plain = got["captured"], got["plain"]
    assert captured.error is None and plain.error is None, (captured.error, plain.error)
    case = checks.make_case()
    assert_moving_statistics(captured, checks.STEPS, case.examples.features["x"][:BATCH],
                             case.initial_values["d1/kernel"], case.initial_values["d1/bias"],
                             checks.MOMENTUM, atol=1e-6)
    # observing them changes nothing: the uncaptured run (read after each execution) is
    # bitwise the captured one at every step, moving statistics included (on TensorFlow both
    # without Grappler's arithmetic optimizer, which the gradient tap would otherwise steer:
    # see keras3_model_state_checks.main and docs/limitations.md)
    state = [k for k in plain.values if k.quantity in ("weight", "slot") and k.step > 0]
    assert {k.tensor for k in state} >= set(MOVING)
    different = [k for k in state if not np.array_equal(np.asarray(plain.values[k]),
                                                         np.asarray(captured.values[k]))]
    assert different == [], (backend, different[:5])


def test_another_momentum_is_caught_at_the_moving_statistics(traces):
    backend, got = traces
    rows = compare_traces(got["captured"], got["control"])
    divergence = first_divergence(rows)
    assert divergence is not None, backend
    assert (divergence.step, divergence.quantity) == (1, "weight"), divergence.describe()
    assert divergence.tensor in MOVING
    failing = rows[~rows["passed"].astype(bool)]
    assert set(failing["tensor"]) == set(MOVING), failing[["step", "quantity", "tensor"]]
    # gradients and trainable weights agree at every step: only the moving statistics differ
    assert rows[rows["quantity"].isin(["grad", "loss"])]["passed"].all()
