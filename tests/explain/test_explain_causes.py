"""The explanation stage's hypotheses on what differs while the training agrees (state, a
tracked metric, initial values, per-replica batch statistics), on which rows of a table an
update moved, on FTRL's beta and linear slot, and on tables captured by touched rows: each
recovers its cause on synthetic traces and rejects a negative control."""
from __future__ import annotations

import numpy as np

from verify.core.trace import SparseRows, TouchedRows, Trace
from verify.explain import explain_traces
from verify.explain.evidence import Evidence
from verify.explain.forward import batch_statistics, initializer, metric_only, state
from verify.explain.rows import repeated_rows, row_update
from verify.explain.step_size import ftrl_beta, learning_rate
from verify.judge.compare import Divergence

RNG = np.random.default_rng(5)
X = [RNG.normal(size=(8, 3)) for _ in range(4)]          # the batches a layer normalizes
G = [RNG.normal(size=(3, 2)) for _ in range(4)]          # the kernel's gradients


def bn_run(name: str, momentum: float = 0.997, lr: float = 0.1, replicas: int = 1,
           metric_factor: float = 1.0) -> Trace:
    """A kernel trained by SGD beside BatchNormalization's moving mean and variance; with
    `replicas` > 1 the statistics are those of each replica's part of the batch, averaged."""
    trace = Trace(name, {"replicas": replicas,
                         "declared_config": {"optimizer/model/kind": "sgd",
                                             "optimizer/model/learning_rate": lr}})
    kernel, mean, var = np.ones((3, 2)), np.zeros(3), np.ones(3)
    for tensor, value in (("dense/kernel", kernel), ("bn/moving_mean", mean),
                          ("bn/moving_variance", var)):
        trace.record(0, "weight", tensor, value)
    for step in range(1, 4):
        parts = np.split(X[step], replicas)
        batch_mean = np.mean([p.mean(axis=0) for p in parts], axis=0)
        batch_var = np.mean([p.var(axis=0) for p in parts], axis=0)
        mean = momentum * mean + (1 - momentum) * batch_mean
        var = momentum * var + (1 - momentum) * batch_var
        kernel = kernel - lr * G[step]
        trace.record(step, "input", "x", f"digest-{step}")
        trace.record(step, "loss", "loss", np.float64(batch_var.sum()))
        trace.record(step, "grad", "dense/kernel", G[step])
        for tensor, value in (("dense/kernel", kernel), ("bn/moving_mean", mean),
                              ("bn/moving_variance", var)):
            trace.record(step, "weight", tensor, value)
        trace.record(step, "metric", "train/loss", np.float64(step * metric_factor))
    return trace


def test_a_moving_average_momentum_is_state_and_a_learning_rate_is_not():
    found = state(Evidence(bn_run("a"), bn_run("b", momentum=0.99), 1, "weight",
                           "bn/moving_mean"))
    assert found.fits and abs(found.value - 10 / 3) < 0.01 * 10 / 3, found
    assert found.label() == "state x3.333"
    rejected = state(Evidence(bn_run("a"), bn_run("b", momentum=0.99, lr=0.2), 1, "weight",
                              "bn/moving_mean"))
    assert not rejected.fits and "trainable weights differ" in rejected.evidence


def test_a_learning_rate_is_read_from_trained_variables_beside_moving_statistics():
    """The moving statistics (weights no gradient reaches) move by their momentum, not by the
    learning rate: the step size is read from the trained variables only (a --sensitivity run
    on batch_norm read 'no known cause fits' when the statistics were counted)."""
    found = learning_rate(Evidence(bn_run("a"), bn_run("b", lr=0.101), 1, "weight",
                                   "dense/kernel"))
    assert found.fits and found.label() == "learning_rate x1.01", found
    # negative control: another momentum alone is no learning rate
    rejected = learning_rate(Evidence(bn_run("a"), bn_run("b", momentum=0.99), 1, "weight",
                                      "bn/moving_mean"))
    assert rejected is None or not rejected.fits, rejected


def test_per_replica_batch_statistics_need_more_replicas_on_the_candidate():
    found = batch_statistics(Evidence(bn_run("a"), bn_run("b", replicas=2), 1, "loss", "loss"))
    assert found.fits and "2 replicas" in found.sentence, found
    # negative control: the same difference of the moving statistics, one replica each side
    rejected = batch_statistics(Evidence(bn_run("a"), bn_run("b", momentum=0.99), 1, "loss",
                                         "loss"))
    assert not rejected.fits and "replicas 1 against 1" in rejected.evidence


