"""The case API: what a migration under test declares.

A case is data (numpy examples, canonical initial values), the implementations that train on
it, one name map per implementation, and tolerances. Implementations that are deliberately
wrong (negative controls) say where the suite must catch them.

Example (the shipped TPU-embedding case is the full version of this)::

    CASE = Case(
        name="my_migration",
        examples=Examples({"x": x}, labels=y), eval_examples=Examples({"x": xe}, labels=ye),
        batch_size=8, steps=12,
        initial_values={"dense/kernel": k0, "dense/bias": b0},
        implementations=(
            Implementation("tf1", EstimatorRunner(model_fn=..., input_fn=...),
                           NameMap({"dense/kernel": "dense/kernel", "dense/bias": "dense/bias"})),
            Implementation("tf2", KerasRunner(build_model=..., dataset_fn=...),
                           NameMap({"dense/kernel": "dense/kernel", "dense/bias": "dense/bias"})),
        ),
        reference="tf1",
    )
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Mapping, Protocol, Sequence

import numpy as np

from verify.names import NameMap
from verify.tolerances import Tolerances
from verify.trace import QUANTITIES, Trace


@dataclasses.dataclass(frozen=True)
class SparseIds:
    """Variable-length ids per example, laid out like `tf.SparseTensor` (row, position) -> id.

    >>> s = SparseIds.from_lists([[0, 5], [], [3]])
    >>> s.indices.tolist(), s.values.tolist(), s.dense_shape
    ([[0, 0], [0, 1], [2, 0]], [0, 5, 3], (3, 2))
    """

    indices: np.ndarray
    values: np.ndarray
    dense_shape: tuple[int, int]

    @classmethod
    def from_lists(cls, ids_per_example: Sequence[Sequence[int]], width: int | None = None):
        width = width or max((len(ids) for ids in ids_per_example), default=1) or 1
        indices = [(row, pos) for row, ids in enumerate(ids_per_example) for pos in range(len(ids))]
        values = [i for ids in ids_per_example for i in ids]
        return cls(np.asarray(indices, np.int64).reshape(-1, 2), np.asarray(values, np.int64),
                   (len(ids_per_example), width))

    def __len__(self):
        return self.dense_shape[0]


@dataclasses.dataclass(frozen=True)
class Examples:
    """Per-example features (dense arrays or `SparseIds`) and labels, in training order."""

    features: Mapping[str, np.ndarray | SparseIds]
    labels: np.ndarray

    def __post_init__(self):
        sizes = {name: len(v) for name, v in self.features.items()}
        sizes["labels"] = len(self.labels)
        if len(set(sizes.values())) != 1:
            raise ValueError(f"features and labels must have one example count each, got {sizes}")

    def __len__(self):
        return len(self.labels)


@dataclasses.dataclass(frozen=True)
class Expectation:
    """Where a negative control must be caught: its first divergence.

    `tensor` is a shell pattern (None: any tensor). `min_ratio` is how far beyond the tolerance
    the worst failing row of that step must be (`tightest_rtol / rtol`), so a control that only
    scrapes past the tolerance does not count as caught; digests (input) have no ratio.
    """

    step: int
    quantity: str
    why: str
    tensor: str | None = None
    min_ratio: float = 10.0

    def __post_init__(self):
        if self.quantity not in QUANTITIES:
            raise ValueError(f"Expectation quantity {self.quantity!r} is not one of {QUANTITIES}")


@dataclasses.dataclass(frozen=True)
class SuiteOptions:
    """What the user asked of this session (pytest options); a case module may read it in
    `cases(options)` to choose its data and steps."""

    steps: int | None = None          # overrides every case's own step count
    device: str = "cpu"               # "cpu" or "tpu"
    tpu_name: str = ""
    replicas: tuple[int, ...] = (1, 2, 4, 8)
    full: bool = False                # the long tier: the seeds' full training runs
    data_dir: Path | None = None      # where real datasets are, for cases that use them


@dataclasses.dataclass
class RunRequest:
    """What the harness asks a runner to do."""

    case: "Case"
    implementation: "Implementation"
    steps: int
    initial_values: dict[str, np.ndarray]   # in the implementation's own variable names
    device: str                             # "cpu" or "tpu"
    workdir: Path
    capture_steps: bool = True              # False: run as shipped, capture only what is free
    tpu_name: str = ""


class Runner(Protocol):
    """Runs one implementation for real and returns a Trace in the implementation's own names.

    Gradients, weights and slots are recorded under native names (slots as `var::slot`); the
    harness maps them to canonical names.
    """

    def run(self, request: RunRequest) -> Trace: ...

    def describe(self) -> dict[str, Any]: ...


@dataclasses.dataclass(frozen=True)
class Implementation:
    """One way of training the case: the reference, a faithful migration, or a control."""

    name: str
    runner: Runner
    names: NameMap
    description: str = ""
    # Set on negative controls: where the suite must catch this implementation.
    expect: Expectation | None = None
    # Set on controls that preflight must catch: config key patterns it must flag as blocking.
    # With `expect` None, the numbers must agree (the mistake is invisible on this device).
    preflight_expect: tuple[str, ...] = ()
    # Replicas the implementation trains with; the runner reads it from here.
    replicas: int = 1
    # False: run as shipped (no per-step instrumentation), captured only where that is free.
    capture_steps: bool = True
    # Native slot name -> canonical slot name, where optimizers call the same slot differently.
    slot_names: Mapping[str, str] = dataclasses.field(default_factory=dict)

    @property
    def is_control(self) -> bool:
        return self.expect is not None or bool(self.preflight_expect)


@dataclasses.dataclass(frozen=True)
class Case:
    """A migration under test. See the module docstring for an example."""

    name: str
    examples: Examples
    batch_size: int
    steps: int
    initial_values: Mapping[str, np.ndarray]
    implementations: Sequence[Implementation]
    reference: str
    eval_examples: Examples | None = None
    tolerances: Tolerances = dataclasses.field(default_factory=Tolerances.default)
    description: str = ""
    # (reference, candidate) pairs; default: every other implementation against `reference`.
    pairs: Sequence[tuple[str, str]] = ()
    seed: int = 0
    # The implementation that computes the documented math (e.g. a `verify.oracle.OracleRunner`):
    # drift against it says which side departs from the math (`verify.attribution`).
    oracle: str | None = None

    def __post_init__(self):
        names = [i.name for i in self.implementations]
        if len(set(names)) != len(names):
            raise ValueError(f"case {self.name}: implementation names repeat: {names}")
        if self.oracle is not None and self.oracle not in names:
            raise ValueError(f"case {self.name}: oracle {self.oracle!r} is not one of its "
                             f"implementations {names}")
        if self.reference not in names:
            raise ValueError(f"case {self.name}: reference {self.reference!r} is not one of "
                             f"its implementations {names}")
        for ref, cand in self.all_pairs():
            for n in (ref, cand):
                if n not in names:
                    raise ValueError(f"case {self.name}: pair ({ref}, {cand}) names {n!r}, "
                                     f"which is not one of {names}")
        if self.batch_size <= 0 or self.steps <= 0:
            raise ValueError(f"case {self.name}: batch_size and steps must be positive")

    def implementation(self, name: str) -> Implementation:
        for impl in self.implementations:
            if impl.name == name:
                return impl
        raise KeyError(f"case {self.name} has no implementation {name!r}")

    def all_pairs(self) -> list[tuple[str, str]]:
        if self.pairs:
            return list(self.pairs)
        return [(self.reference, i.name) for i in self.implementations
                if i.name != self.reference]

    def canonical_shapes(self) -> dict[str, tuple]:
        return {n: np.shape(v) for n, v in self.initial_values.items()}
