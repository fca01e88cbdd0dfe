"""The division-free screen of the comparison kernel: a block it calls quiet can change no
running maximum, so the kernel's figures stay those of the element-by-element loop, near ties
and subnormal products included; a bound that is not lowered is caught (negative control)."""
import numpy as np
import pytest

from verify.judge import compare_engine

pytestmark = pytest.mark.skipif(compare_engine.comparison_engine() != "numba",
                                reason="numba is not installed")

from verify.judge import scan_kernel, scan_screen  # noqa: E402 (numba needed)

from test_compare_kernel import CAPS, same_scan  # noqa: E402


def quotient(num, den):
    """The scan's quotient figure: num / den, inf for num > 0 over den <= 0, 0 for num == 0."""
    if den > 0:
        return num / den
    return np.inf if num > 0 else 0.0


def near_ties(rng, count=200_000):
    """(num, den, best) where fl(num / den) falls within a few ulps of best, over magnitudes
    from subnormal to huge, with zeros among numerators and denominators."""
    den = 10.0 ** rng.uniform(-320, 300, count) * rng.uniform(1, 2, count)
    best = 10.0 ** rng.uniform(-300, 300, count)
    with np.errstate(over="ignore"):
        num = best * den
    num = np.where(np.isfinite(num), num, 1.0)
    num = num + np.spacing(num) * rng.integers(-3, 4, count)
    num[rng.random(count) < 0.05] = 0.0
    den[rng.random(count) < 0.05] = 0.0
    best[rng.random(count) < 0.05] = 0.0
    return np.abs(num), den, best


def unsound(may_beat, rng):
    """How many (num, den, best) `may_beat` calls certain whose quotient beats best."""
    misses = 0
    with np.errstate(over="ignore", invalid="ignore"):
        for num, den, best in zip(*near_ties(rng)):
            certain = not may_beat(num, den, best, scan_screen.zero_bound.py_func(best))
            misses += certain and quotient(num, den) > best
    return misses


def test_a_quotient_called_certain_never_beats_its_best():
    assert unsound(scan_screen._quotient_may_beat.py_func, np.random.default_rng(41)) == 0


def test_a_screen_that_lets_ties_of_the_product_through_is_caught():
    """Negative control: num <= best * den (not <) passes quotients that round above best."""
    def lenient(num, den, best, zero):
        p = best * den
        return not num <= (p if p > zero else zero)

    assert unsound(lenient, np.random.default_rng(41)) > 0


def near_tie_pairs(rng, size=64 * scan_kernel.SUM_BLOCK + 77):
    """Values drawn from a handful of magnitudes a few ulps apart, so that later blocks hold
    quotients equal to, or one ulp beyond, the running maxima of earlier ones."""
    for dtype in (np.float32, np.float64):
        base = np.array([1.0, 3.0, 1e-30, 0.0, 7.5e3], dtype)
        ref = base[rng.integers(0, base.size, size)]
        ulps = rng.integers(-2, 3, size).astype(dtype)
        cand = ref + ulps * np.spacing(np.maximum(np.abs(ref), np.finfo(dtype).tiny))
        yield cand.astype(dtype), ref


def test_kernel_with_the_screen_equals_the_element_by_element_loop_near_ties():
    rng = np.random.default_rng(43)
    quiet_seen = 0
    for cand, ref in near_tie_pairs(rng):
        for (rtol, atol), (capped, cap, floor) in zip(
                ((1e-5, 1e-6), (0.0, 0.0), (1e-3, 1e-30)), CAPS):
            args = (cand, ref, rtol, atol, capped, cap, floor)
            same_scan(scan_kernel.scan(*args), scan_kernel.scan(*args, False))
            best = scan_kernel.scan(*args)
            running = (best[2], 0, best[4], 0, best[6], 0, best[8], 0, best[10], 0, best[12])
            quiet_seen += scan_screen.quiet_block(cand, ref, 0, scan_kernel.SUM_BLOCK, rtol,
                                                  atol, cap, floor if capped else None,
                                                  running)[0]
    assert quiet_seen > 0, "the screen never called a block quiet: its fast path is untested"


