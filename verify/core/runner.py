"""What a runner is, and how a run is asked for.

- `Runner`: runs one implementation for real (`run`), says what it is (`describe`) and what
  its pipeline declares (`declared_config`, for preflight).
- `RunRequest`: what the harness hands a runner in-process (the case and implementation
  objects, initial values in the implementation's own names, a work directory).
- `RunSpec`: the same request as plain data: a case named by where it is loaded from and its
  name, an implementation by name. It survives JSON, so another process (another environment,
  another machine) can be asked for a run: `python -m verify run SPEC.json OUT`.
- `CAPABILITIES`: what a runner may declare it can do beyond a plain CPU run
  (`Runner.capabilities`); `check_capable` refuses a request that needs one it lacks, naming
  the runner and the capability, where the run is asked for.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from verify.core.case import Case, Implementation, SuiteOptions
from verify.core.trace import Trace

# What a request may need of its runner beyond a plain one-replica CPU run with capture.
CAPABILITIES = {
    "tpu": "train on a TPU (--tpu)",
    "mutations": "apply a sensitivity mutation (learning rate, epsilon, clipping, a dropped "
                 "step) to its optimizer",
    "nudges": "nudge its gradients by an ulp (calibration)",
    "resume": "resume from a checkpoint (RunRequest.restore_from)",
    "own_restore": "run the implementation's own restore code (ResumeRunner(restore=...))",
    "write_checkpoint": "keep its trained state as a checkpoint (RunRequest.checkpoint_dir)",
    "tf1_checkpoint_source": "train the TF1 checkpoint a conversion reads",
    "keras_checkpoint_target": "train the Keras model a converted checkpoint is written for",
    "layer_replay": "observe every layer of a step (a layer replay, RunRequest.layers)",
}


class Runner(Protocol):
    """Runs one implementation for real and returns a Trace in the implementation's own names.

    Gradients, weights and slots are recorded under native names (slots as `var::slot`); the
    harness maps them to canonical names. `declared_config(case, implementation)` returns the
    pipeline's static configuration as a flat dict of plain values (`verify.judge.preflight`
    diffs two of them); a runner that cannot read one returns {}.
    """

    def run(self, request: "RunRequest") -> Trace: ...

    def describe(self) -> dict[str, Any]: ...

    def declared_config(self, case: Case, implementation: Implementation) -> dict[str, Any]: ...

    # Optional: what it can do of `CAPABILITIES` (none when absent).
    # capabilities: frozenset[str]
    # Optional: its side's trainable variables, native name -> (shape, dtype name), in
    # creation order, read without training (`python -m verify names`).
    # def native_variables(self, case, implementation) -> dict[str, tuple]: ...


class UnsupportedRequest(NotImplementedError):
    """A run asked of a runner for something it does not declare it can do."""


def capabilities(runner: Any) -> frozenset[str]:
    """What `runner` declares it can do (`CAPABILITIES`); nothing when it declares nothing.

    >>> class Plain:
    ...     pass
    >>> sorted(capabilities(Plain()))
    []
    """
    return frozenset(getattr(runner, "capabilities", frozenset()))


def needed_capabilities(request: "RunRequest") -> list[str]:
    """What `request` needs of its runner (`CAPABILITIES` keys), in that table's order."""
    implementation = request.implementation
    mutation = implementation.mutation
    needs = {
        "tpu": request.device == "tpu",
        "mutations": mutation is not None and mutation.kind != "nudge_gradients",
        "nudges": mutation is not None and mutation.kind == "nudge_gradients",
        "resume": request.restore_from is not None,
        "own_restore": request.restore_with is not None,
        "write_checkpoint": request.checkpoint_dir is not None,
        "layer_replay": request.layers is not None,
    }
    return [name for name in CAPABILITIES if needs.get(name)]


