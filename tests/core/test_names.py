"""Name maps: transforms round-trip, and a wrong map names what does not match."""
import numpy as np
import pytest

from verify.core.names import (Mapped, NameMap, NameMapError, PermuteRows, Reshape, Transpose)
from verify.runners.run import canonicalize
from verify.core.case import Implementation
from verify.core.trace import SparseRows, Trace


@pytest.mark.parametrize("transform, shape", [
    (PermuteRows((2, 0, 1)), (3, 4)), (Transpose(), (3, 4)), (Reshape((12,), (3, 4)), (3, 4))])
def test_transforms_round_trip(transform, shape):
    native = np.arange(12, dtype=np.float32).reshape(shape)
    assert np.array_equal(transform.to_native(transform.to_canonical(native)), native)


def test_swap_blocks_maps_dense_first_kernel_to_embedding_first_layout():
    tf2_kernel = np.array([[10], [11], [0], [1], [2]])    # rows: dense(2), embedding(3)
    canonical = PermuteRows.swap_blocks(2, 3).to_canonical(tf2_kernel)
    assert canonical.ravel().tolist() == [0, 1, 2, 10, 11]  # embedding(3), dense(2)


def test_permutation_must_be_a_permutation_and_fit_the_tensor():
    with pytest.raises(ValueError, match="permutation"):
        PermuteRows((0, 0, 1))
    with pytest.raises(ValueError, match="3 rows applied to a tensor of shape"):
        PermuteRows((0, 1, 2)).to_canonical(np.zeros((4, 1)))


def test_check_against_lists_unmatched_names_on_each_side_and_wrong_shapes():
    names = NameMap({"dense/kernel": "dense/kernel", "dense/bias": "dense/biass",
                     "table": "emb/table"})
    with pytest.raises(NameMapError) as e:
        names.check_against({"dense/kernel": (3, 1), "dense/bias": (1,), "emb/table": (5, 2)},
                            {"dense/kernel": (4, 1), "dense/bias": (1,), "table": (5, 2)}, "tf2")
    message = str(e.value)
    assert "mapped but not variables of tf2: ['dense/biass']" in message
    assert "variables of tf2 that no canonical name maps to: ['dense/bias']" in message
    assert "'dense/kernel' <- 'dense/kernel': shape (3, 1)" in message


def test_check_against_accepts_a_fitting_map_and_only_that():
    names = NameMap({"k": Mapped("dense/kernel", Transpose())})
    assert names.check_against({"dense/kernel": (2, 3)}, {"k": (3, 2)}, "tf2") is None
    with pytest.raises(NameMapError, match=r"shape \(2, 3\) after the transform"):
        NameMap({"k": "dense/kernel"}).check_against({"dense/kernel": (2, 3)}, {"k": (3, 2)},
                                                     "tf2")


def test_two_canonical_names_for_one_variable_are_refused():
    with pytest.raises(NameMapError, match="several canonical names"):
        NameMap({"a": "x", "b": "x"})


def test_missing_initial_value_is_named():
    with pytest.raises(NameMapError, match=r"no initial value for \['b'\]"):
        NameMap({"a": "x", "b": "y"}).to_native({"a": np.zeros(1)})


def test_canonicalize_renames_transforms_and_names_slots():
    impl = Implementation("tf2", runner=None, names=NameMap({
        "k": Mapped("dense/kernel", PermuteRows((1, 0))), "t": "table"}),
        slot_names={"accumulator": "acc"})
    native = Trace("tf2")
    native.record(1, "weight", "dense/kernel", np.array([[1.0], [2.0]], np.float32))
    native.record(1, "slot", "dense/kernel::accumulator", np.array([[3.0], [4.0]], np.float32))
    native.record(1, "grad", "table", SparseRows(np.array([1]), np.ones((1, 2)), (3, 2)))
    native.record(1, "loss", "loss", np.float32(1))
    out = canonicalize(native, impl)
    assert out.get(1, "weight", "k").ravel().tolist() == [2.0, 1.0]
    assert out.get(1, "slot", "k/acc").ravel().tolist() == [4.0, 3.0]
    assert isinstance(out.get(1, "grad", "t"), SparseRows)
    native.record(1, "weight", "stray", np.zeros(1))
    with pytest.raises(NameMapError, match="stray"):
        canonicalize(native, impl)
