"""Whether a block of elements can change any running maximum of the scan, decided without a
division (numba): the fast path of `scan_kernel.scan` for the many blocks that change none.

Once the first blocks have set the running maxima (|x-y|, rel, tight, excess, times, own), a
later block rarely beats one. Two screens, cheapest first, both erring only towards the exact
path (`scan_kernel._plain_block`), which finds the new maxima and their first indices:

- `block_extremes` reads each element once for the block's largest |x-y| and smallest and
  largest |y| (as integer bit patterns, whose extremes vectorize where float ones do not here),
  the count of excesses and the sums of squares; `extremes_quiet` then asks whether an element
  holding the largest |x-y| and the smallest |y| could beat a running maximum. Every figure
  grows with |x-y| and shrinks as |y| grows (own grows with |y|: the largest |y| bounds it),
  and rounding is monotone, so a block quiet by its extremes is quiet element by element.
- `quiet_block`, for a block the extremes cannot settle, computes each element's |x-y|, own,
  allowed and excess as `scan_kernel._figures` does (the same float64 operations in the same
  order), counts the excesses and the owns below the floor, and asks of each figure only
  whether it *may* beat the running maximum: for |x-y|, excess and own by comparing; for the
  three quotients by comparing the numerator with the running maximum times the denominator,
  so no division is taken.

Both loops have no branches and vectorize; each reads each element once.
"""
import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from verify.judge import kernel_cache

kernel_cache.install()   # before the kernels compile: see kernel_cache

# A quotient num / den (num >= 0; by the scan's rules inf for num > 0 and den <= 0, 0 for
# num == 0) is <= best for certain when num < p for p = fl(best * den), den > 0: rounding to
# nearest puts every float below p below the exact best * den too (p = inf included), so
# num / den < best exactly and, rounding being monotone, fl(num / den) <= best. Where the
# product decides nothing (0, NaN, negative) the numerator is held to `zero_bound` instead.
# This needs den >= 0: a negative best over a negative den gives p = +inf and "certain" for a
# quotient (inf) that beats it, so the scan takes its screens only where allowed >= 0 (a cap
# >= 0; |y| and own are never negative).
_TINIEST = 5e-324   # the smallest positive float64: num < it means num == 0


@numba.njit(cache=True, inline="always")
def zero_bound(best):
    """What a numerator must stay below when no product decides: inf when best is inf (nothing
    beats it), above 0 exactly when best >= 0 (a quotient of 0 cannot beat it), else 0."""
    if best == np.inf:
        return np.inf
    return _TINIEST if best >= 0.0 else 0.0


@numba.njit(cache=True, inline="always")
def _quotient_may_beat(num, den, best, zero):
    """False only when the quotient figure of `num` over `den` is <= best for certain (see
    above); `zero` is zero_bound(best)."""
    p = best * den
    return not num < (p if p > zero else zero)


@numba.njit(cache=True, error_model="numpy")
def quiet_block(a, b, start, stop, rtol, atol, cap, floor, best):
    """Over elements start..stop-1 of flat `a` (candidate) and `b` (reference): (quiet, low,
    bad): quiet when every |x-y| is finite and no element may beat a running maximum of `best`
    (the tuple `scan_kernel.scan` keeps); low counts own < floor, bad counts excess > 0.
    `floor` None (compiled apart): not capped, `cap` unused; else `cap` is >= 0, finite or inf.
    rtol and atol are finite and >= 0. The block's sums of squares are `block_extremes`'s,
    taken before: this loop has only integer and boolean reductions, which vectorize without
    reassociating any float operation."""
    (abs_v, _, rel_v, _, tight_v, _, excess_v, _, times_v, _, own_max) = best
    abs_bound = min(abs_v, np.finfo(np.float64).max)   # d = inf or NaN is never below it
    rel_zero, tight_zero, times_zero = zero_bound(rel_v), zero_bound(tight_v), zero_bound(times_v)
    loud = False
    low = bad = 0
    for i in range(np.uint64(start), np.uint64(stop)):   # unsigned: no wraparound check
        x = np.float64(a[i])
        y = np.float64(b[i])
        d = abs(x - y)
        s = abs(y)
        own = rtol * s
        own += atol
        allowed = own
        if floor is not None:
            allowed = own if own < cap else cap
            loud |= own > own_max
            low += own < floor
        t = d - atol
        t = t if t > 0.0 else 0.0
        excess = d - allowed
        # `|`, not `or`: no branches, so the loop vectorizes
        loud |= ((not d <= abs_bound) | (excess > excess_v)
                 | _quotient_may_beat(d, s, rel_v, rel_zero)
                 | _quotient_may_beat(t, s, tight_v, tight_zero)
                 | _quotient_may_beat(d, allowed, times_v, times_zero))
        bad += excess > 0
    return not loud, low, bad


@intrinsic
def bits(typingctx, value):
    """The bits of a float64 as an int64 (no conversion)."""
    if isinstance(value, types.Float) and value.bitwidth == 64:
        def codegen(context, builder, signature, args):
            return builder.bitcast(args[0], ir.IntType(64))
        return types.int64(value), codegen
    return None


