"""The chunked compare_arrays (and sparse rows compared without densifying) against the
whole-array computation it replaced: every Drift field and reason must be identical."""
import dataclasses
import itertools
import math
import warnings

import numpy as np
import pytest

from verify.judge import arrays, compare_engine
from verify.judge.arrays import EXACT_KINDS, Drift, compare_arrays, compare_exactly
from verify.judge.drift import _allowed, index_text as _index
from verify.core.tolerances import Tolerance


# The previous implementation, kept verbatim below, warns on float64 values beyond float32's
# range (the adversarial cases); the warning is its, not the new code's.
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")


def _reference_compare_arrays(candidate: np.ndarray, reference: np.ndarray, tol: Tolerance) -> Drift:
    """compare_arrays as it was before chunking (whole arrays in float64), verbatim."""
    a, b = np.asarray(candidate), np.asarray(reference)
    if a.shape != b.shape:
        return Drift(reason=f"Shape mismatch: candidate {a.shape}, reference {b.shape}.")
    if a.dtype != b.dtype:
        return Drift(reason=f"Dtype mismatch: candidate {a.dtype}, reference {b.dtype}.")
    if a.size == 0:
        return Drift(0.0, 0.0, 0.0, 0.0, "", True, "", 0.0)
    if a.dtype.kind in EXACT_KINDS:
        return compare_exactly(a, b)
    # complex values stay complex: |a - b| is the modulus of the complex difference
    wide = np.complex128 if a.dtype.kind == "c" else np.float64
    a64, b64 = a.astype(wide), b.astype(wide)
    nonfinite = ~(np.isfinite(a64) & np.isfinite(b64))
    with np.errstate(invalid="ignore"):
        diff = np.abs(a64 - b64)
    scale = np.abs(b64)
    allowed = tol.atol + tol.rtol * scale
    floor = looseness = np.nan
    below_floor = False
    if tol.floor is not None:
        # never below one float32 ulp of the reference's largest element
        floor = max(tol.floor, float(np.spacing(np.float32(scale.max()))))
        own = allowed
        allowed = np.minimum(own, tol.multiple * floor)
        looseness = float(own.max() / floor)
        below_floor = bool((own < floor).any())
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.where(scale > 0, diff / scale, np.where(diff > 0, np.inf, 0.0))
        tight = np.where(scale > 0, np.maximum(diff - tol.atol, 0.0) / scale,
                         np.where(diff > tol.atol, np.inf, 0.0))
        norm_b = np.linalg.norm(b64[~nonfinite]) if (~nonfinite).any() else 0.0
        norm_d = np.linalg.norm(diff[~nonfinite]) if (~nonfinite).any() else 0.0
        rel_l2 = norm_d / norm_b if norm_b > 0 else (0.0 if norm_d == 0 else np.inf)
    if nonfinite.any():
        where = _index(np.argwhere(nonfinite)[0], a.shape)
        count = int(nonfinite.sum())
        return Drift(np.nan, np.nan, np.nan, np.nan, where, False,
                     f"Non-finite values: {count} / {a.size} elements are NaN or Inf "
                     f"(first at index {where}: candidate {a64[tuple(np.argwhere(nonfinite)[0])]}, "
                     f"reference {b64[tuple(np.argwhere(nonfinite)[0])]}).")
    excess = diff - allowed
    passed = bool((excess <= 0).all()) and not below_floor
    # The worst element: the one furthest past its tolerance, or the largest difference.
    worst = np.unravel_index(int(np.argmax(diff if passed else excess)), a.shape)
    # max_rel is inf only where the reference is 0 and the candidate is not.
    max_abs, max_rel = float(diff.max()), float(rel.max())
    reason = ""
    if below_floor:
        reason = (f"The case's tolerance (atol {tol.atol:.3g}, rtol {tol.rtol:.3g}) is below the "
                  f"noise floor {floor:.3g} measured for this tensor at this step: it cannot tell "
                  f"a mistake from float noise. Raise it, or re-calibrate.")
    elif not passed:
        bad = int((excess > 0).sum())
        abs_at = np.unravel_index(int(np.argmax(diff)), a.shape)
        rel_at = np.unravel_index(int(np.argmax(rel)), a.shape)
        reason = (f"Mismatched elements: {bad} / {a.size} ({100.0 * bad / a.size:.1f}%). "
                  f"Greatest absolute difference: {max_abs:.3g} at index {_index(abs_at, a.shape)}"
                  f" (up to {_allowed(tol, floor)} allowed). "
                  f"Greatest relative difference: {float(rel[rel_at]):.3g} at index "
                  f"{_index(rel_at, a.shape)} (up to {tol.rtol:.3g} allowed).")
    with np.errstate(divide="ignore", invalid="ignore"):
        times = np.where(allowed > 0, diff / allowed, np.where(diff > 0, np.inf, 0.0))
    return Drift(max_abs, max_rel, float(rel_l2), float(tight.max()), _index(worst, a.shape),
                 passed, reason, float(times.max()), floor, looseness)


