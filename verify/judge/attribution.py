"""Which side of a pair departs from the math: drift against an oracle, in one sentence.

A pair's drift rows say THAT a reference and a candidate differ and where they first do. With
an oracle (an implementation computing the documented math, e.g. `cases.recommender.oracle.OracleRunner`)
compared against each side, the first divergence of (oracle, reference) and of
(oracle, candidate) says WHICH side departs from the math, and from where:

- one side departs, the other matches: that side is wrong;
- both depart: the one that departs first is the origin; when both depart at the same place
  and agree with each other, the oracle is the odd one out (check its configuration);
- neither departs: the two differ from each other only within their distance to the math.

Pure pandas (no TensorFlow), so it runs on saved drift rows anywhere.
"""
from __future__ import annotations

import pandas as pd

from verify.judge.compare import Divergence, first_divergence
from verify.judge.records import Status
from verify.core.trace import QUANTITIES


def _where(d: Divergence) -> str:
    what = d.quantity if d.quantity == "loss" else f"{d.quantity} {d.tensor}"
    if d.status == Status.MISSING.value:
        what += ", present on one side only"
    elif d.quantity == "run":
        what += f": {d.reason}"
    return f"step {d.step} ({what})"


def _name(rows: pd.DataFrame, column: str, given: str | None, fallback: str) -> str:
    if given:
        return given
    if not rows.empty and column in rows:
        return str(rows[column].iloc[0])
    return fallback


def attribute(reference_vs_candidate: pd.DataFrame, oracle_vs_reference: pd.DataFrame,
              oracle_vs_candidate: pd.DataFrame, *, math: str = "the oracle",
              reference: str | None = None, candidate: str | None = None) -> str:
    """One sentence saying which side departs from the oracle, where, and whether the two
    sides differ from each other. Arguments are drift rows as `compare_traces` returns them
    (the oracle is the reference of the two oracle comparisons); `math` names what the oracle
    computes ("the Adagrad math"); names default to the rows' own columns.

    >>> def rows(ref, cand, failing=None):
    ...     step, quantity, tensor = failing or (1, "loss", "loss")
    ...     return pd.DataFrame({"reference": [ref], "candidate": [cand], "step": [step],
    ...                          "quantity": [quantity], "tensor": [tensor],
    ...                          "passed": [failing is None], "reason": ["differs"]})
    >>> slot = (3, "slot", "embedding/user/accumulator")
    >>> attribute(rows("tf1", "tf2", slot), rows("oracle", "tf1"), rows("oracle", "tf2", slot),
    ...           math="the Adagrad math")
    'tf2 departs from the Adagrad math at step 3 (slot embedding/user/accumulator); tf1 matches.'
    >>> attribute(rows("tf1", "tf2"), rows("oracle", "tf1", (1, "loss", "loss")),
    ...           rows("oracle", "tf2", (1, "loss", "loss")))  # doctest: +ELLIPSIS
    'both depart from the oracle at step 1 (loss) and agree with each other: the oracle is ...'
    """
    ref = _name(oracle_vs_reference, "candidate", reference, "reference")
    ref = _name(reference_vs_candidate, "reference", reference, ref)
    cand = _name(oracle_vs_candidate, "candidate", candidate, "candidate")
    cand = _name(reference_vs_candidate, "candidate", candidate, cand)
    if oracle_vs_reference.empty or oracle_vs_candidate.empty:
        return (f"{math} was not compared with both {ref} and {cand}; "
                f"no side can be attributed.")
    d_pair = first_divergence(reference_vs_candidate) if not reference_vs_candidate.empty else None
    d_ref, d_cand = first_divergence(oracle_vs_reference), first_divergence(oracle_vs_candidate)
    if d_ref is None and d_cand is None:
        if d_pair is None:
            return f"neither departs from {math}; {ref} and {cand} agree."
        return (f"neither departs from {math}; they differ from each other only in "
                f"{_where(d_pair)}, within each one's tolerance of {math}.")
    if d_ref is None or d_cand is None:
        wrong, right, d = (cand, ref, d_cand) if d_ref is None else (ref, cand, d_ref)
        return f"{wrong} departs from {math} at {_where(d)}; {right} matches."
    if (d_ref.step, d_ref.quantity) == (d_cand.step, d_cand.quantity):
        if d_pair is None:
            return (f"both depart from {math} at {_where(d_ref)} and agree with each other: "
                    f"{math} is the odd one out; check how the oracle is configured.")
        return (f"both depart from {math} at {_where(d_ref)}, and differently: {ref} and "
                f"{cand} differ from each other from {_where(d_pair)}.")
    order = sorted(((d_ref, ref), (d_cand, cand)),
                   key=lambda dn: (dn[0].step, QUANTITIES.index(dn[0].quantity)))
    (first, first_name), (later, later_name) = order
    return (f"{first_name} departs from {math} first, at {_where(first)}; {later_name} "
            f"departs later, at {_where(later)}.")


def attribute_pair(rows: pd.DataFrame, case: str, reference: str, candidate: str,
                   oracle: str, *, math: str = "the oracle") -> str:
    """`attribute` on a report's combined drift rows (columns `case`, `reference`,
    `candidate`): picks the (reference, candidate), (oracle, reference) and
    (oracle, candidate) rows of `case`.

    >>> rows = pd.DataFrame({"case": ["c"] * 3, "reference": ["tf1", "oracle", "oracle"],
    ...     "candidate": ["tf2", "tf1", "tf2"], "step": [1] * 3, "quantity": ["loss"] * 3,
    ...     "tensor": ["loss"] * 3, "passed": [True] * 3, "reason": [""] * 3})
    >>> attribute_pair(rows, "c", "tf1", "tf2", "oracle")
    'neither departs from the oracle; tf1 and tf2 agree.'
    """
    of_case = rows[rows["case"] == case]

    def pick(ref, cand):
        return of_case[(of_case["reference"] == ref) & (of_case["candidate"] == cand)]

    return attribute(pick(reference, candidate), pick(oracle, reference), pick(oracle, candidate),
                     math=math, reference=reference, candidate=candidate)
