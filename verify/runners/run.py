"""Run one implementation of a case and return its Trace in canonical names.

A run that raises does not raise out of here: it returns a Trace carrying the error (its
whole message, where it was raised and the step it failed at) and the steps it captured, which
the comparison turns into a failing 'run' row, so one broken implementation never loses the
results of the others. A run that exceeds its time limit fails the same way (`TimeLimit`).
"""
from __future__ import annotations

import re
import signal
import threading
import time
import traceback
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from verify.core.case import Case, Implementation
from verify.core.scratch import scratch_directory
from verify.runners.capture.process_state import starting_fresh
from verify.runners.capture.tf_internals import untuned_per_device_input
from verify.core.runner import RunRequest, check_capable
from verify.core.names import NameMapError, native_name
from verify.core.meta import Environment
from verify.core.quantities import PER_VARIABLE
from verify.core.trace import Key, Trace
from verify.runners.capture.step_record import StepRecorder

MAX_ERROR = 4000      # characters of a run's error kept in its trace
MAX_HEADLINE = 1000   # characters of the error's first line, so its location and step show


class RunTimeout(BaseException):
    """A run exceeded its time limit. A BaseException, so that a runner's `except Exception`
    cannot swallow it."""

    def __init__(self, seconds: float):
        super().__init__(f"timed out after {seconds:g} s")
        self.seconds = seconds


class TimeLimit:
    """Raise RunTimeout in the main thread after `seconds` (None or 0: no limit).

    It uses SIGALRM, so it acts only in the main thread and only when no other interval timer
    is armed; elsewhere it does nothing. A run stuck inside one C++ call that never returns to
    Python (one TensorFlow op, a deadlocked collective) is not interrupted: the handler runs
    when the interpreter runs again.

    >>> with TimeLimit(0.05):
    ...     time.sleep(5)
    Traceback (most recent call last):
    ...
    verify.runners.run.RunTimeout: timed out after 0.05 s
    """

    def __init__(self, seconds: float | None):
        self.seconds = seconds or None
        self._installed, self._armed, self._previous = False, False, None

    def __enter__(self) -> "TimeLimit":
        if self.seconds and _can_alarm():
            self._previous = signal.signal(signal.SIGALRM, self._expire)
            self._installed = self._armed = True
            signal.setitimer(signal.ITIMER_REAL, self.seconds)
        return self

    def _expire(self, signum, frame) -> None:
        if self._armed:   # raise at most once, and never after the limit was lifted
            self._armed = False
            raise RunTimeout(self.seconds)

    def __exit__(self, *exc) -> bool:
        if self._installed:
            try:
                self._armed = False
                signal.setitimer(signal.ITIMER_REAL, 0)
            finally:
                signal.signal(signal.SIGALRM, self._previous)
                self._installed = False
        return False


def _can_alarm() -> bool:
    return (hasattr(signal, "setitimer")
            and threading.current_thread() is threading.main_thread()
            and signal.getitimer(signal.ITIMER_REAL)[0] == 0)


def _interrupt_under(error: BaseException) -> KeyboardInterrupt | None:
    """The KeyboardInterrupt `error` was raised while handling, if any. A run stuck inside one
    C call when both its time limit and the user's ^C arrive gets SIGINT's handler first and
    the time limit's while that unwinds: the interrupt, not the RunTimeout, is what happened.

    >>> try:
    ...     try:
    ...         raise KeyboardInterrupt("stopped by SIGINT")
    ...     except KeyboardInterrupt:
    ...         raise RunTimeout(5)
    ... except RunTimeout as e:
    ...     _interrupt_under(e)
    KeyboardInterrupt('stopped by SIGINT')
    """
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, KeyboardInterrupt):
            return error
        seen.add(id(error))
        error = error.__context__
    return None


