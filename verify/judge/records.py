"""The two records a comparison produces, typed: a `DriftRow` per compared value and a
`PairRecord` per judged pair. The CSV columns of `drift.csv.gz` and `summary.csv` are their fields.

Nothing here imports TensorFlow.
"""
from __future__ import annotations

import dataclasses
import enum
import math
import operator
from typing import Any, Iterable

import pandas as pd

from verify.core.tolerances import Tolerance
from verify.judge.arrays import Drift


class Status(str, enum.Enum):
    """What a drift row says of its value: compared and within tolerance; compared and not (or
    not comparable: a run raised, a step was not captured); present on one side only (it
    fails); or declared not capturable on the run's device (informational: it passes without
    a number)."""

    PASSED = "passed"
    FAILED = "failed"
    MISSING = "missing"
    NOT_CAPTURED = "not captured"

    def __str__(self) -> str:
        return self.value


@dataclasses.dataclass(frozen=True)
class DriftRow:
    """One compared value of one pair at one step: a line of `drift.csv.gz`.

    >>> row = DriftRow.of(case="c", reference="tf1", candidate="tf2", replicas=1, step=1,
    ...                   quantity="loss", tensor="loss", drift=Drift(passed=True),
    ...                   tolerance=Tolerance(1e-6, 1e-5))
    >>> row.status, row.passed, COLUMNS[-1]
    (<Status.PASSED: 'passed'>, True, 'status')
    """

    case: str
    reference: str
    candidate: str
    replicas: int
    step: int
    quantity: str
    tensor: str
    max_abs: float
    max_rel: float
    rel_l2: float
    atol: float
    rtol: float
    tightest_rtol: float
    times_tolerance: float
    worst_index: str
    passed: bool
    reason: str
    floor: float
    looseness: float
    status: Status

    @classmethod
    def of(cls, *, case: str, reference: str, candidate: str, replicas: int, step: int,
           quantity: str, tensor: str, drift: Drift, tolerance: Tolerance,
           status: Status | None = None) -> "DriftRow":
        """The row of `drift` under `tolerance`; its status is passed or failed, as the drift
        says, unless given (`MISSING`, `NOT_CAPTURED`)."""
        status = status or (Status.PASSED if drift.passed else Status.FAILED)
        return cls(case, reference, candidate, replicas, step, quantity, tensor,
                   drift.max_abs, drift.max_rel, drift.rel_l2, tolerance.atol, tolerance.rtol,
                   drift.tightest_rtol, drift.times_tolerance, drift.worst_index, drift.passed,
                   drift.reason, drift.floor, drift.looseness, status)


COLUMNS = [f.name for f in dataclasses.fields(DriftRow)]
# The columns holding a measured figure: NaN where a row has none.
NUMERIC_COLUMNS = [f.name for f in dataclasses.fields(DriftRow) if f.type == "float"
                   and f.name not in ("atol", "rtol")]
_ROW_TYPES = {"step": "int64", "replicas": "int64", "passed": "bool"}
_ROW_FIELDS = operator.attrgetter(*COLUMNS)


def rows_frame(rows: Iterable[DriftRow]) -> pd.DataFrame:
    """Drift rows as a table with `COLUMNS`, statuses as their text.

    >>> rows_frame([]).columns.tolist() == COLUMNS
    True
    """
    # the fields as they are (no deep copy: astuple's cost a third of judging a pair)
    frame = pd.DataFrame([_ROW_FIELDS(r) for r in rows], columns=COLUMNS)
    frame["status"] = frame["status"].map(str)
    return frame.astype(_ROW_TYPES)


@dataclasses.dataclass(frozen=True)
class PairRecord:
    """One judged pair: a line of `summary.csv`. Change it with `dataclasses.replace`.

    >>> record = PairRecord("c", "tf1", "tf2", 1, verdict="PASS")
    >>> dataclasses.replace(record, message="ok").message, PAIR_COLUMNS[:5]
    ('ok', ['case', 'reference', 'candidate', 'replicas', 'role'])
    """

    case: str
    reference: str
    candidate: str
    replicas: int
    role: str = "faithful"            # faithful, control, or the case's own role name
    verdict: str = "FAIL"
    first_step: int | None = None     # the first divergence, when there is one
    first_quantity: str = ""
    first_tensor: str = ""
    margin: float = math.nan          # how far the worst value is inside (or past) its tolerance
    message: str = ""
    expected: str = ""                # what a control is expected to be caught at
    seed: int | None = None
    steps: int | None = None
    seconds: float | None = None      # the candidate's run time
    preflight: str = ""
    attribution: str = ""             # which side departs from the math (a case's oracle)
    tables_trained_by: str = ""
    calibration: str = ""             # which noise floor capped the tolerances, or why none
    environments: str = ""            # where each side ran
    not_captured: str = ""            # values a device did not let a run capture
    # A layer replay of the first divergent step (verify.session.layer_replay): the first divergent
    # layer (forward order, then backward) and its max abs drift, and what the replay did.
    first_layer: str = ""
    first_layer_drift: float = math.nan
    layer_replay: str = ""
    # A substitution of that layer (verify.session.substitution): local or carried in, with
    # its figures, and the repro written for a layer found local (relative to the report).
    substitution: str = ""
    repro: str = ""
    # The explanation stage (verify.explain): the likely cause of the first divergence with its
    # figures, the figures of every hypothesis tried, the cause a control declares and whether
    # the cause found is that one ('yes', or 'no: ...').
    likely_cause: str = ""
    cause_evidence: str = ""
    expected_cause: str = ""
    explained: str = ""

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


PAIR_COLUMNS = [f.name for f in dataclasses.fields(PairRecord)]


def pairs_frame(records: Iterable[PairRecord]) -> pd.DataFrame:
    """Pair records as a table with `PAIR_COLUMNS`."""
    return pd.DataFrame([r.as_dict() for r in records], columns=PAIR_COLUMNS)
