"""Two sparse gradients of one table (`SparseRows`) compared on the rows either side touched,
never densified: each side's rows summed by id onto the union of the ids (by a slot per table
row, compiled in `sparse_rows_kernel`, or by sorting), scanned by `compare_engine`, and the
figures put back in the table's coordinates: the Drift the dense tables give.

Pure numpy: nothing here imports TensorFlow.
"""
from __future__ import annotations

import functools

import numpy as np

from verify.core.tolerances import Tolerance
from verify.core.trace import SparseRows
from verify.judge import compare_engine, kernel_warmup
from verify.judge.drift import Drift, ScanFigures, drift_of_scan


def _summed_rows(sparse: SparseRows) -> tuple[np.ndarray, np.ndarray]:
    """Sorted distinct ids and their rows summed in the order given, as `to_dense` sums them
    (compiled when numba is there: the same sums, without np.add.at's per-element cost)."""
    rows = np.asarray(sparse.rows)
    if (rows.dtype in compare_engine.KERNEL_DTYPES and len(sparse.ids)
            and compare_engine.compiled_scan() is not None):
        from verify.judge.sparse_rows_kernel import summed_rows

        kernel_warmup.ready("summed_rows", rows.dtype)
        ids, summed = summed_rows(sparse.ids, rows.reshape(len(sparse.ids), -1))
        return ids, summed.reshape((len(ids), *sparse.dense_shape[1:]))
    ids, inverse = np.unique(np.asarray(sparse.ids).astype(np.int64), return_inverse=True)
    rows = np.zeros((len(ids), *sparse.dense_shape[1:]), sparse.rows.dtype)
    np.add.at(rows, inverse.reshape(-1), sparse.rows)
    return ids, rows


# A table of up to SLOTS_PER_LOOKUP rows per lookup (both sides' ids) plus SLOTS_ALWAYS rows
# numbers its touched rows with a table-long slot array (`sparse_rows_kernel.union_rows`: 4
# bytes and one scanned slot per table row) instead of sorting each side's ids. Its cost grows
# with the table, the sort's with the lookups: measured with 50K lookups a side of 64 float32, a
# whole comparison takes 13-28 ms by slots against 30-55 ms sorted up to 80 table rows per
# lookup, 63 ms against 32 ms at 160; SLOTS_ALWAYS keeps small gradients of tables up to 1M rows
# (4 MB of slots) on the slots.
SLOTS_PER_LOOKUP = 64
SLOTS_ALWAYS = 1 << 20


def _by_slots(candidate: SparseRows, reference: SparseRows, table_rows: int) -> bool:
    lookups = len(candidate.ids) + len(reference.ids)
    return (candidate.rows.dtype == reference.rows.dtype
            and reference.rows.dtype in compare_engine.KERNEL_DTYPES and table_rows < 2 ** 31
            and table_rows <= SLOTS_PER_LOOKUP * lookups + SLOTS_ALWAYS
            and compare_engine.compiled_scan() is not None)


def _rows_on_union(candidate: SparseRows, reference: SparseRows, table_rows: int,
                   width: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The sorted ids either side touched, and each side's rows summed on them as (ids x
    width) arrays, zeros where a side did not touch an id: by a slot per table row (compiled)
    where `_by_slots`, else by sorting each side's ids; bitwise the same arrays."""
    if _by_slots(candidate, reference, table_rows):
        from verify.judge.sparse_rows_kernel import union_rows

        kernel_warmup.ready("union_rows", reference.rows.dtype)
        return union_rows(candidate.ids, np.asarray(candidate.rows).reshape(-1, width),
                          reference.ids, np.asarray(reference.rows).reshape(-1, width),
                          table_rows)
    cand_ids, cand_rows = _summed_rows(candidate)
    ref_ids, ref_rows = _summed_rows(reference)
    ids = np.union1d(cand_ids, ref_ids)
    dtype = reference.rows.dtype
    a = np.zeros((len(ids), width), dtype)
    b = np.zeros((len(ids), width), dtype)
    a[np.searchsorted(ids, cand_ids)] = cand_rows.reshape(len(cand_ids), width)
    b[np.searchsorted(ids, ref_ids)] = ref_rows.reshape(len(ref_ids), width)
    return ids, a, b