def run_implementation(case: Case, implementation: Implementation, *, steps: int | None = None,
                       device: str = "cpu", capture_steps: bool | None = None,
                       workdir: Path | None = None, tpu_name: str = "",
                       timeout: float | None = None,
                       tables_every: int | None = None, layers: Any = None) -> Trace:
    """Train `implementation` on `case` for real and capture it; a run longer than `timeout`
    seconds fails with the steps it captured (see `TimeLimit`).

    >>> from cases.tpu_embedding import CASE as case  # doctest: +SKIP
    >>> trace = run_implementation(case, case.implementation("tf1"), steps=4)  # doctest: +SKIP
    """
    steps = steps or case.steps
    if capture_steps is None:
        capture_steps = implementation.capture_steps
    started = time.perf_counter()
    with scratch_directory(case.name) as tmp:
        request = RunRequest(case=case, implementation=implementation, steps=steps,
                             initial_values={}, device=device,
                             workdir=Path(workdir or tmp), capture_steps=capture_steps,
                             tpu_name=tpu_name, tables_every=tables_every, layers=layers)
        isolated = _uses_tensorflow(implementation.runner)
        try:
            if isolated:
                starting_fresh()
            # the time limit is lifted first: a RunTimeout raised while an interrupt unwinds
            # the run must not skip putting TensorFlow's pipeline builder back
            with (untuned_per_device_input() if isolated else nullcontext()), TimeLimit(timeout):
                request.initial_values = implementation.names.to_native(case.initial_values)
                check_capable(implementation.runner, request)
                native = implementation.runner.run(request)
                native.values.flush()   # its tables written (a full disk fails the run here)
            trace = canonicalize(native, implementation)
        except (Exception, RunTimeout) as e:  # noqa: BLE001 - every failure is a failing row
            interrupt = _interrupt_under(e)
            if interrupt is not None:   # raised while ^C/SIGTERM unwound the run: stop
                raise interrupt from None
            trace = _partial(request.trace, implementation, e)
        finally:
            # what the run left changed is put back now: neither preflight's reading of the
            # pipeline below nor the next run sees it
            left = starting_fresh() if isolated else []
    meta = trace.meta
    meta.seconds = round(time.perf_counter() - started, 3)   # the run, not what follows
    if left:
        meta.details["process_state_reset"] = left
    try:
        meta.runner = implementation.runner.describe()
    except Exception as e:  # noqa: BLE001 - a broken describe() must not lose the trace
        meta.runner = {"describe_error": describe_error(e)}
    meta.declared_config = declared_config(case, implementation)
    meta.case, meta.implementation, meta.steps = case.name, implementation.name, steps
    meta.device, meta.seed, meta.data_digest = device, case.seed, case.data_digest()
    if meta.replicas is None:   # the runner did not say how many replicas it trained on
        meta.replicas = implementation.replicas
    meta.capture = "every step" if capture_steps else "boundaries"
    meta.environment = Environment.current()
    return trace


def _uses_tensorflow(runner) -> bool:
    """Whether a run of `runner` needs a fresh TensorFlow process state: every runner but
    those that say `uses_tensorflow = False` (a numpy oracle)."""
    try:
        return bool(getattr(runner, "uses_tensorflow", True))
    except Exception:  # noqa: BLE001 - a runner that cannot be built fails in its run
        return True


def declared_config(case: Case, implementation: Implementation) -> dict[str, Any]:
    """What the implementation's pipeline declares (for preflight); the error as a finding
    when reading it fails. Read once per process for each runner, name map and replica count
    of a case (mutants and calibration variants share their candidate's)."""
    key = (id(case), id(implementation.runner), id(implementation.names),
           implementation.replicas)
    if key not in _DECLARED:
        # the case and implementation are kept with the result so their ids stay unique
        _DECLARED[key] = (case, implementation, _read_declared_config(case, implementation))
    return dict(_DECLARED[key][2])


_DECLARED: dict[tuple, tuple] = {}


def _read_declared_config(case: Case, implementation: Implementation) -> dict[str, Any]:
    runner = implementation.runner
    if not hasattr(runner, "declared_config"):
        return {"preflight/error": f"{type(runner).__name__} has no declared_config(case, "
                                  f"implementation) (see verify.core.runner.Runner); "
                                  f"return {{}} from it when the pipeline declares nothing"}
    try:
        return dict(runner.declared_config(case, implementation))
    except Exception as e:  # noqa: BLE001 - reported as a finding, not a crash
        return {"preflight/error": f"{type(e).__name__}: {e}"}


