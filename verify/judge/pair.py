"""Judging one pair: compare -> verdict -> preflight -> attribution, in one place.

Every way the suite judges a pair (the pytest run, `python -m verify compare`, re-comparing
kept traces) calls `judge_pair`, so they cannot disagree. Everything it needs is in the traces
(values, and in their meta what each side declared) and the pair's `PairSpec`. Nothing here
imports TensorFlow.
"""
from __future__ import annotations

import dataclasses
from dataclasses import replace
from typing import Any, Callable, Mapping

import numpy as np
import pandas as pd

from verify.core.case import Expectation, PairSpec
from verify.core.noise_floor import MULTIPLE, Calibration, NoiseFloor
from verify.core.tolerances import Tolerances
from verify.core.trace import Trace, as_dense
from verify.core.meta import SUITE_ENVIRONMENT
from verify.judge.arrays import Drift
from verify.judge.attribution import attribute
from verify.judge.compare import compare_traces, describe_not_captured, first_divergence
from verify.judge.inputs import layout_findings
from verify.judge.preflight import COLUMNS as PREFLIGHT_COLUMNS
from verify.judge.preflight import preflight, tables_trained_by
from verify.judge.layers import LAYER_COLUMNS
from verify.judge.records import (COLUMNS, PAIR_COLUMNS, DriftRow, PairRecord, rows_frame)
from verify.judge.verdict import FAIL, Verdict, judge, judge_with_preflight

__all__ = ["PAIR_COLUMNS", "LOSS_COLUMNS", "PairResult", "PairRecord", "judge_pair"]
LOSS_COLUMNS = ["case", "reference", "candidate", "replicas", "step", "tensor", "reference_loss",
                "candidate_loss"]


@dataclasses.dataclass
class PairResult:
    """One compared pair: its drift rows, its record (a summary.csv line), its losses and its
    verdict."""

    rows: pd.DataFrame
    record: PairRecord
    losses: pd.DataFrame
    verdict: Verdict | None = None
    preflight: pd.DataFrame = dataclasses.field(
        default_factory=lambda: pd.DataFrame(columns=PREFLIGHT_COLUMNS))
    # Where the candidate ran (environment facts and device), for the report.
    environment: dict[str, Any] = dataclasses.field(default_factory=dict)
    # The layer replay's rows (verify.judge.layers.LAYER_COLUMNS); empty without a replay.
    layers: pd.DataFrame = dataclasses.field(
        default_factory=lambda: pd.DataFrame(columns=LAYER_COLUMNS))

    @classmethod
    def failed(cls, record: PairRecord) -> "PairResult":
        """A pair that produced no rows (the harness raised, a case source did not load): its
        record only, FAIL with the record's message."""
        return cls(pd.DataFrame(columns=COLUMNS), replace(record, verdict=FAIL),
                   pd.DataFrame(columns=LOSS_COLUMNS), Verdict(FAIL, record.message))


