"""The compiled comparison kernel (numba) against the whole-array reference: every Drift field
and reason identical except rel_l2, which agrees within a relative 1e-12; its fallback when
numba is missing; sparse tables on their touched rows; a wrong candidate caught."""
import itertools
import math
import sys
import warnings

import numpy as np
import pytest

from verify.core.tolerances import Tolerance
from verify.core.trace import SparseRows
from verify.judge import (compare_engine, equal_kernel, kernel_warmup, scan_kernel, sparse_rows,
                          sparse_rows_kernel)
from verify.judge.arrays import compare_arrays, compare_values

from test_compare_chunked import (REL_L2_WITHIN, TOLERANCES, adversarial_pairs, assert_same,
                                  random_pairs, reference_compare_arrays, sparse_pairs)

pytestmark = [pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning"),
              pytest.mark.skipif(compare_engine.comparison_engine() != "numba",
                                 reason="numba is not installed")]


@pytest.fixture
def kernel_everywhere(monkeypatch):
    """Every real float array of more than 0 elements takes the kernel."""
    monkeypatch.setattr(compare_engine, "KERNEL_ABOVE", 0)


def takes_kernel(a) -> bool:
    a = np.asarray(a)
    return a.dtype in (np.float32, np.float64) and a.size > compare_engine.KERNEL_ABOVE


def test_kernel_equals_whole_array_on_adversarial_arrays(kernel_everywhere):
    rng = np.random.default_rng(0)
    on_kernel = 0
    for (cand, ref), tol in itertools.product(list(adversarial_pairs(rng)), TOLERANCES):
        assert_same(compare_arrays(cand, ref, tol), reference_compare_arrays(cand, ref, tol),
                    rel_l2_within=REL_L2_WITHIN)
        on_kernel += takes_kernel(ref) and np.shape(cand) == np.shape(ref) and \
            np.asarray(cand).dtype == np.asarray(ref).dtype
    assert on_kernel > 300


def test_kernel_equals_whole_array_on_random_arrays(kernel_everywhere):
    rng = np.random.default_rng(5)
    for cand, ref in random_pairs(rng, 600):
        tol = TOLERANCES[rng.integers(len(TOLERANCES))]
        assert_same(compare_arrays(cand, ref, tol), reference_compare_arrays(cand, ref, tol),
                    rel_l2_within=REL_L2_WITHIN)


