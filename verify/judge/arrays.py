"""One tensor x one tensor -> a Drift: element-wise comparison within a tolerance, a chunk at
a time (or by the compiled kernel, `scan_kernel`), sparse rows on their rows, equal tensors from
one read of each, integers and booleans exactly.

Pure numpy: nothing here imports TensorFlow.
"""
from __future__ import annotations

import dataclasses
import warnings
from typing import Iterable

import numpy as np

from verify.core.tolerances import Tolerance
from verify.core.trace import SparseRows, as_dense

# Integers and booleans are equal or not, whatever the tolerance: float64 cannot hold every
# int64 (2**60 and 2**60 + 1 are one float64), and a tolerance on a count or a flag means nothing.
EXACT_KINDS = "iub"
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


def compare_arrays(candidate: np.ndarray, reference: np.ndarray, tol: Tolerance) -> Drift:
    """Compare two dense arrays element-wise; a failure says how, like `torch.testing`.

    Floats pass within the tolerance; complex values likewise, by the modulus of the complex
    difference; integers and booleans only when equal (`compare_exactly`).

    >>> d = compare_arrays(np.array([1.0, 2.5]), np.array([1.0, 2.0]), Tolerance(0, 1e-3))
    >>> d.passed, d.max_abs, d.worst_index
    (False, 0.5, '(1,)')
    >>> d.reason
    'Mismatched elements: 1 / 2 (50.0%). Greatest absolute difference: 0.5 at index (1,) (up to 0 allowed). Greatest relative difference: 0.25 at index (1,) (up to 0.001 allowed).'
    """
    a, b = np.asarray(candidate), np.asarray(reference)
    if a.shape != b.shape:
        return Drift(reason=f"Shape mismatch: candidate {a.shape}, reference {b.shape}.")
    if a.dtype != b.dtype:
        return Drift(reason=f"Dtype mismatch: candidate {a.dtype}, reference {b.dtype}.")
    if a.size == 0:
        return Drift(0.0, 0.0, 0.0, 0.0, "", True, "", 0.0)
    if a.dtype.kind in EXACT_KINDS:
        return compare_exactly(a, b)
    return _compare_in_chunks(a, b, tol)


# Elements per chunk: a chunk's float64 temporaries (a few times 1 MiB) stay in cache.
CHUNK = 1 << 17
# Real float32/float64 arrays (and sparse tables) of more elements than this take the compiled
# kernel (`scan_kernel`, numba) when numba is installed: every figure as the numpy path gives
# it except rel_l2, whose sums of squares it adds in its own order (relative error <= 1.2e-13,
# `scan_kernel.SUM_BLOCK`), not np.linalg.norm's. Up to here the numpy path costs about 1 ms
# and its two full-length norm vectors 2 MiB, so every smaller tensor's figures stay exactly
# np.linalg.norm's.
KERNEL_ABOVE = 1 << 17
_KERNEL_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
_kernel = None   # not looked for yet; False: numba missing


def _scan_kernel():
    """The compiled scan, or None without numba (said once, by a warning)."""
    global _kernel
    if _kernel is None:
        try:
            from verify.judge.scan_kernel import scan
            _kernel = scan
        except ImportError as error:
            warnings.warn(f"numba is not importable ({error}): tensors of more than "
                          f"{KERNEL_ABOVE} elements are compared on the numpy path, about 10x "
                          f"slower with two full-length float64 vectors (pip install numba)",
                          RuntimeWarning, stacklevel=3)
            _kernel = False
    return _kernel or None


def comparison_engine() -> str:
    """Which path compares large real float tensors: "numba" (the compiled kernel) or "numpy".

    >>> comparison_engine() in ("numba", "numpy")
    True
    """
    return "numba" if _scan_kernel() else "numpy"


def _kernel_for(dtype: np.dtype, size: int, tol: Tolerance):
    if size <= KERNEL_ABOVE or dtype not in _KERNEL_DTYPES:
        return None
    if tol.floor is not None and np.isnan(tol.multiple * tol.floor):
        return None
    return _scan_kernel()


