"""The summing of sparse rows onto their ids in compiled loops (numba), for `sparse_rows`:
bitwise what np.unique and np.add.at into zeros give, in the order the rows came, without
np.add.at's per-element cost or, for `union_rows`, any sort.

Imported only by `sparse_rows`, and only when `compare_engine` has found numba.
"""
import numba
import numpy as np

from verify.judge import kernel_cache
from verify.judge.kernel_cache import readonly

kernel_cache.install()   # before the kernels compile: see kernel_cache


@numba.njit(cache=True)
def _add_rows_in_order(rows, order, segment, out):
    """out[segment[j]] += rows[order[j]] for j in order: each id's rows added one after the
    other in the order they came, in the rows' own dtype, as np.add.at adds them."""
    for j in range(order.size):
        target, source = segment[j], order[j]
        for k in range(rows.shape[1]):
            out[target, k] += rows[source, k]


def summed_rows(ids: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sorted distinct `ids` and their `rows` (2-D, one per id) summed: bitwise what
    np.unique + np.add.at into zeros give, without np.add.at's per-element cost."""
    ids = np.asarray(ids).astype(np.int64).reshape(-1)
    order = np.argsort(ids, kind="stable")            # equal ids keep the order they came
    ordered = ids[order]
    new = np.empty(len(ids), bool)
    new[:1] = True
    np.not_equal(ordered[1:], ordered[:-1], out=new[1:])
    segment = np.cumsum(new) - 1
    distinct = ordered[new]
    out = np.zeros((len(distinct), rows.shape[1]), rows.dtype)
    _add_rows_in_order(readonly(np.ascontiguousarray(rows)), order, segment, out)
    return distinct, out


@numba.njit(cache=True)
def _number_touched(slot, first_ids, second_ids, out_ids):
    """Marks the ids either side touched in `slot` (all -1 on entry), then numbers them in
    increasing id order by one scan of the table's rows: slot[id] becomes the id's place in
    the union, out_ids[place] the id (out_ids: one more entry than there can be ids). Returns
    how many distinct ids there are."""
    for j in range(first_ids.size):
        slot[first_ids[j]] = 0
    for j in range(second_ids.size):
        slot[second_ids[j]] = 0
    count = 0
    for r in range(slot.size):   # without branches: out_ids holds one spare entry
        touched = slot[r] >= 0
        slot[r] = count if touched else -1
        out_ids[count] = r
        count += touched
    return count


@numba.njit(cache=True)
def _accumulate(slot, ids, rows, zero, out):
    """out[slot[ids[j]]] += rows[j] for j in the order given, out's rows starting from zeros:
    each id's rows added one after the other in the rows' own dtype, as np.add.at adds them
    into zeros. A row's first addition is written as `zero + row` (the same operation
    np.add.at does on its zeros: -0.0 gives +0.0) so `out` need not be zeroed first; rows of
    `out` no id reaches are zeroed at the end."""
    width = rows.shape[1]
    written = np.zeros(out.shape[0], np.bool_)
    for j in range(ids.size):
        target = slot[ids[j]]
        if written[target]:
            for k in range(np.uint64(width)):   # unsigned: no wraparound check
                out[target, k] += rows[j, k]
        else:
            written[target] = True
            for k in range(np.uint64(width)):
                out[target, k] = zero + rows[j, k]
    for target in range(out.shape[0]):
        if not written[target]:
            for k in range(np.uint64(width)):
                out[target, k] = zero


def union_rows(cand_ids: np.ndarray, cand_rows: np.ndarray, ref_ids: np.ndarray,
               ref_rows: np.ndarray, table_rows: int):
    """The sorted ids either side touched and each side's rows summed on them: (ids, a, b),
    a[i] and b[i] the candidate's and reference's rows of ids[i] (zeros where a side did not
    touch it), bitwise what np.unique, np.add.at into zeros and the scatter onto the union
    give, with no sort: a table-long slot array numbers the ids (ids must be valid rows).

    >>> ids, a, b = union_rows(np.array([3, 1, 3]), np.ones((3, 2)), np.array([0]),
    ...                        np.full((1, 2), 5.0), 4)
    >>> ids.tolist(), a.tolist(), b.tolist()
    ([0, 1, 3], [[0.0, 0.0], [1.0, 1.0], [2.0, 2.0]], [[5.0, 5.0], [0.0, 0.0], [0.0, 0.0]])
    """
    if cand_rows.dtype != ref_rows.dtype:
        raise TypeError(f"both sides' rows must be of one dtype, got {cand_rows.dtype} and "
                        f"{ref_rows.dtype}: cast one side first")
    cand_ids = np.asarray(cand_ids).astype(np.int64, copy=False).reshape(-1)
    ref_ids = np.asarray(ref_ids).astype(np.int64, copy=False).reshape(-1)
    slot = np.full(table_rows, -1, np.int32)
    touched = np.empty(min(table_rows, cand_ids.size + ref_ids.size) + 1, np.int64)
    cand_ids, ref_ids = readonly(cand_ids), readonly(ref_ids)
    cand_rows = readonly(np.ascontiguousarray(cand_rows))
    ref_rows = readonly(np.ascontiguousarray(ref_rows))
    count = _number_touched(slot, cand_ids, ref_ids, touched)
    width = cand_rows.shape[1]
    # one np.empty for both (filled by _accumulate): numpy asks the kernel for huge pages on
    # large np.empty arrays (not on np.zeros), and one block is reused by the allocator from
    # one call to the next more often than two: about 3x less paid in page faults
    both = np.empty((2, count, width), cand_rows.dtype)
    a, b = both
    _accumulate(slot, cand_ids, cand_rows, cand_rows.dtype.type(0), a)
    _accumulate(slot, ref_ids, ref_rows, ref_rows.dtype.type(0), b)
    return touched[:count], a, b