def _partial(captured: Trace, implementation: Implementation, error: BaseException) -> Trace:
    """A run that raised: the steps it captured before the error, in canonical names, and
    the error with the step it failed at (the step after the last one captured)."""
    step = max(captured.steps(), default=0) + 1
    try:
        trace = canonicalize(captured, implementation)
    except NameMapError:
        trace = Trace(implementation.name, captured.meta)
    except OSError:   # the captured steps cannot even be kept (a full disk): the error stays
        trace = Trace(implementation.name, captured.meta)
    trace.error = describe_error(error, step)
    return trace


def describe_error(error: BaseException, step: int | None = None) -> str:
    """A run's error as its trace keeps it: the type, the message's first line, where it was
    raised and the step, then the message's other lines; at most MAX_ERROR characters.

    >>> try:
    ...     raise AssertionError("weights exploded: max 1e9\\n  w grew 10x per step")
    ... except AssertionError as e:
    ...     print(describe_error(e, step=5))
    AssertionError: weights exploded: max 1e9 (at <doctest ...>:2, step 5)
      w grew 10x per step
    """
    name = type(error).__name__
    if isinstance(error, (NameMapError, NotImplementedError)):
        return _bounded(f"{name}: {error}")   # the message says it all; not at a step
    frames = traceback.extract_tb(error.__traceback__)
    if isinstance(error, RunTimeout):
        frames = frames[:-1]   # the last frame is the alarm's handler
    where = f"{Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else ""
    if isinstance(error, RunTimeout):
        return (f"{name}: {error} at step {step} (--run-timeout {error.seconds:g}"
                + (f"; it was running {where}" if where else "") + ")")
    lines = [line.rstrip() for line in str(error).strip().splitlines()]
    first, rest = (lines[0].strip(), lines[1:]) if lines else ("", [])
    # An error raised while tracing a tf.function reads "in user code: <frames> ValueError: why";
    # its own line leads, the whole message follows.
    own = f"{name}: "
    if first == "in user code:":
        first = next((line.strip()[len(own):] for line in lines
                      if line.strip().startswith(own)), first)
        rest = lines
    inner = _python_error_inside(lines)
    if inner and inner not in first:
        # TensorFlow's "Graph execution error" around a Python function it called (a tap's
        # numpy_function, a py_function): that function's own error leads, before the node's
        # definition stack, which can run to thousands of characters
        first = f"{inner} (raised in a Python function TensorFlow called: {first})"
    if not first and frames and frames[-1].line:
        first = frames[-1].line    # a bare `assert x`: its source line
    if len(first) > MAX_HEADLINE:
        first = f"{first[:MAX_HEADLINE]}… ({len(first) - MAX_HEADLINE} characters more)"
    place = ", ".join(p for p in (f"at {where}" if where else "",
                                  f"step {step}" if step is not None else "") if p)
    body = "\n".join(rest).strip("\n")
    return _bounded(f"{name}: {first}" + (f" ({place})" if place else "")
                    + (f"\n{body}" if body else ""))


_TRACEBACK = "Traceback (most recent call last):"
_ERROR_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit|Warning)\b.*: ")


def _python_error_inside(lines: list[str]) -> str:
    """The `Name: message` line that ends the last Python traceback quoted in an error's
    message, or "".

    >>> _python_error_inside(["Graph execution error:", "Traceback (most recent call last):",
    ...     '  File "tap.py", line 3, in f', "OSError: [Errno 28] No space left on device",
    ...     "\t [[{{node PyFunc}}]]"])
    'OSError: [Errno 28] No space left on device'
    """
    starts = [i for i, line in enumerate(lines) if line.strip() == _TRACEBACK]
    if not starts:
        return ""
    return next((line.strip() for line in lines[starts[-1] + 1:]
                 if _ERROR_LINE.match(line.strip())), "")


def _bounded(text: str) -> str:
    """At most MAX_ERROR characters: the start and the end of a longer text (where a quoted
    traceback says what raised), the middle cut."""
    if len(text) <= MAX_ERROR:
        return text
    head, tail = MAX_ERROR // 2, MAX_ERROR // 2 - 60
    return f"{text[:head]}\n… ({len(text) - head - tail} characters cut) …\n{text[-tail:]}"