def _kernel_scan(kernel, flat_a: np.ndarray, flat_b: np.ndarray, tol: Tolerance,
                 floor: float) -> tuple["_Scan", tuple]:
    """`_scan` by the compiled kernel, and the sums of squares of the reference and |diff|."""
    scan = _Scan()
    if flat_a.size == 0:
        return scan, (0.0, 0.0)
    capped = tol.floor is not None
    (nonfinite, first_bad, abs_v, abs_i, rel_v, rel_i, tight_v, tight_i, excess_v, excess_i,
     times_v, times_i, own_max, below_floor, bad, squares_b, squares_d) = kernel(
        flat_a, flat_b, float(tol.rtol), float(tol.atol), capped,
        float(tol.multiple * floor) if capped else np.inf, float(floor) if capped else np.nan)
    for running, value, index in ((scan.abs_max, abs_v, abs_i), (scan.rel_max, rel_v, rel_i),
                                  (scan.tight_max, tight_v, tight_i),
                                  (scan.excess_max, excess_v, excess_i),
                                  (scan.times_max, times_v, times_i)):
        running.value, running.index = np.float64(value), int(index)
    if capped:
        scan.own_max = np.float64(own_max)
    scan.below_floor, scan.bad, scan.nonfinite = bool(below_floor), int(bad), int(nonfinite)
    if nonfinite:
        scan.first_bad = (int(first_bad), np.float64(flat_a[first_bad]),
                          np.float64(flat_b[first_bad]))
    return scan, (squares_b, squares_d)


def _norms_of_squares(squares: tuple) -> tuple:
    return tuple(np.sqrt(np.float64(s)) for s in squares)


class _Argmax:
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
class _Scan:
    """The figures a Drift needs, gathered over the elements scanned so far (flat indices)."""

    abs_max: _Argmax = dataclasses.field(default_factory=_Argmax)
    rel_max: _Argmax = dataclasses.field(default_factory=_Argmax)
    tight_max: _Argmax = dataclasses.field(default_factory=_Argmax)
    excess_max: _Argmax = dataclasses.field(default_factory=_Argmax)
    times_max: _Argmax = dataclasses.field(default_factory=_Argmax)
    own_max: object = None
    below_floor: bool = False
    bad: int = 0
    nonfinite: int = 0
    first_bad: tuple | None = None

    def maxima(self) -> tuple[_Argmax, ...]:
        return self.abs_max, self.rel_max, self.tight_max, self.excess_max, self.times_max


def _scale_max(flat_b: np.ndarray, wide) -> np.float64:
    """max |reference| over the elements, a chunk at a time, as the whole array gives it."""
    return max(np.abs(flat_b[s:s + CHUNK].astype(wide)).max()
               for s in range(0, flat_b.size, CHUNK))


def _reference_scale(flat_b: np.ndarray, wide, kernel) -> np.float64:
    """max |reference|: in one compiled pass where the kernel compares, else by chunks."""
    if kernel is not None:
        from verify.judge.scan_kernel import abs_max

        return abs_max(flat_b)
    return _scale_max(flat_b, wide)


def _floor(tol: Tolerance, scale_max) -> float:
    # never below one float32 ulp of the reference's largest element (values beyond float32's
    # range, only possible in float64 traces, give an infinite spacing: said by the numbers)
    with np.errstate(over="ignore"):
        return max(tol.floor, float(np.spacing(np.float32(scale_max))))


def _scan(flat_a: np.ndarray, flat_b: np.ndarray, tol: Tolerance, floor: float,
          ref_out: np.ndarray, diff_out: np.ndarray) -> _Scan:
    """Compare two flat arrays a chunk at a time in float64 (complex128), element for element
    as the whole-array rules do; the cast reference and |diff| land in ref_out and diff_out
    (for the norms). After a non-finite element only non-finite elements are counted."""
    wide = ref_out.dtype
    cap = None if tol.floor is None else tol.multiple * floor
    scan = _Scan()
    for start in range(0, flat_a.size, CHUNK):
        stop = min(start + CHUNK, flat_a.size)
        a64 = flat_a[start:stop].astype(wide)
        b64 = ref_out[start:stop]
        b64[...] = flat_b[start:stop]
        diff = diff_out[start:stop]
        with np.errstate(all="ignore"):
            np.abs(a64 - b64, out=diff)
        i = int(np.argmax(diff))
        if not np.isfinite(diff[i]) or scan.nonfinite:
            nonfinite = ~(np.isfinite(a64) & np.isfinite(b64))
            count = int(nonfinite.sum())
            if count and scan.first_bad is None:
                i = int(np.argmax(nonfinite))
                scan.first_bad = (start + i, a64[i], b64[i])
            scan.nonfinite += count
        if scan.nonfinite:
            continue
        scan.abs_max.update(diff, start)
        scale = np.abs(b64)
        with np.errstate(all="ignore"):
            allowed = tol.rtol * scale
            allowed += tol.atol
            if cap is not None:
                own = allowed
                m = own.max()
                scan.own_max = m if scan.own_max is None else max(scan.own_max, m)
                scan.below_floor = scan.below_floor or bool(own.min() < floor)
                allowed = np.minimum(own, cap)
            # x / 0 is inf for x > 0 as the rules want; 0 / 0 (NaN) is the one case to redo
            rel = diff / scale
            tight = np.maximum(diff - tol.atol, 0.0)
            tight /= scale
            excess = diff - allowed
            times = diff / allowed
            for running, values, exact in (
                    (scan.rel_max, rel, lambda: np.where(scale > 0, diff / scale,
                                                         np.where(diff > 0, np.inf, 0.0))),
                    (scan.tight_max, tight, lambda: np.where(
                        scale > 0, np.maximum(diff - tol.atol, 0.0) / scale,
                        np.where(diff > tol.atol, np.inf, 0.0))),
                    (scan.times_max, times, lambda: np.where(allowed > 0, diff / allowed,
                                                             np.where(diff > 0, np.inf, 0.0)))):
                j = int(np.argmax(values))
                running.update(exact() if np.isnan(values[j]) else values, start)
        scan.excess_max.update(excess, start)
        if not excess.max() <= 0:
            scan.bad += int((excess > 0).sum())
    return scan