def check_capable(runner: Any, request: "RunRequest") -> None:
    """Refuse (`UnsupportedRequest`) a request that needs what `runner` does not declare, so a
    setting is never silently ignored (a runner that cannot restore would otherwise train
    from the initial values without a word).

    >>> class CpuOnly:
    ...     capabilities = frozenset({"nudges"})
    >>> from verify.core.names import NameMap
    >>> side = Implementation("tf2", CpuOnly(), NameMap({}))
    >>> request = RunRequest(case=None, implementation=side, steps=1, initial_values={},
    ...                      device="tpu", workdir=Path("."), trace=Trace("tf2"))
    >>> check_capable(side.runner, request)  # doctest: +NORMALIZE_WHITESPACE
    Traceback (most recent call last):
    ...
    verify.core.runner.UnsupportedRequest: tf2 runs CpuOnly, which cannot train on a TPU
    (--tpu) (its capabilities: nudges)
    """
    missing = [name for name in needed_capabilities(request)
               if name not in capabilities(runner)]
    if missing:
        kind = type(runner.resolve() if hasattr(type(runner), "resolve") else runner).__name__
        declared = ", ".join(sorted(capabilities(runner))) or "none declared"
        raise UnsupportedRequest(
            f"{request.implementation.name} runs {kind}, which cannot "
            f"{' or '.join(CAPABILITIES[name] for name in missing)} (its capabilities: "
            f"{declared})")


@dataclasses.dataclass
class RunRequest:
    """What the harness asks a runner to do. The runner records into `trace` as it goes (and
    returns it), so a run that raises midway still hands over the steps it captured."""

    case: Case
    implementation: Implementation
    steps: int
    initial_values: dict[str, np.ndarray]   # in the implementation's own variable names
    device: str                             # "cpu" or "tpu"
    workdir: Path
    capture_steps: bool = True              # False: run as shipped, capture only what is free
    tpu_name: str = ""
    trace: Trace | None = None              # set by the harness; a fresh one if not given
    # A checkpoint directory in the implementation's own format to start from instead of the
    # initial values (weights, optimizer slots, step): step 0 and the evaluation recorded at
    # step 0 are the restored state. None: start from `initial_values`.
    restore_from: Path | None = None
    # The implementation's own restore code for `restore_from` (`ResumeRunner(restore=...)`):
    # called as `restore(model, optimizer, checkpoint_prefix)`; None: the runner's restore.
    restore_with: Any = None
    # Where to keep the trained state as the implementation's own checkpoint (None: nowhere).
    checkpoint_dir: Path | None = None
    # TPU: read the embedding tables and their slots every K steps (None: the runner's default,
    # `verify.runners.capture.host_call.tables_every`)
    tables_every: int | None = None
    # A layer replay (`verify.session.layer_replay`): a
    # `verify.core.layer_capture.LayerRecorder` the runner's taps hand every layer's values of
    # its step to. None: no layer is observed.
    layers: Any = None

    def __post_init__(self):
        if self.trace is None:
            self.trace = Trace(self.implementation.name)


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """A run asked for by name, as JSON-able data.

    `sources` are the case sources (directories, files or module names, see
    `verify.runners.case_sources`) the case is loaded from; `options` the session's `SuiteOptions`
    fields that shape the case (steps, full, data_dir, replicas).

    >>> spec = RunSpec(sources=("cases",), case="tpu_embedding", implementation="tf2", steps=4)
    >>> RunSpec.from_json(spec.to_json()) == spec
    True
    """

    sources: tuple[str, ...]
    case: str
    implementation: str
    steps: int | None = None
    device: str = "cpu"
    tpu_name: str = ""
    tpu_tables_every: int | None = None
    full: bool = False
    data_dir: str | None = None
    replicas: tuple[int, ...] = (1, 2, 4, 8)

    def options(self) -> SuiteOptions:
        return SuiteOptions(steps=self.steps, device=self.device, tpu_name=self.tpu_name,
                            tpu_tables_every=self.tpu_tables_every,
                            replicas=tuple(self.replicas), full=self.full,
                            data_dir=Path(self.data_dir) if self.data_dir else None)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=1)

    @classmethod
    def from_json(cls, text: str) -> "RunSpec":
        try:
            doc = json.loads(text)
            doc["sources"] = tuple(doc["sources"])
            doc["replicas"] = tuple(doc.get("replicas", (1, 2, 4, 8)))
            return cls(**doc)
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"a run spec is JSON with keys sources, case, implementation (and "
                             f"optionally steps, device, tpu_name, full, data_dir, replicas); "
                             f"could not read it: {e}") from None
