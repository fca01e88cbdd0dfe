"""The capped scan in one read (`scan_deferred`): bitwise the figures of a read of the reference
for the noise floor and then the scan, on many arrays and tolerances; the cap's effect on the
count of excesses is found, not assumed; a NaN or Inf takes the two-read path."""
import numpy as np
import pytest

from verify.core.tolerances import Tolerance
from verify.judge import compare_engine
from verify.judge.kernel_cache import readonly

pytestmark = pytest.mark.skipif(compare_engine.comparison_engine() != "numba",
                                reason="numba is not installed")


def two_reads(flat_a, flat_b, tol):
    """The path before: max |reference| read first, then the scan with the floor it gives."""
    kernel = compare_engine.compiled_scan()
    floor = compare_engine.noise_floor(tol, compare_engine.reference_scale(flat_b, np.float64,
                                                                           kernel))
    return (floor, *compare_engine.kernel_scan(kernel, flat_a, flat_b, tol, floor))


def one_read(flat_a, flat_b, tol, monkeypatch):
    """`capped_kernel_scan`, failing if it reads the reference alone (`reference_scale`): the
    figures then come from the one read, not from the two-read path it falls back on."""
    def no_read_of_its_own(*args):
        raise AssertionError("the capped scan read the reference alone")

    with monkeypatch.context() as patched:
        patched.setattr(compare_engine, "reference_scale", no_read_of_its_own)
        return compare_engine.capped_kernel_scan(compare_engine.compiled_scan(), flat_a,
                                                 flat_b, tol)


def figures(floor, scan, squares) -> str:
    """Every figure, NaNs and signs included, as one comparable text."""
    maxima = [(float(m.value), m.index) for m in scan.maxima()]
    return repr((float(floor), maxima, scan.own_max, scan.below_floor, scan.bad,
                 scan.nonfinite, scan.first_bad, squares))


def pairs(rng):
    """Near-equal pairs of many lengths (not only whole blocks), scales and noises, with
    outliers and runs of zeros; float32 and float64."""
    for trial in range(120):
        n = int(rng.integers(4097, 120_000))
        dtype = (np.float32, np.float64)[trial % 2]
        scale = 10.0 ** rng.uniform(-6, 4)
        b = (rng.standard_normal(n) * scale).astype(dtype)
        a = (b + rng.standard_normal(n) * scale * 10.0 ** rng.uniform(-9, -1)).astype(dtype)
        if trial % 5 == 0:
            a[rng.integers(0, n)] += dtype(scale)
        if trial % 7 == 0:
            b[: n // 3] = 0
        tol = Tolerance(float(10 ** rng.uniform(-8, -2)),
                        float(10 ** rng.uniform(-7, -1)) if trial % 3 else 0.0)
        yield a, b, tol.with_floor(float(10 ** rng.uniform(-9, -4)),
                                   float(rng.choice([1.0, 3.0, 10.0, 100.0])))


def test_one_read_gives_every_figure_of_two(monkeypatch):
    rng = np.random.default_rng(7)
    for a, b, tol in pairs(rng):
        assert figures(*one_read(a, b, tol, monkeypatch)) == figures(*two_reads(a, b, tol))


def test_a_cap_below_the_own_allowance_is_counted_not_assumed(monkeypatch):
    """Elements whose |x-y| lies between the cap and their own rtol*|y| + atol are excesses
    only under the cap. After a first block of larger differences, the other blocks change no
    maximum (their extremes say so), but each of their elements is such an excess: a block
    settled by its uncapped count, which is 0 here, would miss them all (the negative control,
    run here: told that no |x-y| lies within its own allowance, the scan counts 1024)."""
    from verify.judge.scan_deferred import block_summaries, scan_summarized
    from verify.judge.scan_kernel import FIELDS

    b = np.full(5 * 1024, 2.0)                   # own = 1e-3 * 2 = 2e-3 everywhere
    a = b + 5e-4                                 # within own, beyond the cap of 1e-4
    a[:1024] = b[:1024] + 1.5e-3                 # the first block sets every maximum
    tol = Tolerance(0.0, 1e-3).with_floor(1e-5, 10.0)   # floor 1e-5 (> 1 float32 ulp of 2)
    floor, scan, squares = one_read(a, b, tol, monkeypatch)
    assert figures(floor, scan, squares) == figures(*two_reads(a, b, tol))
    assert scan.bad == b.size
    finite, _, bits, counts, parts = block_summaries(readonly(a), readonly(b), 1e-3, 0.0,
                                                     np.inf, 0.0)
    assert finite and counts.sum() == 0, "the uncapped count alone would have said no excess"
    # the negative control: the same scan told that no |x-y| lies within its own allowance
    blind = bits.copy()
    blind[3] = 0
    wrong = scan_summarized(readonly(a), readonly(b), 0.0, 1e-3, 1e-4, 1e-5, blind, counts,
                            parts)
    assert wrong[FIELDS.index("bad")] == 1024


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("side", ["candidate", "reference"])
def test_a_nonfinite_element_takes_the_two_read_path(value, side, monkeypatch):
    rng = np.random.default_rng(3)
    b = rng.standard_normal(20_000).astype(np.float32)
    a = b + np.float32(1e-6)
    (a if side == "candidate" else b)[12_345] = value
    tol = Tolerance(1e-6, 1e-5).with_floor(1e-7, 10.0)
    kernel = compare_engine.compiled_scan()
    reads = []
    real_read = compare_engine.reference_scale
    monkeypatch.setattr(compare_engine, "reference_scale",
                        lambda *args: reads.append(args) or real_read(*args))
    got = compare_engine.capped_kernel_scan(kernel, a, b, tol)
    assert len(reads) == 1, "the reference was not read alone first"
    assert figures(*got) == figures(*two_reads(a, b, tol))
    assert got[1].nonfinite == 1 and got[1].first_bad[0] == 12_345


@pytest.mark.parametrize("own_floor", [-1.0, -np.inf])
def test_a_negative_cap_scans_element_by_element_as_before(own_floor, monkeypatch):
    """A reference beyond float32's range has no float32 spacing, so a negative floor of the
    tolerance's own stays the floor and the cap is negative: the scan then screens no block
    and sums its squares one element after the other; so must the one-read path (summed
    through the screens, the sums differed in their last bits)."""
    rng = np.random.default_rng(0)
    b = rng.standard_normal(8192) * 1e40
    a = b * (1 + rng.standard_normal(8192) * 1e-6)
    tol = Tolerance(1e-6, 1e-5).with_floor(own_floor, 10.0)
    got = one_read(a, b, tol, monkeypatch)   # the floor found in the read, then the scan
    assert figures(*got) == figures(*two_reads(a, b, tol))
    assert got[0] == own_floor