def kept_variables(model) -> list:
    """Every variable a Keras model keeps, in the order its layers created them: the trainable
    ones and those its layers update themselves (BatchNormalization's moving mean and
    variance, any other non-trainable weight). The optimizer's step counter (`iterations`)
    belongs to the optimizer, not the model, and is not among them. None when nothing is
    trainable (a frozen model, whose variables still say `trainable`: `checked_variables`
    says so)."""
    return list(model.variables) if model.trainable_variables else []


def checked_variables(model_variables, request: RunRequest) -> dict[str, Any]:
    """A model's variables (`kept_variables`) by native name, checked against the
    implementation's name map (a `NameMapError` lists every mismatch)."""
    implementation = request.implementation
    variables = {native_name(v): v for v in model_variables}
    if not variables:
        raise NameMapError(
            f"the model of {implementation.name} has no trainable variables, so nothing can be "
            f"loaded or compared: are its layers frozen (trainable=False), or is it not built "
            f"yet? Build it (call it on an input or model.build(shape)) in the implementation's "
            f"own code before it is handed over")
    implementation.names.check_against({n: tuple(v.shape) for n, v in variables.items()},
                                       request.case.canonical_shapes(), implementation.name)
    return variables


def variable_shapes(model_variables) -> dict[str, tuple[tuple[int, ...], str]]:
    """Variables by native name -> (shape, dtype name), in the order given (creation order):
    what `Runner.native_variables` returns (`python -m verify names`)."""
    return {native_name(v): (tuple(int(d) for d in v.shape), v.dtype.name)
            for v in model_variables}


def load_initial_values(model_variables, request: RunRequest, trace: Trace) -> dict[str, Any]:
    """Check the name map, assign the case's initial values and record them as step 0 of
    `trace`; return the variables by native name."""
    variables = checked_variables(model_variables, request)
    for name, value in request.initial_values.items():
        variables[name].assign(value)
    StepRecorder(trace).weights(0, ((name, variable.numpy())
                                    for name, variable in variables.items()))
    return variables


def canonicalize(native: Trace, implementation: Implementation) -> Trace:
    """Rename a runner's native records to canonical names and canonical layouts.

    Slots recorded as `var::slot` become `canonical/slot`. A native variable that no canonical
    name maps to is an error listing it (runners check maps before training, so this is a
    last guard).
    """
    out = Trace(native.implementation, native.meta, error=native.error)
    recorder = StepRecorder(out)
    unmapped = set()
    for key in native.values:
        new_key, value = key, native.values[key]
        if key.quantity in PER_VARIABLE:
            var = key.tensor.partition("::")[0]
            found = implementation.names.canonical_of(var)
            if found is None:
                unmapped.add(var)
                continue
            new_key = Key(key.step, key.quantity, canonical_tensor(key.tensor, implementation))
            canonical = implementation.names.value_to_canonical(found[1], value)
            if canonical is not value:      # transformed: a new value
                recorder.renamed(native, key, new_key, canonical)
                continue
        recorder.renamed(native, key, new_key)   # the same value: never written again
    if unmapped:
        raise NameMapError(f"{implementation.name} recorded variables no canonical name maps to: "
                           f"{sorted(unmapped)}")
    # what the runner could not see, named as the values are (a native name no map knows stays)
    for field in ("not_captured", "read_every"):
        declared = getattr(native.meta, field)
        setattr(out.meta, field, {q: {canonical_tensor(t, implementation): v
                                      for t, v in tensors.items()}
                                  for q, tensors in declared.items()})
    return out


def canonical_tensor(native: str, implementation: Implementation) -> str:
    """The canonical name of a native variable (`var`) or slot (`var::slot`); the native name
    when the map does not know the variable.

    >>> from verify.core.names import NameMap
    >>> impl = Implementation("tf2", None, NameMap({"emb/t": "tpu_embedding/table_0"}))
    >>> canonical_tensor("tpu_embedding/table_0::accumulator", impl)
    'emb/t/accumulator'
    """
    var, _, slot = native.partition("::")
    found = implementation.names.canonical_of(var)
    if found is None:
        return native
    return f"{found[0]}/{implementation.slot_names.get(slot, slot)}" if slot else found[0]