def judge_pair(spec: PairSpec, traces: Callable[[str], Trace], tolerances: Tolerances | None,
               *, oracle_rows: dict[str, pd.DataFrame] | None = None,
               calibration: Calibration | None = None) -> PairResult:
    """Judge one pair of a case from its traces: the drift rows, the numeric verdict, the
    preflight findings folded into it and, when the case has an oracle, which side departs
    from the math.

    `traces(name)` gives implementation `name`'s trace. `oracle_rows` caches the drift rows
    of (oracle, implementation) comparisons across the pairs of one case. With the case's
    `calibration`, tolerances are capped at the case's multiple of the measured noise floor of
    the pair's floor sources (`PairSpec.floor_source`: the reference; for the float64 oracle
    the larger of the case's float32 reference's and the oracle's own), when the calibration
    was measured on the data and device the reference ran on. Nothing of the candidate
    chooses its tolerance.

    >>> ref, cand = Trace("tf1", {"seed": 3}), Trace("tf2", {"seconds": 1.5})
    >>> for t in (ref, cand):
    ...     t.record(1, "loss", "loss", np.float32(0.5))
    >>> spec = PairSpec("demo", "tf1", "tf2")
    >>> result = judge_pair(spec, {"tf1": ref, "tf2": cand}.__getitem__, None)
    >>> result.record.verdict, result.record.preflight
    ('PASS', 'not declared')
    """
    reference, candidate = traces(spec.reference), traces(spec.candidate)
    floor, multiple, calibrated = applicable_floor(calibration, spec.floor_source, reference,
                                                   spec.multiple, spec.multiple_why)
    result = compare_pair(reference, candidate, tolerances, case=spec.case,
                          replicas=spec.replicas, expect=spec.expect, control=spec.control,
                          floor=floor, multiple=multiple)
    result.record = replace(result.record, role=spec.role or result.record.role,
                            calibration=calibrated)
    add_preflight(result, reference.meta.declared_config, candidate.meta.declared_config,
                  expect=spec.expect, preflight_expect=spec.preflight_expect,
                  device=candidate.meta.device)
    resumed = _resumed_from(reference, candidate)
    if spec.oracle and spec.oracle not in (spec.reference, spec.candidate) and resumed:
        # the oracle trains from the case's initial values, not from the restored state
        result.record = replace(result.record, attribution=(
            f"not attributed: the pair resumes from {resumed}'s checkpoint; the oracle "
            f"({spec.oracle}) trains from the initial values"))
    elif spec.oracle and spec.oracle not in (spec.reference, spec.candidate):
        cache = {} if oracle_rows is None else oracle_rows
        oracle = traces(spec.oracle)

        def against_oracle(name: str) -> pd.DataFrame:
            if name not in cache:
                oracle_floor, oracle_multiple, _ = applicable_floor(
                    calibration, spec.oracle_floor_of or (spec.oracle,), oracle, spec.multiple,
                    spec.multiple_why)
                cache[name] = compare_traces(oracle, traces(name), tolerances, case=spec.case,
                                             floor=oracle_floor, multiple=oracle_multiple)
            return cache[name]

        sentence = attribute(result.rows, against_oracle(spec.reference),
                             against_oracle(spec.candidate), reference=spec.reference,
                             candidate=spec.candidate)
        message = result.record.message
        result.record = replace(result.record, attribution=sentence, message=message if (
            result.verdict.ok) else f"{message} Attribution: {sentence}")
    return result


def _resumed_from(*traces: Trace) -> str:
    """The implementation whose checkpoint either trace resumed from (`ResumeRunner` records
    it in the trace's meta), '' when neither resumed."""
    for trace in traces:
        resumed = trace.meta.details.get("resumed_from")
        if isinstance(resumed, dict) and resumed.get("implementation"):
            return str(resumed["implementation"])
    return ""


def applicable_floor(calibration: Calibration | None, name: str | tuple[str, ...],
                     trace: Trace, multiple: float = MULTIPLE,
                     why: str = "") -> tuple[NoiseFloor | None, float, str]:
    """The measured floor of implementation `name` when the calibration applies to the data
    and device `trace` was run on, else None; the multiple it is taken with (the case's,
    never a measurement); and a phrase saying which, for the report.

    >>> applicable_floor(None, "tf1", Trace("tf1"))
    (None, 10.0, 'not calibrated')
    >>> from verify.core.noise_floor import Calibration
    >>> calibration = Calibration("c", data_digest="d", steps=1, references={},
    ...                           provenance={"device": "cpu"})
    >>> applicable_floor(calibration, "tf1", Trace("tf1", {"data_digest": "d", "device": "tpu"}))[2]
    'calibrated on cpu: not applied to a tpu run'
    """
    if calibration is None:
        return None, multiple, "not calibrated"
    if calibration.data_digest != trace.meta.data_digest:
        return None, multiple, "calibrated on other data: not applied"
    measured_on = calibration.provenance.get("device", "cpu")
    if measured_on != trace.meta.device:   # a TPU's matmul passes and engine are other noise
        return None, multiple, (f"calibrated on {measured_on}: not applied to a "
                                f"{trace.meta.device} run")
    names = (name,) if isinstance(name, str) else tuple(name)
    floor, measured = calibration.floor_of_sources(names)
    if floor is None:
        return None, multiple, f"no floor measured for {' or '.join(names)}"
    name = " and ".join(measured)
    reason = f" (the case's multiple: {why})" if why else ""
    measured_cpu = calibration.provenance.get("cpu", "")
    run_cpu = trace.meta.environment.cpu if trace.meta.environment else ""
    other_cpu = (f"; measured on {measured_cpu}, this run on {run_cpu}"
                 if measured_cpu and run_cpu and measured_cpu != run_cpu else "")
    return floor, multiple, (
        f"{multiple:g}x the floor of {name}{reason} ({calibration.provenance.get('date', '?')}"
        f", TF {calibration.provenance.get('tensorflow', '?')}, {calibration.steps} steps"
        f"{other_cpu})")


