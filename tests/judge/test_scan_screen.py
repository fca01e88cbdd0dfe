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
