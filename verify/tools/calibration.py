"""Tolerances from a case's own noise floor.

A tolerance is a measurement: how far may two faithful implementations drift apart? The
floor is how far a legitimately different float computation of the reference drifts from
the reference itself. `python -m verify calibrate CASE` runs each reference of the case again
from its initial values moved by one ulp up and one ulp down (and, where the case names them,
other legitimate computations of it such as another summation order), and records per
quantity, tensor and step the largest absolute difference from the plain run, as a running
maximum over steps (drift grows; it does not shrink back). A third run nudges every
gradient the optimizer applies by one ulp up or down (seeded), which measures how the
reference's own update amplifies rounding noise of the size two implementations of the same
formula make (Adam's update of near-zero gradients, for one). The result is stored beside the
case (`calibration.json`) with its provenance: TF version, steps, date, machine, and the case's
data digest, so a calibration of other data is never applied.

In a pair whose reference is calibrated, every element may differ by
`min(atol + rtol*|reference|, M * floor)`: the case's own tolerance where it is tighter, else
`M` times the floor of that tensor at that step. `M` is the case's `tolerance_multiple`, 10
unless the case gives another with a written reason: a constant stated before anything is
measured. The drift of the pairs being judged never chooses it, nor any floor: a calibration
measures references only, each from its own runs (`python -m verify calibrate` shows how far
each pair sits above its floor, as information). Pairs against the float64 oracle take the
larger of the floors of the case's float32 reference and of the oracle (whose declared
variant computes the same math in float32). A row whose own tolerance is below the floor fails
(such a tolerance cannot tell a mistake from noise), `ceiling_advice` says which atol to set
instead, and reports flag rows whose tolerance is more than `LOOSE` times the floor.

Nothing here imports TensorFlow except `calibrate_case`, which runs the implementations.

The floors and their file format live in `verify.core.noise_floor`.
"""
from __future__ import annotations

import dataclasses
import datetime
import math
import platform
from typing import Iterable, Mapping

import numpy as np

from verify.core.case import Mutation
from verify.core.meta import Environment
from verify.core.noise_floor import Calibration, NoiseFloor
from verify.core.quantities import NUMERIC
from verify.core.trace import TouchedRows, Trace, as_dense
from verify.judge.touched_rows import TouchedComparison


class ReferenceRaised(ValueError):
    """A run of the reference being calibrated raised (the case's code: the user's error);
    the message is the run's error."""


def measure_floor(plain: Trace, variants: Iterable[Trace]) -> NoiseFloor:
    """The largest absolute difference of any variant from `plain`, per numeric (quantity,
    tensor) and step, as a running maximum over steps.

    >>> a, b = Trace("ref"), Trace("ref+ulp")
    >>> for step, (x, y) in enumerate([(1.0, 1.0), (2.0, 2.5), (3.0, 3.1)]):
    ...     a.record(step, "weight", "w", np.float32(x)); b.record(step, "weight", "w", np.float32(y))
    >>> [round(v, 3) for v in measure_floor(a, [b]).floors[("weight", "w")]]
    [0.0, 0.5, 0.5]
    """
    worst: dict[tuple[str, str], dict[int, float]] = {}
    for variant in variants:
        if variant.error is not None:
            raise ReferenceRaised(f"the calibration run {variant.implementation} raised: "
                                  f"{variant.error}")
        touched = TouchedComparison(plain, variant)   # tables captured by touched rows
        for key in sorted(plain.values, key=lambda k: k.step):
            value = plain.values[key]
            if key.quantity not in NUMERIC or isinstance(value, str):
                continue
            other = variant.values.get(key)
            if other is None or isinstance(other, str):
                continue
            if isinstance(value, TouchedRows) or isinstance(other, TouchedRows):
                both = touched.rows(key)   # on the rows either run touched
                if both is None:
                    continue
                a, b = both[1].astype(np.float64), both[2].astype(np.float64)
            else:
                a = as_dense(value).astype(np.float64)
                b = as_dense(other).astype(np.float64)
            if a.shape != b.shape:
                continue
            diff = float(np.max(np.abs(a - b))) if a.size else 0.0
            series = worst.setdefault((key.quantity, key.tensor), {})
            series[key.step] = max(series.get(key.step, 0.0), diff)
    floors = {}
    for key, by_step in worst.items():
        running, series = 0.0, []
        for step in range(max(by_step) + 1):
            running = max(running, by_step.get(step, 0.0))
            series.append(running)
        floors[key] = tuple(series)
    return NoiseFloor(floors)