def test_a_tracked_metric_alone_and_not_when_the_training_differs():
    found = metric_only(Evidence(bn_run("a"), bn_run("b", metric_factor=0.5), 2, "metric",
                                 "train/loss"))
    assert found.fits and found.label() == "metric x0.5"
    rejected = metric_only(Evidence(bn_run("a"), bn_run("b", lr=0.2, metric_factor=0.5), 2,
                                    "metric", "train/loss"))
    assert not rejected.fits


def test_initial_values_that_differ_and_equal_ones():
    other = bn_run("b")
    other.record(0, "weight", "dense/kernel", 2 * np.ones((3, 2)) + np.eye(3, 2))
    found = explain_traces(bn_run("a"), other, Divergence(0, "weight", "dense/kernel", ""))
    assert found.finding.hypothesis == "initializer" and "initial values differ" in found.cause
    assert initializer(Evidence(bn_run("a"), bn_run("b"), 0, "weight", "dense/kernel")) is None


def table_run(name: str, skip: int | None = None, dense: bool = False, lr: float = 0.1,
              touched_rows: bool = False) -> Trace:
    """One SGD step of a 6-row table whose batch looks up rows 0, 2 and 3 (row 2 twice)."""
    trace = Trace(name, {"declared_config": {"optimizer/model/kind": "sgd",
                                             "optimizer/model/learning_rate": 0.1}})
    table = np.arange(12, dtype=np.float64).reshape(6, 2) / 10
    ids = np.array([0, 2, 2, 3])
    pieces = SparseRows(ids, np.random.default_rng(7).normal(size=(4, 2)), (6, 2))
    g = pieces.to_dense()
    after = table - lr * g
    if skip is not None:
        after[skip] = table[skip]
    if dense:
        after[[1, 4, 5]] *= 0.5              # rows without a gradient recomputed
    trace.record(0, "weight", "embedding/item", table)
    trace.record(1, "grad", "embedding/item", pieces)
    trace.record(1, "weight", "embedding/item", TouchedRows(np.unique(ids), after[np.unique(
        ids)], (6, 2)) if touched_rows else after)
    return trace


def test_a_skipped_row_and_untouched_rows_moved_and_not_a_learning_rate():
    at = (1, "weight", "embedding/item")
    skipped = row_update(Evidence(table_run("a"), table_run("b", skip=2), *at))
    assert skipped.hypothesis == "row_skipped" and "ids 2" in skipped.sentence, skipped
    dense = row_update(Evidence(table_run("a"), table_run("b", dense=True), *at))
    assert dense.hypothesis == "untouched_rows_updated" and dense.fits
    # negative control: every looked-up row moved by another rate, no row skipped or added
    assert row_update(Evidence(table_run("a"), table_run("b", lr=0.2), *at)) is None


def test_a_table_captured_by_touched_rows_has_its_learning_rate_read():
    found = learning_rate(Evidence(table_run("a", touched_rows=True),
                                   table_run("b", lr=0.2, touched_rows=True), 1, "weight",
                                   "embedding/item"))
    assert found.fits and found.label() == "learning_rate x2", found
    skipped = row_update(Evidence(table_run("a", touched_rows=True),
                                  table_run("b", skip=2, touched_rows=True), 1, "weight",
                                  "embedding/item"))
    assert skipped.hypothesis == "row_skipped"


def adagrad_table(name: str, apart: bool) -> Trace:
    """One Adagrad step of the table above: the accumulator grows by the square of each row's
    summed gradient, or (`apart`) by the sum of each lookup's square."""
    reference = table_run(name)
    pieces = reference.get(1, "grad", "embedding/item")
    grown = np.zeros((6, 2))
    if apart:
        np.add.at(grown, pieces.ids, pieces.rows ** 2)
    else:
        grown = pieces.to_dense() ** 2
    reference.record(1, "slot", "embedding/item/accumulator", 0.1 + grown)
    return reference


def test_repeated_ids_updated_once_per_lookup_and_not_when_summed():
    at = (1, "slot", "embedding/item/accumulator")
    found = repeated_rows(Evidence(adagrad_table("a", False), adagrad_table("b", True), *at))
    assert found.fits and "once per lookup" in found.sentence, found
    alike = repeated_rows(Evidence(adagrad_table("a", False), adagrad_table("b", False), *at))
    assert not alike.fits   # negative control: both sum the lookups before squaring


