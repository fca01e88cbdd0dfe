"""How close two float32 values must be to count as the same number.

An element passes when `|candidate - reference| <= atol + rtol * |reference|`. Defaults are per
quantity; a case overrides them per quantity or per tensor (shell-style patterns on the tensor
name, or on `quantity:tensor`).

The defaults are the quantity table's (`verify.core.quantities`), each with the drift measured
beside it.
"""
from __future__ import annotations

import dataclasses
import fnmatch
from typing import Mapping

from verify.core.quantities import QUANTITIES


@dataclasses.dataclass(frozen=True)
class Tolerance:
    """`|candidate - reference| <= atol + rtol*|reference|` per element. With a measured noise
    `floor` (see `verify.tools.calibration`) an element may differ by at most `multiple * floor`
    where that is tighter, and a tolerance below the floor fails its row.

    >>> Tolerance(1e-2, 0.0).with_floor(1e-7, 10.0).cap
    1e-06
    """

    atol: float
    """The absolute part of the bound, in the tensor's own units."""
    rtol: float
    """The relative part of the bound: times `|reference|` per element."""
    floor: float | None = dataclasses.field(default=None, repr=False)
    """The measured noise floor (set by the judge from a calibration; a case leaves it None)."""
    multiple: float = dataclasses.field(default=10.0, repr=False)
    """Times the floor an element may differ by, where that is tighter."""

    def __post_init__(self):
        if not (self.atol >= 0 and self.rtol >= 0):
            raise ValueError(f"tolerances must be >= 0, got atol={self.atol}, rtol={self.rtol}")

    @property
    def cap(self) -> float | None:
        return None if self.floor is None else self.multiple * self.floor

    def with_floor(self, floor: float | None, multiple: float) -> "Tolerance":
        """This tolerance, capped at `multiple` times a measured `floor` (None: unchanged)."""
        if floor is None:
            return self
        return dataclasses.replace(self, floor=float(floor), multiple=float(multiple))


# The defaults per quantity, with the drift each was set from: `verify.core.quantities`.
DEFAULTS: dict[str, Tolerance] = {q.name: Tolerance(q.atol, q.rtol) for q in QUANTITIES}


@dataclasses.dataclass(frozen=True)
class Tolerances:
    """Tolerances per quantity, with per-tensor overrides.

    >>> t = Tolerances.default().override(grad=Tolerance(1e-5, 1e-3),
    ...                                   tensors={"embedding/*": Tolerance(1e-5, 1e-2)})
    >>> t.lookup("grad", "dense/kernel").rtol, t.lookup("weight", "embedding/table").rtol
    (0.001, 0.01)
    """

    by_quantity: Mapping[str, Tolerance]
    """Quantity (input, loss, grad, slot, weight, metric) -> its tolerance."""
    by_tensor: Mapping[str, Tolerance] = dataclasses.field(default_factory=dict)
    """Shell pattern on the tensor name or on `quantity:tensor` -> its tolerance; the last
    matching pattern wins over the quantity's."""

    @classmethod
    def default(cls) -> "Tolerances":
        """The suite's defaults per quantity, each set from a measured drift
        (`verify.core.quantities`)."""
        return cls(dict(DEFAULTS))

    def override(self, tensors: Mapping[str, Tolerance] | None = None,
                 **quantities: Tolerance) -> "Tolerances":
        """A copy with these quantities' tolerances (`loss=Tolerance(...)`) and these tensor
        patterns' (`tensors={"embedding/*": Tolerance(...)}`) replaced."""
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
