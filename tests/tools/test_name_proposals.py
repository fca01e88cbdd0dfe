"""Name maps inferred from an implementation's variables: by the implementation's own map,
a unique shape, shape and creation order (flagged as a guess), a transposed shape; what cannot
be decided is listed, never guessed silently."""
from verify.core.names import Mapped, NameMap, PermuteRows
from verify.tools.name_proposals import propose

CANONICAL = {"embedding/items": (10, 4), "conv/bias": (64,), "dense/bias": (64,),
             "dense/kernel": (6, 1), "out/kernel": (3, 2)}


def native(**shapes):
    return {name.replace("__", "/"): (shape, "float32") for name, shape in shapes.items()}


def test_unique_shapes_then_creation_order_then_transposes():
    found = propose(native(table__0=(10, 4), conv2d__bias=(64,), dense__bias=(64,),
                           dense__kernel=(6, 1), out__kernel=(2, 3)), CANONICAL)
    assert [(m.native, m.canonical, m.how) for m in found.matches] == [
        ("table/0", "embedding/items", "shape (the only one)"),
        ("conv2d/bias", "conv/bias", "shape and creation order"),
        ("dense/bias", "dense/bias", "shape and creation order"),
        ("dense/kernel", "dense/kernel", "shape (the only one)"),
        ("out/kernel", "out/kernel", "transposed shape")]
    assert found.decided
    code = found.name_map_code()
    assert "'conv/bias': 'conv2d/bias',  # shape and creation order: check it" in code
    assert "'out/kernel': Mapped('out/kernel', Transpose()),  # transposed shape: check it" \
        in code


def test_what_cannot_be_decided_is_listed():
    found = propose(native(a=(64,), b=(64,), c=(64,), odd=(9, 9)), CANONICAL)
    assert not found.decided
    assert {m.native: m.canonical for m in found.matches} == {"a": "", "b": "", "c": "",
                                                              "odd": ""}
    assert found.matches[0].how == "2 canonical names of this shape, 3 variables: not decided"
    assert found.matches[3].how.startswith("no canonical name of this shape")
    assert "# ?: 'odd' (9, 9)" in found.name_map_code()
    assert "# 'embedding/items': no variable of this side matched it" in found.name_map_code()


def test_the_implementations_own_map_comes_first_with_its_transform():
    current = NameMap({"dense/kernel": Mapped("k", PermuteRows((0, 2, 1, 3, 4, 5))),
                       "conv/bias": "second", "dense/bias": "first"})
    found = propose(native(first=(64,), second=(64,), k=(6, 1)), CANONICAL, current)
    assert {m.native: (m.canonical, m.how) for m in found.matches} == {
        "first": ("dense/bias", "the implementation's name map"),
        "second": ("conv/bias", "the implementation's name map"),
        "k": ("dense/kernel", "the implementation's name map")}
    assert "PermuteRows(order=(0, 2, 1, 3, 4, 5))" in found.name_map_code()
