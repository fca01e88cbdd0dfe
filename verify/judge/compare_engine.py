"""The element-wise scan of two flat arrays into `ScanFigures`, by one of two engines: numpy a
chunk at a time (`scan_in_chunks`), or the compiled kernel (`scan_kernel`, numba) for large real
float arrays when numba is installed (`kernel_for`, `kernel_scan`; under a noise-floor cap
`capped_kernel_scan`, which finds the floor in the scan's own read, `scan_deferred`); the
reference's largest magnitude the noise floor starts from (`reference_scale`, `noise_floor`);
and the equality of two arrays with the reference's extremes (`equal_extremes`, compiled in
`equal_kernel`).

The only importer of `scan_kernel` and `equal_kernel`: without numba every array takes the
numpy path (said once, by a warning). Pure numpy otherwise: nothing here imports TensorFlow.
"""
from __future__ import annotations

import warnings

import numpy as np

from verify.core.tolerances import Tolerance
from verify.judge import kernel_warmup
from verify.judge.kernel_cache import readonly
from verify.judge.drift import ScanFigures

# Elements per chunk: a chunk's float64 temporaries (a few times 1 MiB) stay in cache.
CHUNK = 1 << 17
# Real float32/float64 arrays (and sparse tables) of more elements than this take the compiled
# kernel (`scan_kernel`, numba) when numba is installed: every figure as the numpy path gives
# it except rel_l2, whose sums of squares it adds in its own order (relative error <= 1.2e-13,
# `scan_kernel.SUM_BLOCK`), not np.linalg.norm's (whose own figure moves with BLAS's thread
# count: 4.9e-15 apart on one 100K vector between 1 and 2 OpenBLAS threads). Measured per
# comparison, numpy path against kernel: 0.2 against 0.1 ms at 100 elements, 0.8 against 0.4
# ms at 10K, 7 to 11 against 0.3 ms at 100K. Up to here the numpy path's figures stay exactly
# np.linalg.norm's, for the many tiny tensors (biases, scalars) where its cost is small.
KERNEL_ABOVE = 1 << 12
KERNEL_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
_kernel = None   # not looked for yet; False: numba missing


def compiled_scan():
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
    return "numba" if compiled_scan() else "numpy"


def kernel_for(dtype: np.dtype, size: int, tol: Tolerance | None = None):
    """The compiled scan for an array of this dtype and size under `tol` (None: no tolerance
    involved, as for the equality check), or None: the numpy path."""
    if size <= KERNEL_ABOVE or dtype not in KERNEL_DTYPES:
        return None
    if tol is not None and tol.floor is not None and np.isnan(tol.multiple * tol.floor):
        return None
    return compiled_scan()


def kernel_scan(kernel, flat_a: np.ndarray, flat_b: np.ndarray, tol: Tolerance,
                floor: float) -> tuple[ScanFigures, tuple]:
    """`scan_in_chunks` by the compiled kernel, and the sums of squares of the reference and
    |diff|."""
    if flat_a.size == 0:
        return ScanFigures(), (0.0, 0.0)
    capped = tol.floor is not None
    kernel_warmup.ready("scan", flat_a.dtype, capped)
    figures = kernel(readonly(flat_a), readonly(flat_b), float(tol.rtol), float(tol.atol),
                     capped, float(tol.multiple * floor) if capped else np.inf,
                     float(floor) if capped else np.nan)
    return _scan_figures(figures, flat_a, flat_b, capped)


def capped_kernel_scan(kernel, flat_a: np.ndarray, flat_b: np.ndarray,
                       tol: Tolerance) -> tuple[float, ScanFigures, tuple]:
    """(the noise floor, the scan, the sums of squares) of a capped tolerance by the compiled
    kernel: the floor found in the scan's own read of the arrays (`scan_deferred`) where every
    |x-y| is finite and the scan screens blocks under this tolerance (`scan_screen.screens`),
    else by a read of the reference first (`reference_scale`) or, where the cap comes out
    negative, the floor found here and the scan element by element; the same figures every
    way."""
    rtol, atol = float(tol.rtol), float(tol.atol)
    if flat_a.size and kernel is compiled_scan():
        from verify.judge.scan_deferred import block_summaries, scan_summarized
        from verify.judge.scan_screen import screens

        kernel_warmup.ready("scan", flat_a.dtype, True)
        a, b = readonly(flat_a), readonly(flat_b)
        if screens(rtol, atol, np.inf):
            finite, top, *summaries = block_summaries(a, b, rtol, atol, np.inf, 0.0)
            if finite:   # every element finite: max |reference| is the largest block's
                floor = noise_floor(tol, np.array([top], np.int64).view(np.float64)[0])
                cap = float(tol.multiple * floor)
                if not screens(rtol, atol, cap):   # the scan screens no block: as the scan
                    return (floor, *kernel_scan(kernel, flat_a, flat_b, tol, floor))
                figures = scan_summarized(a, b, rtol, atol, cap, float(floor), *summaries)
                return (floor, *_scan_figures(figures, flat_a, flat_b, True))
    floor = noise_floor(tol, reference_scale(flat_b, np.float64, kernel))
    return (floor, *kernel_scan(kernel, flat_a, flat_b, tol, floor))


