"""The batch a step consumed, in the canonical per-example form a trace keeps as `input`.

Pipelines lay the same examples out differently: a label of shape (8,) or (8, 1), ids as int32
or int64, variable-length ids as a `tf.SparseTensor`, a `tf.RaggedTensor` or a dense array
padded beside a 0/1 mask. The model trains on the same thing: per example and feature, an
ordered list of numbers. `input_feature` brings one feature of a batch to that form:

- a dense feature's list is its example's values in C order, so unit dimensions ((8,) against
  (8, 1)) are layout; a sparse, ragged or masked feature's list is its example's ids in their
  order (as the combiner sees them), so the padded width and column positions are layout;
- numbers compare as numbers: int32 3, int64 3 and float32 3.0 are equal (float64 holds every
  float32 and every integer up to 2**53 exactly); float32 0.1 and float64 0.1 are not;
- each example gets a 64-bit digest of its list, and the lists themselves are kept for batches
  of up to `KEEP_VALUES` numbers, so a difference can name both values (`verify.judge.inputs`).

How the pipeline laid the feature out is kept beside it (`layout`): a layout difference the
canonical form removes is reported as information, never as a failure.

>>> a = input_feature(np.array([[1], [0]], np.int32))
>>> b = input_feature(np.array([1.0, 0.0], np.float32))
>>> bool((a.digests == b.digests).all()), a.layout, b.layout
(True, 'int32 (2, 1)', 'float32 (2,)')
"""
from __future__ import annotations

import dataclasses
import hashlib
from typing import Any, Mapping

import numpy as np

# A feature's numbers are kept beside their digests up to this many per step (8 bytes each);
# a larger batch (images) keeps digests and list lengths only.
KEEP_VALUES = 1 << 14
EXACT_INTEGERS = 2 ** 53           # every integer up to this is exactly a float64

_INT_SALT = np.uint64(0xD6E8FEB86659FD93)   # an int64 word is never a float64's bits


@dataclasses.dataclass(frozen=True)
class RaggedIds:
    """Variable-length ids per example as the host receives them from a `tf.RaggedTensor` (or a
    dense array padded beside a 0/1 mask): the ids in example order and each example's count.

    >>> ids = RaggedIds.from_mask(np.array([[4, 2], [7, 0]]), np.array([[1, 1], [1, 0]]))
    >>> ids.values.tolist(), ids.row_lengths.tolist(), ids.layout
    ([4, 2, 7], [2, 1], 'dense int64 (2, 2) with a 0/1 mask')
    """

    values: np.ndarray
    row_lengths: np.ndarray
    layout: str = ""

    @classmethod
    def from_row_splits(cls, values, row_splits) -> "RaggedIds":
        values, splits = np.asarray(values), np.asarray(row_splits, np.int64)
        return cls(values, np.diff(splits), f"RaggedTensor {values.dtype} "
                                            f"({len(splits) - 1}, None)")

    @classmethod
    def from_mask(cls, ids, mask) -> "RaggedIds":
        ids, mask = np.asarray(ids), np.asarray(mask) != 0
        return cls(ids[mask], mask.reshape(len(ids), -1).sum(axis=1).astype(np.int64),
                   f"dense {ids.dtype} {ids.shape} with a 0/1 mask")

    @classmethod
    def concat(cls, parts: list["RaggedIds"]) -> "RaggedIds":
        """The replicas' parts as one global batch, in replica order."""
        lengths = np.concatenate([p.row_lengths for p in parts])
        layout = parts[0].layout.replace(f"({len(parts[0].row_lengths)},",
                                         f"({len(lengths)},", 1)
        return cls(np.concatenate([p.values for p in parts]), lengths, layout)