def _compare_in_chunks(a: np.ndarray, b: np.ndarray, tol: Tolerance) -> Drift:
    """`compare_arrays` for floats and complex values, a chunk at a time in float64 (complex128).

    Every figure is the one the whole-array computation gives: element-wise values are the
    same float64 operations, maxima keep np.argmax's first occurrence, and the norms for rel_l2
    are taken over full-length float64 vectors, as np.linalg.norm sums in its own order. Real
    arrays of more than KERNEL_ABOVE elements take the compiled kernel when numba is there:
    the same figures, rel_l2 from its own sums of squares (no full-length vectors).
    """
    wide = np.complex128 if a.dtype.kind == "c" else np.float64
    flat_a, flat_b = a.reshape(-1), b.reshape(-1)
    if a.dtype.kind == "f":
        equal = _bitwise_equal_drift(flat_a, flat_b, tol, a.shape)
        if equal is not None:
            return equal
    kernel = _kernel_for(a.dtype, a.size, tol)
    floor = np.nan if tol.floor is None else _floor(tol, _reference_scale(flat_b, wide, kernel))
    if kernel is not None:
        scan, squares = _kernel_scan(kernel, flat_a, flat_b, tol, floor)
        return _finish(scan, tol, floor, lambda: _norms_of_squares(squares), a.shape, a.size)
    ref_all, diff_all = np.empty(flat_a.size, wide), np.empty(flat_a.size, np.float64)
    scan = _scan(flat_a, flat_b, tol, floor, ref_all, diff_all)
    return _finish(scan, tol, floor,
                   lambda: (np.linalg.norm(ref_all), np.linalg.norm(diff_all)), a.shape, a.size)


def _bitwise_equal_drift(flat_a: np.ndarray, flat_b: np.ndarray, tol: Tolerance,
                         shape: tuple) -> Drift | None:
    """The Drift of two equal, finite real arrays from one read of each (many faithful pairs
    train bitwise the same numbers), with every figure the full scan gives them: no difference
    anywhere, the worst index the first element, and the floor figures from the reference's
    extremes (max |b| and min |b|; max and min commute with the monotone rtol*|b| + atol).
    None when the arrays differ anywhere, hold a NaN or an infinity, or the tolerance is below
    the floor somewhere: the full scan says how and where.

    >>> _bitwise_equal_drift(np.ones(3), np.ones(3), Tolerance(0, 1e-3), (3,)).passed
    True
    >>> _bitwise_equal_drift(np.ones(3), np.array([1.0, 1.0, 2.0]), Tolerance(0, 1e-3), (3,))
    """
    for start in range(0, flat_a.size, EQUAL_CHUNK):
        if not np.array_equal(flat_a[start:start + EQUAL_CHUNK],
                              flat_b[start:start + EQUAL_CHUNK]):
            return None
    low, high = np.float64(flat_b.min()), np.float64(flat_b.max())
    if not (np.isfinite(low) and np.isfinite(high)):
        return None
    scale_max = max(abs(low), abs(high))
    scale_min = np.float64(0.0) if low <= 0.0 <= high else min(abs(low), abs(high))
    floor, own_max = np.nan, None
    if tol.floor is not None:
        floor = _floor(tol, scale_max)
        own_max = np.float64(tol.rtol * scale_max) + tol.atol
        below = bool(np.float64(tol.rtol * scale_min) + tol.atol < floor)
        if below:
            return None      # a tolerance below the floor: the full scan names where
    zero = _Argmax()
    zero.offer(np.float64(0.0), 0)
    scan = _Scan(abs_max=zero, rel_max=zero, tight_max=zero, excess_max=_Argmax(),
                 times_max=zero, own_max=own_max)
    scan.excess_max.offer(np.float64(-1.0), 0)    # only its sign is read: within tolerance
    return _finish(scan, tol, floor, lambda: (np.float64(1.0), np.float64(0.0)), shape,
                   flat_a.size)


