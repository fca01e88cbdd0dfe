"""The explanation stage on synthetic traces: each hypothesis recovers the cause it is about,
with its value within 1%, and rejects the others (its negative controls); a faithful pair gets
no cause; a pair no hypothesis fits says so with what was ruled out."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from verify.core.case import Expectation, PairSpec
from verify.core.trace import SparseRows, Trace
from verify.explain import NO_CAUSE, explain_pair, explain_traces, explained
from verify.explain.evidence import Evidence
from verify.explain.gradients import clip_global_norm, drop_step, gradient_scale, loss_scale
from verify.explain.step_size import epsilon, learning_rate
from verify.judge.compare import Divergence
from verify.judge.pair import judge_pair

STEPS = 5
SHAPES = {"embedding/user": (20, 4), "dense/kernel": (4, 3)}


def _gradients():
    rng = np.random.default_rng(0)
    out = {}
    for step in range(1, STEPS + 1):
        scale = 1.0 + 0.3 * step * (-1) ** step          # norms that go up and down
        out[step] = {n: (rng.normal(size=s) * scale * np.where(
            rng.random(s) < 0.2, 1e-5, 1.0)).astype(np.float32) for n, s in SHAPES.items()}
    return out


GRADIENTS = _gradients()


def train(name: str, kind: str = "sgd", lr: float = 0.05, lr_tables: float | None = None,
          eps: float = 1e-8, transform=None, loss_factor: float = 1.0) -> Trace:
    """A run of SGD or Adam in float32 on fixed gradients; `transform(step, grads)` changes
    what the optimizer applies (and is captured), as the suite's mutations do."""
    rng = np.random.default_rng(1)
    trace = Trace(name, {"declared_config": {"optimizer/model/kind": kind,
                                             "optimizer/model/learning_rate": lr,
                                             "optimizer/model/epsilon": eps,
                                             "optimizer/model/beta_2": 0.999}})
    weights = {n: rng.normal(size=s).astype(np.float32) for n, s in SHAPES.items()}
    m = {n: np.zeros(s, np.float32) for n, s in SHAPES.items()}
    v = {n: np.zeros(s, np.float32) for n, s in SHAPES.items()}
    for n, w in weights.items():
        trace.record(0, "weight", n, w.copy())
    b1, b2 = np.float32(0.9), np.float32(0.999)
    for step in range(1, STEPS + 1):
        grads = dict(GRADIENTS[step])
        if transform is not None:
            grads = transform(step, grads)
        trace.record(step, "loss", "loss", np.float32(0.7 * loss_factor / step))
        trace.record(step, "input", "user", f"digest-{step}")
        for n, g in grads.items():
            rate = np.float32(lr_tables if lr_tables and n.startswith("embedding") else lr)
            trace.record(step, "grad", n, g)
            if kind == "sgd":
                weights[n] = weights[n] - rate * g
            else:
                m[n] = b1 * m[n] + (np.float32(1) - b1) * g
                v[n] = b2 * v[n] + (np.float32(1) - b2) * g * g
                lr_t = rate * np.sqrt(np.float32(1) - b2 ** step) / (np.float32(1) - b1 ** step)
                weights[n] = weights[n] - lr_t * m[n] / (np.sqrt(v[n]) + np.float32(eps))
                trace.record(step, "slot", f"{n}/m", m[n].copy())
                trace.record(step, "slot", f"{n}/v", v[n].copy())
            trace.record(step, "weight", n, weights[n].copy())
    return trace


def clip_at(cap):
    def transform(step, grads):
        norm = np.sqrt(sum(float((g.astype(np.float64) ** 2).sum()) for g in grads.values()))
        return {n: (g * np.float32(min(1.0, cap / norm))) for n, g in grads.items()}
    return transform


def drop(at):
    return lambda step, grads: {n: g * np.float32(step != at) for n, g in grads.items()}


def scaled(factor):
    return lambda step, grads: {n: g * np.float32(factor) for n, g in grads.items()}


def evidence(reference, candidate, step, quantity, tensor="dense/kernel"):
    return Evidence(reference, candidate, step, quantity, tensor)


def test_learning_rate_recovered_per_group_within_one_percent():
    found = learning_rate(evidence(train("a"), train("b", lr=0.0505), 1, "weight"))
    assert found.fits and abs(found.value - 1.01) < 0.0101
    assert found.sentence == ("tables and dense layers trained at 1.010x the reference's "
                              "learning rate (0.0505 vs 0.05)")
    tables_only = learning_rate(evidence(train("a"), train("b", lr_tables=0.0505), 1, "weight"))
    assert tables_only.sentence == ("tables trained at 1.010x the reference's learning rate "
                                    "(0.0505 vs 0.05); dense layers equal")