def ftrl_step(name: str, beta: float = 0.1, lr: float = 0.1, linear: float = 0.0) -> Trace:
    """One FTRL step (TF's, learning_rate_power -0.5) from a `linear` slot of that value."""
    config = {"optimizer/model/kind": "ftrl", "optimizer/model/learning_rate": lr,
              "optimizer/model/l1_regularization_strength": 1e-3,
              "optimizer/model/l2_regularization_strength": 1e-2, "optimizer/model/beta": beta}
    trace, g = Trace(name, {"declared_config": config}), G[1]
    w, n = np.full(g.shape, 0.05), np.full(g.shape, 0.1)
    n_new = n + g ** 2
    z = linear + g - (np.sqrt(n_new) - np.sqrt(n)) / lr * w
    trace.record(0, "weight", "dense/kernel", w)
    trace.record(1, "grad", "dense/kernel", g)
    trace.record(1, "slot", "dense/kernel/accumulator", n_new)
    trace.record(1, "slot", "dense/kernel/linear", z)
    trace.record(1, "weight", "dense/kernel", np.where(
        np.abs(z) > 1e-3, (np.sign(z) * 1e-3 - z) / ((beta + np.sqrt(n_new)) / lr + 2e-2), 0.0))
    return trace


def test_ftrl_beta_recovered_and_a_learning_rate_is_not_a_beta():
    found = ftrl_beta(Evidence(ftrl_step("a"), ftrl_step("b", beta=0.0), 1, "weight",
                               "dense/kernel"))
    assert found.fits and "FTRL beta 0 where the reference's is 0.1" in found.sentence, found
    rejected = ftrl_beta(Evidence(ftrl_step("a"), ftrl_step("b", lr=0.101), 1, "weight",
                                  "dense/kernel"))
    assert not rejected.fits


def test_ftrl_linear_slot_not_restored():
    carried = RNG.normal(size=G[1].shape) * 0.3
    found = explain_traces(ftrl_step("a", linear=carried), ftrl_step("b"),
                           Divergence(1, "slot", "dense/kernel/linear", ""))
    assert found.finding.hypothesis == "slot_not_restored" and "linear" in found.cause
    both = explain_traces(ftrl_step("a", linear=carried), ftrl_step("b", linear=carried),
                          Divergence(1, "slot", "dense/kernel/linear", ""))
    assert both.finding is None or both.finding.hypothesis != "slot_not_restored"


def test_an_oracle_is_read_by_the_constants_its_math_used():
    reference = Trace("oracle", {"details": {"math_config": {"optimizer/model/epsilon": 1e-8}}})
    evidence = Evidence(reference, Trace("b"), 1, "weight", "w")
    assert evidence.number("reference", "optimizer/model/epsilon") == 1e-8
    assert evidence.number("candidate", "optimizer/model/epsilon") is None


def clip_run(name: str, where: str, replicas: int = 2, cap: float = 0.5) -> Trace:
    """Gradients of 2 replicas' parts, clipped to global norm `cap` after they are summed
    ('after'), each part before ('per_replica'), or not at all ('none')."""
    rng, trace = np.random.default_rng(9), Trace(name, {"replicas": replicas})
    trace.record(0, "weight", "dense/kernel", np.zeros((3, 2)))
    for step in range(1, 5):
        parts = [rng.normal(size=(3, 2)) * 0.4 for _ in range(2)]

        def clip(g):
            return g * min(1.0, cap / float(np.linalg.norm(g)))
        g = {"after": clip(parts[0] + parts[1]), "none": parts[0] + parts[1],
             "per_replica": clip(parts[0]) + clip(parts[1])}[where]
        trace.record(step, "grad", "dense/kernel", g)
    return trace


def test_clipping_per_replica_and_not_an_unclipped_sum():
    found = explain_traces(clip_run("a", "after", 1), clip_run("b", "per_replica"),
                           Divergence(1, "grad", "dense/kernel", ""))
    assert found.label() == "clip_per_replica 0.5", found.evidence()
    from verify.explain.gradients import clip_per_replica
    rejected = clip_per_replica(Evidence(clip_run("a", "after", 1), clip_run("b", "none"), 1,
                                         "grad", "dense/kernel"))
    assert not rejected.fits, rejected   # negative control: the sum not clipped at all