# Elements per slice of the equality check: its boolean temporary stays small.
EQUAL_CHUNK = 1 << 20


def _finish(scan: _Scan, tol: Tolerance, floor: float, norms, shape: tuple,
            size: int) -> Drift:
    """The Drift of a scan whose indices are flat indices of an array of `shape`; `norms()`
    gives the L2 norms of the reference and of |diff| over the whole array."""
    if scan.nonfinite:
        at, cand, ref = scan.first_bad
        where = _index(np.unravel_index(at, shape), shape)
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
                  f"Greatest absolute difference: {max_abs:.3g} at index {_index(abs_at, shape)}"
                  f" (up to {_allowed(tol, floor)} allowed). "
                  f"Greatest relative difference: {float(scan.rel_max.value):.3g} at index "
                  f"{_index(rel_at, shape)} (up to {tol.rtol:.3g} allowed).")
    return Drift(max_abs, max_rel, float(rel_l2), float(scan.tight_max.value),
                 _index(worst, shape), passed, reason, float(scan.times_max.value), floor,
                 looseness)


def _summed_rows(sparse: SparseRows) -> tuple[np.ndarray, np.ndarray]:
    """Sorted distinct ids and their rows summed in the order given, as `to_dense` sums them
    (compiled when numba is there: the same sums, without np.add.at's per-element cost)."""
    rows = np.asarray(sparse.rows)
    if rows.dtype in _KERNEL_DTYPES and len(sparse.ids) and _scan_kernel() is not None:
        from verify.judge.scan_kernel import summed_rows

        ids, summed = summed_rows(sparse.ids, rows.reshape(len(sparse.ids), -1))
        return ids, summed.reshape((len(ids), *sparse.dense_shape[1:]))
    ids, inverse = np.unique(np.asarray(sparse.ids).astype(np.int64), return_inverse=True)
    rows = np.zeros((len(ids), *sparse.dense_shape[1:]), sparse.rows.dtype)
    np.add.at(rows, inverse.reshape(-1), sparse.rows)
    return ids, rows


# A table of up to SLOTS_PER_LOOKUP rows per lookup (both sides' ids) plus SLOTS_ALWAYS rows
# numbers its touched rows with a table-long slot array (`scan_kernel.union_rows`: 4 bytes and
# one scanned slot per table row) instead of sorting each side's ids. Its cost grows with the
# table, the sort's with the lookups: measured with 50K lookups a side of 64 float32, a whole
# comparison takes 13-28 ms by slots against 30-55 ms sorted up to 80 table rows per lookup,
# 63 ms against 32 ms at 160; SLOTS_ALWAYS keeps small gradients of tables up to 1M rows
# (4 MB of slots) on the slots.
SLOTS_PER_LOOKUP = 64
SLOTS_ALWAYS = 1 << 20


def _by_slots(candidate: SparseRows, reference: SparseRows, table_rows: int) -> bool:
    lookups = len(candidate.ids) + len(reference.ids)
    return (candidate.rows.dtype == reference.rows.dtype
            and reference.rows.dtype in _KERNEL_DTYPES and table_rows < 2 ** 31
            and table_rows <= SLOTS_PER_LOOKUP * lookups + SLOTS_ALWAYS
            and _scan_kernel() is not None)