def reference_compare_arrays(candidate, reference, tol):
    """The whole-array reference, its float warnings silenced."""
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        return _reference_compare_arrays(candidate, reference, tol)


def assert_same(got: Drift, want: Drift, rel_l2_within: float | None = None):
    """Every field identical; with `rel_l2_within`, rel_l2 only within that relative error
    (the compiled kernel sums its squares in its own order, not np.linalg.norm's)."""
    for field in dataclasses.fields(Drift):
        g, w = getattr(got, field.name), getattr(want, field.name)
        if field.name == "rel_l2" and rel_l2_within is not None and math.isfinite(w):
            assert type(g) is float and abs(g - w) <= rel_l2_within * abs(w), (g, w)
            continue
        if isinstance(w, float) or isinstance(g, float):
            assert type(g) is type(w) and repr(g) == repr(w), (field.name, g, w)
        else:
            assert g == w and type(g) is type(w), (field.name, g, w)


# Tensors of more than compare_engine.KERNEL_ABOVE elements: rel_l2 from the kernel's own sums.
REL_L2_WITHIN = 1e-12

TOLERANCES = [Tolerance(0.0, 0.0), Tolerance(1e-6, 1e-5), Tolerance(0.0, 1e-3), Tolerance(1e-3, 0.0),
              Tolerance(1e-6, 1e-5).with_floor(1e-7, 10.0), Tolerance(1e-2, 1e-1).with_floor(1e-7, 10.0),
              Tolerance(0.0, 0.0).with_floor(0.0, 10.0), Tolerance(1e-6, 1e-5).with_floor(1e-3, 2.0)]


