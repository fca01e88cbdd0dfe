"""Whether two real float arrays are equal, and the reference's extremes, in one compiled read
of each (numba): the fast path for the many faithful pairs that train bitwise the same numbers.

Imported only through `verify.judge.compare_engine.equal_extremes`, which falls back to numpy
when numba is missing. Equality is `np.array_equal`'s (-0.0 equals 0.0, a NaN equals nothing);
the extremes are taken on the bits, made to order as the floats do, because integer minima and
maxima vectorize where float ones with NaN rules do not.
"""
import numba
import numpy as np

from verify.judge import kernel_cache
from verify.judge.kernel_cache import readonly

kernel_cache.install()   # before the kernels compile: see kernel_cache

# Elements per block of `equal_extremes`: it stops at the end of the first block that differs.
EQUAL_BLOCK = 1 << 16


@numba.njit(cache=True, inline="always")
def _ordered(key, sign_shift, magnitude):
    """A float's bits (as a signed integer of its width) made to order as the float does."""
    return key ^ ((key >> sign_shift) & magnitude)


@numba.njit(cache=True)
def _equal_key_range(a, b, keys, sign_shift, magnitude):
    """(whether a == b everywhere, the smallest and largest ordered key of b); stops at the end
    of the first block holding a difference (a NaN is one)."""
    low = high = _ordered(keys[0], sign_shift, magnitude)
    for start in range(0, a.size, EQUAL_BLOCK):
        stop = min(start + EQUAL_BLOCK, a.size)
        differ = False
        block_low = block_high = low
        for i in range(np.uint64(start), np.uint64(stop)):   # unsigned: no wraparound check
            differ |= a[i] != b[i]
            key = _ordered(keys[i], sign_shift, magnitude)
            block_low = min(block_low, key)
            block_high = max(block_high, key)
        if differ:
            return False, low, high
        low, high = min(low, block_low), max(high, block_high)
    return True, low, high


def equal_extremes(a: np.ndarray, b: np.ndarray):
    """For flat, non-empty float32/float64 arrays of one dtype and size: (low, high), the
    smallest and largest element of `b` as float64, when `a == b` element for element
    (`np.array_equal`: -0.0 equals 0.0, a NaN equals nothing); None where they differ. One
    compiled read of each, where `np.array_equal`, `b.min()` and `b.max()` take four.

    >>> equal_extremes(np.array([1.0, -2.0]), np.array([1.0, -2.0]))
    (-2.0, 1.0)
    >>> equal_extremes(np.array([1.0, np.nan]), np.array([1.0, np.nan])) is None
    True
    """
    ints = np.int32 if a.dtype == np.float32 else np.int64
    width = np.dtype(ints).itemsize * 8
    sign_shift, magnitude = ints(width - 1), ints(2 ** (width - 1) - 1)
    a, b = readonly(a), readonly(b)   # (a view of a read-only array is read-only)
    equal, low, high = _equal_key_range(a, b, b.view(ints), sign_shift, magnitude)
    if not equal:
        return None
    # _ordered is its own inverse: the keys back to the floats' bits
    bits = np.array([_ordered.py_func(low, sign_shift, magnitude),
                     _ordered.py_func(high, sign_shift, magnitude)], ints)
    low, high = bits.view(a.dtype).astype(np.float64)
    return low, high