def _rows_on_union(candidate: SparseRows, reference: SparseRows, table_rows: int,
                   width: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The sorted ids either side touched, and each side's rows summed on them as (ids x
    width) arrays, zeros where a side did not touch an id: by a slot per table row (compiled)
    where `_by_slots`, else by sorting each side's ids; bitwise the same arrays."""
    if _by_slots(candidate, reference, table_rows):
        from verify.judge.scan_kernel import union_rows

        return union_rows(candidate.ids, np.asarray(candidate.rows).reshape(-1, width),
                          reference.ids, np.asarray(reference.rows).reshape(-1, width),
                          table_rows)
    cand_ids, cand_rows = _summed_rows(candidate)
    ref_ids, ref_rows = _summed_rows(reference)
    ids = np.union1d(cand_ids, ref_ids)
    dtype = reference.rows.dtype
    a = np.zeros((len(ids), width), dtype)
    b = np.zeros((len(ids), width), dtype)
    a[np.searchsorted(ids, cand_ids)] = cand_rows.reshape(len(cand_ids), width)
    b[np.searchsorted(ids, ref_ids)] = ref_rows.reshape(len(ref_ids), width)
    return ids, a, b


def _compare_sparse(candidate: SparseRows, reference: SparseRows, tol: Tolerance) -> Drift:
    """Two valid sparse gradients of one table (float or complex rows), compared on the rows
    either side touched: the Drift the dense tables give. A row touched on one side only
    compares against zeros; rows neither touched are zeros on both sides, stand in for the
    argmax ties at the first of them, and add nothing to the norms (tables of up to
    KERNEL_ABOVE elements keep np.linalg.norm's figure over full-length vectors)."""
    shape = tuple(reference.dense_shape)
    size = int(np.prod(shape))
    width = size // shape[0]
    ids, a, b = _rows_on_union(candidate, reference, shape[0], width)
    dtype = reference.rows.dtype
    flat_a, flat_b = a.reshape(-1), b.reshape(-1)
    wide = np.complex128 if dtype.kind == "c" else np.float64
    untouched = len(ids) < shape[0]
    floor = np.nan
    kernel = _kernel_for(dtype, size, tol)
    if tol.floor is not None:
        scale_max = _reference_scale(flat_b, wide, kernel) if flat_b.size else None
        if untouched:
            scale_max = np.float64(0.0) if scale_max is None else max(scale_max, np.float64(0.0))
        floor = _floor(tol, scale_max)
    if kernel is not None:
        scan, squares = _kernel_scan(kernel, flat_a, flat_b, tol, floor)
    else:
        ref_part, diff_part = np.empty(flat_a.size, wide), np.empty(flat_a.size, np.float64)
        scan = _scan(flat_a, flat_b, tol, floor, ref_part, diff_part)

    def dense_index(k: int) -> int:
        return int(ids[k // width]) * width + k % width

    if scan.first_bad is not None:
        at, cand, ref = scan.first_bad
        scan.first_bad = (dense_index(at), cand, ref)
    for running in scan.maxima():
        if running.value is not None:
            running.index = dense_index(running.index)
    if untouched and not scan.nonfinite:
        # the first element of the first row neither side touched: 0 against 0
        # (ids are sorted and distinct: the first k with ids[k] != k, else len(ids))
        first = int(np.flatnonzero(np.append(ids != np.arange(len(ids)), True))[0])
        at = first * width
        own = tol.atol + tol.rtol * np.zeros(1)
        allowed = own if tol.floor is None else np.minimum(own, tol.multiple * floor)
        with np.errstate(divide="ignore", invalid="ignore"):
            times = np.where(allowed > 0, 0.0 / allowed, 0.0)
        zero = np.float64(0.0)
        for running, value in ((scan.abs_max, zero), (scan.rel_max, zero),
                               (scan.tight_max, zero), (scan.excess_max, (0.0 - allowed)[0]),
                               (scan.times_max, times[0])):
            running.offer(value, at)
        if tol.floor is not None:
            scan.own_max = own[0] if scan.own_max is None else max(scan.own_max, own[0])
            scan.below_floor = scan.below_floor or bool(own[0] < floor)

    def norms():
        if kernel is not None:
            return _norms_of_squares(squares)
        if size > KERNEL_ABOVE:   # the untouched rows' zeros add nothing
            return np.linalg.norm(ref_part), np.linalg.norm(diff_part)
        # small tables: np.linalg.norm's own figure over the whole table, as densified
        ref_all, diff_all = np.zeros(size, wide), np.zeros(size, np.float64)
        ref_all.reshape(shape[0], width)[ids] = ref_part.reshape(len(ids), width)
        diff_all.reshape(shape[0], width)[ids] = diff_part.reshape(len(ids), width)
        return np.linalg.norm(ref_all), np.linalg.norm(diff_all)

    return _finish(scan, tol, floor, norms, shape, size)


def _allowed(tol: Tolerance, floor: float) -> str:
    if tol.floor is None:
        return f"{tol.atol:.3g}"
    return (f"{tol.atol:.3g}, capped at {tol.multiple:g}x the noise floor "
            f"{floor:.3g} = {tol.multiple * floor:.3g}")


def compare_exactly(candidate: np.ndarray, reference: np.ndarray) -> Drift:
    """Compare two integer or boolean arrays of one shape and dtype exactly: any difference
    fails, saying how many elements differ and where the first is.

    >>> d = compare_exactly(np.array([2**60 + 1, 7]), np.array([2**60, 7]))
    >>> d.passed, d.max_abs, d.worst_index
    (False, 1.0, '(0,)')
    >>> print(d.reason)  # doctest: +NORMALIZE_WHITESPACE
    int64 values differ (compared exactly): 1 / 2 elements (50.0%), first at index (0,):
    candidate 1152921504606846977, reference 1152921504606846976. Greatest absolute
    difference: 1 at index (0,).
    """
    a, b = candidate, reference
    mismatch = np.asarray(a != b)
    if not mismatch.any():
        return Drift(0.0, 0.0, 0.0, 0.0, _index(np.unravel_index(0, a.shape), a.shape), True,
                     "", 0.0)
    at = np.argwhere(mismatch)
    # exact differences as Python integers (int64 - int64 can overflow)
    diff = np.abs(a[mismatch].astype(object) - b[mismatch].astype(object))
    scale = np.abs(b[mismatch].astype(object))
    worst = int(np.argmax(diff))
    first, worst_at = _index(at[0], a.shape), _index(at[worst], a.shape)
    count = len(at)
    rel = [float(d) / float(s) if s else np.inf for d, s in zip(diff, scale)]
    norm_b = float(np.linalg.norm(b.astype(np.float64)))
    norm_d = float(np.linalg.norm(np.asarray(diff, np.float64)))
    reason = (f"{a.dtype} values differ (compared exactly): {count} / {a.size} elements "
              f"({100.0 * count / a.size:.1f}%), first at index {first}: candidate "
              f"{a[tuple(at[0])].item()}, reference {b[tuple(at[0])].item()}. Greatest absolute "
              f"difference: {diff[worst]} at index {worst_at}.")
    return Drift(float(diff[worst]), max(rel), norm_d / norm_b if norm_b > 0 else np.inf,
                 np.nan, worst_at, False, reason, np.nan)


def _index(index: Iterable, shape: tuple) -> str:
    return str(tuple(int(i) for i in index)) if shape else "()"


def compare_values(candidate, reference, tol: Tolerance) -> Drift:
    """Compare two captured values of any kind (digest string, dense array, sparse rows).

    Sparse rows that are not a slice of their table (`SparseRows.problem`) fail, saying why.

    >>> bad = SparseRows(np.array([-1]), np.ones((1, 2)), (4, 2))
    >>> good = SparseRows(np.array([3]), np.ones((1, 2)), (4, 2))
    >>> compare_values(bad, good, Tolerance(1e-6, 1e-5)).reason
    'Sparse candidate: row ids [-1] are out of range for a table of 4 rows (ids 0 to 3).'
    """
    if isinstance(candidate, str) or isinstance(reference, str):
        if candidate == reference:
            return Drift(0.0, 0.0, 0.0, 0.0, "", True, "", 0.0)
        return Drift(reason=f"Input differs: candidate digest {candidate}, reference digest "
                            f"{reference} (different examples, order or batching).")
    for side, value in (("candidate", candidate), ("reference", reference)):
        if isinstance(value, SparseRows) and value.problem():
            return Drift(reason=f"Sparse {side}: {value.problem()}.")
    if isinstance(candidate, SparseRows) and isinstance(reference, SparseRows):
        if tuple(candidate.dense_shape) != tuple(reference.dense_shape):
            return Drift(reason=f"Shape mismatch: candidate {tuple(candidate.dense_shape)}, "
                                f"reference {tuple(reference.dense_shape)}.")
        if (candidate.rows.dtype == reference.rows.dtype and reference.rows.dtype.kind in "fc"
                and np.prod(candidate.dense_shape) > 0):
            return _compare_sparse(candidate, reference, tol)
    return compare_arrays(as_dense(candidate), as_dense(reference), tol)
