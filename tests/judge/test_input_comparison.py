"""Comparing `input` per example (verify.judge.inputs): each kind of difference the model would
train on is named with its example; a layout difference passes and is listed by preflight."""
import numpy as np
import pytest

from verify.core.case import PairSpec, SparseIds
from verify.core.inputs import KEEP_VALUES, RaggedIds, input_batch, input_feature
from verify.core.trace import Trace
from verify.judge.compare import compare_traces
from verify.judge.inputs import compare_inputs
from verify.judge.pair import judge_pair

LISTS = [[4, 2], [], [7, 3, 5], [1], [6, 2], [3]]


def message(candidate_lists, reference_lists=LISTS) -> str:
    return compare_inputs(input_feature(SparseIds.from_lists(candidate_lists)),
                          input_feature(SparseIds.from_lists(reference_lists)))


@pytest.mark.parametrize("lists, expected", [
    ([[4, 2], [], [7, 9, 5], [1], [6, 2], [3]],
     "A different value: 1 of 6 examples differ, first example 2, position 1: candidate 9, "
     "reference 3."),
    ([[4, 2], [], [7, 5], [1], [6, 2], [3]],
     "Dropped ids: 1 of 6 examples differ, first example 2, id 3 dropped: candidate [7, 5], "
     "reference [7, 3, 5]."),
    ([[4, 2], [], [7, 3, 5, 0, 0], [1], [6, 2], [3]],
     "A padding id counted as an id: 1 of 6 examples differ, first example 2, which ends in 2 x "
     "id 0 the reference's does not have: candidate [7, 3, 5, 0, 0], reference [7, 3, 5]."),
    ([[4, 2], [], [7, 3, 5, 8], [1], [6, 2], [3]],
     "Added ids: 1 of 6 examples differ, first example 2, id 8 added: candidate [7, 3, 5, 8], "
     "reference [7, 3, 5]."),
    ([[3], [6, 2], [1], [7, 3, 5], [], [4, 2]],
     "Same examples, other order (a shuffle?): the candidate's examples are the reference's 5, "
     "4, 3, 2, 1, 0, in that order."),
    (LISTS[:4],
     "Other batching: the candidate's batch holds 4 examples, the reference's 6; 4 of the first "
     "4 agree."),
    ([[4, 2], [7, 3, 5], [1], [6, 2], [3], [8]],
     "Other examples: 5 of 6 examples differ, first example 1, which is the reference's example "
     "2; 4 of the 5 that differ are elsewhere in the reference's batch (a shuffle across steps, "
     "or other batching?)."),
    ([[9], [4, 2], [], [7, 3, 5], [1], [6, 2]],
     "Other examples: 6 of 6 examples differ, first example 0; 5 of the 6 that differ are "
     "elsewhere in the reference's batch (a shuffle across steps, or other batching?)."),
])
def test_each_kind_of_difference_is_named_with_its_example(lists, expected):
    assert message(lists) == expected


def test_the_same_examples_in_another_layout_agree():
    ragged = RaggedIds.from_row_splits(np.array([4, 2, 7, 3, 5, 1, 6, 2, 3], np.int32),
                                       [0, 2, 2, 5, 6, 8, 9])
    assert compare_inputs(input_feature(ragged), input_feature(SparseIds.from_lists(LISTS))) == ""


def test_a_large_batch_names_the_example_from_its_digests():
    image = np.zeros((4, KEEP_VALUES), np.float32)
    other = image.copy()
    other[2, 7] = 1.0
    assert compare_inputs(input_feature(other), input_feature(image)) == (
        f"Different examples: 1 of 4 examples differ, first example 2 ({KEEP_VALUES} numbers "
        f"each; the batch is too large for its values to be kept, digests only).")


def traces(reference_batch, candidate_batch):
    reference, candidate = Trace("tf1"), Trace("tf2")
    for trace, batch in ((reference, reference_batch), (candidate, candidate_batch)):
        for name, feature in input_batch(batch).items():
            trace.record(1, "input", name, feature)
        trace.record(1, "loss", "loss", np.float32(0.5))
    return reference, candidate


def test_a_layout_difference_passes_and_preflight_lists_it_as_information():
    label = np.array([[1.0], [0.0]], np.float32)
    reference, candidate = traces({"label": label, "ids": SparseIds.from_lists([[4, 2], [7]])},
                                  {"label": label.ravel(), "ids": RaggedIds.from_row_splits(
                                      np.array([4, 2, 7], np.int32), [0, 2, 3])})
    result = judge_pair(PairSpec("c", "tf1", "tf2"),
                        {"tf1": reference, "tf2": candidate}.__getitem__, None)
    assert result.record.verdict == "PASS"
    found = result.preflight.set_index("key")
    assert set(found["severity"]) == {"informational"}
    assert found.loc["input/label", "rule"].startswith("label: shape (2,) vs (2, 1), same values")
    assert found.loc["input/ids", "rule"].startswith(
        "ids: RaggedTensor int32 (2, None) vs SparseTensor int64 (2, 2), same values")
    assert result.record.preflight == "2 informational"


def test_another_batch_size_is_batching_not_a_layout():
    reference, candidate = traces({"x": np.ones((4, 3), np.float32)},
                                  {"x": np.ones((2, 3), np.float32)})
    result = judge_pair(PairSpec("c", "tf1", "tf2"),
                        {"tf1": reference, "tf2": candidate}.__getitem__, None)
    assert result.preflight.empty
    assert "Other batching: the candidate's batch holds 2 examples, the reference's 4" in (
        result.record.message)


def test_a_different_id_fails_at_input_naming_feature_and_example():
    reference, candidate = traces({"ids": SparseIds.from_lists([[4, 2], [7]])},
                                  {"ids": SparseIds.from_lists([[4, 2], [8]])})
    result = judge_pair(PairSpec("c", "tf1", "tf2"),
                        {"tf1": reference, "tf2": candidate}.__getitem__, None)
    assert result.record.verdict == "FAIL"
    assert (result.record.first_step, result.record.first_quantity,
            result.record.first_tensor) == (1, "input", "ids")
    assert ("input ids: Input differs. A different value: 1 of 2 examples differ, first "
            "example 1: candidate 8, reference 7.") in result.record.message


def test_an_older_trace_digest_against_the_per_example_form_says_to_rewrite_it():
    reference, candidate = traces({"x": np.ones(2)}, {"x": np.ones(2)})
    reference.record(1, "input", "x", "0123456789abcdef")
    rows = compare_traces(reference, candidate)
    reason = rows[rows["quantity"] == "input"]["reason"].iloc[0]
    assert "write the older trace again" in reason


def test_features_keyed_otherwise_name_each_sides_keys_not_the_name_maps():
    # a side whose dataset yields a bare tensor (recorded as 'features') against a dict
    reference, candidate = traces({"x": np.ones((2, 3), np.float32)},
                                  {"features": np.ones((2, 3), np.float32)})
    rows = compare_traces(reference, candidate)
    reasons = " ".join(rows[rows["quantity"] == "input"]["reason"])
    assert "reference: x; candidate: features" in reasons
    assert "the same feature keys" in reasons and "name maps" not in reasons
    # a variable missing on one side still points at the name maps
    reference.record(1, "weight", "dense/bias", np.ones(2, np.float32))
    candidate.record(1, "weight", "dense/kernel", np.ones(2, np.float32))
    rows = compare_traces(reference, candidate)
    assert "check the name maps" in rows[rows["quantity"] == "weight"]["reason"].iloc[0]