def _scan_figures(figures: tuple, flat_a: np.ndarray, flat_b: np.ndarray,
                  capped: bool) -> tuple[ScanFigures, tuple]:
    """The kernel's returned tuple (`scan_kernel.FIELDS`) as ScanFigures and the sums of
    squares."""
    scan = ScanFigures()
    (nonfinite, first_bad, abs_v, abs_i, rel_v, rel_i, tight_v, tight_i, excess_v, excess_i,
     times_v, times_i, own_max, below_floor, bad, squares_b, squares_d) = figures
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


# Elements per slice of the numpy equality check: its boolean temporary stays small.
EQUAL_CHUNK = 1 << 20


def equal_extremes(flat_a: np.ndarray, flat_b: np.ndarray) -> tuple | None:
    """(min, max) of flat_b as float64 when flat_a == flat_b everywhere (`np.array_equal`),
    else None: by one compiled read of each (`equal_kernel`) for arrays the kernel takes, else
    by numpy a slice at a time.

    >>> equal_extremes(np.array([3.0, -1.0]), np.array([3.0, -1.0]))
    (-1.0, 3.0)
    """
    if kernel_for(flat_a.dtype, flat_a.size) is not None:
        from verify.judge.equal_kernel import equal_extremes as compiled_extremes

        kernel_warmup.ready("equal", flat_a.dtype)
        return compiled_extremes(flat_a, flat_b)
    for start in range(0, flat_a.size, EQUAL_CHUNK):
        if not np.array_equal(flat_a[start:start + EQUAL_CHUNK],
                              flat_b[start:start + EQUAL_CHUNK]):
            return None
    return np.float64(flat_b.min()), np.float64(flat_b.max())


def norms_of_squares(squares: tuple) -> tuple:
    return tuple(np.sqrt(np.float64(s)) for s in squares)


def _scale_max(flat_b: np.ndarray, wide) -> np.float64:
    """max |reference| over the elements, a chunk at a time, as the whole array gives it."""
    return max(np.abs(flat_b[s:s + CHUNK].astype(wide)).max()
               for s in range(0, flat_b.size, CHUNK))


def reference_scale(flat_b: np.ndarray, wide, kernel) -> np.float64:
    """max |reference|: in one compiled pass where the kernel compares, else by chunks."""
    if kernel is not None:
        from verify.judge.scan_deferred import abs_max

        kernel_warmup.ready("abs_max", flat_b.dtype)
        return abs_max(flat_b)
    return _scale_max(flat_b, wide)


def noise_floor(tol: Tolerance, scale_max) -> float:
    """The tolerance's noise floor for a reference whose largest magnitude is `scale_max`."""
    # never below one float32 ulp of the reference's largest element (values beyond float32's
    # range, only possible in float64 traces, have no float32 spacing: np.spacing gives NaN
    # there, and the floor is then the tolerance's own)
    with np.errstate(over="ignore"):
        return max(tol.floor, float(np.spacing(np.float32(scale_max))))


def scan_in_chunks(flat_a: np.ndarray, flat_b: np.ndarray, tol: Tolerance, floor: float,
                   ref_out: np.ndarray, diff_out: np.ndarray) -> ScanFigures:
    """Compare two flat arrays a chunk at a time in float64 (complex128), element for element
    as the whole-array rules do; the cast reference and |diff| land in ref_out and diff_out
    (for the norms). After a non-finite element only non-finite elements are counted."""
    wide = ref_out.dtype
    cap = None if tol.floor is None else tol.multiple * floor
    scan = ScanFigures()
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
