"""The canonical per-example input form (verify.core.inputs): the same examples in another
layout give the same digests; anything the model would train on differently does not."""
import numpy as np
import pytest

from verify.core.case import SparseIds
from verify.core.inputs import KEEP_VALUES, RaggedIds, input_batch, input_feature

LISTS = [[4, 2], [], [7, 3, 5], [1]]


def same(a, b) -> bool:
    return a.digests.tolist() == b.digests.tolist() and a.lengths.tolist() == b.lengths.tolist()


def layouts_of(lists):
    """The same ids as SparseTensor (int64, int32, wider), RaggedTensor and dense with a mask."""
    sparse = SparseIds.from_lists(lists, width=5)
    width = max(len(ids) for ids in lists)
    padded = np.zeros((len(lists), width), np.int32)
    mask = np.zeros((len(lists), width), np.float32)
    for row, ids in enumerate(lists):
        padded[row, :len(ids)], mask[row, :len(ids)] = ids, 1.0
    splits = np.cumsum([0] + [len(ids) for ids in lists])
    return {"sparse int64": sparse,
            "sparse int32": SparseIds(sparse.indices.astype(np.int32),
                                      sparse.values.astype(np.int32), (len(lists), 9)),
            "ragged int32": RaggedIds.from_row_splits(sparse.values.astype(np.int32), splits),
            "masked": RaggedIds.from_mask(padded, mask)}


def test_sparse_ragged_and_masked_ids_of_the_same_examples_are_equal():
    features = {name: input_feature(value) for name, value in layouts_of(LISTS).items()}
    reference = features.pop("sparse int64")
    for name, feature in features.items():
        assert same(feature, reference), name
        assert feature.values.tolist() == reference.values.tolist()
    assert {f.layout for f in features.values()} == {
        "SparseTensor int32 (4, 9)", "RaggedTensor int32 (4, None)",
        "dense int32 (4, 3) with a 0/1 mask"}


@pytest.mark.parametrize("other", [
    [[4, 2], [], [7, 3], [1]],            # an id dropped
    [[4, 2], [], [7, 3, 5, 0], [1]],      # a padding id counted as an id
    [[4, 2], [], [7, 5, 3], [1]],         # the same ids in another order within an example
    [[4, 2], [], [7, 3, 6], [1]],         # another id
    [[4, 2], [7, 3, 5], [], [1]],         # two examples swapped
    [[4, 2], [], [7, 3, 5]],              # an example fewer
])
def test_what_the_model_would_train_on_differently_is_not_equal(other):
    assert not same(input_feature(SparseIds.from_lists(other)),
                    input_feature(SparseIds.from_lists(LISTS)))


def test_unit_dimensions_and_number_widths_are_layout():
    label = np.array([[1.0], [0.0], [1.0]], np.float32)
    for other in (label.ravel(), label.astype(np.float64), label.astype(np.int32).ravel(),
                  label.astype(bool), label.reshape(3, 1, 1)):
        assert same(input_feature(other), input_feature(label)), other.dtype
    assert not same(input_feature(label[[1, 0, 2]]), input_feature(label))


def test_a_dense_feature_is_each_examples_values_in_order():
    dense = np.arange(6, dtype=np.float32).reshape(3, 2)
    assert same(input_feature(SparseIds.from_lists(dense.astype(int).tolist())),
                input_feature(dense))
    assert not same(input_feature(dense[:, ::-1]), input_feature(dense))
    assert input_feature(dense).example(2).tolist() == [4.0, 5.0]


def test_numbers_equal_only_where_exactly_representable():
    a = input_feature(np.array([0.1], np.float32))
    assert not same(a, input_feature(np.array([0.1], np.float64)))
    assert same(a, input_feature(np.array([np.float32(0.1)], np.float64)))
    big = np.array([2 ** 60, 2 ** 60 + 1], np.int64)    # beyond float64's integers
    assert not same(input_feature(big[:1]), input_feature(big[1:]))
    assert same(input_feature(np.array([-0.0])), input_feature(np.array([0.0])))


def test_unsorted_sparse_indices_are_read_in_row_major_order():
    ordered = SparseIds.from_lists(LISTS)
    order = np.array([3, 0, 5, 1, 4, 2])
    shuffled = SparseIds(ordered.indices[order], ordered.values[order], ordered.dense_shape)
    assert same(input_feature(shuffled), input_feature(ordered))


def test_a_ragged_value_with_deeper_dimensions_is_flattened_per_example():
    class Ragged:      # tf.compat.v1.ragged.RaggedTensorValue's shape, without TensorFlow
        def __init__(self, values, row_splits):
            self.values, self.row_splits = values, np.asarray(row_splits)

    nested = Ragged(Ragged(np.array([4, 2, 7, 3, 5, 1]), [0, 2, 2, 5, 6]), [0, 1, 2, 4])
    assert input_feature(nested).lengths.tolist() == [2, 0, 4]
    assert input_feature(nested).values.tolist() == [4, 2, 7, 3, 5, 1]


def test_large_batches_keep_digests_and_lengths_only():
    image = np.zeros((2, KEEP_VALUES), np.float32)
    feature = input_feature(image)
    assert feature.values is None and feature.example(0) is None
    assert feature.lengths.tolist() == [KEEP_VALUES] * 2
    assert input_feature(image[:1]).values is not None


def test_text_features_compare_by_content():
    a = input_batch({"q": np.array([b"shoes", b"hat"])})["q"]
    assert same(a, input_feature(np.array(["shoes", "hat"])))
    assert not same(a, input_feature(np.array([b"hat", b"shoes"])))
