"""A Drift (one drift row's numbers) and the figures a comparison gathers to make one: running
maxima with np.argmax's first occurrence, the count of elements beyond the tolerance, the first
non-finite element; `drift_of_scan` turns them into the Drift and its reason.

Pure numpy: nothing here imports TensorFlow.
"""
from __future__ import annotations

import dataclasses
from typing import Iterable

import numpy as np

from verify.core.tolerances import Tolerance


@dataclasses.dataclass(frozen=True)
class Drift:
    """How far one candidate tensor is from its reference: one drift row's numbers."""

    max_abs: float = np.nan
    max_rel: float = np.nan
    rel_l2: float = np.nan
    tightest_rtol: float = np.nan
    worst_index: str = ""
    passed: bool = False
    reason: str = ""
    # max |a-b| / (atol + rtol*|b|) over the elements: > 1 fails; NaN for structural failures
    times_tolerance: float = np.nan
    # the measured noise floor of this tensor at this step (NaN: not calibrated), and how many
    # times it the case's own tolerance allows at most
    floor: float = np.nan
    looseness: float = np.nan


class RunningArgmax:
    """A running np.argmax/np.max over elements offered in any order: the largest wins, the
    lowest index among equals, and the first NaN beats everything (as np.argmax does)."""

    __slots__ = ("value", "index")

    def __init__(self):
        self.value, self.index = None, 0

    def offer(self, value, index: int):
        if self.value is None or (not np.isnan(self.value) and (
                np.isnan(value) or value > self.value
                or (value == self.value and index < self.index))):
            self.value, self.index = value, index

    def update(self, chunk: np.ndarray, offset: int):
        i = int(np.argmax(chunk))
        self.offer(chunk[i], offset + i)


@dataclasses.dataclass
class ScanFigures:
    """The figures a Drift needs, gathered over the elements scanned so far (flat indices)."""

    abs_max: RunningArgmax = dataclasses.field(default_factory=RunningArgmax)
    rel_max: RunningArgmax = dataclasses.field(default_factory=RunningArgmax)
    tight_max: RunningArgmax = dataclasses.field(default_factory=RunningArgmax)
    excess_max: RunningArgmax = dataclasses.field(default_factory=RunningArgmax)
    times_max: RunningArgmax = dataclasses.field(default_factory=RunningArgmax)
    own_max: object = None
    below_floor: bool = False
    bad: int = 0
    nonfinite: int = 0
    first_bad: tuple | None = None

    def maxima(self) -> tuple[RunningArgmax, ...]:
        return self.abs_max, self.rel_max, self.tight_max, self.excess_max, self.times_max


def drift_of_scan(scan: ScanFigures, tol: Tolerance, floor: float, norms, shape: tuple,
                  size: int) -> Drift:
    """The Drift of a scan whose indices are flat indices of an array of `shape`; `norms()`
    gives the L2 norms of the reference and of |diff| over the whole array."""
    if scan.nonfinite:
        at, cand, ref = scan.first_bad
        where = index_text(np.unravel_index(at, shape), shape)
        return Drift(np.nan, np.nan, np.nan, np.nan, where, False,
                     f"Non-finite values: {scan.nonfinite} / {size} elements are NaN or Inf "
                     f"(first at index {where}: candidate {cand}, reference {ref}).")
    with np.errstate(over="ignore", invalid="ignore"):   # inf / inf: NaN, as it should
        looseness = np.nan if tol.floor is None else float(scan.own_max / floor)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        norm_b, norm_d = norms()
        rel_l2 = norm_d / norm_b if norm_b > 0 else (0.0 if norm_d == 0 else np.inf)
    # every excess <= 0: the largest is (a NaN, from inf - inf, is the largest)
    passed = bool(scan.excess_max.value <= 0) and not scan.below_floor
    worst = np.unravel_index(scan.abs_max.index if passed else scan.excess_max.index, shape)
    max_abs, max_rel = float(scan.abs_max.value), float(scan.rel_max.value)
    reason = ""
    if scan.below_floor:
        reason = (f"The case's tolerance (atol {tol.atol:.3g}, rtol {tol.rtol:.3g}) is below the "
                  f"noise floor {floor:.3g} measured for this tensor at this step: it cannot tell "
                  f"a mistake from float noise. Raise it, or re-calibrate.")
    elif not passed:
        bad = scan.bad
        abs_at = np.unravel_index(scan.abs_max.index, shape)
        rel_at = np.unravel_index(scan.rel_max.index, shape)
        reason = (f"Mismatched elements: {bad} / {size} ({100.0 * bad / size:.1f}%). "
                  f"Greatest absolute difference: {max_abs:.3g} at index "
                  f"{index_text(abs_at, shape)} (up to {_allowed(tol, floor)} allowed). "
                  f"Greatest relative difference: {float(scan.rel_max.value):.3g} at index "
                  f"{index_text(rel_at, shape)} (up to {tol.rtol:.3g} allowed).")
    return Drift(max_abs, max_rel, float(rel_l2), float(scan.tight_max.value),
                 index_text(worst, shape), passed, reason, float(scan.times_max.value), floor,
                 looseness)


def _allowed(tol: Tolerance, floor: float) -> str:
    if tol.floor is None:
        return f"{tol.atol:.3g}"
    return (f"{tol.atol:.3g}, capped at {tol.multiple:g}x the noise floor "
            f"{floor:.3g} = {tol.multiple * floor:.3g}")


def index_text(index: Iterable, shape: tuple) -> str:
    """An element's index as a drift row gives it: '(1, 0)'; '()' for a scalar.

    >>> index_text((1, 0), (4, 2)), index_text((), ())
    ('(1, 0)', '()')
    """
    return str(tuple(int(i) for i in index)) if shape else "()"