def test_a_later_block_that_beats_only_a_quotient_is_not_called_quiet():
    """An element deep in the array whose rel alone beats the running maximum (its |x-y|,
    excess and times stay below theirs): only the screen's quotient test can send its block
    to the exact path, and rel's index must land on it (it cannot if that test is skipped)."""
    rng = np.random.default_rng(47)
    size = 40 * scan_kernel.SUM_BLOCK
    ref = np.ones(size, np.float32) + rng.random(size, dtype=np.float32)
    cand = ref + (rng.standard_normal(size) * 1e-6).astype(np.float32)
    at = 33 * scan_kernel.SUM_BLOCK + 5
    ref[at], cand[at] = np.float32(1e-3), np.float32(1e-3) + np.float32(1e-7)
    for capped, cap, floor in CAPS[:2]:
        got = dict(zip(scan_kernel.FIELDS,
                       scan_kernel.scan(cand, ref, 1e-6, 1e-5, capped, cap, floor)))
        assert got["rel_index"] == at, got
        assert at not in (got["abs_index"], got["excess_index"], got["times_index"]), got
        same_scan(scan_kernel.scan(cand, ref, 1e-6, 1e-5, capped, cap, floor),
                  scan_kernel.scan(cand, ref, 1e-6, 1e-5, capped, cap, floor, False))


def element_figures(cand, ref, rtol, atol, cap, floor):
    """Each element's |x-y|, rel, tight, excess, times and own, by the scan's rules, in numpy."""
    x, y = cand.astype(np.float64), ref.astype(np.float64)
    d, s = np.abs(x - y), np.abs(y)
    own = rtol * s
    own += atol
    allowed = own if floor is None else np.minimum(own, cap)
    with np.errstate(all="ignore"):
        rel = np.where(s > 0, d / s, np.where(d > 0, np.inf, 0.0))
        tight = np.where(s > 0, np.maximum(d - atol, 0.0) / s, np.where(d > atol, np.inf, 0.0))
        times = np.where(allowed > 0, d / allowed, np.where(d > 0, np.inf, 0.0))
    return d, rel, tight, d - allowed, times, own


def extremes_blocks(rng, size=scan_kernel.SUM_BLOCK):
    """Blocks of float32 and float64 pairs: noise, near ties, zeros and subnormals in the
    reference, a wide range of magnitudes."""
    for dtype in (np.float32, np.float64):
        tiny = np.finfo(dtype).smallest_subnormal
        for _ in range(6):
            ref = rng.standard_normal(size).astype(dtype)
            noise = rng.standard_normal(size) * 10.0 ** rng.uniform(-8, -3)
            yield (ref + noise.astype(dtype)).astype(dtype), ref
            zeros = ref.copy()
            zeros[rng.random(size) < 0.05] = 0
            zeros[rng.integers(0, size)] = tiny
            yield (zeros + noise.astype(dtype)).astype(dtype), zeros
            wide = (ref * 10.0 ** rng.uniform(-30, 30, size)).astype(dtype)
            yield wide + np.spacing(wide) * rng.integers(-2, 3, size).astype(dtype), wide
        for cand, ref in near_tie_pairs(rng, size):
            if cand.dtype == dtype:
                yield cand, ref


def running_maxima(figures, rng):
    """A running-maxima tuple (`scan_kernel.scan`'s `best`) around these figures' maxima: all
    well above their block's largest values, or each at, a few ulps either side of, or well
    above its own."""
    best = []
    above = rng.random() < 0.5
    for values in figures:
        top = values.max()
        if above or rng.random() < 0.3:
            top = top * 1e3 + 1.0 if top >= 0 else 0.0
        elif np.isfinite(top):
            top += rng.integers(-2, 3) * np.spacing(abs(top))
        best += [top, 0]
    return tuple(best[:-1])