def test_learning_rate_of_adam_recovered_and_epsilon_rejects_it():
    reference, candidate = train("a", "adam"), train("b", "adam", lr=0.0505)
    found = learning_rate(evidence(reference, candidate, 1, "weight"))
    assert found.fits and abs(found.value - 1.01) < 0.0101
    assert not epsilon(evidence(reference, candidate, 1, "weight")).fits   # negative control


def test_epsilon_recovered_and_learning_rate_rejects_it():
    reference, candidate = train("a", "adam", eps=1e-7), train("b", "adam", eps=1e-6)
    found = epsilon(evidence(reference, candidate, 1, "weight"))
    assert found.fits and abs(found.value - 10.0) < 0.1, found
    rejected = learning_rate(evidence(reference, candidate, 1, "weight"))
    assert not rejected.fits and "spread" in rejected.evidence   # negative control


def test_clip_global_norm_names_its_cap_and_gradient_scale_rejects_it():
    norms = [np.sqrt(sum(float((g.astype(np.float64) ** 2).sum()) for g in GRADIENTS[s].values()))
             for s in GRADIENTS]
    cap = float(np.median(norms))
    first = next(s for s, n in zip(GRADIENTS, norms) if n > cap)
    reference, candidate = train("a"), train("b", transform=clip_at(cap))
    found = clip_global_norm(evidence(reference, candidate, first, "grad"))
    assert found.fits and abs(found.value - cap) < 0.01 * cap
    if first > 1:
        assert not gradient_scale(evidence(reference, candidate, first, "grad")).fits


def test_gradient_scale_from_the_first_step_and_clip_rejects_it():
    reference, candidate = train("a"), train("b", transform=scaled(0.5))
    found = explain_traces(reference, candidate, Divergence(1, "grad", "dense/kernel", ""))
    assert found.finding.hypothesis == "gradient_scale" and found.finding.value == 0.5
    assert "averaged twice" in found.cause
    assert not clip_global_norm(evidence(reference, candidate, 1, "grad")).fits


def test_dropped_step_named_and_rejected_on_a_learning_rate():
    found = drop_step(evidence(train("a"), train("b", transform=drop(2)), 2, "grad"))
    assert found.fits and found.label() == "drop_step 2"
    assert not drop_step(evidence(train("a"), train("b", lr=0.0505), 1, "weight")).fits


def test_loss_scale_needs_the_gradients_at_the_same_factor():
    reference = train("a")
    both = train("b", transform=scaled(2.0), loss_factor=2.0)
    assert loss_scale(evidence(reference, both, 1, "loss", "loss")).value == pytest.approx(2.0)
    loss_only = train("b", loss_factor=2.0)
    assert not loss_scale(evidence(reference, loss_only, 1, "loss", "loss")).fits


def test_input_in_another_order_and_other_values():
    reference, shuffled, other = train("a"), train("b"), train("c")
    for step in (1, 2):
        shuffled.record(step, "input", "user", f"digest-{3 - step}")
    other.record(1, "input", "user", "digest-new")
    said = explain_traces(reference, shuffled, Divergence(1, "input", "user", "")).cause
    assert "another order" in said
    assert "other values" in explain_traces(reference, other, Divergence(1, "input", "user",
                                                                          "")).cause


def test_no_known_cause_lists_what_was_ruled_out():
    reference = train("a")
    noisy = train("b", transform=lambda step, grads: {
        n: g * np.float32(1 + 0.3 * np.random.default_rng(step).random(g.shape))
        for n, g in grads.items()})
    found = explain_traces(reference, noisy, Divergence(1, "grad", "dense/kernel", ""))
    assert found.finding is None and found.cause.startswith(NO_CAUSE)
    assert "gradient_scale" in found.cause and "ruled out" in found.evidence()


def test_declared_difference_tied_when_its_effect_matches():
    preflight = pd.DataFrame([{"key": "table/embedding/user/combiner", "severity": "blocking",
                               "reference_value": "sqrtn", "candidate_value": "mean"}])
    reference, candidate = train("a"), train("b", loss_factor=1.3, transform=scaled(1.7))
    found = explain_traces(reference, candidate, Divergence(1, "loss", "loss", ""), preflight)
    assert found.finding.hypothesis == "combiner"
    assert found.cause.startswith("declared: table/embedding/user/combiner sqrtn → mean")


