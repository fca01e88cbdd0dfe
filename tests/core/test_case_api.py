"""The case API refuses malformed cases with messages that say what to fix."""
import numpy as np
import pytest

from verify.core.case import Case, Examples, Expectation, Implementation, SparseIds
from verify.core.names import NameMap


def impl(name, **kw):
    return Implementation(name, runner=None, names=NameMap({"w": "w"}), **kw)


def case(**kw):
    args = dict(name="c", examples=Examples({"x": np.zeros((4, 2))}, np.zeros(4)), batch_size=2,
                steps=2, initial_values={"w": np.zeros(2)},
                implementations=(impl("a"), impl("b")), reference="a")
    args.update(kw)
    return Case(**args)


def test_default_pairs_are_every_implementation_against_the_reference():
    assert case(implementations=(impl("a"), impl("b"), impl("c"))).all_pairs() == [
        ("a", "b"), ("a", "c")]


def test_malformed_cases_are_refused():
    with pytest.raises(ValueError, match="reference 'z' is not one of"):
        case(reference="z")
    with pytest.raises(ValueError, match="names repeat"):
        case(implementations=(impl("a"), impl("a")))
    with pytest.raises(ValueError, match="pair \\(a, q\\) names 'q'"):
        case(pairs=(("a", "q"),))
    with pytest.raises(ValueError, match="one example count"):
        Examples({"x": np.zeros((4, 2))}, np.zeros(3))
    with pytest.raises(ValueError, match="quantity 'losss'"):
        Expectation(1, "losss", why="typo")


def test_sparse_ids_keep_empty_rows():
    s = SparseIds.from_lists([[], [4, 2]], width=3)
    assert s.dense_shape == (2, 3) and s.indices.tolist() == [[1, 0], [1, 1]]
    assert len(s) == 2
