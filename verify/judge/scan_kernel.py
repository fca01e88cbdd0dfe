"""The element-wise comparison of two real float arrays in one compiled pass (numba).

Imported only through `verify.judge.compare_engine`, which falls back to numpy when numba is
missing. Every element's figures are the float64 operations of `compare_engine.scan_in_chunks`,
in the same order (cast, |a-b|, |b|, rtol*|b| then + atol, the cap, the 0/0 and x/0 rules), so
maxima, their first indices, counts and the first non-finite element are bitwise those of the
numpy path. Only the sums of squares for `rel_l2` differ in order from `np.linalg.norm`: see
`SUM_BLOCK`.

The elements are taken in blocks of SUM_BLOCK. Most blocks change no running maximum. A block
is first read once by `scan_screen.block_extremes`, which takes its largest |x-y|, its smallest
(and, capped, largest) |y|, its count of excesses and its sums of squares; every figure is
monotone in those extremes, so `scan_screen.extremes_quiet` can often tell from them alone that
no element beats a running maximum (`_screened_block`). Where it cannot, `scan_screen.quiet_block`
asks the same of each element, without a division. A block whose elements and differences are
all finite (a plain block; the rules for NaN, Inf and overflow cannot apply there) and that may
change a maximum goes through `_block_maxima` (`_plain_block`), a loop without branches that
the compiler vectorizes: it gives each figure's largest value in the block as an integer key
ordered as the floats are; only when a block's largest value beats the running maximum is the
block searched again for the first element holding it (a tie keeps the earlier element). Every
other block, and every block after the first non-finite element, takes the element-by-element
loop that applies every rule (`_elementwise_block`).
"""
import numba
import numpy as np

from verify.judge import kernel_cache
from verify.judge.scan_screen import (INF_BITS, MAGNITUDE, bits, block_extremes, extremes_quiet,
                                      from_bits, quiet_block, screens)

kernel_cache.install()   # before the kernels compile: see kernel_cache

# Squares are summed in blocks of this many elements in float64 (in plain blocks in the order
# `block_extremes`'s vectorized loop takes, elsewhere one after the other), and the block sums
# added with Neumaier's compensation: for the non-negative squares the relative error of a total
# is at most (SUM_BLOCK + 2) * 2**-53 (about 1.1e-13) whatever the order within a block and the
# array's length.
SUM_BLOCK = 1024

# The returned tuple, in order (indices are flat; -1: none).
FIELDS = ("nonfinite", "first_bad", "abs_value", "abs_index", "rel_value", "rel_index",
          "tight_value", "tight_index", "excess_value", "excess_index", "times_value",
          "times_index", "own_max", "below_floor", "bad", "squares_reference",
          "squares_difference")


@numba.njit(cache=True, inline="always")
def _nan_min(x, y):
    """np.minimum: NaN if either is NaN."""
    if x != x or y != y:
        return np.nan
    return x if x < y else y


@numba.njit(cache=True, inline="always")
def _beats(value, best):
    """Whether `value`, met later, takes np.argmax's place from `best` (first NaN wins)."""
    return best == best and (value > best or value != value)


# Below this a product may be subnormal and lose the relative accuracy _may_reach relies on.
_NORMAL = 2.0 ** -1020
_SHRINK = 1.0 - 2.0 ** -51


@numba.njit(cache=True, inline="always")
def _may_reach(num, den, best):
    """False only when fl(num / den) <= best for certain (num >= 0, den > 0), so the division
    cannot change a running maximum; True (divide) whenever in doubt.

    With p = fl(best*den) normal and finite, p <= best*den*(1 + 2**-53) and
    fl(p*(1 - 2**-51)) <= best*den*(1 + 2**-53)**2*(1 - 2**-51) < best*den: num below it means
    num/den < best exactly, and rounding is monotone. 0/den is 0, no more than a best >= 0."""
    if num == 0.0 and best >= 0.0:
        return False
    p = best * den
    if not (p >= _NORMAL and p < np.inf):
        return True
    return not (num < p * _SHRINK)


_LOWEST_KEY = -0x8000000000000000


@numba.njit(cache=True, inline="always")
def _key(value):
    """An int64 ordered as non-NaN floats are: _key(x) > _key(y) exactly when x > y; -0.0 and
    0.0 share the key 0."""
    k = bits(value + 0.0)
    return k ^ ((k >> 63) & MAGNITUDE)


@numba.njit(cache=True, inline="always")
def _beaten(key, best):
    """Whether a block's largest value, of this key, takes the running maximum `best`'s place
    (never a NaN's: np.argmax keeps the first NaN)."""
    return best == best and key > _key(best)


