"""The 'declared' cause: a pair whose numbers agree while a blocking preflight finding decides
its verdict (a control only preflight catches, a faithful pair preflight fails) is explained by
that finding; informational findings, numbers that differ or nothing compared give no such
cause (its negative controls), nor do values a device did not let a run capture."""
from __future__ import annotations

import pandas as pd

from verify.core.case import Expectation, PairSpec
from verify.core.trace import Trace
from verify.explain import explain_agreeing, explain_pair, explained
from verify.explain.declared import declared_only
from verify.judge.pair import judge_pair

from test_explain import train

INITIALIZER = "table/embedding/user/initializer"


def declaring(trace: Trace, **config) -> Trace:
    """`trace` declaring `config` besides its optimizer."""
    trace.meta.declared_config.update(config)
    return trace


def judged(spec: PairSpec, reference: Trace, candidate: Trace):
    traces = {spec.reference: reference, spec.candidate: candidate}.__getitem__
    return explain_pair(judge_pair(spec, traces, None), spec, traces).record


def initializers(candidate_stddev: str) -> tuple[Trace, Trace]:
    return (declaring(train("tf1"), **{INITIALIZER: "TruncatedNormal(mean=0, stddev=0.447)"}),
            declaring(train("tf2"), **{INITIALIZER: f"TruncatedNormal(mean=0, stddev="
                                                    f"{candidate_stddev})"}))


def test_a_control_only_preflight_catches_is_explained_by_its_blocking_finding():
    spec = PairSpec("c", "tf1", "tf2", control=True, role="control",
                    preflight_expect=("table/*/initializer",),
                    preflight_cause="declared table/*/initializer")
    record = judged(spec, *initializers("1"))
    assert record.verdict == "CAUGHT" and record.first_step is None
    assert record.likely_cause.startswith(f"declared: {INITIALIZER} TruncatedNormal(")
    assert "…stddev=1)" in record.likely_cause and "through step 5" in record.likely_cause
    assert len(record.likely_cause) <= 200 and record.explained == "yes"
    assert record.expected_cause == "declared table/*/initializer"


def test_a_faithful_pair_preflight_fails_gets_the_finding_and_declares_nothing():
    record = judged(PairSpec("c", "tf1", "tf2"), *initializers("1"))
    assert record.verdict == "FAIL" and record.likely_cause.startswith("declared: ")
    assert record.expected_cause == "" and record.explained == ""


def test_informational_findings_and_agreeing_configs_give_no_cause():
    # negative controls: a speed-only difference (informational), and no difference at all
    reference = declaring(train("tf1"), **{"loop/steps_per_call": 1})
    candidate = declaring(train("tf2"), **{"loop/steps_per_call": 10})
    record = judged(PairSpec("c", "tf1", "tf2"), reference, candidate)
    assert record.verdict == "PASS" and "informational" in record.preflight
    assert record.likely_cause == "" and record.cause_evidence == ""
    record = judged(PairSpec("c", "tf1", "tf2"), *initializers("0.447"))
    assert record.verdict == "PASS" and record.likely_cause == ""


def test_numbers_that_differ_are_explained_by_them_not_by_the_declaration_alone():
    reference = train("tf1")
    candidate = declaring(train("tf2", lr=0.0505), **{"optimizer/model/learning_rate": 0.0505})
    spec = PairSpec("c", "tf1", "tf2", control=True, role="control",
                    expect=Expectation(1, "slot|weight", why="lr", cause="learning_rate x1.01"))
    record = judged(spec, reference, candidate)
    assert record.first_step == 1 and record.explained == "yes"   # learning_rate, not declared
    # the declared-only cause itself refuses rows that differ, and nothing compared
    blocking = pd.DataFrame([{"key": INITIALIZER, "severity": "blocking",
                              "reference_value": "a", "candidate_value": "b"}])
    assert declared_only(blocking, pd.DataFrame({"step": [1], "passed": [False]})) is None
    assert declared_only(blocking, pd.DataFrame({"step": [], "passed": []})) is None
    unseen = pd.DataFrame({"step": [1], "passed": [True], "status": ["not captured"]})
    assert declared_only(blocking, unseen) is None
    informational = blocking.assign(severity="informational")
    assert explain_agreeing(informational, pd.DataFrame({"step": [1], "passed": [True]})) \
        .finding is None


def test_a_declared_cause_is_matched_by_its_key_pattern():
    found = explain_agreeing(pd.DataFrame([{"key": INITIALIZER, "severity": "blocking",
                                            "reference_value": "a", "candidate_value": "b"}]),
                             pd.DataFrame({"step": [0, 1], "passed": [True, True]}))
    assert explained("declared table/*/initializer", found) == "yes"
    assert explained("declared optimizer/embedding/*", found) == \
        f"no: found declared {INITIALIZER}"
    assert explained("learning_rate x1.01", found) == f"no: found declared {INITIALIZER}"