def compare_sparse_rows(candidate: SparseRows, reference: SparseRows,
                        tol: Tolerance) -> Drift:
    """Two valid sparse gradients of one table (float or complex rows), compared on the rows
    either side touched: the Drift the dense tables give. A row touched on one side only
    compares against zeros; rows neither touched are zeros on both sides, stand in for the
    argmax ties at the first of them, and add nothing to the norms (tables of up to
    KERNEL_ABOVE elements keep np.linalg.norm's figure over full-length vectors).

    >>> ref = SparseRows(np.array([5, 1, 5]), np.ones((3, 4), np.float32), (10, 4))
    >>> cand = SparseRows(np.array([1, 5, 2]), np.ones((3, 4), np.float32), (10, 4))
    >>> d = compare_sparse_rows(cand, ref, Tolerance(1e-6, 1e-5))
    >>> d.passed, d.worst_index, d.reason[:36]
    (False, '(2, 0)', 'Mismatched elements: 8 / 40 (20.0%).')
    """
    shape = tuple(reference.dense_shape)
    size = int(np.prod(shape))
    width = size // shape[0]
    ids, a, b = _rows_on_union(candidate, reference, shape[0], width)
    dtype = reference.rows.dtype
    flat_a, flat_b = a.reshape(-1), b.reshape(-1)
    wide = np.complex128 if dtype.kind == "c" else np.float64
    untouched = len(ids) < shape[0]
    floor = np.nan
    kernel = compare_engine.kernel_for(dtype, size, tol)
    if kernel is not None and tol.floor is not None and flat_b.size:
        # the floor found in the scan's read: the untouched rows' zeros change no max |y|
        floor, scan, squares = compare_engine.capped_kernel_scan(kernel, flat_a, flat_b, tol)
        norms = functools.partial(compare_engine.norms_of_squares, squares)
    else:
        if tol.floor is not None:
            floor = _table_floor(tol, flat_b, wide, kernel, untouched)
        scan, norms = _scan_rows(kernel, flat_a, flat_b, tol, floor, ids, shape, wide)
    _to_table_indices(scan, ids, width)
    if untouched and not scan.nonfinite:
        _offer_first_untouched(scan, ids, width, tol, floor)
    return drift_of_scan(scan, tol, floor, norms, shape, size)


def _scan_rows(kernel, flat_a: np.ndarray, flat_b: np.ndarray, tol: Tolerance, floor: float,
               ids: np.ndarray, shape: tuple, wide) -> tuple:
    """The scan of the touched rows (flat_a against flat_b) by the kernel, if any, else by
    numpy, and `norms()`: the L2 norms of the reference and |diff| over the whole table."""
    if kernel is not None:
        scan, squares = compare_engine.kernel_scan(kernel, flat_a, flat_b, tol, floor)
        return scan, lambda: compare_engine.norms_of_squares(squares)
    ref_part, diff_part = np.empty(flat_a.size, wide), np.empty(flat_a.size, np.float64)
    scan = compare_engine.scan_in_chunks(flat_a, flat_b, tol, floor, ref_part, diff_part)
    return scan, lambda: _table_norms(ref_part, diff_part, ids, shape, wide)


def _table_floor(tol: Tolerance, flat_b: np.ndarray, wide, kernel, untouched: bool) -> float:
    """The noise floor of the whole table from the touched rows of its reference: the rows
    neither side touched are zeros."""
    scale_max = compare_engine.reference_scale(flat_b, wide, kernel) if flat_b.size else None
    if untouched:
        scale_max = np.float64(0.0) if scale_max is None else max(scale_max, np.float64(0.0))
    return compare_engine.noise_floor(tol, scale_max)


def _to_table_indices(scan: ScanFigures, ids: np.ndarray, width: int) -> None:
    """The scan's flat indices into the touched rows stacked (row k is table row ids[k]) made
    flat indices into the table."""
    def dense_index(k: int) -> int:
        return int(ids[k // width]) * width + k % width

    if scan.first_bad is not None:
        at, cand, ref = scan.first_bad
        scan.first_bad = (dense_index(at), cand, ref)
    for running in scan.maxima():
        if running.value is not None:
            running.index = dense_index(running.index)


def _offer_first_untouched(scan: ScanFigures, ids: np.ndarray, width: int, tol: Tolerance,
                           floor: float) -> None:
    """Offers the scan the figures of the first element of the first row neither side touched:
    0 against 0, standing in for every untouched element (the argmax ties at the first)."""
    # ids are sorted and distinct: the first k with ids[k] != k, else len(ids)
    first = int(np.flatnonzero(np.append(ids != np.arange(len(ids)), True))[0])
    at = first * width
    own = tol.atol + tol.rtol * np.zeros(1)
    allowed = own if tol.floor is None else np.minimum(own, tol.multiple * floor)
    with np.errstate(divide="ignore", invalid="ignore"):
        times = np.where(allowed > 0, 0.0 / allowed, 0.0)
    zero = np.float64(0.0)
    for running, value in ((scan.abs_max, zero), (scan.rel_max, zero),
                           (scan.tight_max, zero), (scan.excess_max, (0.0 - allowed)[0]),
                           (scan.times_max, times[0])):
        running.offer(value, at)
    if tol.floor is not None:
        scan.own_max = own[0] if scan.own_max is None else max(scan.own_max, own[0])
        scan.below_floor = scan.below_floor or bool(own[0] < floor)


def _table_norms(ref_part: np.ndarray, diff_part: np.ndarray, ids: np.ndarray, shape: tuple,
                 wide) -> tuple:
    """The L2 norms of the reference and |diff| over the whole table, from the touched rows'
    parts the numpy path filled (ref_part, diff_part)."""
    size = int(np.prod(shape))
    width = size // shape[0]
    if size > compare_engine.KERNEL_ABOVE:   # the untouched rows' zeros add nothing
        return np.linalg.norm(ref_part), np.linalg.norm(diff_part)
    # small tables: np.linalg.norm's own figure over the whole table, as densified
    ref_all, diff_all = np.zeros(size, wide), np.zeros(size, np.float64)
    ref_all.reshape(shape[0], width)[ids] = ref_part.reshape(len(ids), width)
    diff_all.reshape(shape[0], width)[ids] = diff_part.reshape(len(ids), width)
    return np.linalg.norm(ref_all), np.linalg.norm(diff_all)