@numba.njit(cache=True, inline="always", error_model="numpy")
def _figures(x, y, rtol, atol, cap):
    """|x-y|, rel, tight, excess, times and own of one element, as the scalar loop computes
    them, without branches. Exact for finite x, y, |x-y|, rtol, atol and a non-NaN cap (inf:
    no cap): no NaN can arise there, so every rule of the scalar loop reduces to these."""
    d = abs(x - y)
    s = abs(y)
    own = rtol * s
    own += atol
    allowed = own if own < cap else cap
    t = d - atol
    t = t if t > 0.0 else 0.0
    rel = d / s if s > 0 else (np.inf if d > 0 else 0.0)
    tight = t / s if s > 0 else (np.inf if d > atol else 0.0)
    times = d / allowed if allowed > 0 else (np.inf if d > 0 else 0.0)
    return d, rel, tight, d - allowed, times, own


# the figures of _figures, by position
_ABS, _REL, _TIGHT, _EXCESS, _TIMES, _OWN = 0, 1, 2, 3, 4, 5


@numba.njit(cache=True, error_model="numpy")
def _block_maxima(a, b, start, stop, rtol, atol, cap, floor):
    """Over elements start..stop-1: the keys of the largest |x-y| (its bits; at or above
    INF_BITS when some |x-y| is not finite: then nothing else here holds), rel, tight, excess,
    times and own; how many own < floor and how many excess > 0. With floor None (compiled
    apart) own is left out: its key stays _LOWEST_KEY, its count 0."""
    k_abs = k_rel = k_tight = k_excess = k_times = k_own = _LOWEST_KEY
    low = bad = 0
    for i in range(np.uint64(start), np.uint64(stop)):   # unsigned: no wraparound check
        d, rel, tight, excess, times, own = _figures(np.float64(a[i]), np.float64(b[i]), rtol,
                                                     atol, cap)
        # all but excess are >= 0 (or -0.0): their bits without the sign are their keys
        k_abs = max(k_abs, bits(d) & MAGNITUDE)
        k_rel = max(k_rel, bits(rel) & MAGNITUDE)
        k_tight = max(k_tight, bits(tight) & MAGNITUDE)
        k_excess = max(k_excess, _key(excess))
        k_times = max(k_times, bits(times) & MAGNITUDE)
        if floor is not None:
            k_own = max(k_own, bits(own) & MAGNITUDE)
            low += own < floor
        bad += excess > 0
    return k_abs, k_rel, k_tight, k_excess, k_times, k_own, low, bad


@numba.njit(cache=True, error_model="numpy")
def _first_with_key(a, b, start, stop, rtol, atol, cap, figure, key):
    """The first element from start on whose figure (_ABS.._OWN) has this key, and its value."""
    for i in range(start, stop):
        value = _figures(np.float64(a[i]), np.float64(b[i]), rtol, atol, cap)[figure]
        if _key(value) == key:
            return i, value
    raise AssertionError("a block's largest key was not found in the block")


@numba.njit(cache=True)
def _no_maxima(n):
    """The scan's start: (the running maxima, none yet, as `FIELDS` orders them; nothing below
    the floor; no excess), typed int64 and bool as the loop carries them, not as the literals
    0 and False: a literal start compiled every block function twice, once for the first
    block."""
    none = np.int64(n - n)
    return ((-np.inf, none, -np.inf, none, -np.inf, none, -np.inf, none, -np.inf, none, -np.inf),
            n < 0, none)


@numba.njit(cache=True, error_model="numpy")
def scan(a, b, rtol, atol, capped, cap, floor, blocks=True):
    """One pass over flat arrays `a` (candidate) and `b` (reference) of one real float dtype:
    the figures of `compare_engine.scan_in_chunks` and the sums of squares of b and |a-b| (see
    SUM_BLOCK).

    After the first non-finite element only non-finite elements are counted (the figures are
    then unused, as in `scan_in_chunks`). `blocks=False` takes every block element by element
    (the same figures; the sums of squares in another order)."""
    n = a.size
    # (abs_v, abs_i, rel_v, rel_i, tight_v, tight_i, excess_v, excess_i, times_v, times_i,
    # own_max): the running maxima, values and their first indices (see FIELDS)
    best, below_floor, bad = _no_maxima(n)
    nonfinite, first_bad = bad, bad - 1   # int64s, as the loop carries them
    total_b = total_d = comp_b = comp_d = 0.0
    # _figures is exact only for finite tolerances and a cap that is not NaN; with rtol, atol
    # >= 0 (as Tolerance has them) own is too, and the screens' quotient bounds hold only for
    # denominators >= 0, so a negative cap (a negative multiple) goes element by element too
    block_cap = cap if capped else np.inf
    fast = blocks and screens(rtol, atol, block_cap)
    for start in range(0, n, SUM_BLOCK):
        stop = min(start + SUM_BLOCK, n)
        plain = False
        part_b = part_d = 0.0
        if fast and nonfinite == 0:
            plain, best, below_floor, bad, part_b, part_d = _screened_block(
                a, b, start, stop, rtol, atol, capped, block_cap, floor, best, below_floor, bad)
        if not plain:   # element by element: every rule (NaN, Inf, overflow)
            (best, below_floor, bad, nonfinite, first_bad, part_b,
             part_d) = _elementwise_block(a, b, start, stop, rtol, atol, capped, cap, floor,
                                          best, below_floor, bad, nonfinite, first_bad)
        total_b, comp_b = _neumaier(total_b, comp_b, part_b)
        total_d, comp_d = _neumaier(total_d, comp_d, part_d)
    return scan_result(nonfinite, first_bad, best, below_floor, bad, total_b, comp_b, total_d,
                       comp_d)