def adversarial_pairs(rng):
    """Arrays that stress every rule: NaN/Inf, zeros in the reference, ties, 0-d, empty."""
    yield np.float32(1.5), np.float32(1.5)
    yield np.array(2.0), np.array(np.nan)
    yield np.zeros((0, 3), np.float32), np.zeros((0, 3), np.float32)
    yield np.ones(5), np.ones(6)
    yield np.ones(5, np.float32), np.ones(5)
    yield np.array([1, 2, 3]), np.array([1, 2, 4])
    yield np.array([True, False]), np.array([True, True])
    yield np.array([2**60 + 1, 7]), np.array([2**60, 7])
    for dtype in (np.float16, np.float32, np.float64):
        for n in (1, 7, 10, 33):
            ref = rng.standard_normal(n).astype(dtype)
            cand = (ref + rng.standard_normal(n) * 1e-5).astype(dtype)
            yield cand, ref
            yield ref.copy(), ref
            z = ref.copy(); z[::3] = 0
            c = z.copy(); c[::2] = 0.25
            yield c, z
            yield z, c
            tie = ref.copy(); t = tie.copy(); t[1::4] += dtype(0.5)
            yield t, tie
            for bad in (np.nan, np.inf, -np.inf):
                c = cand.copy(); c[n // 2] = bad
                yield c, ref
                r = ref.copy(); r[-1] = bad; r[0] = bad
                yield cand, r
    big = np.array([1e308, -1e308, 1.0, 5.0])
    yield big, -big
    yield big * 0.5, big
    yield np.full((4, 5), 3.0, np.float32), np.full((4, 5), 3.0, np.float32) + 1
    f = np.asfortranarray(rng.standard_normal((6, 7)))
    yield f + 1e-4, f
    yield (rng.standard_normal((3, 4)) + 1j * rng.standard_normal((3, 4))).astype(np.complex64), \
        (rng.standard_normal((3, 4)) + 1j * rng.standard_normal((3, 4))).astype(np.complex64)
    c = rng.standard_normal(9) + 1j * rng.standard_normal(9)
    yield c, c + 1e-6j
    cc = c.copy(); cc[4] = complex(np.nan, 0)
    yield cc, c
    yield c * 0, c


def random_pairs(rng, count):
    for _ in range(count):
        shape = tuple(rng.integers(1, 9, size=rng.integers(0, 4)))
        dtype = rng.choice([np.float16, np.float32, np.float64, np.complex64, np.complex128])
        ref = rng.standard_normal(shape) * 10.0 ** rng.integers(-8, 4)
        if np.dtype(dtype).kind == "c":
            ref = ref + 1j * rng.standard_normal(shape)
        ref = np.asarray(ref).astype(dtype)
        noise = rng.standard_normal(shape) * 10.0 ** rng.integers(-9, 0)
        cand = np.asarray(ref + noise).astype(dtype)
        mask = rng.random(shape) < 0.2
        ref = np.where(mask, 0, ref).astype(dtype)
        if rng.random() < 0.3:
            cand = np.where(rng.random(shape) < 0.3, ref, cand).astype(dtype)
        if rng.random() < 0.1:
            cand = np.where(rng.random(shape) < 0.1, np.nan, cand).astype(dtype)
        if rng.random() < 0.1:
            cand = np.where(rng.random(shape) < 0.1, 7, cand).astype(dtype)
        yield cand, ref


@pytest.fixture(params=[1, 3, 16, compare_engine.CHUNK], ids=lambda c: f"chunk{c}")
def chunk(request, monkeypatch):
    """Small chunks put ties, NaNs and maxima on either side of chunk boundaries."""
    monkeypatch.setattr(compare_engine, "CHUNK", request.param)
    return request.param


def test_chunked_equals_whole_array_on_adversarial_arrays(chunk):
    rng = np.random.default_rng(0)
    cases = 0
    for (cand, ref), tol in itertools.product(list(adversarial_pairs(rng)), TOLERANCES):
        assert_same(compare_arrays(cand, ref, tol), reference_compare_arrays(cand, ref, tol))
        cases += 1
    assert cases > 500


def test_chunked_equals_whole_array_on_random_arrays(chunk):
    rng = np.random.default_rng(chunk)
    for cand, ref in random_pairs(rng, 300):
        tol = TOLERANCES[rng.integers(len(TOLERANCES))]
        assert_same(compare_arrays(cand, ref, tol), reference_compare_arrays(cand, ref, tol))


def test_large_table_equals_whole_array():
    """Several default-size chunks: the norms and maxima across them match the whole array."""
    rng = np.random.default_rng(1)
    ref = rng.standard_normal((5000, 64)).astype(np.float32)
    cand = ref + (rng.standard_normal(ref.shape) * 1e-6).astype(np.float32)
    cand[4321, 7] = ref[4321, 7] + 1.0
    cand[1234, 5] = ref[1234, 5] + 1.0
    for tol in TOLERANCES:
        assert_same(compare_arrays(cand, ref, tol), reference_compare_arrays(cand, ref, tol),
                    rel_l2_within=REL_L2_WITHIN)


def test_bitwise_equal_arrays_take_the_fast_path_with_every_figure_unchanged(monkeypatch):
    """Equal tensors (many faithful pairs train bitwise the same numbers) are compared from
    one read of each; every Drift field is the whole-array computation's, under every
    tolerance (a floor below the tolerance, zero tolerances, zeros in the reference)."""
    taken = []
    real = arrays._bitwise_equal_drift

    def counted(*args):
        found = real(*args)
        taken.append(found is not None)
        return found

    monkeypatch.setattr(arrays, "_bitwise_equal_drift", counted)
    rng = np.random.default_rng(7)
    tables = [np.float32(3.5) * np.ones(()), np.zeros(5), -np.arange(6.0).reshape(2, 3),
              rng.standard_normal((40, 3)).astype(np.float32), np.array([0.0, -0.0, 1e-30]),
              rng.standard_normal(7).astype(np.float16), np.array([1e300, -1e300]),
              (rng.standard_normal((3000, 64)) * 1e-3).astype(np.float32)]
    for array, tol in itertools.product(tables, TOLERANCES):
        assert_same(compare_arrays(array.copy(), array, tol),
                    reference_compare_arrays(array.copy(), array, tol))
    assert sum(taken) >= len(tables) * len(TOLERANCES) - 3 * len(tables)   # below-floor ones
    # negative controls: a difference, an infinity or a NaN anywhere takes the full scan
    taken.clear()
    one_off = tables[3].copy()
    one_off[39, 2] = np.nextafter(one_off[39, 2], np.float32(9))
    with_inf = np.array([1.0, np.inf])
    with_nan = np.array([1.0, np.nan])
    for cand, ref in ((one_off, tables[3]), (with_inf, with_inf.copy()),
                      (with_nan, with_nan.copy())):
        for tol in TOLERANCES:
            assert_same(compare_arrays(cand, ref, tol), reference_compare_arrays(cand, ref, tol))
    assert not any(taken)
    assert not compare_arrays(one_off, tables[3], Tolerance(0.0, 0.0)).passed


def test_assert_same_can_fail():
    a = reference_compare_arrays(np.array([1.0, 2.0]), np.array([1.0, 2.5]), TOLERANCES[1])
    with pytest.raises(AssertionError):
        assert_same(dataclasses.replace(a, rel_l2=math.nextafter(a.rel_l2, 1.0)), a)
    with pytest.raises(AssertionError):
        assert_same(dataclasses.replace(a, reason=a.reason + " "), a)


def sparse_pairs(rng):
    """Sparse gradients of one table: repeated ids, ids on one side only, no ids at all,
    every row touched, NaN rows, exact ties with the untouched zeros."""
    from verify.core.trace import SparseRows
    for _ in range(150):
        rows = int(rng.integers(1, 12))
        rest = tuple(int(d) for d in rng.integers(1, 4, size=rng.integers(0, 3)))
        dtype = rng.choice([np.float32, np.float64, np.complex64])
        sides = []
        for _side in range(2):
            n = int(rng.integers(0, 2 * rows + 1))
            ids = rng.integers(0, rows, size=n)
            values = rng.standard_normal((n, *rest)) * 10.0 ** rng.integers(-6, 2)
            if np.dtype(dtype).kind == "c":
                values = values + 1j * rng.standard_normal((n, *rest))
            values = values.astype(dtype)
            if n and rng.random() < 0.2:
                values[rng.integers(n)] = 0
            if n and rng.random() < 0.05:
                values.reshape(-1)[rng.integers(values.size)] = np.nan
            sides.append(SparseRows(ids, values, (rows, *rest)))
        if rng.random() < 0.3:  # the same rows on both sides, slightly perturbed
            ref = sides[1]
            noise = (rng.standard_normal(ref.rows.shape) * 1e-7).astype(dtype)
            sides[0] = SparseRows(ref.ids.copy(), ref.rows + noise, ref.dense_shape)
        if rng.random() < 0.1:  # every row touched
            all_ids = np.arange(rows)
            sides[0] = SparseRows(all_ids, np.ones((rows, *rest), dtype), (rows, *rest))
        yield sides[0], sides[1]


def test_sparse_rows_compare_as_their_dense_tables(chunk):
    from verify.judge.arrays import compare_values
    rng = np.random.default_rng(chunk + 7)
    for cand, ref in sparse_pairs(rng):
        tol = TOLERANCES[rng.integers(len(TOLERANCES))]
        want = reference_compare_arrays(cand.to_dense(), ref.to_dense(), tol)
        assert_same(compare_values(cand, ref, tol), want)


def test_sparse_rows_take_the_sparse_path(monkeypatch):
    """The sparse comparison never builds the dense tables with to_dense."""
    from verify.core.trace import SparseRows
    from verify.judge.arrays import compare_values

    def refuse(self):
        raise AssertionError("densified")
    monkeypatch.setattr(SparseRows, "to_dense", refuse)
    ref = SparseRows(np.array([5, 1, 5]), np.ones((3, 4), np.float32), (10, 4))
    cand = SparseRows(np.array([1, 5, 2]), np.ones((3, 4), np.float32), (10, 4))
    d = compare_values(cand, ref, Tolerance(1e-6, 1e-5))
    assert not d.passed and d.reason.startswith("Mismatched elements: 8 / 40 (20.0%).")


def test_large_sparse_table_equals_dense():
    from verify.core.trace import SparseRows
    from verify.judge.arrays import compare_values
    rng = np.random.default_rng(3)
    ids = rng.integers(0, 20000, size=6000)
    rows = rng.standard_normal((6000, 16)).astype(np.float32)
    ref = SparseRows(ids, rows, (20000, 16))
    cand = SparseRows(ids[::-1].copy(), rows[::-1].copy(), (20000, 16))
    for tol in TOLERANCES:
        want = reference_compare_arrays(cand.to_dense(), ref.to_dense(), tol)
        assert_same(compare_values(cand, ref, tol), want, rel_l2_within=REL_L2_WITHIN)