def unjudged(spec: PairSpec, problems: Mapping[str, str],
             tolerances: Tolerances | None = None) -> PairResult:
    """A pair that cannot be judged because traces it needs are unusable (missing, unreadable,
    not the trace they claim to be): a failing 'run' row at step 0 per unusable trace, named
    by its implementation, with the problem as its reason; FAIL whatever the pair's role.

    >>> result = unjudged(PairSpec("demo", "tf1", "tf2"), {"tf1": "tf1.json: no such file"})
    >>> result.record.verdict, result.record.first_tensor, result.rows["reason"].tolist()
    ('FAIL', 'tf1', ['tf1.json: no such file'])
    """
    tol = (tolerances or Tolerances.default()).lookup("run", "")
    rows = rows_frame(DriftRow.of(case=spec.case, reference=spec.reference,
                                  candidate=spec.candidate, replicas=spec.replicas, step=0,
                                  quantity="run", tensor=name, drift=Drift(reason=why),
                                  tolerance=tol) for name, why in problems.items())
    divergence = first_divergence(rows)
    message = "not compared: " + "; ".join(f"the trace of {name} cannot be used: {why}"
                                           for name, why in problems.items())
    expected = (f"step {spec.expect.step} {spec.expect.quantity}" if spec.expect else
                "preflight " + ", ".join(spec.preflight_expect) if spec.preflight_expect else "")
    record = PairRecord(spec.case, spec.reference, spec.candidate, spec.replicas,
                        role=spec.role or ("control" if spec.control else "faithful"),
                        verdict=FAIL, first_step=divergence.step,
                        first_quantity=divergence.quantity, first_tensor=divergence.tensor,
                        message=message, expected=expected, preflight="not compared")
    return PairResult(rows, record, pd.DataFrame(columns=LOSS_COLUMNS),
                      Verdict(FAIL, message, divergence))


def compare_pair(reference: Trace, candidate: Trace, tolerances: Tolerances | None, *,
                 case: str, replicas: int, expect: Expectation | None = None,
                 control: bool | None = None, floor: NoiseFloor | None = None,
                 multiple: float = MULTIPLE) -> PairResult:
    """Compare two traces and judge them: the rows, the pair record, the loss curves and, as
    informational preflight findings, the input layouts the two sides differ in.

    >>> ref, cand = Trace("tf1", {"seed": 3}), Trace("tf2", {"seconds": 1.5})
    >>> for t in (ref, cand):
    ...     t.record(1, "loss", "loss", np.float32(0.5))
    >>> result = compare_pair(ref, cand, None, case="demo", replicas=1)
    >>> result.record.verdict, result.record.seed, len(result.losses)
    ('PASS', 3, 1)
    """
    rows = compare_traces(reference, candidate, tolerances, case=case, replicas=replicas,
                          floor=floor, multiple=multiple)
    verdict = judge(rows, expect)
    d = verdict.divergence
    record = PairRecord(
        case, reference.implementation, candidate.implementation, replicas,
        role="control" if (expect is not None if control is None else control) else "faithful",
        verdict=verdict.status, first_step=d.step if d else None,
        first_quantity=d.quantity if d else "", first_tensor=d.tensor if d else "",
        margin=verdict.margin, message=verdict.message,
        expected=f"step {expect.step} {expect.quantity}" if expect else "",
        seed=_first(reference.meta.seed, candidate.meta.seed),
        steps=_first(candidate.meta.steps, reference.meta.steps),
        seconds=candidate.meta.seconds,
        environments=f"{environment_text(reference)} → {environment_text(candidate)}",
        not_captured=describe_not_captured(rows, reference, candidate))
    layouts = pd.DataFrame([{**r, "case": case, "reference": reference.implementation,
                             "candidate": candidate.implementation}
                            for r in layout_findings(reference, candidate, rows)],
                           columns=PREFLIGHT_COLUMNS).astype(str)
    return PairResult(rows, record, loss_curves(reference, candidate, case=case,
                                                replicas=replicas), verdict, layouts,
                      environment=_suite_side_environment(reference, candidate))


def _suite_side_environment(reference: Trace, candidate: Trace) -> dict[str, Any]:
    """The environment facts a report's header cites: the candidate's, unless only the
    reference ran in the suite's own environment."""
    side = candidate
    if (candidate.meta.environment.name != SUITE_ENVIRONMENT
            and reference.meta.environment.name == SUITE_ENVIRONMENT):
        side = reference
    return {**side.meta.environment.facts(), "name": side.meta.environment.name,
            "device": side.meta.device}