@numba.njit(cache=True)
def scan_result(nonfinite, first_bad, best, below_floor, bad, total_b, comp_b, total_d, comp_d):
    """The scan's returned tuple (`FIELDS`) from its running state: the sums of squares are the
    compensated totals (`_neumaier`), as they are while finite."""
    squares_b = total_b + comp_b if np.isfinite(total_b) else total_b
    squares_d = total_d + comp_d if np.isfinite(total_d) else total_d
    (abs_v, abs_i, rel_v, rel_i, tight_v, tight_i, excess_v, excess_i, times_v, times_i,
     own_max) = best
    return (nonfinite, first_bad, abs_v, abs_i, rel_v, rel_i, tight_v, tight_i, excess_v,
            excess_i, times_v, times_i, own_max, below_floor, bad, squares_b, squares_d)


@numba.njit(cache=True, error_model="numpy")
def _screened_block(a, b, start, stop, rtol, atol, capped, cap, floor, best, below_floor, bad):
    """Elements start..stop-1 when every |x-y| there is finite: (True, `best`, below_floor,
    bad updated, the block's sums of squares), by the cheapest screen that decides it: the
    block's extremes (`block_extremes`, one read that also counts the excesses and sums the
    squares), then each element (`quiet_block`), then the exact maxima (`_plain_block`). Else
    (False, ...): the block has a non-finite |x-y|, for `_elementwise_block`. `cap` is >= 0,
    finite or inf."""
    if capped:
        d_bits, s_min, s_max, block_bad, part_b, part_d, _ = block_extremes(
            a, b, start, stop, rtol, atol, cap, floor)
    else:
        d_bits, s_min, s_max, block_bad, part_b, part_d, _ = block_extremes(
            a, b, start, stop, rtol, atol, cap, None)
    if not d_bits < INF_BITS:
        return False, best, below_floor, bad, part_b, part_d
    if capped:
        quiet, low = extremes_quiet(from_bits(d_bits), from_bits(s_min), from_bits(s_max),
                                    rtol, atol, cap, floor, best)
    else:
        quiet, low = extremes_quiet(from_bits(d_bits), from_bits(s_min), 0.0, rtol, atol, cap,
                                    None, best)
    if quiet:   # no running maximum changes: only the counts
        return True, best, below_floor or low, bad + block_bad, part_b, part_d
    if capped:
        quiet, low_count, block_bad = quiet_block(a, b, start, stop, rtol, atol, cap, floor,
                                                  best)
    else:
        quiet, low_count, block_bad = quiet_block(a, b, start, stop, rtol, atol, cap, None,
                                                  best)
    if quiet:
        return True, best, below_floor or low_count > 0, bad + block_bad, part_b, part_d
    _, best, below_floor, bad = _plain_block(a, b, start, stop, rtol, atol, capped, cap, floor,
                                             best, below_floor, bad)
    return True, best, below_floor, bad, part_b, part_d


