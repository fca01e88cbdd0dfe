"""The host side of a layer replay: calls named by their canonical variables, replicas and
repeated calls joined along the batch axis, permuted inputs, several output tensors."""
import numpy as np
import pytest

from verify.core.layer_capture import LayerCall, LayerRecorder, layer_name
from verify.core.names import Mapped, NameMap, PermuteRows

NAMES = NameMap({"dense/kernel": Mapped("d/kernel", PermuteRows((2, 0, 1))),
                 "dense/bias": "d/bias", "embedding/items": "t/items"})


def recorder_with(values_by_replica, calls, step=1):
    recorder = LayerRecorder(step)
    for index, call in calls.items():
        recorder.describe(index, call)
    recorder.take(step, values_by_replica)
    return recorder


def test_layers_are_named_by_their_canonical_variables_in_call_order():
    calls = {0: LayerCall("TPUEmbedding", "emb", ("t/items",)),
             1: LayerCall("Dense", "d", ("d/kernel", "d/bias"), fed_by="Concatenate"),
             2: LayerCall("MeanSquaredError", "mse", (), loss=True)}
    values = {"0:output": np.ones((2, 4)), "1:input": np.arange(6.0).reshape(2, 3),
              "1:output": np.ones((2, 1)), "2:per-example loss": np.ones(2)}
    capture = recorder_with({0: values}, calls).capture(NAMES)
    assert [(e.layer, e.kind, e.fed_by) for e in capture.entries] == [
        ("embedding/items", "output", ""), ("dense", "input", "Concatenate"),
        ("dense", "output", ""), ("loss", "per-example loss", "")]


def test_an_input_meeting_a_permuted_kernel_is_permuted_on_its_last_axis():
    calls = {0: LayerCall("Dense", "d", ("d/kernel", "d/bias"))}
    native = np.array([[10.0, 11.0, 12.0]])
    grads = np.array([[1.0, 2.0, 3.0]])
    capture = recorder_with({0: {"0:input": native, "0:input:grad": grads}}, calls).capture(NAMES)
    entry = capture.entries[0]
    assert entry.forward.tolist() == [[12.0, 10.0, 11.0]]     # canonical i = native order[i]
    assert entry.backward.tolist() == [[3.0, 1.0, 2.0]]


def test_replicas_then_repeated_calls_are_joined_along_the_batch_axis():
    calls = {0: LayerCall("Dense", "d", ("d/bias",)), 1: LayerCall("Dense", "d", ("d/bias",))}
    by_replica = {r: {"0:output": np.full((1, 1), 10 * r + 0.0),
                      "1:output": np.full((1, 1), 10 * r + 1.0)} for r in (0, 1)}
    names = NameMap({"dense/bias": "d/bias"})
    entry = recorder_with(by_replica, calls).capture(names).entries[0]
    # call 0 of replicas 0 and 1, then call 1 of both: the chunks of one global batch in order
    assert entry.forward[:, 0].tolist() == [0.0, 10.0, 1.0, 11.0]
    assert entry.backward is None   # no gradient was sent


def test_an_output_of_several_tensors_is_one_entry_per_feature():
    """A tfrs layer's dict by feature: each tensor with its own gradient; a feature-column
    layer's concatenation: its features' tensors, its one gradient split by their widths in
    the order it concatenated them."""
    tfrs = {0: LayerCall("TPUEmbedding", "emb", ("t/items",))}
    values = {"0:output#user": np.zeros((2, 2)), "0:output#item": np.ones((2, 3)),
              "0:output#user:grad": np.full((2, 2), 5.0), "0:output#item:grad": np.ones((2, 3))}
    entries = recorder_with({0: values}, tfrs).capture(NAMES).entries
    assert [(e.part, e.forward.shape, e.backward[0, 0]) for e in entries] == [
        ("item", (2, 3), 1.0), ("user", (2, 2), 5.0)]
    tf1 = {0: LayerCall("DenseFeatures", "df", ("t/items",), parts=("user", "item"))}
    values = {"0:output": np.zeros((2, 5)), "0:output#user": np.zeros((2, 2)),
              "0:output#item": np.ones((2, 3)),
              "0:output:grad": np.array([[5.0, 5.0, 1.0, 1.0, 1.0]] * 2)}
    entries = recorder_with({0: values}, tf1).capture(NAMES).entries
    assert [(e.part, e.forward.shape, e.backward.tolist()[0]) for e in entries] == [
        ("item", (2, 3), [1.0, 1.0, 1.0]), ("user", (2, 2), [5.0, 5.0])]


def test_only_the_step_asked_for_is_kept_and_a_missing_step_says_so():
    recorder = LayerRecorder(2)
    recorder.describe(0, LayerCall("Dense", "d", ("d/bias",)))
    recorder.take(1, {0: {"0:output": np.ones(1)}})
    with pytest.raises(RuntimeError, match="saw no step 2"):
        recorder.capture(NameMap({"dense/bias": "d/bias"}))
    recorder.take(2, {0: {"0:output": np.zeros(1)}})
    assert recorder.capture(NameMap({"dense/bias": "d/bias"})).entries[0].forward.tolist() == [0.0]
    with pytest.raises(ValueError, match="training step"):
        LayerRecorder(0)


def test_variable_free_layers_are_listed_unless_observed_as_an_input():
    recorder = LayerRecorder(1)
    recorder.not_compared("Flatten flatten", "no variables")
    recorder.not_compared("Concatenate concatenate", "no variables")
    recorder.observed_as_input("Concatenate concatenate")
    recorder.take(1, {0: {}})
    assert recorder.capture(NAMES).unobserved == ("Flatten flatten (no variables)",)


def test_a_layer_name_is_the_common_path_of_its_variables():
    assert layer_name(["conv1/kernel", "conv1/bias"]) == "conv1"
    assert layer_name(["tower/dense/kernel", "tower/dense/bias"]) == "tower/dense"
    assert layer_name(["a/x", "b/y"]) == "a/x, b/y"