def test_judged_pairs_get_a_cause_only_when_they_fail():
    reference = train("tf1")
    faithful = judge_pair(PairSpec("c", "tf1", "tf2"), {"tf1": reference,
                                                        "tf2": train("tf2")}.__getitem__, None)
    traces = {"tf1": reference, "tf2": train("tf2"), "m": train("m", lr=0.0505)}.__getitem__
    assert explain_pair(faithful, PairSpec("c", "tf1", "tf2"), traces).record.likely_cause == ""
    spec = PairSpec("c", "tf1", "m", expect=Expectation(1, "slot|weight", why="lr",
                                                        cause="learning_rate x1.01"))
    mutant = explain_pair(judge_pair(spec, traces, None), spec, traces)
    assert mutant.record.explained == "yes" and "1.010x" in mutant.record.likely_cause
    assert len(mutant.record.likely_cause) <= 200 and "learning_rate fits" in \
        mutant.record.cause_evidence


def test_a_wrong_explanation_is_said():
    assert explained("clip_global_norm 0.5", explain_traces(
        train("a"), train("b", transform=drop(2)),
        Divergence(2, "grad", "dense/kernel", ""))) == "no: found drop_step 2"


def test_sparse_gradients_are_read_dense():
    reference, candidate = train("a"), train("b")
    rows = SparseRows(np.array([0, 3]), np.ones((2, 4), np.float32), (20, 4))
    reference.record(1, "grad", "embedding/user", rows)
    value = evidence(reference, candidate, 1, "grad").value("reference", 1, "grad",
                                                             "embedding/user")
    assert value.shape == (20, 4) and value[3].tolist() == [1.0] * 4


def adagrad(name: str, initial: float = 0.1, carried: np.ndarray | None = None) -> Trace:
    """One Adagrad step from an accumulator of `initial` (or the `carried` state)."""
    trace, w = Trace(name, {"declared_config": {"optimizer/model/kind": "adagrad",
                                                "optimizer/model/learning_rate": 0.05}}), \
        np.ones((4, 3), np.float32)
    acc = np.full((4, 3), initial, np.float32) if carried is None else carried
    g = GRADIENTS[1]["dense/kernel"]
    trace.record(0, "weight", "dense/kernel", w)
    acc = acc + g * g
    trace.record(1, "grad", "dense/kernel", g)
    trace.record(1, "slot", "dense/kernel/accumulator", acc)
    trace.record(1, "weight", "dense/kernel", w - np.float32(0.05) * g / np.sqrt(acc))
    return trace


def test_initial_accumulator_and_a_slot_not_restored():
    from verify.explain.state import slot_state
    at = Divergence(1, "slot", "dense/kernel/accumulator", "")
    found = explain_traces(adagrad("a"), adagrad("b", 0.01), at)
    assert found.label() == "initial_accumulator x0.1" and "0.01" in found.cause
    trained = np.random.default_rng(3).random((4, 3)).astype(np.float32) + 0.1
    found = explain_traces(adagrad("a", carried=trained), adagrad("b"), at)
    assert found.finding.hypothesis == "slot_not_restored"
    # negative control: both fresh from the same value, a gradient scaled: not a slot's start
    other = adagrad("b")
    other.record(1, "grad", "dense/kernel", GRADIENTS[1]["dense/kernel"] * np.float32(2))
    assert slot_state(evidence(adagrad("a"), other, 1, "slot",
                               "dense/kernel/accumulator")) is None or \
        not slot_state(evidence(adagrad("a"), other, 1, "slot",
                                "dense/kernel/accumulator")).fits


def test_adam_step_count_restarted_and_not_claimed_for_a_learning_rate():
    from verify.explain.state import adam_bias_correction, adam_step_count
    reference = train("a", "adam")
    factor = float(adam_bias_correction(np.float64(1)) / adam_bias_correction(np.float64(40)))
    found = adam_step_count(evidence(reference, train("b", "adam"), 1, "weight"), factor)
    assert found.label() == "adam_step_count 40"
    assert adam_step_count(evidence(reference, train("b", "adam", lr=0.0505), 1, "weight"),
                           1.01) is None   # negative control: the rates are declared apart


def test_a_variable_on_one_side_only_and_a_reference_that_clips():
    reference, candidate = train("a"), train("b")
    candidate.record(0, "weight", "embedding/item_2", np.zeros(3))
    found = explain_traces(reference, candidate,
                           Divergence(0, "weight", "embedding/item_2", "", "missing"))
    assert found.finding.hypothesis == "structure" and "only in the candidate" in found.cause
    norms = [np.sqrt(sum(float((g.astype(np.float64) ** 2).sum()) for g in GRADIENTS[s].values()))
             for s in GRADIENTS]
    clipped = train("a", transform=clip_at(min(norms) / 2))
    found = explain_traces(clipped, train("b"), Divergence(1, "grad", "dense/kernel", ""))
    assert found.label() == f"clip_global_norm {min(norms) / 2:.4g}"
    assert found.cause.startswith("the reference's gradients clipped")