@dataclasses.dataclass(frozen=True, eq=False)
class InputFeature:
    """One feature of a step's batch in canonical form: per example a digest of its list of
    numbers (`digests`, uint64) and the list's length (`lengths`); the lists themselves
    (`values`, flat, float64, or int64 for integers beyond 2**53) when the batch holds at most
    KEEP_VALUES numbers, else None; `layout` says how the pipeline laid the feature out.

    >>> f = input_feature(np.array([[0.5, 2.0], [1.0, 3.0]], np.float32))
    >>> f.lengths.tolist(), f.examples(), f.example(1).tolist()
    ([2, 2], 2, [1.0, 3.0])
    """

    digests: np.ndarray
    lengths: np.ndarray
    values: np.ndarray | None
    layout: str

    def examples(self) -> int:
        return len(self.digests)

    def __eq__(self, other) -> bool:
        """The same examples, laid out the same way."""
        if not isinstance(other, InputFeature):
            return NotImplemented
        return (self.layout == other.layout and np.array_equal(self.digests, other.digests)
                and np.array_equal(self.lengths, other.lengths))

    __hash__ = None

    def example(self, index: int) -> np.ndarray | None:
        """Example `index`'s list of numbers (None when the values were not kept)."""
        if self.values is None:
            return None
        start = int(self.lengths[:index].sum())
        return self.values[start:start + int(self.lengths[index])]

    def arrays(self) -> dict[str, np.ndarray]:
        """The arrays a trace file stores (`from_arrays` reads them back)."""
        kept = {} if self.values is None else {"values": self.values}
        return {"digests": self.digests, "lengths": self.lengths, **kept}

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, np.ndarray], layout: str) -> "InputFeature":
        return cls(np.asarray(arrays["digests"], np.uint64),
                   np.asarray(arrays["lengths"], np.int64),
                   None if arrays.get("values") is None else np.asarray(arrays["values"]),
                   layout)


def input_batch(batch: Mapping[str, Any]) -> dict[str, InputFeature]:
    """Every feature of a batch (name -> dense array, sparse ids, `RaggedIds`) in canonical
    form (`input_feature`)."""
    return {name: input_feature(value) for name, value in batch.items()}


def input_feature(value: Any) -> InputFeature:
    """One feature of a batch in canonical form: a dense array (examples first), sparse ids
    (anything with `indices`, `values` and `dense_shape`, e.g. `tf.compat.v1.SparseTensorValue`
    or `verify.SparseIds`) or `RaggedIds`.

    >>> from verify.core.case import SparseIds
    >>> sparse = input_feature(SparseIds.from_lists([[4, 2], [], [7]], width=5))
    >>> ragged = input_feature(RaggedIds.from_row_splits(np.array([4, 2, 7], np.int32), [0, 2, 2, 3]))
    >>> bool((sparse.digests == ragged.digests).all()), sparse.layout, ragged.layout
    (True, 'SparseTensor int64 (3, 5)', 'RaggedTensor int32 (3, None)')
    """
    if hasattr(value, "row_splits") and hasattr(value, "values"):   # a RaggedTensorValue
        value = _ragged_ids(value)
    if isinstance(value, RaggedIds):
        return _lists(value.values, value.row_lengths, value.layout)
    if hasattr(value, "indices") and hasattr(value, "values"):
        indices = np.asarray(value.indices, np.int64)
        shape = tuple(int(d) for d in np.asarray(value.dense_shape).ravel())
        indices = indices.reshape(-1, max(len(shape), 1))
        ids = np.asarray(value.values).ravel()
        if len(ids) > 1 and not _row_major(indices):
            order = np.lexsort(indices.T[::-1])
            indices, ids = indices[order], ids[order]
        lengths = np.bincount(indices[:, 0], minlength=shape[0] if shape else 0)
        return _lists(ids, lengths.astype(np.int64), f"SparseTensor {ids.dtype} {shape}")
    array = np.asarray(value)
    if array.ndim == 0:
        array = array.reshape(1)
    count = len(array)
    width = int(np.prod(array.shape[1:], dtype=np.int64))
    return _lists(array.reshape(count * width), np.full(count, width, np.int64),
                  f"{array.dtype} {array.shape}", width)


def _ragged_ids(value) -> RaggedIds:
    """A ragged value's ids per example over its first dimension (its deeper ragged or dense
    dimensions flattened into each example's list)."""
    splits, flat = np.asarray(value.row_splits, np.int64), value.values
    while hasattr(flat, "row_splits"):
        splits, flat = np.asarray(flat.row_splits, np.int64)[splits], flat.values
    flat = np.asarray(flat)
    width = int(np.prod(flat.shape[1:], dtype=np.int64))
    return RaggedIds.from_row_splits(flat.reshape(-1), splits * width)