@intrinsic
def from_bits(typingctx, value):
    """The float64 whose bits are this int64 (no conversion)."""
    if isinstance(value, types.Integer) and value.bitwidth == 64:
        def codegen(context, builder, signature, args):
            return builder.bitcast(args[0], ir.DoubleType())
        return types.float64(value), codegen
    return None


# |x| of a float64 is finite exactly when its bits are below those of +inf.
INF_BITS = 0x7FF0000000000000
MAGNITUDE = 0x7FFFFFFFFFFFFFFF


@numba.njit(cache=True, error_model="numpy", fastmath={"reassoc"})
def block_extremes(a, b, start, stop, rtol, atol, cap, floor):
    """Over elements start..stop-1, in one read of each: (the bits of the largest |x-y|, at or
    above INF_BITS when some |x-y| is not finite; the bits of the smallest and, when capped
    (`floor` not None, compiled apart), of the largest |y|; how many excess > 0 (allowed =
    rtol*|y| + atol, at most `cap` when capped); the sums of y*y and |x-y|**2; when capped, the
    bits of the largest |x-y| within its own rtol*|y| + atol, uncapped (0 if none is), which
    says whether a cap moves the count: `scan_deferred`). Every value is >= 0 (or NaN, whose
    bits lie above INF_BITS), so its bits order as it does and integer extremes, which
    vectorize, stand for the floats' (float minima and maxima do not vectorize here).

    `fastmath` allows reassociation for every operation of the function (numba sets it per
    function), not only the two sums it is meant for; in the code compiled here the others
    keep their order (no other operation there has anything to reassociate with: own is one
    product and one sum, the count a comparison). The tests compare every count and decision
    with numpy's figures of each element, so a compiler that rewrote them would fail them."""
    d_bits = s_max = d_within = 0
    s_min = MAGNITUDE
    bad = 0
    part_b = part_d = 0.0
    for i in range(np.uint64(start), np.uint64(stop)):   # unsigned: no wraparound check
        y = np.float64(b[i])
        d = abs(np.float64(a[i]) - y)
        s = abs(y)
        d_bits = max(d_bits, bits(d))
        s_min = min(s_min, bits(s))
        if floor is not None:
            s_max = max(s_max, bits(s))
        own = rtol * s
        own += atol
        allowed = own
        if floor is not None:
            allowed = own if own < cap else cap
            d_within = max(d_within, bits(0.0 if d > own else d))
        bad += d > allowed   # for finite d, exactly excess = fl(d - allowed) > 0
        part_b += y * y
        part_d += d * d
    return d_bits, s_min, s_max, bad, part_b, part_d, d_within


@numba.njit(cache=True, error_model="numpy")
def extremes_quiet(d_max, s_min, s_max, rtol, atol, cap, floor, best):
    """(quiet, some own < floor) for a block of finite elements whose largest |x-y| is d_max
    and whose |y| lie in [s_min, s_max] (both attained), decided on those three alone; rtol,
    atol and cap are >= 0 (cap may be inf), `floor` None: not capped.

    Every figure is monotone in them: |x-y|, excess, rel, tight and times grow with |x-y| and
    shrink as |y| grows, own grows with |y|. own, allowed, t and excess at the extremes are
    the elements' own operations on them, and rounding is monotone, so they bound every
    element's. The quotients are bounded as `quiet_block` bounds them (num < fl(best * den),
    or the `zero_bound` where that product decides nothing: s_min = 0, allowed = 0), with the
    largest numerator over the smallest denominator, which bounds every element's quotient.
    So quiet here means quiet for every element."""
    (abs_v, _, rel_v, _, tight_v, _, excess_v, _, times_v, _, own_max) = best
    own = rtol * s_min
    own += atol
    allowed = own
    low = False
    loud = False
    if floor is not None:
        allowed = own if own < cap else cap
        low = own < floor
        top = rtol * s_max
        top += atol
        loud = top > own_max
    t = d_max - atol
    t = t if t > 0.0 else 0.0
    excess = d_max - allowed
    loud = (loud or not d_max <= min(abs_v, np.finfo(np.float64).max) or excess > excess_v
            or _quotient_may_beat(d_max, s_min, rel_v, zero_bound(rel_v))
            or _quotient_may_beat(t, s_min, tight_v, zero_bound(tight_v))
            or _quotient_may_beat(d_max, allowed, times_v, zero_bound(times_v)))
    return not loud, low


@numba.njit(cache=True)
def screens(rtol, atol, cap):
    """Whether `scan_kernel.scan` may decide blocks by these screens: rtol and atol
    finite and >= 0, the cap >= 0 (inf: none); else it takes every element one at a time.
    `compare_engine.capped_kernel_scan` asks it too, to take the scan's path for the same
    tolerances.

    >>> screens(1e-6, 1e-5, float("inf")), screens(1e-6, 1e-5, -1e-7)
    (True, False)
    """
    return 0.0 <= rtol < np.inf and 0.0 <= atol < np.inf and cap >= 0.0