def nudged(values: Mapping[str, np.ndarray], direction: float | None,
           seed: int = 0) -> dict[str, np.ndarray]:
    """Every initial value moved by one ulp towards `direction` (+inf or -inf), or, with
    `direction` None, each element up or down by a seeded random sign: rounding errors are
    independent per element, and a nudge of every element the same way scales a layer's
    output as a whole, so terms that cancel move together and their difference hardly at all.

    >>> nudged({"w": np.float32([1.0])}, np.inf)["w"] > 1.0
    array([ True])
    >>> moved = nudged({"w": np.ones(1000, np.float32)}, None)["w"]
    >>> bool((moved > 1).any() and (moved < 1).any())
    True
    """
    rng = np.random.default_rng(seed)
    out = {}
    for name in sorted(values):
        value = np.asarray(values[name])
        if value.dtype.kind == "f":
            if direction is None:
                up = rng.random(value.shape) < 0.5
                value = np.where(up, np.nextafter(value, np.asarray(np.inf, value.dtype)),
                                 np.nextafter(value, np.asarray(-np.inf, value.dtype)))
            else:
                value = np.nextafter(value, np.asarray(direction, value.dtype))
        out[name] = value
    return out


def calibrate_case(case, *, references: Iterable[str] | None = None, steps: int | None = None,
                   device: str = "cpu", tpu_name: str = "", log=print,
                   plains: dict[str, Trace] | None = None) -> Calibration:
    """Measure the noise floor of each reference of `case`, each from its own runs only: the
    plain run against its runs from initial values one ulp up, one ulp down and one ulp up or
    down per element (seeded random sign), with applied gradients nudged by one ulp, and the
    case's `noise_variants` of it.

    `references` default to `case.calibrated_references()`: the floor source of every pair's
    reference, never a candidate as such, so the calibration of a case is the same with and
    without the candidates it judges. The multiple is the case's (`Case.tolerance_multiple`),
    not the calibration's: nothing measured here chooses it. `plains`, when given, receives
    each reference's plain run (for `ceiling_advice`). `device` "tpu" measures on the TPU
    `tpu_name` names (the judge applies a calibration only to runs on its device).
    """
    from verify.runners.run import run_implementation

    def run(case, implementation):
        return run_implementation(case, implementation, steps=steps, device=device,
                                  tpu_name=tpu_name)

    steps = steps or case.steps
    names = list(references or case.calibrated_references())
    skipped = case.uncalibratable(names)
    for name, why in skipped.items():
        log(f"not calibrated: {name} ({why})")
    names = [name for name in names if name not in skipped]
    floors = {}
    for name in names:
        implementation = case.implementation(name)
        log(f"calibrating {case.name}: {name}")
        plain = run(case, implementation)
        if plain.error is not None:
            raise ReferenceRaised(f"{case.name}: the reference {name} raised while being "
                                  f"calibrated, so nothing was measured: {plain.error}")
        if plains is not None:
            plains[name] = plain
        variants = [run(dataclasses.replace(case, initial_values=nudged(
                        case.initial_values, direction)), implementation)
                    for direction in (np.inf, -np.inf, None)]
        nudged_gradients = dataclasses.replace(implementation,
                                               mutation=Mutation("nudge_gradients"))
        variants.append(run(case, nudged_gradients))
        for other in case.noise_variants.get(name, ()):
            variants.append(run(case, case.implementation(other)))
        floors[name] = measure_floor(plain, variants)
    provenance = _provenance(case, device, floors)
    if skipped:
        provenance["not_calibrated"] = dict(skipped)
    return Calibration(case.name, case.data_digest(), steps, floors, provenance)


