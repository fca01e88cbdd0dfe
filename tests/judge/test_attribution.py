"""Attribution sentences: which side departs from the oracle, for every situation."""

import pandas as pd

from verify.judge.attribution import attribute, attribute_pair


def rows(reference, candidate, *failing, case="c"):
    """Drift rows of one pair: a passing loss row at steps 1-3, plus the given failing rows
    (step, quantity, tensor[, reason[, status]])."""
    out = [dict(case=case, reference=reference, candidate=candidate, step=s, quantity="loss",
                tensor="loss", passed=True, reason="", status="passed") for s in (1, 2, 3)]
    for f in failing:
        step, quantity, tensor, *rest = f
        reason = rest[0] if rest else "Mismatched elements: 1 / 1"
        status = rest[1] if len(rest) > 1 else "failed"
        out.append(dict(case=case, reference=reference, candidate=candidate, step=step,
                        quantity=quantity, tensor=tensor, passed=False, reason=reason,
                        status=status))
    return pd.DataFrame(out)


SLOT = (3, "slot", "embedding/user/accumulator")
LOSS = (1, "loss", "loss")


def test_candidate_departs_reference_matches():
    got = attribute(rows("tf1", "tf2", SLOT), rows("oracle", "tf1"), rows("oracle", "tf2", SLOT),
                    math="the Adagrad math")
    assert got == ("tf2 departs from the Adagrad math at step 3 (slot "
                   "embedding/user/accumulator); tf1 matches.")


def test_reference_departs_candidate_matches():
    got = attribute(rows("tf1", "tf2", SLOT), rows("oracle", "tf1", SLOT), rows("oracle", "tf2"))
    assert got.startswith("tf1 departs from the oracle at step 3") and got.endswith(
        "tf2 matches.")


def test_both_depart_at_the_same_place_and_agree_blames_the_oracle():
    got = attribute(rows("tf1", "tf2"), rows("oracle", "tf1", LOSS), rows("oracle", "tf2", LOSS))
    assert got.startswith("both depart from the oracle at step 1 (loss) and agree with each other")
    assert "odd one out" in got


def test_both_depart_at_the_same_place_differently():
    got = attribute(rows("tf1", "tf2", (2, "grad", "w")), rows("oracle", "tf1", LOSS),
                    rows("oracle", "tf2", LOSS))
    assert got == ("both depart from the oracle at step 1 (loss), and differently: tf1 and tf2 "
                   "differ from each other from step 2 (grad w).")


def test_both_depart_the_earlier_one_is_named_first():
    got = attribute(rows("tf1", "tf2", (2, "weight", "w")),
                    rows("oracle", "tf1", (4, "loss", "loss")),
                    rows("oracle", "tf2", (2, "weight", "w")))
    assert got == ("tf2 departs from the oracle first, at step 2 (weight w); tf1 departs later, "
                   "at step 4 (loss).")
    # same step: the quantity order decides (grad before weight)
    got = attribute(rows("tf1", "tf2"), rows("oracle", "tf1", (2, "weight", "w")),
                    rows("oracle", "tf2", (2, "grad", "w")))
    assert got.startswith("tf2 departs from the oracle first, at step 2 (grad w)")


def test_neither_departs():
    assert attribute(rows("tf1", "tf2"), rows("oracle", "tf1"), rows("oracle", "tf2")) == (
        "neither departs from the oracle; tf1 and tf2 agree.")


def test_neither_departs_but_they_differ_from_each_other():
    got = attribute(rows("tf1", "tf2", (5, "weight", "dense/kernel")), rows("oracle", "tf1"),
                    rows("oracle", "tf2"))
    assert got == ("neither departs from the oracle; they differ from each other only in step 5 "
                   "(weight dense/kernel), within each one's tolerance of the oracle.")


def test_structural_and_run_failures_are_described():
    missing = (0, "weight", "embedding/extra", "Missing in reference: weight ...", "missing")
    got = attribute(rows("tf1", "ctl", missing), rows("oracle", "tf1"),
                    rows("oracle", "ctl", missing))
    assert got == ("ctl departs from the oracle at step 0 (weight embedding/extra, present on one "
                   "side only); tf1 matches.")
    crashed = (1, "run", "ctl", "candidate ctl raised: ValueError: boom")
    got = attribute(rows("tf1", "ctl", crashed), rows("oracle", "tf1"),
                    rows("oracle", "ctl", crashed))
    assert "step 1 (run ctl: candidate ctl raised: ValueError: boom)" in got


def test_without_oracle_rows_nothing_is_attributed():
    got = attribute(rows("tf1", "tf2", LOSS), pd.DataFrame(), rows("oracle", "tf2"))
    assert got == "the oracle was not compared with both tf1 and tf2; no side can be attributed."


def test_attribute_pair_picks_the_three_comparisons_of_a_case():
    drift = pd.concat([rows("tf1", "tf2", SLOT), rows("oracle", "tf1"),
                       rows("oracle", "tf2", SLOT),
                       rows("tf1", "tf2", case="other"), rows("oracle", "tf2", LOSS, case="other"),
                       rows("oracle", "tf1", case="other")])
    assert attribute_pair(drift, "c", "tf1", "tf2", "oracle").startswith(
        "tf2 departs from the oracle at step 3 (slot")
    assert attribute_pair(drift, "other", "tf1", "tf2", "oracle").startswith(
        "tf2 departs from the oracle at step 1 (loss)")
