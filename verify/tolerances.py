"""How close two float32 values must be to count as the same number.

An element passes when `|candidate - reference| <= atol + rtol * |reference|`. Defaults are per
quantity; a case overrides them per quantity or per tensor (shell-style patterns on the tensor
name, or on `quantity:tensor`).

The defaults were set from drift measured on a 2-core x86-64 CPU, TF 2.15.1, float32, between
the faithful implementations of the shipped cases, above the worst measured drift and far below
the smallest negative-control drift. The figures are written beside each default.
"""
from __future__ import annotations

import dataclasses
import fnmatch
from typing import Mapping


@dataclasses.dataclass(frozen=True)
class Tolerance:
    atol: float
    rtol: float

    def __post_init__(self):
        if not (self.atol >= 0 and self.rtol >= 0):
            raise ValueError(f"tolerances must be >= 0, got atol={self.atol}, rtol={self.rtol}")


# Beside each default: the worst drift measured on the faithful pairs of the tpu_embedding case
# (tf1 against tf2, tf2-mirrored (2 replicas) and the steps_per_execution=10 runs, 20 steps):
# max |a-b|, and max |a-b|/|b| over all elements.
DEFAULTS: dict[str, Tolerance] = {
    # Inputs are compared by digest: equal or not. The tolerance is unused.
    "input": Tolerance(atol=0.0, rtol=0.0),
    # measured: 6.0e-8 abs on a loss of 0.69, 2.7e-7 rel
    "loss": Tolerance(atol=1e-6, rtol=1e-5),
    # measured: 2.4e-7 abs on a kernel gradient of max |g| 2.2; 2.1e-5 rel on an element of
    # 2.2e-4. The atol alone is 4x the worst absolute drift.
    "grad": Tolerance(atol=1e-6, rtol=1e-4),
    # measured: 1.9e-6 abs on an accumulator of max 14.2, 1.7e-7 rel
    "slot": Tolerance(atol=1e-6, rtol=1e-4),
    # measured: 6.7e-8 abs, 3.0e-5 rel on an element of -2.0e-3
    "weight": Tolerance(atol=1e-6, rtol=1e-5),
    # measured: eval loss 1.5e-8 abs, 1.2e-7 rel
    "metric": Tolerance(atol=1e-6, rtol=1e-5),
    # A run that raised fails whatever the tolerance.
    "run": Tolerance(atol=0.0, rtol=0.0),
}


@dataclasses.dataclass(frozen=True)
class Tolerances:
    """Tolerances per quantity, with per-tensor overrides.

    >>> t = Tolerances.default().override(grad=Tolerance(1e-5, 1e-3),
    ...                                   tensors={"embedding/*": Tolerance(1e-5, 1e-2)})
    >>> t.lookup("grad", "dense/kernel").rtol, t.lookup("weight", "embedding/table").rtol
    (0.001, 0.01)
    """

    by_quantity: Mapping[str, Tolerance]
    by_tensor: Mapping[str, Tolerance] = dataclasses.field(default_factory=dict)

    @classmethod
    def default(cls) -> "Tolerances":
        return cls(dict(DEFAULTS))

    def override(self, tensors: Mapping[str, Tolerance] | None = None,
                 **quantities: Tolerance) -> "Tolerances":
        unknown = set(quantities) - set(DEFAULTS)
        if unknown:
            raise ValueError(f"unknown quantities {sorted(unknown)}; expected some of "
                             f"{sorted(DEFAULTS)}")
        return Tolerances({**self.by_quantity, **quantities},
                          {**self.by_tensor, **(tensors or {})})

    def lookup(self, quantity: str, tensor: str) -> Tolerance:
        """The most specific tolerance: the last matching tensor pattern, else the quantity's."""
        found = None
        for pattern, tolerance in self.by_tensor.items():
            if fnmatch.fnmatchcase(tensor, pattern) or fnmatch.fnmatchcase(
                    f"{quantity}:{tensor}", pattern):
                found = tolerance
        return found or self.by_quantity[quantity]
