"""Run one implementation of a case and return its Trace in canonical names.

A run that raises does not raise out of here: it returns a Trace carrying the error, which
the comparison turns into a failing 'run' row, so one broken implementation never loses the
results of the others.
"""
from __future__ import annotations

import platform
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

from verify.case import Case, Implementation, RunRequest
from verify.names import NameMapError, native_name
from verify.trace import Key, Trace


def environment() -> dict[str, str]:
    """Versions and machine facts that a drift figure depends on."""
    import numpy

    env = {"python": platform.python_version(), "numpy": numpy.__version__,
           "platform": platform.platform(), "cpu": _cpu_model()}
    if "tensorflow" in sys.modules:
        import tensorflow as tf

        env["tensorflow"] = tf.__version__
    return env


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def run_implementation(case: Case, implementation: Implementation, *, steps: int | None = None,
                       device: str = "cpu", capture_steps: bool | None = None,
                       workdir: Path | None = None, tpu_name: str = "") -> Trace:
    """Train `implementation` on `case` for real and capture it.

    >>> from cases import load_cases  # doctest: +SKIP
    >>> case = load_cases()["tpu_embedding"]  # doctest: +SKIP
    >>> trace = run_implementation(case, case.implementation("tf1"), steps=4)  # doctest: +SKIP
    """
    steps = steps or case.steps
    if capture_steps is None:
        capture_steps = implementation.capture_steps
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=f"parity-{case.name}-") as tmp:
        request = RunRequest(case=case, implementation=implementation, steps=steps,
                             initial_values={}, device=device,
                             workdir=Path(workdir or tmp), capture_steps=capture_steps,
                             tpu_name=tpu_name)
        try:
            request.initial_values = implementation.names.to_native(case.initial_values)
            native = implementation.runner.run(request)
            trace = canonicalize(native, implementation)
        except Exception as e:  # noqa: BLE001 - every failure becomes a failing row
            trace = Trace(implementation.name, error=_describe(e))
    try:
        described = implementation.runner.describe()
    except Exception as e:  # noqa: BLE001 - a broken describe() must not lose the trace
        described = {"describe_error": _describe(e)}
    trace.meta.update({"case": case.name, "implementation": implementation.name,
                       "steps": steps, "device": device, "seed": case.seed,
                       "replicas": trace.meta.get("replicas", implementation.replicas),
                       "capture": "every step" if capture_steps else "boundaries",
                       "seconds": round(time.perf_counter() - started, 3),
                       **described, **environment()})
    return trace


def _describe(error: Exception) -> str:
    if isinstance(error, (NameMapError, NotImplementedError)):
        return f"{type(error).__name__}: {error}"
    frames = traceback.extract_tb(error.__traceback__)
    where = f" (at {Path(frames[-1].filename).name}:{frames[-1].lineno})" if frames else ""
    message = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    first = message[0] if message else ""
    # An error raised while tracing a tf.function reads "in user code: <frames> ValueError: why".
    own = f"{type(error).__name__}: "
    if first == "in user code:":
        first = next((line[len(own):] for line in message if line.startswith(own)), first)
    return f"{type(error).__name__}: {first}{where}"


def checked_variables(trainable, request: RunRequest) -> dict[str, Any]:
    """A model's trainable variables by native name, checked against the implementation's name
    map (a `NameMapError` lists every mismatch)."""
    implementation = request.implementation
    variables = {native_name(v): v for v in trainable}
    implementation.names.check_against({n: tuple(v.shape) for n, v in variables.items()},
                                       request.case.canonical_shapes(), implementation.name)
    return variables


def load_initial_values(trainable, request: RunRequest, trace: Trace) -> dict[str, Any]:
    """Check the name map, assign the case's initial values and record them as step 0 of
    `trace`; return the variables by native name."""
    variables = checked_variables(trainable, request)
    for name, value in request.initial_values.items():
        variables[name].assign(value)
    for name, variable in variables.items():
        trace.record(0, "weight", name, variable.numpy())
    return variables


def canonicalize(native: Trace, implementation: Implementation) -> Trace:
    """Rename a runner's native records to canonical names and canonical layouts.

    Slots recorded as `var::slot` become `canonical/slot`. A native variable that no canonical
    name maps to is an error listing it (runners check maps before training, so this is a
    last guard).
    """
    out = Trace(native.implementation, dict(native.meta), error=native.error)
    unmapped = set()
    for key, value in native.values.items():
        if key.quantity in ("grad", "weight", "slot"):
            var, _, slot = key.tensor.partition("::")
            found = implementation.names.canonical_of(var)
            if found is None:
                unmapped.add(var)
                continue
            canonical, transform = found
            name = f"{canonical}/{implementation.slot_names.get(slot, slot)}" if slot else canonical
            out.values[Key(key.step, key.quantity, name)] = implementation.names.value_to_canonical(
                transform, value)
        else:
            out.values[key] = value
    if unmapped:
        raise NameMapError(f"{implementation.name} recorded variables no canonical name maps to: "
                           f"{sorted(unmapped)}")
    return out
