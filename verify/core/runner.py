"""What a runner is, and how a run is asked for.

- `Runner`: runs one implementation for real (`run`), says what it is (`describe`) and what
  its pipeline declares (`declared_config`, for preflight).
- `RunRequest`: what the harness hands a runner in-process (the case and implementation
  objects, initial values in the implementation's own names, a work directory).
- `RunSpec`: the same request as plain data: a case named by where it is loaded from and its
  name, an implementation by name. It survives JSON, so another process (another environment,
  another machine) can be asked for a run: `python -m verify run SPEC.json OUT`.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from verify.core.case import Case, Implementation, SuiteOptions
from verify.core.trace import Trace

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

    def __post_init__(self):
        if self.trace is None:
            self.trace = Trace(self.implementation.name)


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """A run asked for by name, as JSON-able data.

    `sources` are the case sources (directories, files or module names, see
    `verify.case_sources`) the case is loaded from; `options` the session's `SuiteOptions`
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
