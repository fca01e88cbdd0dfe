"""The oracle's model and runner: gradients against finite differences, batches as
`repeat().batch()` cuts them, and a trace shaped like a TF runner's."""
import numpy as np
import pytest

from verify.core.case import Case, Examples, Implementation, SparseIds
from verify.core.runner import RunRequest
from cases.recommender.oracle import DenseInput, Embedded, EmbeddingMLP, OracleRunner
from verify.oracle_math import SGD, Adagrad, batch_at
from verify.core.trace import SparseRows

MODEL = EmbeddingMLP(
    (Embedded("a", "shared", "mean"), Embedded("b", "shared", "sum"),
     Embedded("c", "other", "sqrtn"), DenseInput("x")),
    (("hidden", "relu"), ("out", None)))


def params(seed=0):
    rng = np.random.default_rng(seed)
    return {"embedding/shared": rng.normal(size=(5, 2)),
            "embedding/other": rng.normal(size=(4, 3)),
            "hidden/kernel": rng.normal(size=(2 + 2 + 3 + 2, 6)),
            "hidden/bias": rng.normal(size=6),
            "out/kernel": rng.normal(size=(6, 1)), "out/bias": rng.normal(size=1)}


BATCH = {"a": [[0, 1], [4], [], [2, 2]], "b": [[1], [], [0, 3, 4], [1]],
         "c": [[0, 3], [1], [2], []], "x": np.arange(8.0).reshape(4, 2) / 10}
LABELS = np.array([[1.0], [0.0], [1.0], [0.0]])


@pytest.mark.parametrize("loss", ["sigmoid_cross_entropy", "mean_squared_error"])
def test_backward_equals_central_finite_differences(loss):
    model = EmbeddingMLP(MODEL.inputs, MODEL.layers, loss=loss)
    p = params()
    _, cache = model.forward(p, BATCH, LABELS)
    grads = model.backward(p, BATCH, cache)
    for name, value in p.items():
        numeric = np.zeros_like(value)
        for index in np.ndindex(value.shape):
            for sign in (1, -1):
                shifted = {k: v.copy() for k, v in p.items()}
                shifted[name][index] += sign * 1e-6
                numeric[index] += sign * model.forward(shifted, BATCH, LABELS)[0] / 2e-6
        g = grads[name]
        dense = g.to_dense() if isinstance(g, SparseRows) else g
        np.testing.assert_allclose(dense, numeric, atol=1e-7, rtol=1e-5, err_msg=name)


def test_shared_table_gradient_sums_both_features_and_touches_row_0_for_empty_rows():
    p = params()
    _, cache = MODEL.forward(p, BATCH, LABELS)
    shared = MODEL.backward(p, BATCH, cache)["embedding/shared"]
    # a and b together; row 0 also from b's empty row
    assert shared.ids.tolist() == [0, 1, 2, 3, 4]
    other = MODEL.backward(p, BATCH, cache)["embedding/other"]
    assert other.ids.tolist() == [0, 1, 2, 3]


def test_batches_follow_repeat_then_batch():
    ex = Examples({"ids": SparseIds.from_lists([[1], [], [2, 3]], width=2)},
                  labels=np.array([0.0, 1.0, 2.0]))
    batch, labels = batch_at(ex, 2, 2)            # examples 2 and 0 (wraps into epoch 2)
    assert labels.tolist() == [2.0, 0.0]
    assert batch["ids"].indices.tolist() == [[0, 0], [0, 1], [1, 0]]
    assert batch["ids"].values.tolist() == [2, 3, 1]


def tiny_case(runner):
    rng = np.random.default_rng(1)
    examples = Examples({"ids": SparseIds.from_lists([[0, 1], [], [2], [1, 2]], width=2),
                         "x": rng.normal(size=(4, 1)).astype(np.float32)},
                        labels=np.array([[1.0], [0.0], [1.0], [0.0]], np.float32))
    init = {"embedding/t": rng.normal(size=(3, 2)).astype(np.float32),
            "out/kernel": rng.normal(size=(3, 1)).astype(np.float32),
            "out/bias": np.zeros(1, np.float32)}
    impl = Implementation("oracle", runner, runner.names())
    return Case("tiny", examples, batch_size=2, steps=3, initial_values=init,
                implementations=(impl,), reference="oracle", eval_examples=examples)


def test_runner_records_what_a_tf_runner_records():
    model = EmbeddingMLP((Embedded("ids", "t", "mean"), DenseInput("x")), (("out", None),))
    runner = OracleRunner(model, Adagrad(0.1))
    case = tiny_case(runner)
    trace = runner.run(RunRequest(case, case.implementations[0], 3, dict(case.initial_values),
                                  "cpu", workdir=None))
    assert trace.steps() == [1, 2, 3]
    assert set(trace.keys_at(0)) and all(k.quantity == "weight" for k in trace.keys_at(0))
    quantities = {(k.quantity, k.tensor) for k in trace.keys_at(2)}
    assert {("input", "ids"), ("input", "x"), ("input", "label"), ("loss", "loss"),
            ("grad", "embedding/t"), ("slot", "embedding/t::accumulator"),
            ("weight", "out/kernel")} <= quantities
    assert isinstance(trace.get(1, "grad", "embedding/t"), SparseRows)
    assert trace.get(3, "metric", "eval/loss").dtype == np.float32
    assert all(np.asarray(v).dtype == np.float32 for k, v in trace.values.items()
               if k.quantity in ("loss", "weight", "slot"))
    # a table optimizer of its own trains only the tables
    split = OracleRunner(model, Adagrad(0.1), table_optimizer=SGD(0.1)).run(
        RunRequest(case, case.implementations[0], 1, dict(case.initial_values), "cpu", None))
    assert split.get(1, "slot", "embedding/t::accumulator") is None
    assert split.get(1, "slot", "out/kernel::accumulator") is not None


def test_runner_refuses_a_case_without_its_initial_values():
    model = EmbeddingMLP((DenseInput("x"),), (("out", None),))
    runner = OracleRunner(model, SGD(0.1))
    case = tiny_case(OracleRunner(EmbeddingMLP((Embedded("ids", "t", "mean"), DenseInput("x")),
                                               (("out", None),)), SGD(0.1)))
    with pytest.raises(ValueError, match="out/bias"):
        runner.run(RunRequest(case, case.implementations[0], 1,
                              {"out/kernel": np.zeros((1, 1))}, "cpu", None))
