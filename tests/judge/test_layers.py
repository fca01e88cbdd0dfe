"""Naming the first divergent layer of a replayed step: forward first, then the loss, then the
gradients last layer first, then what came after the backward pass. Each naming is shown on a
deliberately wrong side (the negative control) and not on a faithful one."""
import math

import numpy as np

from verify.core.layer_capture import LayerCapture, ObservedLayer
from verify.core.tolerances import Tolerances
from verify.judge.layers import compare_layers, layer_rows

TOLERANCES = Tolerances.default()


def model(embedding=1.0, dense_input=1.0, output=1.0, per_example=1.0, grad=1.0,
          loss_class="MeanSquaredError"):
    """A two-layer model's replayed step; each argument scales one value (1.0: faithful)."""
    def entry(order, layer, kind, cls, value, fed_by=""):
        value = np.linspace(0.5, 1.5, 8).reshape(4, 2) * value
        return ObservedLayer(layer, kind, order, cls, fed_by, value, value * 0.1 * grad)

    return LayerCapture(1, (
        entry(0, "embedding/items", "output", "TPUEmbedding", embedding),
        entry(1, "dense", "input", "Dense", dense_input, fed_by="Concatenate"),
        entry(2, "dense", "output", "Dense", output),
        entry(3, "loss", "per-example loss", loss_class, per_example)))


def test_a_faithful_step_names_nothing():
    found = compare_layers(model(), model(), TOLERANCES)
    assert found.first == "" and math.isnan(found.first_drift)
    assert set(found.rows["status"]) == {"passed"}
    assert list(found.rows["direction"]) == ["forward"] * 4 + ["backward"] * 4


def test_the_first_forward_value_beyond_tolerance_is_named():
    found = compare_layers(model(), model(embedding=2.0, dense_input=2.0, output=2.0), TOLERANCES)
    assert found.first.startswith("embedding lookup `embedding/items` (after its combiner")
    assert found.first_drift == 1.5


def test_an_input_that_differs_after_a_faithful_layer_names_what_feeds_it():
    found = compare_layers(model(), model(dense_input=-1.0, output=3.0), TOLERANCES)
    assert found.first.startswith("the input of `dense` (the Concatenate feeding it): max abs")


def test_a_loss_that_differs_after_agreeing_layers_is_its_reduction():
    found = compare_layers(model(), model(), TOLERANCES, loss_differs=True)
    assert found.first.startswith("the loss's reduction")
    without = LayerCapture(1, model().entries[:3])   # no per-example losses on one side
    found = compare_layers(without, model(), TOLERANCES, loss_differs=True)
    assert found.first.startswith("the loss: every layer observed agrees")
    assert "only on the candidate" in set(found.rows["status"])


def test_a_gradient_that_differs_is_named_from_the_last_layer_back():
    bad = model()
    entries = list(bad.entries)
    for n in (1, 2):   # the dense layer's input and output gradients are off
        e = entries[n]
        entries[n] = ObservedLayer(e.layer, e.kind, e.order, e.layer_class, e.fed_by, e.forward,
                                   e.backward * 3)
    found = compare_layers(model(), LayerCapture(1, tuple(entries)), TOLERANCES)
    assert found.first.startswith("backward: the gradient at `dense` output")


def test_agreeing_layers_and_gradients_with_different_applied_gradients_is_after_backward():
    found = compare_layers(model(), model(), TOLERANCES, grads_differ=True)
    assert found.first.startswith("after the backward pass")
    assert compare_layers(model(), model(), TOLERANCES, grads_differ=False).first == ""


def test_per_element_tf1_losses_meet_per_example_keras_losses():
    tf1 = model()
    entries = list(tf1.entries)
    e = entries[3]
    entries[3] = ObservedLayer(e.layer, e.kind, e.order, "tf.compat.v1.losses", "",
                               e.forward.reshape(8, 1), e.backward.reshape(8, 1))
    reference = LayerCapture(1, tuple(entries))
    keras = LayerCapture(1, tuple(list(model().entries[:3]) + [ObservedLayer(
        "loss", "per-example loss", 3, "MeanSquaredError", "", e.forward.reshape(8),
        e.backward.reshape(8))]))
    assert compare_layers(reference, keras, TOLERANCES).first == ""


def test_rows_carry_the_pair():
    found = compare_layers(model(), model(output=2.0), TOLERANCES)
    rows = layer_rows(found, "case", "tf1", "tf2", 2, 1)
    assert rows.iloc[0][["case", "reference", "candidate", "replicas", "step"]].tolist() == [
        "case", "tf1", "tf2", 2, 1]
    assert rows.loc[rows["status"] == "failed", "layer"].tolist() == ["dense", "dense"]


def test_a_layer_with_one_tensor_per_feature_names_the_feature():
    def side(category):
        value = np.ones((4, 2))
        return LayerCapture(1, tuple(
            ObservedLayer("embedding", "output", n, cls, "", value * scale, value, part=part)
            for n, (part, scale, cls) in enumerate((("categories", category, "DenseFeatures"),
                                                    ("items", 1.0, "DenseFeatures")))))
    found = compare_layers(side(1.0), side(0.5))
    assert found.first.startswith("embedding lookup `embedding` (feature `categories`, after")
    rows = found.rows[found.rows["direction"] == "forward"]
    assert rows[["part", "status"]].values.tolist() == [["categories", "failed"],
                                                        ["items", "passed"]]