def _provenance(case, device: str, floors: dict) -> dict:
    """Where and how a calibration was measured (the judge applies it only on its device)."""
    import sys

    tensorflow = sys.modules.get("tensorflow")
    return {"tensorflow": getattr(tensorflow, "__version__", ""),
            "numpy": np.__version__, "python": platform.python_version(),
            "machine": platform.machine(), "processor": platform.processor(),
            # a chaotic run's floors depend on the CPU's kernels (docs/explanation/tolerances.md)
            "cpu": Environment.current().cpu,
            "date": datetime.date.today().isoformat(), "device": device,
            "variants": ["initial values +1 ulp", "initial values -1 ulp",
                         "initial values +-1 ulp (seeded random sign per element)",
                         "applied gradients +-1 ulp (seeded random sign)"]
                        + [f"{ref}: {', '.join(v)}" for ref, v in
                           case.noise_variants.items() if ref in floors]}


@dataclasses.dataclass(frozen=True)
class PairHeadroom:
    """How far a pair's worst row sits above its floor (information: it never sets a
    tolerance), where, and the pair's role."""

    reference: str
    candidate: str
    role: str
    times_floor: float
    where: str


def pair_headroom(case, calibration: Calibration, *, steps: int | None = None,
                  device: str = "cpu", log=print) -> list[PairHeadroom]:
    """Every pair of `case` run and compared with unlimited tolerances: its worst drift in
    floors of its floor source (`Case.floor_source`). Shown by `python -m verify calibrate`
    so a user sees how much of the case's multiple each faithful pair uses; it is never
    stored and never chooses a tolerance."""
    from verify.core.tolerances import Tolerance, Tolerances
    from verify.judge.compare import compare_traces
    from verify.runners.run import run_implementation

    unlimited = Tolerances({q: Tolerance(float("inf"), 0.0)
                            for q in Tolerances.default().by_quantity})
    steps = steps or calibration.steps
    traces: dict[str, Trace] = {}

    def trace(name: str) -> Trace:
        if name not in traces:
            log(f"  running {name}")
            traces[name] = run_implementation(case, case.implementation(name), steps=steps,
                                              device=device)
        return traces[name]

    found = []
    for spec in case.pair_specs(device):
        floor, _ = calibration.floor_of_sources(spec.floor_source)
        if floor is None:
            continue
        reference, candidate = trace(spec.reference), trace(spec.candidate)
        if reference.error or candidate.error:
            found.append(PairHeadroom(spec.reference, spec.candidate, spec.role, float("nan"),
                                      "a side raised"))
            continue
        rows = compare_traces(reference, candidate, unlimited, floor=floor, multiple=1.0)
        rows = rows[rows["floor"].notna()]
        if rows.empty:
            continue
        top = rows.loc[rows["times_tolerance"].astype(float).idxmax()]
        found.append(PairHeadroom(spec.reference, spec.candidate, spec.role,
                                  float(top["times_tolerance"]),
                                  f"step {int(top['step'])} {top['quantity']} {top['tensor']}"))
    return found


@dataclasses.dataclass(frozen=True)
class CeilingAdvice:
    """A case tolerance that sits below the multiple of the floor it will be capped with: the
    case's own tolerance judges there instead of the calibrated one (`binding`), or it is
    below the floor itself and every such row fails as float noise (`below_floor`)."""

    quantity: str
    tensors: str          # the tolerance's tensor pattern, or "" for the quantity's own
    atol: float
    rtol: float
    floor: float          # the floor where it falls furthest short
    where: str
    suggested_atol: float
    below_floor: bool = False

    def line(self, multiple: float) -> str:
        name = f"{self.quantity} ({self.tensors})" if self.tensors else self.quantity
        state = ("is BELOW the floor: those rows fail as float noise" if self.below_floor
                 else f"is below {multiple:g}x the floor: it judges instead of the calibrated "
                      f"cap")
        own = f"atol {self.atol:.3g}" + (f", rtol {self.rtol:.3g}" if self.rtol else "")
        return (f"{name}: {own} {state} (floor {self.floor:.3g} at {self.where}); set atol "
                f">= {self.suggested_atol:.1g}")