@numba.njit(cache=True, error_model="numpy")
def _plain_block(a, b, start, stop, rtol, atol, capped, cap, floor, best, below_floor, bad):
    """Elements start..stop-1 by `_block_maxima` when the block is plain (every |x-y| finite):
    (True, the running maxima `best`, below_floor and bad updated); else (False, them as they
    were), for `_elementwise_block` to take the block. `cap` is finite or inf, never NaN."""
    if capped:
        (k_abs, k_rel, k_tight, k_excess, k_times, k_own, low,
         block_bad) = _block_maxima(a, b, start, stop, rtol, atol, cap, floor)
    else:
        (k_abs, k_rel, k_tight, k_excess, k_times, k_own, low,
         block_bad) = _block_maxima(a, b, start, stop, rtol, atol, cap, None)
    if not k_abs < INF_BITS:
        return False, best, below_floor, bad
    (abs_v, abs_i, rel_v, rel_i, tight_v, tight_i, excess_v, excess_i, times_v, times_i,
     own_max) = best
    at = start - start   # 0, an int64 and not a literal: one _first_with_key for every figure

    def first(figure, key):
        return _first_with_key(a, b, start, stop, rtol, atol, cap, at + figure, key)

    if _beaten(k_abs, abs_v):
        abs_i, abs_v = first(_ABS, k_abs)
    if _beaten(k_rel, rel_v):
        rel_i, rel_v = first(_REL, k_rel)
    if _beaten(k_tight, tight_v):
        tight_i, tight_v = first(_TIGHT, k_tight)
    if _beaten(k_excess, excess_v):
        excess_i, excess_v = first(_EXCESS, k_excess)
    if _beaten(k_times, times_v):
        times_i, times_v = first(_TIMES, k_times)
    if capped:
        if _beaten(k_own, own_max):
            own_max = first(_OWN, k_own)[1]
        below_floor = below_floor or low > 0
    bad += block_bad
    return True, (abs_v, abs_i, rel_v, rel_i, tight_v, tight_i, excess_v, excess_i, times_v,
                  times_i, own_max), below_floor, bad


@numba.njit(cache=True, error_model="numpy")
def _elementwise_block(a, b, start, stop, rtol, atol, capped, cap, floor, best, below_floor,
                       bad, nonfinite, first_bad):
    """Elements start..stop-1 one at a time, every rule applied (NaN, Inf, overflow): the
    running maxima `best`, below_floor, bad, nonfinite and first_bad updated, and the block's
    sums of squares of b and |a-b|, added one after the other."""
    (abs_v, abs_i, rel_v, rel_i, tight_v, tight_i, excess_v, excess_i, times_v, times_i,
     own_max) = best
    part_b = part_d = 0.0
    for i in range(start, stop):
        x = np.float64(a[i])
        y = np.float64(b[i])
        if not (np.isfinite(x) and np.isfinite(y)):
            if nonfinite == 0:
                first_bad = i
            nonfinite += 1
            continue
        if nonfinite:
            continue
        d = abs(x - y)
        s = abs(y)
        own = rtol * s
        own += atol
        if capped:
            if own > own_max:
                own_max = own
            if own < floor:
                below_floor = True
            allowed = _nan_min(own, cap)
        else:
            allowed = own
        if _beats(d, abs_v):
            abs_v, abs_i = d, i
        excess = d - allowed
        if _beats(excess, excess_v):
            excess_v, excess_i = excess, i
        if excess > 0:
            bad += 1
        rel_v, rel_i, tight_v, tight_i, times_v, times_i = _offer_ratios(
            d, s, allowed, atol, i, rel_v, rel_i, tight_v, tight_i, times_v, times_i)
        part_b += y * y
        part_d += d * d
    return ((abs_v, abs_i, rel_v, rel_i, tight_v, tight_i, excess_v, excess_i, times_v, times_i,
             own_max), below_floor, bad, nonfinite, first_bad, part_b, part_d)


@numba.njit(cache=True, inline="always", error_model="numpy")
def _offer_ratios(d, s, allowed, atol, i, rel_v, rel_i, tight_v, tight_i, times_v, times_i):
    """Element i's rel, tight and times offered to their running maxima, returned: x/0 is inf
    for x > 0, 0/0 is 0; a division only where the quotient can beat the running maximum."""
    if s > 0:
        if _may_reach(d, s, rel_v):
            rel = d / s
            if _beats(rel, rel_v):
                rel_v, rel_i = rel, i
        t = d - atol
        if not (t > 0.0 or t != t):
            t = 0.0
        if _may_reach(t, s, tight_v):
            tight = t / s
            if _beats(tight, tight_v):
                tight_v, tight_i = tight, i
    else:
        rel = np.inf if d > 0 else 0.0
        if _beats(rel, rel_v):
            rel_v, rel_i = rel, i
        tight = np.inf if d > atol else 0.0
        if _beats(tight, tight_v):
            tight_v, tight_i = tight, i
    if allowed > 0:
        if _may_reach(d, allowed, times_v):
            times = d / allowed
            if _beats(times, times_v):
                times_v, times_i = times, i
    else:
        times = np.inf if d > 0 else 0.0
        if _beats(times, times_v):
            times_v, times_i = times, i
    return rel_v, rel_i, tight_v, tight_i, times_v, times_i


@numba.njit(cache=True, inline="always")
def _neumaier(total, comp, value):
    """total + value, the rounding error of the sum kept in comp (Neumaier's summation)."""
    t = total + value
    if np.isfinite(t):
        if abs(total) >= abs(value):
            comp += (total - t) + value
        else:
            comp += (value - t) + total
    return t, comp
