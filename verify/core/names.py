"""Canonical names: how one implementation's variables map onto the case's names.

A case names every variable once (`embedding/table`, `dense/kernel`) and gives, for each
implementation, the implementation's own variable name plus an optional transform from the
implementation's layout to the canonical one. Transforms are invertible, because the same map
loads the case's initial values into the implementation and reads its values back.
"""
from __future__ import annotations

import dataclasses
from typing import Mapping, Protocol

import numpy as np

from verify.core.trace import SparseRows, TouchedRows


def native_name(variable) -> str:
    """A variable's name as its implementation knows it: a TF variable's name without the
    output index (`dense/kernel:0` -> `dense/kernel`); a Keras 3 variable's path
    (`sequential/dense/kernel`: its `name` is only `kernel`)."""
    path = getattr(variable, "path", None)
    if isinstance(path, str) and path:
        return path
    return variable.name.split(":")[0]


class Transform(Protocol):
    def to_canonical(self, value: np.ndarray) -> np.ndarray: ...

    def to_native(self, value: np.ndarray) -> np.ndarray: ...


@dataclasses.dataclass(frozen=True)
class Identity:
    def to_canonical(self, value):
        return value

    def to_native(self, value):
        return value


@dataclasses.dataclass(frozen=True)
class PermuteRows:
    """Canonical row i is native row `order[i]`.

    The seed's TF1 model concatenates `[embedding(5), dense(2)]` and its TF2 rewrite
    `[dense(2), embedding(5)]`, so the TF2 Dense kernel maps with
    `PermuteRows((2, 3, 4, 5, 6, 0, 1))`:

    >>> p = PermuteRows((2, 0, 1))
    >>> p.to_canonical(np.array([10, 11, 12])).tolist(), p.to_native(np.array([12, 10, 11])).tolist()
    ([12, 10, 11], [10, 11, 12])
    """

    order: tuple[int, ...]

    def __post_init__(self):
        if sorted(self.order) != list(range(len(self.order))):
            raise ValueError(f"PermuteRows needs a permutation of 0..{len(self.order) - 1}, "
                             f"got {self.order}")

    def to_canonical(self, value):
        self._check(value)
        return np.asarray(value)[list(self.order)]

    def to_native(self, value):
        self._check(value)
        return np.asarray(value)[np.argsort(self.order)]

    def _check(self, value):
        if np.ndim(value) == 0 or np.shape(value)[0] != len(self.order):
            raise ValueError(f"PermuteRows of {len(self.order)} rows applied to a tensor of shape "
                             f"{np.shape(value)}; fix the order in the case's name map")

    @classmethod
    def swap_blocks(cls, first: int, second: int) -> "PermuteRows":
        """Rows of a kernel fed by `concat([a, b])` seen as fed by `concat([b, a])`.

        >>> PermuteRows.swap_blocks(2, 3).order
        (2, 3, 4, 0, 1)
        """
        return cls(tuple(range(first, first + second)) + tuple(range(first)))


@dataclasses.dataclass(frozen=True)
class Transpose:
    def to_canonical(self, value):
        return np.transpose(value)

    def to_native(self, value):
        return np.transpose(value)


@dataclasses.dataclass(frozen=True)
class Reshape:
    canonical_shape: tuple[int, ...]
    native_shape: tuple[int, ...]

    def to_canonical(self, value):
        return np.reshape(value, self.canonical_shape)

    def to_native(self, value):
        return np.reshape(value, self.native_shape)


@dataclasses.dataclass(frozen=True)
class Mapped:
    """One implementation's name for a canonical variable, and the layout transform: a
    `NameMap` entry where a rename is not enough.

    >>> Mapped("dense/kernel", PermuteRows.swap_blocks(3, 8)).native
    'dense/kernel'
    """

    native: str
    """The variable's name in that implementation (as `python -m verify names` lists it)."""
    transform: Transform = Identity()
    """From the native layout to the canonical one: `PermuteRows`, `Transpose`, `Reshape`."""


def as_mapped(entry: str | Mapped) -> Mapped:
    return entry if isinstance(entry, Mapped) else Mapped(entry)


class NameMapError(ValueError):
    """The name map and the implementation's variables do not match."""


@dataclasses.dataclass(frozen=True)
class NameMap:
    """Canonical name -> the implementation's variable (and transform).

    >>> m = NameMap({"dense/kernel": Mapped("dense/kernel", PermuteRows((1, 0))), "dense/bias": "dense/bias"})
    >>> m.to_native({"dense/kernel": np.array([[1.], [2.]]), "dense/bias": np.zeros(1)})["dense/kernel"].ravel().tolist()
    [2.0, 1.0]
    """

    entries: Mapping[str, str | Mapped]

    def __post_init__(self):
        natives = [as_mapped(e).native for e in self.entries.values()]
        duplicated = sorted({n for n in natives if natives.count(n) > 1})
        if duplicated:
            raise NameMapError(f"name map sends several canonical names to {duplicated}")
        object.__setattr__(self, "_by_native", {as_mapped(e).native: (c, as_mapped(e).transform)
                                                for c, e in self.entries.items()})

    def native(self, canonical: str) -> Mapped:
        return as_mapped(self.entries[canonical])

    def to_native(self, canonical_values: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        missing = sorted(set(self.entries) - set(canonical_values))
        if missing:
            raise NameMapError(f"the case gives no initial value for {missing}")
        out = {}
        for name, value in canonical_values.items():
            if name in self.entries:
                m = self.native(name)
                out[m.native] = np.asarray(m.transform.to_native(np.asarray(value)))
        return out

    def check_against(self, native_shapes: Mapping[str, tuple], canonical_shapes: Mapping[str, tuple],
                      implementation: str) -> None:
        """Raise a `NameMapError` listing every unmatched name on each side and every wrong shape."""
        by_native = {self.native(c).native: c for c in self.entries}
        unknown = sorted(set(by_native) - set(native_shapes))
        unmapped = sorted(set(native_shapes) - set(by_native))
        problems = []
        if unknown:
            problems.append(f"  mapped but not variables of {implementation}: {unknown}")
        if unmapped:
            problems.append(f"  variables of {implementation} that no canonical name maps to: "
                            f"{unmapped}")
        for native, canonical in sorted(by_native.items()):
            if native in native_shapes and canonical in canonical_shapes:
                try:
                    got = np.shape(self.native(canonical).transform.to_canonical(
                        np.zeros(native_shapes[native])))
                except ValueError as e:
                    problems.append(f"  {canonical!r} <- {native!r}: {e}")
                    continue
                if tuple(got) != tuple(canonical_shapes[canonical]):
                    problems.append(f"  {canonical!r} <- {native!r}: shape {tuple(got)} after the "
                                    f"transform, the case's initial value has "
                                    f"{tuple(canonical_shapes[canonical])}")
        if problems:
            raise NameMapError(
                f"name map of {implementation} does not fit its model:\n" + "\n".join(problems)
                + f"\n  the model's variables are: "
                  f"{ {n: tuple(s) for n, s in sorted(native_shapes.items())} }")

    def canonical_of(self, native: str) -> tuple[str, Transform] | None:
        return self._by_native.get(native)

    def value_to_canonical(self, transform: Transform, value):
        if isinstance(value, TouchedRows):
            if not isinstance(transform, Identity):
                raise NameMapError(f"a table captured by its touched rows cannot be mapped "
                                   f"through {transform!r}: capture it whole")
            return value
        if isinstance(value, SparseRows):
            if isinstance(transform, Identity):
                return value
            value = value.to_dense()
        return np.asarray(transform.to_canonical(np.asarray(value)))