def test_the_reports_show_the_cause_the_evidence_and_a_wrong_explanation():
    from verify.render.html import _likely_cause
    from verify.render.markdown import summary_markdown
    from verify.store.results import RunResults

    traces = {"tf1": train("tf1"), "lr": train("lr", lr=0.0505),
              "drop": train("drop", transform=drop(2))}.__getitem__
    failing = PairSpec("c", "tf1", "lr")
    wrong = PairSpec("c", "tf1", "drop", expect=Expectation(2, "grad", why="x",
                                                            cause="clip_global_norm 0.5"))
    results = RunResults.of([explain_pair(judge_pair(s, traces, None), s, traces)
                             for s in (failing, wrong)])
    text = summary_markdown(results)
    assert ("  - likely cause: declared: optimizer/model/learning_rate 0.05 → 0.0505; the "
            "numbers fit: tables and dense layers trained at 1.010x the reference's learning "
            "rate (0.0505 vs 0.05)") in text
    assert "### 1 control caught but not explained by its declared cause" in text
    assert "declared `clip_global_norm 0.5`, no: found drop_step 2" in text
    assert "1 caught (0 of 1 explained)" in text
    row = results.pairs[results.pairs["candidate"] == "lr"].iloc[0]
    html = "".join(_likely_cause(row))
    assert "<li>learning_rate fits: update ratio tables x1.0100" in html
    assert set(["likely_cause", "cause_evidence", "explained"]) <= set(results.pairs.columns)


def ftrl(name: str, lr: float = 0.1, beta: float = 0.1) -> Trace:
    """One FTRL step (TF's, learning_rate_power -0.5) on fixed gradients, in float64."""
    config = {"optimizer/model/kind": "ftrl", "optimizer/model/learning_rate": 0.1,
              "optimizer/model/l1_regularization_strength": 1e-3,
              "optimizer/model/l2_regularization_strength": 1e-2, "optimizer/model/beta": beta}
    trace = Trace(name, {"declared_config": config})
    for variable, g in GRADIENTS[1].items():
        w = np.random.default_rng(2).normal(size=g.shape) * 0.1
        n, z = np.full(g.shape, 0.1), np.zeros(g.shape)
        n_new = n + g.astype(np.float64) ** 2
        z = z + g - (np.sqrt(n_new) - np.sqrt(n)) / lr * w
        quadratic = (beta + np.sqrt(n_new)) / lr + 2 * 1e-2
        trace.record(0, "weight", variable, w)
        trace.record(1, "grad", variable, g)
        trace.record(1, "slot", f"{variable}/accumulator", n_new)
        trace.record(1, "slot", f"{variable}/linear", z)
        trace.record(1, "weight", variable,
                     np.where(np.abs(z) > 1e-3, (np.sign(z) * 1e-3 - z) / quadratic, 0.0))
    return trace


def test_ftrl_learning_rate_recovered_from_each_sides_state_and_not_from_a_beta():
    found = learning_rate(evidence(ftrl("a"), ftrl("b", lr=0.101), 1, "weight"))
    assert found.fits and abs(found.value - 1.01) < 0.0101
    assert "(0.101 vs 0.1)" in found.sentence
    beta = learning_rate(evidence(ftrl("a"), ftrl("b", beta=0.0), 1, "weight"))
    assert not beta.fits   # negative control: the candidate declares its beta 0


def test_adams_one_minus_beta_2_named_as_legitimate_and_not_claimed_when_alike():
    from verify.explain.declared import adam_one_minus_beta_2

    def adam_v(name: str, one_minus: np.float32) -> Trace:
        trace = train(name, "adam")
        for variable, g in GRADIENTS[1].items():
            trace.record(1, "slot", f"{variable}/v", one_minus * g * g)
        return trace

    float32, python = np.float32(1) - np.float32(0.999), np.float32(0.001)
    found = adam_one_minus_beta_2(evidence(adam_v("a", float32), adam_v("b", python), 1, "slot"))
    assert found.fits and "legitimate rounding difference" in found.sentence
    alike = adam_one_minus_beta_2(evidence(adam_v("a", float32), adam_v("b", float32), 1, "slot"))
    assert not alike.fits   # negative control: both sides round it alike