def screen_misses(extremes_of, rng):
    """(blocks called quiet, blocks called quiet in which some element beats a running
    maximum, blocks whose below-the-floor answer is wrong), over many blocks and running
    maxima; `extremes_of(d_max, s_min, s_max)` gives the extremes the screen is asked with."""
    quiet_count = misses = wrong_low = 0
    for cand, ref in extremes_blocks(rng):
        for (rtol, atol), (capped, cap, floor) in zip(
                ((1e-5, 1e-6), (0.0, 0.0), (1e-3, 1e-30)), CAPS):
            floor = floor if capped else None
            figures = element_figures(cand, ref, rtol, atol, cap, floor)
            d_bits, s_min, s_max, bad, _, _, d_within = scan_screen.block_extremes(
                cand, ref, 0, cand.size, rtol, atol, cap, floor)
            d, own = figures[0], figures[-1]
            assert d_bits == np.float64(d.max()).view(np.int64) and bad == (figures[3] > 0).sum()
            within = np.float64(np.where(d > own, 0.0, d).max()).view(np.int64)
            assert d_within == (within if capped else 0)
            s_min, s_max = np.int64(s_min).view(np.float64), np.int64(s_max).view(np.float64)
            assert s_min == np.abs(ref.astype(np.float64)).min()
            assert not capped or s_max == np.abs(ref.astype(np.float64)).max()
            for _ in range(4):
                best = running_maxima(figures if capped else figures[:-1] + (own * 0,), rng)
                quiet, low = scan_screen.extremes_quiet.py_func(
                    *extremes_of(d.max(), s_min, s_max), rtol, atol, cap, floor, best)
                wrong_low += capped and low != bool((own < floor).any())
                if quiet:
                    quiet_count += 1
                    tops = [values.max() for values in figures[:5 if not capped else 6]]
                    misses += any(t > b for t, b in zip(tops, best[::2]))
    return quiet_count, misses, wrong_low


def test_a_block_quiet_by_its_extremes_is_quiet_in_every_element():
    quiet_count, misses, wrong_low = screen_misses(lambda d, lo, hi: (d, lo, hi),
                                                   np.random.default_rng(53))
    assert misses == 0 and wrong_low == 0
    assert quiet_count > 100, "the extremes seldom called a block quiet: that path is untested"


def test_a_screen_that_takes_the_largest_reference_for_the_smallest_is_caught():
    """Negative control: bounding the quotients with the largest |y| lets blocks through whose
    rel, tight or times beat the running maximum."""
    _, misses, _ = screen_misses(lambda d, lo, hi: (d, hi, hi), np.random.default_rng(53))
    assert misses > 0


def test_a_negative_cap_is_judged_element_by_element_with_the_same_figures():
    """The screens' quotient bounds need denominators >= 0: with a negative cap (a negative
    multiple of the floor) allowed is negative, and the scan takes no screen, so its figures
    are the element-by-element loop's. (The guard is defensive: the first block's |x-y| test
    already kept the screens from such a case, so the equality held without it too; the last
    assertion shows the screen's own answer that the guard keeps out.)"""
    rng = np.random.default_rng(59)
    ref = rng.standard_normal(3 * scan_kernel.SUM_BLOCK + 17).astype(np.float32)
    cand = ref + (rng.standard_normal(ref.size) * 1e-5).astype(np.float32)
    args = (cand, ref, 1e-5, 1e-6, True, -1e-5, 1e-6)
    got = dict(zip(scan_kernel.FIELDS, scan_kernel.scan(*args)))
    same_scan(scan_kernel.scan(*args), scan_kernel.scan(*args, False))
    assert got["times_value"] == np.inf and got["bad"] == ref.size
    # why the scan keeps such a cap off its screens: asked directly, the extremes' screen
    # calls a block quiet whose times (inf, over a negative allowed) beats a running -inf
    best = (np.inf, 0, np.inf, 0, np.inf, 0, np.inf, 0, -np.inf, 0, np.inf)
    assert scan_screen.extremes_quiet.py_func(1.0, 1.0, 1.0, 1e-5, 0.0, -1e-5, 0.0, best)[0]