def large_pairs(rng):
    """Tables around KERNEL_ABOVE and the kernel's summing blocks, with what breaks rules."""
    above = compare_engine.KERNEL_ABOVE
    for n in (above, above + 1, above + 1023, 3 * above + 17, 1_000_003):
        for dtype in (np.float32, np.float64):
            ref = (rng.standard_normal(n) * 10.0 ** rng.integers(-6, 3)).astype(dtype)
            cand = (ref + rng.standard_normal(n) * 1e-6 * np.abs(ref)).astype(dtype)
            yield cand, ref
            yield ref.copy(), ref
            z = ref.copy(); z[::7] = 0
            c = cand.copy(); c[::11] = 0
            yield c, z
            w = cand.copy(); w[n - 1] += 1.0; w[n // 3] += 1.0   # equal errors: first wins
            yield w, ref
            for bad in (np.nan, np.inf):
                c = cand.copy(); c[n - 2] = bad; c[n // 2] = bad
                yield c, ref
    big = np.tile(np.array([1e308, -1e308, 1.0, 5.0]), above // 2)
    yield big, -big
    yield big * 0.5, big
    ramp = np.linspace(0.0, 1.0, above + 5)
    yield ramp + 1e-3, ramp


def test_kernel_on_large_tables_equals_whole_array():
    rng = np.random.default_rng(11)
    cases = 0
    for cand, ref in large_pairs(rng):
        assert takes_kernel(ref) or ref.size == compare_engine.KERNEL_ABOVE
        for tol in TOLERANCES[1::2] + [TOLERANCES[0]]:
            assert_same(compare_arrays(cand, ref, tol), reference_compare_arrays(cand, ref, tol),
                        rel_l2_within=REL_L2_WITHIN)
            cases += 1
    assert cases > 100


def test_kernel_rel_l2_is_within_its_bound_of_the_exact_sum():
    """The kernel's sums of squares against math.fsum's correctly rounded ones."""
    rng = np.random.default_rng(2)
    worst = 0.0
    for n in (compare_engine.KERNEL_ABOVE + 1, 1_000_000):
        ref = rng.standard_normal(n).astype(np.float32) * np.float32(10.0 ** rng.integers(-3, 3))
        cand = ref + (rng.standard_normal(n) * 1e-5).astype(np.float32)
        got = compare_arrays(cand, ref, Tolerance(1e-6, 1e-5)).rel_l2
        b, d = ref.astype(np.float64), np.abs(cand.astype(np.float64) - ref)
        exact = math.sqrt(math.fsum(d * d)) / math.sqrt(math.fsum(b * b))
        worst = max(worst, abs(got - exact) / exact)
    assert worst <= 3e-13, worst


def test_sparse_rows_on_the_kernel_equal_the_dense_tables(kernel_everywhere):
    rng = np.random.default_rng(17)
    for cand, ref in sparse_pairs(rng):
        tol = TOLERANCES[rng.integers(len(TOLERANCES))]
        want = reference_compare_arrays(cand.to_dense(), ref.to_dense(), tol)
        assert_same(compare_values(cand, ref, tol), want, rel_l2_within=REL_L2_WITHIN)


def test_large_sparse_table_never_builds_full_length_vectors(monkeypatch):
    """Above KERNEL_ABOVE the sparse comparison allocates nothing the table's size."""
    rng = np.random.default_rng(4)
    rows, width = 200_000, 8
    ids = rng.integers(0, rows, size=3000)
    grad = rng.standard_normal((3000, width)).astype(np.float32)
    ref = SparseRows(ids, grad, (rows, width))
    cand = SparseRows(ids[::-1].copy(), grad[::-1].copy(), (rows, width))
    want = reference_compare_arrays(cand.to_dense(), ref.to_dense(), TOLERANCES[1])
    real_zeros, real_empty = np.zeros, np.empty

    def small(alloc):
        def make(shape, *args, **kwargs):
            assert np.prod(shape) < rows * width, ("full-length", shape)
            return alloc(shape, *args, **kwargs)
        return make
    monkeypatch.setattr(np, "zeros", small(real_zeros))
    monkeypatch.setattr(np, "empty", small(real_empty))
    assert_same(compare_values(cand, ref, TOLERANCES[1]), want, rel_l2_within=REL_L2_WITHIN)


def test_kernel_catches_a_wrong_candidate():
    """Negative control: a candidate off by 1e-3 on a few known elements fails, counting
    exactly those, the worst at the largest one, on the kernel as on the reference."""
    rng = np.random.default_rng(9)
    ref = rng.standard_normal((4000, 64)).astype(np.float32)
    cand = ref.copy()
    wrong = [(17, 3), (2048, 63), (3999, 0)]
    for k, (r, c) in enumerate(wrong):
        cand[r, c] += np.float32(1e-3 * (k + 1))
    d = compare_arrays(cand, ref, Tolerance(1e-6, 1e-5))
    assert not d.passed and d.reason.startswith(f"Mismatched elements: 3 / {ref.size} ")
    assert d.worst_index == "(3999, 0)"
    assert_same(d, reference_compare_arrays(cand, ref, Tolerance(1e-6, 1e-5)),
                rel_l2_within=REL_L2_WITHIN)
    faithful = compare_arrays(ref.copy(), ref, Tolerance(1e-6, 1e-5))
    assert faithful.passed and faithful.max_abs == 0.0


def test_without_numba_the_numpy_path_compares_exactly(monkeypatch):
    """numba 'missing': a warning once, comparison_engine says numpy, and large tables get the
    numpy path's figures, rel_l2 bitwise np.linalg.norm's."""
    monkeypatch.setattr(compare_engine, "_kernel", None)
    monkeypatch.setitem(sys.modules, "numba", None)
    monkeypatch.delitem(sys.modules, "verify.judge.scan_kernel", raising=False)
    with pytest.warns(RuntimeWarning, match="numba is not importable"):
        assert compare_engine.comparison_engine() == "numpy"
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # said once only
        assert compare_engine.comparison_engine() == "numpy"
    rng = np.random.default_rng(6)
    ref = rng.standard_normal(compare_engine.KERNEL_ABOVE + 100).astype(np.float32)
    cand = ref + np.float32(1e-6)
    for tol in TOLERANCES:
        assert_same(compare_arrays(cand, ref, tol), reference_compare_arrays(cand, ref, tol))


# The kernel's plain blocks (all finite) take the vectorized block path; any other block, and
# every block after a non-finite element, the element-by-element loop. Both must give the same
# figures, wherever the two kinds of blocks meet.
B = scan_kernel.SUM_BLOCK
N_BLOCKS = 5 * B + 300          # five whole blocks and a partial last one
TIE_FIRST, TIE_LATER = 100, 3 * B + 5
EDGES = (0, B - 1, B, 2 * B, N_BLOCKS // 2, 5 * B, N_BLOCKS - 1)
# (capped, cap, floor) as compare passes them: no cap, a cap some elements reach, a zero cap
CAPS = ((False, np.inf, np.nan), (True, 2e-5, 1e-6), (True, 0.0, 0.0))


def switching_pairs(rng):
    """(what, candidate, reference) over N_BLOCKS elements: non-finite values in the middle and
    at block edges, an overflowing |x-y|, ties across blocks and maxima in the last block."""
    for dtype in (np.float32, np.float64):
        ref = (rng.standard_normal(N_BLOCKS) * 10.0 ** rng.integers(-3, 3)).astype(dtype)
        cand = (ref + rng.standard_normal(N_BLOCKS) * 1e-6 * np.abs(ref)).astype(dtype)
        yield "plain", cand, ref
        yield "equal", ref.copy(), ref
        for at, bad in itertools.product(EDGES, (np.nan, np.inf, -np.inf)):
            c = cand.copy(); c[at] = bad
            yield f"candidate {bad} at {at}", c, ref
            r = ref.copy(); r[at] = bad
            yield f"reference {bad} at {at}", cand, r
        tie_r, tie_c = ref.copy(), cand.copy()
        tie_r[[TIE_FIRST, TIE_LATER]] = 0.5
        tie_c[[TIE_FIRST, TIE_LATER]] = 2.0
        yield "tie across blocks", tie_c, tie_r
        last_r, last_c = ref.copy(), cand.copy()
        last_r[[N_BLOCKS - 3, N_BLOCKS - 1]] = 0.5
        last_c[[N_BLOCKS - 3, N_BLOCKS - 1]] = 3.5
        yield "maxima in the last partial block", last_c, last_r
        single = cand.copy(); single[N_BLOCKS - 1] += 3
        yield "the largest error on the last element", single, ref
        z, c = ref.copy(), cand.copy()
        z[::5] = 0; c[::10] = 0
        yield "zeros in the reference", c, z
        tiny = ref.copy(); tiny[B + 7] = np.finfo(dtype).smallest_subnormal
        yield "a subnormal reference", cand, tiny
        ramp = np.linspace(0, 1, N_BLOCKS).astype(dtype)
        yield "a ramp (every block beats the last)", ramp * 2, ramp
    big = rng.standard_normal(N_BLOCKS) * 1e307
    yield "|x-y| overflows in one block", np.where(np.arange(N_BLOCKS) == 2 * B + 5, -1e308,
                                                     big), np.where(np.arange(N_BLOCKS) ==
                                                                    2 * B + 5, 1e308, big)
    yield "own = rtol * |y| overflows", big * (1 + 1e-9), big


def same_scan(got, want):
    """Every field of two kernel results identical (NaN as NaN), the sums of squares within
    SUM_BLOCK's bound of each other."""
    for name, g, w in zip(scan_kernel.FIELDS, got, want):
        if name.startswith("squares_"):
            assert g == w or abs(g - w) <= 2.5e-13 * abs(w), (name, g, w)
        else:
            assert repr(g) == repr(w) and type(g) is type(w), (name, g, w)


def test_block_path_equals_element_by_element_loop():
    rng = np.random.default_rng(23)
    cases = 0
    for what, cand, ref in switching_pairs(rng):
        for (rtol, atol), (capped, cap, floor) in itertools.product(
                ((1e-5, 1e-6), (0.0, 0.0), (10.0, 1e-3), (np.inf, 0.0)), CAPS):
            args = (cand, ref, rtol, atol, capped, cap, floor)
            same_scan(scan_kernel.scan(*args), scan_kernel.scan(*args, False))
            cases += 1
    assert cases > 1000


def test_block_path_keeps_the_first_of_equal_maxima_across_blocks():
    """Equal largest errors in blocks 0 and 3: every figure's index is the first; maxima in the
    last partial block are found there, the earlier of two equal ones."""
    rng = np.random.default_rng(29)
    pairs = {what: (c, r) for what, c, r in switching_pairs(rng)}
    cand, ref = pairs["tie across blocks"]
    got = dict(zip(scan_kernel.FIELDS, scan_kernel.scan(cand, ref, 1e-5, 1e-6, *CAPS[0])))
    for figure in ("abs", "rel", "tight", "excess", "times"):
        assert got[f"{figure}_index"] == TIE_FIRST, (figure, got)
    cand, ref = pairs["maxima in the last partial block"]
    got = dict(zip(scan_kernel.FIELDS, scan_kernel.scan(cand, ref, 1e-5, 1e-6, *CAPS[0])))
    assert got["abs_index"] == got["excess_index"] == N_BLOCKS - 3, got
    assert got["rel_index"] == got["times_index"] == N_BLOCKS - 3, got
    assert got["nonfinite"] == 0 and got["bad"] == 2
    cand, ref = pairs["the largest error on the last element"]
    got = dict(zip(scan_kernel.FIELDS, scan_kernel.scan(cand, ref, 1e-5, 1e-6, *CAPS[0])))
    assert got["abs_index"] == got["excess_index"] == N_BLOCKS - 1, got


def test_block_switching_equals_whole_array(kernel_everywhere):
    """compare_arrays on the kernel against the whole-array reference where blocks switch."""
    rng = np.random.default_rng(31)
    for what, cand, ref in switching_pairs(rng):
        for tol in TOLERANCES[1::3]:
            got = compare_arrays(cand, ref, tol)
            assert_same(got, reference_compare_arrays(cand, ref, tol),
                        rel_l2_within=REL_L2_WITHIN)
            if what.startswith(("candidate", "reference")):
                at = int(what.rsplit(" ", 1)[1])
                assert not got.passed and got.worst_index == f"({at},)", (what, got)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_largest_magnitude_by_bits_is_numpys_whatever_the_values(dtype):
    from verify.judge.scan_deferred import abs_max

    rng = np.random.default_rng(11)
    for case in range(8):
        x = (rng.standard_normal(1000 + case) * 10.0 ** rng.integers(-30, 30)).astype(dtype)
        if case == 1:
            x[5] = np.nan
        if case == 2:
            x[7] = -np.inf
        if case == 3:
            x[:] = -0.0
        if case == 4:
            x[3], x[4] = np.nan, np.inf
        if case == 5:
            x[9] = -np.finfo(dtype).max
        if case == 6:
            x[-1] = np.finfo(dtype).smallest_subnormal * -3
            x[:-1] = 0.0
        expected = np.abs(x.astype(np.float64)).max()
        got = abs_max(x)
        assert type(got) is np.float64
        if np.isnan(expected):
            assert np.isnan(got)
        else:
            assert got == expected and not np.signbit(got), (case, got, expected)
    assert abs_max(np.array([-2.5], dtype)) == 2.5


def test_rows_summed_by_id_are_bitwise_np_add_at_in_the_order_given():
    from verify.judge.sparse_rows_kernel import summed_rows

    rng = np.random.default_rng(12)
    for trial in range(300):
        n, table_rows = int(rng.integers(1, 300)), int(rng.integers(1, 50))
        ids = rng.integers(0, table_rows, n)
        dtype = (np.float32, np.float64)[trial % 2]
        rows = (rng.standard_normal((n, 3)) * 10.0 ** rng.integers(-5, 5, (n, 1))).astype(dtype)
        if trial % 7 == 0:
            rows[0] = -0.0          # alone on its id: +0.0, as zeros + -0.0 gives
        distinct, expected_ids = np.unique(ids, return_inverse=True)
        expected = np.zeros((len(distinct), 3), dtype)
        np.add.at(expected, expected_ids, rows)
        got_ids, got = summed_rows(ids, rows)
        np.testing.assert_array_equal(got_ids, distinct)
        assert got.tobytes() == expected.tobytes(), trial


def slot_pairs(rng):
    """Sparse gradients of real float tables for the slot path: repeated ids, ids one side
    touched, empty sides, -0.0 rows alone on their id, NaN and Inf rows, exact ties, the
    untouched rows' tie (a zero difference everywhere touched), both sides' ids identical."""
    for trial in range(400):
        table = int(rng.integers(1, 40))
        rest = tuple(int(d) for d in rng.integers(1, 5, size=rng.integers(0, 3)))
        dtype = (np.float32, np.float64)[trial % 2]
        sides = []
        for _side in range(2):
            n = int(rng.integers(0, 3 * table + 1)) if rng.random() > 0.1 else 0
            ids = rng.integers(0, max(1, table // int(rng.integers(1, 4))), size=n)
            ids = ids.astype((np.int64, np.int32, np.uint16)[int(rng.integers(3))])
            values = (rng.standard_normal((n, *rest)) * 10.0 ** rng.integers(-6, 3)).astype(dtype)
            if n and rng.random() < 0.3:
                values[rng.integers(n)] = -0.0
            if n and rng.random() < 0.1:
                values.reshape(-1)[rng.integers(values.size)] = (np.nan, np.inf, -np.inf)[
                    int(rng.integers(3))]
            if n and rng.random() < 0.2:          # equal values: ties among the maxima
                values[...] = values.reshape(-1)[0]
            sides.append(SparseRows(ids, values, (table, *rest)))
        kind = rng.random()
        if kind < 0.2:        # the same rows both sides: every touched difference 0
            sides[0] = SparseRows(sides[1].ids.copy(), sides[1].rows.copy(), (table, *rest))
        elif kind < 0.35:     # the same ids, reversed: sums in another order
            sides[0] = SparseRows(sides[1].ids[::-1].copy(), sides[1].rows[::-1].copy(),
                                  (table, *rest))
        elif kind < 0.5:      # the same ids, other rows
            noise = (rng.standard_normal(sides[1].rows.shape) * 1e-6).astype(dtype)
            sides[0] = SparseRows(sides[1].ids.copy(), sides[1].rows + noise, (table, *rest))
        yield sides[0], sides[1]


@pytest.fixture
def slots_counted(monkeypatch):
    """Counts the comparisons that number their rows by slots (`sparse_rows_kernel.union_rows`).
    The kernels' group is made ready first: a process's first use of it calls union_rows once
    on tiny arrays (`kernel_warmup.ready`), which would be counted when this test is that use
    (it failed so under xdist, by test order)."""
    for dtype in ("float32", "float64"):
        kernel_warmup.ready("union_rows", dtype)
    calls = []
    real = sparse_rows_kernel.union_rows

    def counted(*args):
        calls.append(args[-1])
        return real(*args)
    monkeypatch.setattr(sparse_rows_kernel, "union_rows", counted)
    return calls


@pytest.mark.parametrize("on_kernel", [True, False])
def test_sparse_rows_by_slots_equal_the_dense_tables(monkeypatch, slots_counted, on_kernel):
    if on_kernel:
        monkeypatch.setattr(compare_engine, "KERNEL_ABOVE", 0)
    rng = np.random.default_rng(21)
    pairs = 0
    for cand, ref in slot_pairs(rng):
        tol = TOLERANCES[rng.integers(len(TOLERANCES))]
        want = reference_compare_arrays(cand.to_dense(), ref.to_dense(), tol)
        assert_same(compare_values(cand, ref, tol), want,
                    rel_l2_within=REL_L2_WITHIN if on_kernel else None)
        pairs += 1
    assert len(slots_counted) == pairs


def test_tables_beyond_the_slot_rule_are_sorted_with_the_same_figures(monkeypatch,
                                                                      slots_counted):
    """A table of more rows than the rule allows for its lookups takes the sort path; the
    figures are the same either way."""
    rng = np.random.default_rng(22)
    monkeypatch.setattr(compare_engine, "KERNEL_ABOVE", 0)
    pairs = list(itertools.islice(slot_pairs(rng), 150))
    tols = [TOLERANCES[i] for i in rng.integers(len(TOLERANCES), size=len(pairs))]
    by_slots = [compare_values(c, r, t) for (c, r), t in zip(pairs, tols)]
    assert len(slots_counted) == len(pairs)
    monkeypatch.setattr(sparse_rows, "SLOTS_ALWAYS", 0)
    monkeypatch.setattr(sparse_rows, "SLOTS_PER_LOOKUP", 0)
    for (cand, ref), tol, got in zip(pairs, tols, by_slots):
        assert_same(got, compare_values(cand, ref, tol))
    assert len(slots_counted) == len(pairs)   # none more
    assert not sparse_rows._by_slots(pairs[0][0], pairs[0][1], 1)
    monkeypatch.setattr(sparse_rows, "SLOTS_PER_LOOKUP", 64)
    one = SparseRows(np.array([3]), np.ones((1, 2), np.float32), (200, 2))
    assert sparse_rows._by_slots(one, one, 128) and not sparse_rows._by_slots(one, one, 129)


def test_rows_on_the_union_are_bitwise_the_sorted_sums():
    """union_rows against np.unique, np.add.at into zeros and the scatter onto the union:
    the same ids, the same bits (-0.0 alone on its id gives +0.0; NaN and Inf rows)."""
    from verify.judge.sparse_rows_kernel import union_rows

    rng = np.random.default_rng(23)
    for trial in range(300):
        table, width = int(rng.integers(1, 60)), int(rng.integers(1, 70))
        dtype = (np.float32, np.float64)[trial % 2]
        sides = []
        for _side in range(2):
            n = int(rng.integers(0, 80))
            ids = rng.integers(0, table, n)
            rows = (rng.standard_normal((n, width)) * 10.0 ** rng.integers(-5, 5, (n, 1))
                    ).astype(dtype)
            if n and trial % 5 == 0:
                rows[rng.integers(n)] = -0.0
            if n and trial % 7 == 0:
                rows[rng.integers(n), rng.integers(width)] = (np.nan, np.inf)[trial % 2]
            sides.append((ids, rows))
        union = np.union1d(sides[0][0], sides[1][0])
        expected = []
        for ids, rows in sides:
            distinct, inverse = np.unique(ids, return_inverse=True)
            summed = np.zeros((len(distinct), width), dtype)
            np.add.at(summed, inverse, rows)
            on_union = np.zeros((len(union), width), dtype)
            on_union[np.searchsorted(union, distinct)] = summed
            expected.append(on_union)
        got_ids, a, b = union_rows(*sides[0], *sides[1], table)
        np.testing.assert_array_equal(got_ids, union)
        assert a.dtype == b.dtype == dtype and a.shape == b.shape == (len(union), width)
        assert a.tobytes() == expected[0].tobytes(), trial
        assert b.tobytes() == expected[1].tobytes(), trial
    _, a, _ = union_rows(np.array([2]), np.full((1, 3), -0.0), np.array([0]),
                         np.ones((1, 3)), 4)
    assert not np.signbit(a).any()


def test_slot_path_catches_a_row_whose_update_differs(slots_counted):
    """Negative control: one id's summed update off by 1e-3 in one element fails there, at
    its dense index, counting that one element; the faithful candidate (the same lookups in
    another order, summing to the same bits) passes."""
    rng = np.random.default_rng(24)
    table, width = 300_000, 8
    ids = rng.integers(0, table, size=4000)
    ids[:3] = 1234                       # an id looked up three times
    grad = rng.standard_normal((4000, width)).astype(np.float64)
    ref = SparseRows(ids, grad, (table, width))
    order = rng.permutation(4000)
    order = np.concatenate([[0, 1, 2], order[~np.isin(order, [0, 1, 2])]])
    faithful = SparseRows(ids[order], grad[order], (table, width))
    tol = Tolerance(1e-6, 1e-5)
    d = compare_values(faithful, ref, tol)
    assert d.passed and d.max_abs == 0.0, d.reason
    wrong_rows = grad[order].copy()
    wrong_rows[1, 5] += 1e-3             # the second lookup of id 1234
    d = compare_values(SparseRows(ids[order], wrong_rows, (table, width)), ref, tol)
    assert not d.passed and d.reason.startswith(f"Mismatched elements: 1 / {table * width} ")
    assert d.worst_index == "(1234, 5)" and abs(d.max_abs - 1e-3) < 1e-12
    assert len(slots_counted) == 2


def equal_extremes_oracle(a, b):
    """What `equal_kernel.equal_extremes` must give: numpy's equality, min and max."""
    if not np.array_equal(a, b):
        return None
    return np.float64(b.min()), np.float64(b.max())


def equal_pairs(rng):
    """(name, a, b) around the blocks of `equal_extremes`: equal arrays, and arrays differing
    by one ulp, a NaN, an infinity or a sign of zero at block edges and in the last, partial
    block; the extremes at either end."""
    size = 3 * equal_kernel.EQUAL_BLOCK + 5
    for dtype in (np.float32, np.float64):
        ref = rng.standard_normal(size).astype(dtype)
        yield f"{dtype.__name__} equal", ref.copy(), ref
        for at in (0, equal_kernel.EQUAL_BLOCK - 1, equal_kernel.EQUAL_BLOCK, size - 1):
            one_off = ref.copy()
            one_off[at] = np.nextafter(one_off[at], dtype(9))
            yield f"{dtype.__name__} one ulp at {at}", one_off, ref
            extreme = ref.copy()
            extreme[at] = dtype(-40.0 if at % 2 else 40.0)
            yield f"{dtype.__name__} extreme at {at}", extreme.copy(), extreme
            for special in (np.nan, np.inf, -np.inf):
                held = ref.copy()
                held[at] = special
                yield f"{dtype.__name__} {special} at {at} on both", held.copy(), held
            zeros = ref.copy()
            zeros[at] = 0.0
            signed = zeros.copy()
            signed[at] = -0.0
            yield f"{dtype.__name__} -0.0 against 0.0 at {at}", signed, zeros


def test_equal_extremes_is_numpys_equality_min_and_max():
    cases = 0
    for what, a, b in equal_pairs(np.random.default_rng(53)):
        got, want = equal_kernel.equal_extremes(a, b), equal_extremes_oracle(a, b)
        assert repr(got) == repr(want), (what, got, want)
        cases += 1
    assert cases == 2 * (1 + 4 * 6)


def test_an_equality_that_misses_the_last_partial_block_is_caught():
    """Negative control: an equality read up to the last whole block disagrees with numpy."""
    def short(a, b):
        whole = a.size - a.size % equal_kernel.EQUAL_BLOCK
        return equal_kernel.equal_extremes(a[:whole], b[:whole])

    wrong = [what for what, a, b in equal_pairs(np.random.default_rng(53))
             if repr(short(a, b)) != repr(equal_extremes_oracle(a, b))]
    assert wrong and all(f"at {3 * equal_kernel.EQUAL_BLOCK + 4}" in what for what in wrong)
