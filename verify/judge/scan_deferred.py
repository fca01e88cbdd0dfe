"""The reference's largest magnitude, which a capped comparison's noise floor starts from
(numba): found in the read that screens the blocks, so that the capped scan reads each array
once (`block_summaries`, `scan_summarized`), or by a read of its own (`abs_max`, where that
scan cannot: a NaN or Inf in either array).

A capped comparison allows at most `multiple` x the noise floor, and the floor is the larger of
the tolerance's own and one float32 spacing of max |reference| (`compare_engine.noise_floor`):
taken in order, the floor needs a read of the reference before `scan_kernel.scan` reads both
arrays, three array reads in all. Here `block_summaries` reads both arrays once for what every
block's `scan_screen.block_extremes` gives whatever the cap (the largest |x-y|, the smallest and
largest |y|, the sums of squares, the count of |x-y| beyond rtol*|y| + atol and the largest
within it), and max |reference| is the largest of the blocks' largest |y|. `scan_summarized`
then runs `scan_kernel.scan`'s loop on those summaries: a block its extremes say is quiet, and
whose count of excesses the cap does not move (see there), is settled without another read;
every other block is read again by the scan's own `_screened_block`. The figures are bitwise
those of the scan after a read for the floor. A non-finite |x-y| (a NaN or Inf in either
array) ends the first read early: the caller then takes that two-read path, which has the rules
for them; a cap that comes out negative (a negative floor of the tolerance's own) runs the scan
element by element, with the floor found here.

    >>> import numpy as np
    >>> b = np.linspace(-1.0, 1.0, 3 * SUM_BLOCK)
    >>> finite, top, *summaries = block_summaries(b + 1e-9, b, 1e-6, 1e-5, np.inf, 0.0)
    >>> finite, float(np.int64(top).view(np.float64))    # max |b|, found in the same read
    (True, 1.0)
"""
import numba
import numpy as np

from verify.judge import kernel_cache
from verify.judge.kernel_cache import readonly
from verify.judge.scan_kernel import (SUM_BLOCK, _neumaier, _no_maxima, _screened_block,
                                      scan_result)
from verify.judge.scan_screen import INF_BITS, block_extremes, extremes_quiet, from_bits

kernel_cache.install()   # before the kernels compile: see kernel_cache


@numba.njit(cache=True, error_model="numpy")
def block_summaries(a, b, rtol, atol, cap, floor):
    """(finite, the bits of max |b|, and per block of SUM_BLOCK elements: the bits of its
    largest |x-y|, of its smallest and largest |y| and of its largest |x-y| within its own
    uncapped allowance, its count of |x-y| beyond that allowance, and its sums of y*y and
    |x-y|**2), by `block_extremes`, capped (so the sums are those the capped scan takes) with
    `cap` inf: the count uncapped. `cap` and `floor` are passed, not written here, so that the
    block's loop compiles as it does in the scan. finite is False, and the rest unfinished, at
    the first block with a non-finite |x-y|."""
    n = a.size
    count = (n + SUM_BLOCK - 1) // SUM_BLOCK
    bits = np.empty((4, count), np.int64)       # largest |x-y|, smallest, largest |y|, within
    counts = np.empty(count, np.int64)
    parts = np.empty((2, count), np.float64)    # the sums of y*y and of |x-y|**2
    top = 0
    for k in range(count):
        start = k * SUM_BLOCK
        stop = min(start + SUM_BLOCK, n)
        d_bits, low, high, beyond, squares_b, squares_d, within = block_extremes(
            a, b, start, stop, rtol, atol, cap, floor)
        if not d_bits < INF_BITS:
            return False, top, bits, counts, parts
        bits[0, k], bits[1, k], bits[2, k], bits[3, k] = d_bits, low, high, within
        counts[k], parts[0, k], parts[1, k] = beyond, squares_b, squares_d
        top = max(top, high)
    return True, top, bits, counts, parts


@numba.njit(cache=True, error_model="numpy")
def scan_summarized(a, b, rtol, atol, cap, floor, bits, counts, parts):
    """`scan_kernel.scan(a, b, rtol, atol, True, cap, floor)`, bitwise, from `block_summaries`
    of arrays whose every |x-y| is finite; rtol and atol finite and >= 0, cap >= 0.

    A block is settled from its summary when its extremes say it is quiet under this cap and
    floor (`extremes_quiet`, as the scan first asks) and its largest |x-y| within its own
    allowance is at most the cap: an element counts as an excess when |x-y| > min(own, cap),
    that is when |x-y| > own or own >= |x-y| > cap, and no element is in the second case, so
    the block's count under the cap is its uncapped count. Any other block is read again, by
    the scan's own `_screened_block`."""
    n = a.size
    # True (the floor is never NaN here), as a value numba does not type as a literal:
    # `_screened_block` then compiles as the scan calls it (a literal True compiled two more
    # of its specializations, about 19 s)
    capped = floor == floor
    best, below_floor, bad = _no_maxima(n)
    total_b = total_d = comp_b = comp_d = 0.0
    for k in range(counts.size):
        start = k * SUM_BLOCK
        stop = min(start + SUM_BLOCK, n)
        quiet, low = extremes_quiet(from_bits(bits[0, k]), from_bits(bits[1, k]),
                                    from_bits(bits[2, k]), rtol, atol, cap, floor, best)
        if quiet and from_bits(bits[3, k]) <= cap:   # no maximum changes; the count is known
            below_floor = below_floor or low
            bad += counts[k]
            squares_b, squares_d = parts[0, k], parts[1, k]
        else:
            _, best, below_floor, bad, squares_b, squares_d = _screened_block(
                a, b, start, stop, rtol, atol, capped, cap, floor, best, below_floor, bad)
        total_b, comp_b = _neumaier(total_b, comp_b, squares_b)
        total_d, comp_d = _neumaier(total_d, comp_d, squares_d)
    none = bad - bad   # no non-finite element (int64s, as the scan returns them)
    return scan_result(none, none - 1, best, below_floor, bad, total_b, comp_b, total_d, comp_d)


@numba.njit(cache=True)
def _largest_bits(patterns, mask):
    """max(bits & mask) over an unsigned view of floats: with the sign bit masked off the
    bit patterns order as the magnitudes do (NaNs above +inf), so an integer maximum, which
    vectorizes, gives max |x| exactly."""
    largest = patterns[0] & mask
    for i in range(np.uint64(1), np.uint64(patterns.size)):   # unsigned: no wraparound check
        value = patterns[i] & mask
        largest = value if value > largest else largest
    return largest


def abs_max(values: np.ndarray) -> np.float64:
    """max |values| of a non-empty float32/float64 array as float64, exactly what
    `np.abs(values.astype(np.float64)).max()` gives (NaN when any is NaN), in one pass."""
    flat = np.ascontiguousarray(values).reshape(-1)
    if flat.dtype == np.float32:
        largest = _largest_bits(readonly(flat.view(np.uint32)), np.uint32(0x7FFFFFFF))
        return np.float64(np.array([largest], np.uint32).view(np.float32)[0])
    largest = _largest_bits(readonly(flat.view(np.uint64)), np.uint64(0x7FFFFFFFFFFFFFFF))
    return np.float64(np.array([largest], np.uint64).view(np.float64)[0])