def _row_major(indices: np.ndarray) -> bool:
    """Whether sparse indices are in row-major order already (as tf.SparseTensor keeps them)."""
    rows = indices[:, 0]
    if (np.diff(rows) < 0).any():
        return False
    if indices.shape[1] < 2:
        return True
    same_row = np.diff(rows) == 0
    return not (same_row & (np.diff(indices[:, 1]) <= 0)).any()


def _lists(flat: np.ndarray, lengths: np.ndarray, layout: str,
           width: int | None = None) -> InputFeature:
    """Per-example digests of the lists `flat` holds, `lengths[i]` numbers for example i (all
    `width` long for a dense feature): each number's 64 bits mixed, times a key of its position
    in its list, summed per example (modulo 2**64), the sum mixed with the list's length. Few
    numpy calls, whatever the batch: a step's batch costs about as little as its fetch."""
    numbers = canonical_numbers(flat)
    words = numbers.view(np.uint64)
    if numbers.dtype == np.int64:
        words = words ^ _INT_SALT
    element = words ^ (words >> np.uint64(29))
    element *= _K1
    element ^= element >> np.uint64(32)
    count = len(lengths)
    if width is not None:          # a dense feature: every list is `width` long
        sums = (element.reshape(count, width) * _position_keys(width)).sum(axis=1,
                                                                             dtype=np.uint64)
    else:
        starts = np.zeros(count + 1, np.int64)
        np.cumsum(lengths, out=starts[1:])
        position = np.arange(len(element)) - np.repeat(starts[:-1], lengths)
        element *= _position_keys(int(lengths.max(initial=0)))[position]
        total = np.zeros(len(element) + 1, np.uint64)
        np.cumsum(element, dtype=np.uint64, out=total[1:])
        sums = total[starts[1:]] - total[starts[:-1]]
    digests = sums ^ (lengths.astype(np.uint64) * _K2)
    digests *= _K3
    digests ^= digests >> np.uint64(31)
    return InputFeature(digests, lengths.astype(np.int64, copy=False),
                        numbers if len(numbers) <= KEEP_VALUES else None, layout)


def canonical_numbers(array: np.ndarray) -> np.ndarray:
    """An array's numbers as float64 when each is exactly one (every float, bool and integer up
    to 2**53), else as int64; text as a 64-bit hash of each element.

    >>> canonical_numbers(np.array([3, -0], np.int32)).tolist()
    [3.0, 0.0]
    >>> canonical_numbers(np.array([2**60], np.int64)).dtype
    dtype('int64')
    """
    kind = array.dtype.kind
    if kind == "f":
        return array.astype(np.float64) + 0.0          # -0.0 is 0.0
    if kind == "b" or kind in "iu" and array.dtype.itemsize <= 4:
        return array.astype(np.float64)
    if kind in "iu":
        if not array.size or max(-int(array.min()), int(array.max())) <= EXACT_INTEGERS:
            return array.astype(np.float64)
        return array.astype(np.int64)
    text = [bytes(v) if isinstance(v, (bytes, bytearray)) else str(v).encode()
            for v in array.ravel().tolist()]
    return np.array([int.from_bytes(hashlib.blake2b(t, digest_size=8).digest(), "little",
                                    signed=True) for t in text], np.int64)


_K1, _K2, _K3 = (np.uint64(k) for k in (0xBF58476D1CE4E5B9, 0x94D049BB133111EB,
                                         0x9E3779B97F4A7C15))
_keys = np.zeros(0, np.uint64)


def _position_keys(count: int) -> np.ndarray:
    """An odd 64-bit key per position in a list (splitmix64 of the position, fixed arithmetic:
    the same in every process and numpy version), for at least `count` positions."""
    global _keys
    keys = _keys
    if len(keys) < count:
        x = np.arange(max(count, 2 * len(keys), 64), dtype=np.uint64) + _K3
        x ^= x >> np.uint64(30)
        x *= _K1
        x ^= x >> np.uint64(27)
        x *= _K2
        x ^= x >> np.uint64(31)
        keys = x | np.uint64(1)
        keys.flags.writeable = False
        _keys = keys           # one reference swapped: safe for the taps' threads
    return keys[:count]