def ceiling_advice(case, calibration: Calibration,
                   plains: Mapping[str, Trace]) -> list[CeilingAdvice]:
    """Where the case's own tolerance (its ceiling) falls below `tolerance_multiple` times a
    measured floor, per quantity or tensor pattern, judged as the comparison judges it: the
    smallest `atol + rtol*|value|` over a tensor's elements in the reference's plain run
    (`plains`), against the floor of that tensor at that step. Each comes with the atol that
    lifts it above `tolerance_multiple` times every floor it meets.

    >>> from verify.core.tolerances import Tolerance, Tolerances
    >>> class Case: tolerances = Tolerances.default().override(loss=Tolerance(1e-6, 0.0))
    >>> Case.tolerance_multiple = 10.0
    >>> floors = {"ref": NoiseFloor({("loss", "loss"): (0.0, 1e-7, 4e-5)})}
    >>> plain = Trace("ref")
    >>> for step in range(3):
    ...     plain.record(step, "loss", "loss", np.float32(0.5))
    >>> [a.line(10) for a in ceiling_advice(Case, Calibration("c", "d", 2, floors), {"ref": plain})]
    ['loss: atol 1e-06 is BELOW the floor: those rows fail as float noise (floor 4e-05 at ref step 2 loss); set atol >= 0.0004']
    """
    multiple = case.tolerance_multiple
    worst: dict[tuple[str, str], tuple[float, float, str]] = {}   # (ratio, floor, where)
    for reference, floor in sorted(calibration.references.items()):
        plain = plains.get(reference)
        if plain is None:
            continue
        for key, value in plain.values.items():
            series = floor.floors.get((key.quantity, key.tensor))
            if series is None or key.step >= len(series) or not series[key.step]:
                continue
            tolerance = case.tolerances.lookup(key.quantity, key.tensor)
            smallest = (0.0 if isinstance(value, (TouchedRows, str))
                        else float(np.min(np.abs(as_dense(value)))) if np.size(as_dense(value))
                        else 0.0)
            own = tolerance.atol + tolerance.rtol * smallest
            ratio = multiple * series[key.step] / own if own else np.inf
            pattern = next((p for p, t in reversed(list(case.tolerances.by_tensor.items()))
                            if t is tolerance), "")
            if ratio > 1 and ratio > worst.get((key.quantity, pattern), (0.0,))[0]:
                worst[(key.quantity, pattern)] = (
                    ratio, series[key.step], f"{reference} step {key.step} {key.tensor}")
    advice = []
    for (quantity, pattern), (ratio, floor_value, where) in sorted(worst.items()):
        tolerance = (case.tolerances.by_tensor[pattern] if pattern
                     else case.tolerances.by_quantity[quantity])
        advice.append(CeilingAdvice(quantity, pattern, tolerance.atol, tolerance.rtol,
                                    floor_value, where, round_up(multiple * floor_value),
                                    below_floor=ratio > multiple))
    return advice


def round_up(value: float) -> float:
    """`value` rounded up to one significant digit.

    >>> round_up(3.7e-3), round_up(4e-5), round_up(9.2)
    (0.004, 4e-05, 10.0)
    """
    exponent = math.floor(math.log10(value))
    mantissa = math.ceil(round(value / 10.0 ** exponent, 9))
    return float(f"{mantissa}e{exponent}")


def merge_calibrations(existing: Calibration, added: Calibration) -> Calibration:
    """`existing` with the references of `added` measured into it (replacing those of the same
    name): both of the same case, data and steps. The provenance keeps `existing`'s and lists
    each addition.

    >>> floor = NoiseFloor({("loss", "loss"): (0.0, 1e-7)})
    >>> a = Calibration("c", "d", 2, {"ref": floor}, {"date": "2026-11-20"})
    >>> b = Calibration("c", "d", 2, {"new": floor}, {"date": "2026-11-22"})
    >>> merged = merge_calibrations(a, b)
    >>> sorted(merged.references), merged.provenance["added"][0]["references"]
    (['new', 'ref'], ['new'])
    """
    for field in ("case", "data_digest", "steps"):
        if getattr(existing, field) != getattr(added, field):
            raise ValueError(f"cannot merge calibrations of different {field}: "
                             f"{getattr(existing, field)!r} and {getattr(added, field)!r}; "
                             f"calibrate every reference again instead")
    provenance = dict(existing.provenance)
    provenance["added"] = [*provenance.get("added", []),
                           {"references": sorted(added.references), **{
                               k: v for k, v in added.provenance.items() if k != "added"}}]
    return Calibration(existing.case, existing.data_digest, existing.steps,
                       {**existing.references, **added.references}, provenance)