def environment_text(trace: Trace) -> str:
    """Where a trace was run, as a report names it: 'tf221 (TF 2.21.0)'; the Keras 3, tf_keras
    and JAX versions too when the run used them.

    >>> environment_text(Trace("tf2", {"environment": {"name": "tf221", "tensorflow": "2.21.0"}}))
    'tf221 (TF 2.21.0)'
    >>> environment_text(Trace("k", {"environment": {"name": "keras3-jax", "tensorflow": "2.21.0",
    ...                                              "keras": "3.15.1", "jax": "0.10.2"}}))
    'keras3-jax (TF 2.21.0, Keras 3.15.1, JAX 0.10.2)'

    A trace read from a golden reference says so, naming the file:

    >>> environment_text(Trace("tf1", {"environment": {"name": "local", "tensorflow": "2.15.1"},
    ...                                "details": {"golden_file": "goldens/c/tf1.json"}}))
    'local (TF 2.15.1) [golden: goldens/c/tf1.json]'
    """
    env = trace.meta.environment
    parts = [f"TF {env.tensorflow}" if env.tensorflow else "",
             f"Keras {env.keras}" if env.keras.startswith("3") else "",
             f"tf_keras {env.tf_keras}" if env.tf_keras else "",
             f"JAX {env.jax}" if env.jax else ""]
    shown = ", ".join(p for p in parts if p)
    golden = trace.meta.details.get("golden_file")
    return (env.name + (f" ({shown})" if shown else "")
            + (f" [golden: {golden}]" if golden else ""))


def add_preflight(result: PairResult, reference_config: dict[str, Any],
                  candidate_config: dict[str, Any], *, expect: Expectation | None,
                  preflight_expect: tuple[str, ...], device: str) -> None:
    """Diff what both sides declare and fold blocking findings into the pair's verdict and
    record (see `verify.judge.verdict.judge_with_preflight`), after the findings the
    comparison made (input layouts, `compare_pair`). Configurations are plain dicts
    (`declared_config`), so this runs without TensorFlow, also on kept traces."""
    record = result.record
    reference, candidate = record.reference, record.candidate
    if reference_config and candidate_config:
        declared = preflight(record.case, reference, reference_config, candidate,
                             candidate_config, device)
        result.preflight = declared if result.preflight.empty else pd.concat(
            [declared, result.preflight], ignore_index=True)
    result.verdict = judge_with_preflight(result.verdict, result.preflight, expect,
                                          preflight_expect)
    counts = result.preflight["severity"].value_counts().to_dict()
    result.record = replace(
        record, verdict=result.verdict.status, message=result.verdict.message,
        preflight=", ".join(f"{n} {s}" for s, n in sorted(counts.items())) or (
            "not declared" if not (reference_config and candidate_config) else "no difference"),
        tables_trained_by="; ".join(
            tables_trained_by(n, c, device)
            for n, c in ((reference, reference_config), (candidate, candidate_config))
            if any(k.startswith("optimizer/embedding/") for k in c)),
        expected=record.expected or ("preflight " + ", ".join(preflight_expect)
                                     if preflight_expect else ""))


def loss_curves(reference: Trace, candidate: Trace, *, case: str, replicas: int) -> pd.DataFrame:
    """Per-step loss values of both sides (NaN where a side captured none), LOSS_COLUMNS.

    >>> ref, cand = Trace("tf1"), Trace("tf2")
    >>> ref.record(1, "loss", "loss", np.float32(0.5))
    >>> loss_curves(ref, cand, case="demo", replicas=1)[["step", "reference_loss"]].values.tolist()
    [[1.0, 0.5]]
    """
    values: dict[tuple[int, str], list[float]] = {}
    for column, trace in enumerate((reference, candidate)):
        for key, value in trace.values.items():
            if key.quantity == "loss" and not isinstance(value, str):
                array = as_dense(value).astype(np.float64)
                point = values.setdefault((key.step, key.tensor), [np.nan, np.nan])
                point[column] = float(array.mean()) if array.size else np.nan
    records = [{"case": case, "reference": reference.implementation,
                "candidate": candidate.implementation, "replicas": replicas, "step": step,
                "tensor": tensor, "reference_loss": ref, "candidate_loss": cand}
               for (step, tensor), (ref, cand) in sorted(values.items())]
    return pd.DataFrame(records, columns=LOSS_COLUMNS)


def _first(*values):
    """The first value that is not None."""
    return next((v for v in values if v is not None), None)
