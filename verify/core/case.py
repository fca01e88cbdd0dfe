"""The case API: what a migration under test declares.

A case is data (numpy examples, canonical initial values), the implementations that train on
it, one name map per implementation, and tolerances. Implementations that are deliberately
wrong (negative controls) say where the suite must catch them.

Example (the shipped TPU-embedding case is the full version of this):

```python
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
```
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
from pathlib import Path
from typing import TYPE_CHECKING, Mapping, Sequence

import numpy as np

from verify.core.expectations import MUTATIONS, Expectation, Mutation
from verify.core.meta import SUITE_ENVIRONMENT
from verify.core.names import NameMap
from verify.core.noise_floor import MULTIPLE, Calibration
from verify.core.pair_spec import PairSpec
from verify.core.tolerances import Tolerances
from verify.core.trace import digest

if TYPE_CHECKING:
    from verify.core.runner import Runner

# The case API in one import (expectations and mutations: `verify.core.expectations`).
__all__ = ["DEFAULT_RUN_TIMEOUT", "MUTATIONS", "Case", "Examples", "Expectation",
           "Implementation", "Mutation", "PairSpec", "SparseIds", "SuiteOptions"]


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

    def padded(self, dtype=np.int32) -> tuple[np.ndarray, np.ndarray]:
        """Dense `(ids, weights)` of shape `dense_shape`: ids padded with 0, weight 1 where an
        id is and 0 in the padding (keras-rs' dense input format).

        >>> ids, weights = SparseIds.from_lists([[4, 2], []]).padded()
        >>> ids.tolist(), weights.tolist()
        ([[4, 2], [0, 0]], [[1.0, 1.0], [0.0, 0.0]])
        """
        ids = np.zeros(self.dense_shape, dtype)
        weights = np.zeros(self.dense_shape, np.float32)
        rows, positions = self.indices[:, 0], self.indices[:, 1]
        ids[rows, positions], weights[rows, positions] = self.values, 1.0
        return ids, weights


@dataclasses.dataclass(frozen=True)
class Examples:
    """Per-example features (dense arrays or `SparseIds`) and labels, in training order.

    A single categorical id per example is a dense int array of shape `(N, 1)` (or a
    `SparseIds` of one-id lists, where the side declares a sparse feature).

    >>> ex = Examples({"dense": np.zeros((4, 3), np.float32),
    ...                "item": np.array([[3], [0], [7], [3]])}, labels=np.zeros((4, 1)))
    >>> len(ex)
    4
    """

    features: Mapping[str, np.ndarray | SparseIds]
    """Feature name -> one row per example: a numpy array (float32 for dense inputs, int for
    ids) or `SparseIds` for variable-length id lists."""
    labels: np.ndarray
    """One label per example, in the shape the loss expects (e.g. `(N, 1)` float32)."""

    def __post_init__(self):
        sizes = {name: len(v) for name, v in self.features.items()}
        sizes["labels"] = len(self.labels)
        if len(set(sizes.values())) != 1:
            raise ValueError(f"features and labels must have one example count each, got {sizes}")

    def __len__(self):
        return len(self.labels)


DEFAULT_RUN_TIMEOUT = 1800.0   # seconds per run; the shipped quick tiers take seconds


@dataclasses.dataclass(frozen=True)
class SuiteOptions:
    """What the user asked of this session (pytest options); a case module may read it in
    `cases(options)` to choose its data and steps."""

    steps: int | None = None          # overrides every case's own step count
    sensitivity: bool = False   # add automatic mutants to every case (verify.core.sensitivity)
    device: str = "cpu"               # "cpu" or "tpu"
    tpu_name: str = ""
    tpu_tables_every: int | None = None   # --tpu-tables-every: read tables every K steps
    replicas: tuple[int, ...] = (1, 2, 4, 8)
    full: bool = False                # the long tier: the seeds' full training runs
    data_dir: Path | None = None      # where real datasets are, for cases that use them
    # Seconds one run of one implementation may take before it fails (None: no limit).
    run_timeout: float | None = DEFAULT_RUN_TIMEOUT
    # Only pairs whose candidate runs in one of these environments (--env); () for all.
    environments: tuple[str, ...] = ()
    # Pairs whose first divergent step is replayed layer by layer (verify.session.layer_replay):
    # "diverging" (first divergence in loss or grad, mutants excepted), "all" or "off".
    replay_layers: str = "diverging"
    # --shard K/N: only the pairs of shard K of N (`verify.core.pair_spec.shard_of`); None: all.
    shard: tuple[int, int] | None = None


@dataclasses.dataclass(frozen=True)
class Implementation:
    """One way of training the case: the reference, a faithful migration, or a control."""

    name: str
    """Unique within the case; names the side in pairs, reports and on the command line."""
    runner: "Runner"
    """What trains it: `EstimatorRunner`, `KerasRunner`, `Keras3Runner`, `LoopRunner`,
    `MultiWorkerLoopRunner`, `ResumeRunner`, `lazy_runner(...)` or a `verify.Runner` of your own."""
    names: NameMap
    """Canonical name -> this side's variable (and layout transform)."""
    description: str = ""
    """Shown in reports."""
    expect: Expectation | None = None
    """Set on negative controls: where the suite must catch this implementation."""
    preflight_expect: tuple[str, ...] = ()
    """Set on controls that preflight must catch: config key patterns it must flag as blocking.
    With `expect` None, the numbers must agree (the mistake is invisible on this device)."""
    replicas: int = 1
    """Replicas the implementation trains with; the runner reads it from here."""
    capture_steps: bool = True
    """False: run as shipped (no per-step instrumentation), captured only where that is free."""
    slot_names: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """Native slot name -> canonical slot name, where optimizers call the same slot differently."""
    mutation: "Mutation | None" = None
    """A deliberate change of the training applied by the runner through its optimizer tap
    (sensitivity mutants, calibration's gradient nudges); None for the code as written."""
    environment: str = SUITE_ENVIRONMENT
    """The environment it runs in (`python -m verify envs list`): "local" is the suite's own;
    any other runs in a worker process of that environment."""
    expect_on_tpu: Expectation | None = None
    """Where a --tpu run must catch this control, when a TPU runs what the CPU cannot (the
    embedding optimizer trains the tables there); None: `expect` holds on every device."""
    preflight_cause: str = ""
    """With `preflight_expect` and `expect` None: the cause the explanation stage must name,
    'declared KEY-PATTERN' (a blocking finding whose key matches, the numbers agreeing)."""

    @property
    def is_control(self) -> bool:
        return self.expect is not None or bool(self.preflight_expect)


@dataclasses.dataclass(frozen=True)
class Case:
    """A migration under test: the data, the initial values and every implementation that
    trains on them. The module's docstring (above) has an example; a case module defines
    `CASE`, `CASES` or `cases(options)`."""

    name: str
    """Names the case on the command line (`python -m verify names NAME`) and in reports."""
    examples: Examples
    """The training data every implementation reads, in training order."""
    batch_size: int
    """The global batch per step (per replica for a `LoopRunner`)."""
    steps: int
    """Training steps each implementation runs (`--steps` overrides it)."""
    initial_values: Mapping[str, np.ndarray]
    """Canonical name -> the value every side starts from, in the canonical layout."""
    implementations: Sequence[Implementation]
    """The reference, the migrations and the negative controls."""
    reference: str
    """The implementation every other is compared against (unless `pairs` says otherwise)."""
    eval_examples: Examples | None = None
    """Evaluation data (the `metric` quantity); None: no evaluation."""
    tolerances: Tolerances = dataclasses.field(default_factory=Tolerances.default)
    """Per quantity and per tensor: the ceiling; a calibration caps it at 10x the floor."""
    description: str = ""
    """Shown in reports."""
    pairs: Sequence[tuple[str, str]] = ()
    """(reference, candidate) pairs; default: every other implementation against `reference`."""
    seed: int = 0
    """Seeds each run (`tf.keras.utils.set_random_seed`) and the data's digest."""
    oracle: str | None = None
    """The implementation that computes the documented math (e.g. a
    `cases.recommender.oracle.OracleRunner`): drift against it says which side departs from
    the math (`verify.judge.attribution`)."""
    calibration_file: str | Path | None = None
    """Where the measured noise floors are kept (`python -m verify calibrate CASE` writes
    it); None: the case is not calibrated."""
    noise_variants: Mapping[str, Sequence[str]] = dataclasses.field(default_factory=dict)
    """reference -> other legitimate float computations of it (another summation order, ...)
    that calibration measures besides the one-ulp nudges of the initial values."""
    tolerance_multiple: float = MULTIPLE
    """Calibrated, every element may differ by this many times its measured noise floor. Any
    value other than 10 needs `tolerance_multiple_why`, which the report shows."""
    tolerance_multiple_why: str = ""
    """Why `tolerance_multiple` is not 10."""
    sensitivity: tuple[str, ...] = ()
    """Mutant kinds (`verify.core.sensitivity.KINDS`) run against every faithful captured
    candidate in every run; () runs them only with --sensitivity."""
    sensitivity_candidates: tuple[str, ...] = ()
    """The candidates that get mutants (shell patterns); () for every faithful captured one."""

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
        for ref, variants in self.noise_variants.items():
            for n in (ref, *variants):
                if n not in names:
                    raise ValueError(f"case {self.name}: noise variant {n!r} is not one of "
                                     f"its implementations {names}")
        for ref, cand in self.all_pairs():
            for n in (ref, cand):
                if n not in names:
                    raise ValueError(f"case {self.name}: pair ({ref}, {cand}) names {n!r}, "
                                     f"which is not one of {names}")
        if self.batch_size <= 0 or self.steps <= 0:
            raise ValueError(f"case {self.name}: batch_size and steps must be positive")
        if not self.tolerance_multiple > 0:
            raise ValueError(f"case {self.name}: tolerance_multiple must be positive, got "
                             f"{self.tolerance_multiple!r}")
        if self.tolerance_multiple != MULTIPLE and not self.tolerance_multiple_why.strip():
            raise ValueError(f"case {self.name}: tolerance_multiple={self.tolerance_multiple:g} "
                             f"differs from the suite's {MULTIPLE:g}; say why in "
                             f"tolerance_multiple_why (the report shows it)")

    @functools.cached_property
    def calibration(self) -> "Calibration | None":
        """The case's measured noise floors on CPU (None when it has none)."""
        if self.calibration_file is None:
            return None
        return Calibration.load(self.calibration_file)

    def calibration_path(self, device: str = "cpu") -> Path | None:
        """Where the case's calibration on `device` is kept: `calibration_file` on CPU, beside
        it with the device's name on another (`calibration_tpu.json`).

        >>> Case.calibration_path(type("C", (), {"calibration_file": "c/calibration.json"}),
        ...                       "tpu").as_posix()
        'c/calibration_tpu.json'
        """
        if self.calibration_file is None:
            return None
        path = Path(self.calibration_file)
        return path if device == "cpu" else path.with_name(f"{path.stem}_{device}{path.suffix}")

    def calibration_on(self, device: str) -> "Calibration | None":
        """The calibration measured on `device` (`python -m verify calibrate CASE --tpu`);
        without one, the CPU's, which the judge does not apply to another device's run and
        says so."""
        path = self.calibration_path(device)
        if device != "cpu" and path is not None and path.is_file():
            return Calibration.load(path)
        return self.calibration

    def implementation(self, name: str) -> Implementation:
        for impl in self.implementations:
            if impl.name == name:
                return impl
        raise KeyError(f"case {self.name} has no implementation {name!r}")

    def pair_specs(self, device: str = "cpu") -> list["PairSpec"]:
        """Every pair of the case as plain data: what judging it needs besides the traces,
        for a run on `device` ("cpu" or "tpu": `Implementation.expect_on_tpu`)."""
        specs = []
        for reference, candidate in self.all_pairs():
            implementation = self.implementation(candidate)
            role = ("mutant" if implementation.mutation is not None and implementation.expect
                    else "control" if implementation.is_control else "faithful")
            expect = implementation.expect
            if device == "tpu" and implementation.expect_on_tpu is not None:
                expect = implementation.expect_on_tpu
            specs.append(PairSpec(self.name, reference, candidate,
                                  replicas=implementation.replicas,
                                  control=implementation.is_control, role=role,
                                  expect=expect,
                                  preflight_expect=tuple(implementation.preflight_expect),
                                  preflight_cause=implementation.preflight_cause,
                                  oracle=self.oracle, floor_of=self.floor_source(reference),
                                  oracle_floor_of=(self.floor_source(self.oracle)
                                                   if self.oracle else ()),
                                  multiple=self.tolerance_multiple,
                                  multiple_why=self.tolerance_multiple_why))
        return specs

    def floor_source(self, reference: str) -> tuple[str, ...]:
        """The implementations whose measured noise floors judge pairs with `reference`: the
        reference itself; for the float64 oracle, the case's float32 reference and the oracle
        (whose `noise_variants` may hold the same math in float32: the rounding of a float32
        computation, which one-ulp nudges of a float32 side's inputs do not reach). A pair is
        judged against the largest of them.

        >>> ex = Examples({"x": np.zeros((2, 1))}, labels=np.zeros(2))
        >>> sides = tuple(Implementation(n, None, NameMap({})) for n in ("tf1", "tf2", "oracle"))
        >>> case = Case("c", ex, 1, 1, {}, sides, "tf1", oracle="oracle")
        >>> case.floor_source("tf2"), case.floor_source("oracle")
        (('tf2',), ('tf1', 'oracle'))
        """
        if reference == self.oracle and self.reference != self.oracle:
            return (self.reference, self.oracle)
        return (reference,)

    def calibrated_references(self) -> list[str]:
        """The implementations calibration measures: the floor sources of every pair's
        reference. Never a pair's candidate (unless it is also a reference of another pair), so
        a calibration is the same with and without the candidates it judges."""
        return list(dict.fromkeys(name for ref, _ in self.all_pairs()
                                  for name in self.floor_source(ref)))

    def uncalibratable(self, names: Sequence[str]) -> dict[str, str]:
        """Of `names`, those calibration cannot measure here, with why: implementations of
        another environment (calibration runs in the suite's own; their pairs are judged by
        the case's own tolerances, and the report says so)."""
        return {name: f"runs in environment {self.implementation(name).environment!r}; "
                      f"calibration runs in the suite's own ({SUITE_ENVIRONMENT!r})"
                for name in names
                if self.implementation(name).environment != SUITE_ENVIRONMENT}

    def all_pairs(self) -> list[tuple[str, str]]:
        if self.pairs:
            return list(self.pairs)
        return [(self.reference, i.name) for i in self.implementations
                if i.name != self.reference]

    def canonical_shapes(self) -> dict[str, tuple]:
        return {n: np.shape(v) for n, v in self.initial_values.items()}

    def data_digest(self) -> str:
        """A digest of what every implementation is fed: examples (training and evaluation),
        initial values, batch size and seed. A kept or golden trace whose digest differs was
        produced from other data.

        >>> ex = Examples({"x": np.zeros((2, 1))}, labels=np.zeros(2))
        >>> sides = (Implementation("r", None, NameMap({})),)
        >>> a = Case("c", ex, 1, 1, {"w": np.ones(2)}, sides, "r")
        >>> b = Case("c", ex, 1, 1, {"w": np.zeros(2)}, sides, "r")
        >>> a.data_digest() == b.data_digest(), len(a.data_digest())
        (False, 16)
        """
        cached = self.__dict__.get("_data_digest")   # every run records it; hash once
        if cached is not None:
            return cached
        h = hashlib.sha256(f"batch={self.batch_size}|seed={self.seed}|".encode())
        for label, examples in (("train", self.examples), ("eval", self.eval_examples)):
            if examples is None:
                continue
            for name in sorted(examples.features):
                value = examples.features[name]
                parts = ((value.indices, value.values, np.asarray(value.dense_shape))
                         if isinstance(value, SparseIds) else (np.asarray(value),))
                for part in parts:
                    h.update(f"{label}/{name}|".encode() + digest(part).encode())
            h.update(f"{label}/labels|".encode() + digest(np.asarray(examples.labels)).encode())
        for name in sorted(self.initial_values):
            value = np.asarray(self.initial_values[name])
            h.update(f"init/{name}|".encode() + digest(value).encode())
        self.__dict__["_data_digest"] = h.hexdigest()[:16]
        return self.__dict__["_data_digest"]
