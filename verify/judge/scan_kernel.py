"""The element-wise comparison of two real float arrays in one compiled pass (numba).

Imported only through `verify.judge.compare_engine`, which falls back to numpy when numba is
missing. Every element's figures are the float64 operations of `compare._scan`, in the same
order (cast, |a-b|, |b|, rtol*|b| then + atol, the cap, the 0/0 and x/0 rules), so maxima,
their first indices, counts and the first non-finite element are bitwise those of the numpy
path. Only the sums of squares for `rel_l2` differ in order from `np.linalg.norm`: see
`SUM_BLOCK`.
"""
import numba
import numpy as np

# Squares are summed in blocks of this many elements, one after the other in float64, and the
# block sums added with Neumaier's compensation: for the non-negative squares the relative error
# of a total is at most (SUM_BLOCK + 2) * 2**-53 (about 1.1e-13), whatever the array's length.
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


@numba.njit(cache=True)
def scan(a, b, rtol, atol, capped, cap, floor):
    """One pass over flat arrays `a` (candidate) and `b` (reference) of one real float dtype:
    the figures of `compare._scan` and the sums of squares of b and |a-b| (see SUM_BLOCK).

    After the first non-finite element only non-finite elements are counted (the figures are
    then unused, as in `compare._scan`)."""
    n = a.size
    nonfinite = 0
    first_bad = -1
    abs_v = rel_v = tight_v = excess_v = times_v = -np.inf
    abs_i = rel_i = tight_i = excess_i = times_i = 0
    own_max = -np.inf
    below_floor = False
    bad = 0
    total_b = total_d = comp_b = comp_d = 0.0
    for start in range(0, n, SUM_BLOCK):
        stop = min(start + SUM_BLOCK, n)
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
            # rel, tight and times: x/0 is inf for x > 0, 0/0 is 0; a division only where
            # the quotient can beat the running maximum
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
            part_b += y * y
            part_d += d * d
        total_b, comp_b = _neumaier(total_b, comp_b, part_b)
        total_d, comp_d = _neumaier(total_d, comp_d, part_d)
    squares_b = total_b + comp_b if np.isfinite(total_b) else total_b
    squares_d = total_d + comp_d if np.isfinite(total_d) else total_d
    return (nonfinite, first_bad, abs_v, abs_i, rel_v, rel_i, tight_v, tight_i, excess_v,
            excess_i, times_v, times_i, own_max, below_floor, bad, squares_b, squares_d)


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
