"""One tensor x one tensor -> a Drift: element-wise comparison within a tolerance, a chunk at
a time (or by the compiled kernel: `compare_engine`), sparse rows on their rows (`sparse_rows`),
equal tensors from one read of each, integers and booleans exactly.

Pure numpy: nothing here imports TensorFlow.
"""
from __future__ import annotations

import numpy as np

from verify.core.inputs import InputFeature
from verify.core.tolerances import Tolerance
from verify.core.trace import SparseRows, as_dense
from verify.judge.compare_engine import (capped_kernel_scan, equal_extremes, kernel_for,
                                         kernel_scan, noise_floor, norms_of_squares,
                                         reference_scale, scan_in_chunks)
from verify.judge.drift import Drift, RunningArgmax, ScanFigures, drift_of_scan, index_text
from verify.judge.inputs import compare_inputs
from verify.judge.sparse_rows import compare_sparse_rows

__all__ = ["Drift", "EXACT_KINDS", "compare_arrays", "compare_exactly", "compare_values"]

# Integers and booleans are equal or not, whatever the tolerance: float64 cannot hold every
# int64 (2**60 and 2**60 + 1 are one float64), and a tolerance on a count or a flag means nothing.
EXACT_KINDS = "iub"


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
    kernel = kernel_for(a.dtype, a.size, tol)
    if kernel is not None:
        if tol.floor is None:
            floor, (scan, squares) = np.nan, kernel_scan(kernel, flat_a, flat_b, tol, np.nan)
        else:   # the floor found in the scan's read
            floor, scan, squares = capped_kernel_scan(kernel, flat_a, flat_b, tol)
        return drift_of_scan(scan, tol, floor, lambda: norms_of_squares(squares), a.shape,
                             a.size)
    floor = (np.nan if tol.floor is None
             else noise_floor(tol, reference_scale(flat_b, wide, None)))
    ref_all, diff_all = np.empty(flat_a.size, wide), np.empty(flat_a.size, np.float64)
    scan = scan_in_chunks(flat_a, flat_b, tol, floor, ref_all, diff_all)
    return drift_of_scan(scan, tol, floor,
                         lambda: (np.linalg.norm(ref_all), np.linalg.norm(diff_all)), a.shape,
                         a.size)


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
    extremes = equal_extremes(flat_a, flat_b)
    if extremes is None:
        return None
    low, high = extremes
    if not (np.isfinite(low) and np.isfinite(high)):
        return None
    scale_max = max(abs(low), abs(high))
    scale_min = np.float64(0.0) if low <= 0.0 <= high else min(abs(low), abs(high))
    floor, own_max = np.nan, None
    if tol.floor is not None:
        floor = noise_floor(tol, scale_max)
        own_max = np.float64(tol.rtol * scale_max) + tol.atol
        below = bool(np.float64(tol.rtol * scale_min) + tol.atol < floor)
        if below:
            return None      # a tolerance below the floor: the full scan names where
    zero = RunningArgmax()
    zero.offer(np.float64(0.0), 0)
    scan = ScanFigures(abs_max=zero, rel_max=zero, tight_max=zero,
                       excess_max=RunningArgmax(), times_max=zero, own_max=own_max)
    scan.excess_max.offer(np.float64(-1.0), 0)    # only its sign is read: within tolerance
    return drift_of_scan(scan, tol, floor, lambda: (np.float64(1.0), np.float64(0.0)), shape,
                         flat_a.size)


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
        return Drift(0.0, 0.0, 0.0, 0.0, index_text(np.unravel_index(0, a.shape), a.shape),
                     True, "", 0.0)
    at = np.argwhere(mismatch)
    # exact differences as Python integers (int64 - int64 can overflow)
    diff = np.abs(a[mismatch].astype(object) - b[mismatch].astype(object))
    scale = np.abs(b[mismatch].astype(object))
    worst = int(np.argmax(diff))
    first, worst_at = index_text(at[0], a.shape), index_text(at[worst], a.shape)
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


def compare_values(candidate, reference, tol: Tolerance) -> Drift:
    """Compare two captured values of any kind (digest string, dense array, sparse rows).

    Sparse rows that are not a slice of their table (`SparseRows.problem`) fail, saying why.

    >>> bad = SparseRows(np.array([-1]), np.ones((1, 2)), (4, 2))
    >>> good = SparseRows(np.array([3]), np.ones((1, 2)), (4, 2))
    >>> compare_values(bad, good, Tolerance(1e-6, 1e-5)).reason
    'Sparse candidate: row ids [-1] are out of range for a table of 4 rows (ids 0 to 3).'
    """
    if isinstance(candidate, InputFeature) and isinstance(reference, InputFeature):
        difference = compare_inputs(candidate, reference)
        return Drift(0.0, 0.0, 0.0, 0.0, "", True, "", 0.0) if not difference else \
            Drift(reason=f"Input differs. {difference}")
    if isinstance(candidate, InputFeature) or isinstance(reference, InputFeature):
        return Drift(reason="Input not comparable: one trace holds the whole-batch digest "
                            "older versions wrote, the other the per-example form; write the "
                            "older trace again.")
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
            return compare_sparse_rows(candidate, reference, tol)
    return compare_arrays(as_dense(candidate), as_dense(reference), tol)