def test_a_forward_pass_only_when_variables_agree_and_nothing_else_fits():
    reference, candidate = bn_run("a"), bn_run("b")
    candidate.record(1, "loss", "loss", np.float64(7.0))
    found = explain_traces(reference, candidate, Divergence(1, "loss", "loss", ""))
    assert found.label() == "forward_pass" and "from equal inputs" in found.cause, found
    rounded = bn_run("b")
    rounded.record(1, "loss", "loss", reference.get(1, "loss", "loss") * (1 + 1e-5))
    assert explain_traces(reference, rounded, Divergence(1, "loss", "loss", "")).finding is None
    candidate.record(0, "weight", "dense/kernel", np.full((3, 2), 3.0))
    moved = explain_traces(reference, candidate, Divergence(1, "loss", "loss", ""))
    assert moved.finding is None   # negative control: the variables differ before the step


def test_rows_in_another_order_are_a_layout_not_an_initializer():
    reference, candidate = bn_run("a"), bn_run("b")
    kernel = np.arange(6.0).reshape(3, 2)
    reference.record(0, "weight", "dense/kernel", kernel)
    candidate.record(0, "weight", "dense/kernel", kernel[[2, 0, 1]])
    found = initializer(Evidence(reference, candidate, 0, "weight", "dense/kernel"))
    assert found.hypothesis == "kernel_layout" and "3 of 3 rows moved" in found.sentence
    candidate.record(0, "weight", "dense/kernel", kernel * 2)
    other = initializer(Evidence(reference, candidate, 0, "weight", "dense/kernel"))
    assert other.hypothesis == "initializer"   # negative control: other values, not an order


def test_a_combiner_declared_apart_where_the_forward_pass_differs():
    from verify.explain.declared import combiner
    reference, candidate = bn_run("a"), bn_run("b")
    candidate.record(1, "loss", "loss", np.float64(7.0))
    reference.meta.details["math_config"] = {"table/embedding/ids/combiner": "sqrtn"}
    candidate.meta.declared_config["table/embedding/ids/combiner"] = "mean"
    found = combiner(Evidence(reference, candidate, 1, "loss", "loss"))
    assert found.fits and "ids combiner mean where the reference's is sqrtn" in found.sentence
    candidate.meta.declared_config["table/embedding/ids/combiner"] = "sqrtn"
    alike = combiner(Evidence(reference, candidate, 1, "loss", "loss"))
    assert not alike.fits   # negative control: the same combiner declared on both sides


def test_one_tables_own_rate_read_apart_from_the_other_tables():
    def run(name, user_rate):
        trace = Trace(name, {"declared_config": {"optimizer/model/kind": "sgd",
                                                 "optimizer/model/learning_rate": 0.1}})
        for table, rate in (("embedding/user", user_rate), ("embedding/item", 0.1)):
            w, g = np.ones((4, 2)), np.arange(8.0).reshape(4, 2) + 1
            trace.record(0, "weight", table, w)
            trace.record(1, "grad", table, g)
            trace.record(1, "weight", table, w - rate * g)
        return trace
    found = learning_rate(Evidence(run("a", 0.05), run("b", 0.1), 1, "weight",
                                   "embedding/user"))
    assert found.label() == "learning_rate x2" and found.sentence == (
        "embedding/user trained at 2.000x the reference's learning rate; embedding/item equal")
    assert not learning_rate(Evidence(run("a", 0.05), run("b", 0.05), 1, "weight",
                                      "embedding/user")).fits   # negative control: same rates


def test_an_update_applied_twice_in_one_step_and_not_a_learning_rate():
    from verify.explain.state import repeated_update

    def adagrad_twice(name: str, times: int = 1, lr: float = 0.05) -> Trace:
        trace = Trace(name, {"declared_config": {"optimizer/model/kind": "adagrad",
                                                 "optimizer/model/learning_rate": lr}})
        w, acc, g = np.ones((3, 2)), np.full((3, 2), 0.1), G[1]
        trace.record(0, "weight", "dense/kernel", w)
        for _ in range(times):
            acc = acc + g * g
            w = w - lr * g / np.sqrt(acc)
        trace.record(1, "grad", "dense/kernel", g)
        trace.record(1, "slot", "dense/kernel/accumulator", acc)
        trace.record(1, "weight", "dense/kernel", w)
        return trace
    at = (1, "slot", "dense/kernel/accumulator")
    found = repeated_update(Evidence(adagrad_twice("a"), adagrad_twice("b", 2), *at))
    assert found.fits and found.label() == "repeated_update x2", found
    # negative control: another learning rate leaves the accumulator as one update made it
    assert repeated_update(Evidence(adagrad_twice("a"), adagrad_twice("b", lr=0.1), 1,
                                    "weight", "dense/kernel")) is None
