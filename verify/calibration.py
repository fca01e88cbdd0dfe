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
`min(atol + rtol*|reference|, MULTIPLE * floor)`: the case's own tolerance where it is
tighter, else `MULTIPLE` times the floor of that tensor at that step. A row whose own
tolerance is below the floor fails (such a tolerance cannot tell a mistake from noise), and
reports flag rows whose tolerance is more than `LOOSE` times the floor.

Nothing here imports TensorFlow except `calibrate_case`, which runs the implementations.

The floors and their file format live in `verify.core.noise_floor`.
"""
from __future__ import annotations

import dataclasses
import datetime
import platform
from typing import Iterable, Mapping

import numpy as np

from verify.core.case import Mutation
from verify.core.noise_floor import Calibration, NoiseFloor
from verify.core.quantities import NUMERIC
from verify.core.trace import TouchedRows, Trace, as_dense
from verify.judge.touched_rows import TouchedComparison

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
            raise RuntimeError(f"calibration run {variant.implementation} raised: "
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


def nudged(values: Mapping[str, np.ndarray], direction: float) -> dict[str, np.ndarray]:
    """Every initial value moved by one ulp towards `direction` (+inf or -inf).

    >>> nudged({"w": np.float32([1.0])}, np.inf)["w"] > 1.0
    array([ True])
    """
    out = {}
    for name, value in values.items():
        value = np.asarray(value)
        if value.dtype.kind == "f":
            value = np.nextafter(value, np.asarray(direction, value.dtype)).astype(value.dtype)
        out[name] = value
    return out


def calibrate_case(case, *, references: Iterable[str] | None = None, steps: int | None = None,
                   device: str = "cpu", log=print) -> Calibration:
    """Measure the noise floor of each reference of `case` (plain run, initial values one ulp
    up and one ulp down, applied gradients nudged by one ulp, and the case's `noise_variants`),
    then choose the multiple: the smallest of `LADDER` that is at least twice the worst drift
    of any faithful pair measured in floors, so that no faithful pair uses more than half of
    its tolerance. When even the largest would not do, the calibration is written with that
    figure but no multiple (`multiple` 0: not applied) and says why.
    `references` default to every implementation that is the reference of some pair."""
    from verify.runners.run import run_implementation

    steps = steps or case.steps
    names = list(references or dict.fromkeys(ref for ref, _ in case.all_pairs()))
    floors, plains = {}, {}
    for name in names:
        implementation = case.implementation(name)
        log(f"calibrating {case.name}: {name}")
        plain = plains[name] = run_implementation(case, implementation, steps=steps,
                                                  device=device)
        if plain.error is not None:
            raise RuntimeError(f"{name} raised: {plain.error}")
        variants = [run_implementation(dataclasses.replace(case, initial_values=nudged(
                        case.initial_values, direction)), implementation, steps=steps,
                        device=device)
                    for direction in (np.inf, -np.inf)]
        nudged_gradients = dataclasses.replace(implementation,
                                               mutation=Mutation("nudge_gradients"))
        variants.append(run_implementation(case, nudged_gradients, steps=steps, device=device))
        for other in case.noise_variants.get(name, ()):
            variants.append(run_implementation(case, case.implementation(other), steps=steps,
                                               device=device))
        floors[name] = measure_floor(plain, variants)
    worst, where = faithful_ratio(case, floors, plains, steps, device, log)
    multiple = next((m for m in LADDER if m >= 2 * worst), 0.0)
    import sys

    tensorflow = sys.modules.get("tensorflow")
    provenance = {"tensorflow": getattr(tensorflow, "__version__", ""),
                  "numpy": np.__version__, "python": platform.python_version(),
                  "machine": platform.machine(), "processor": platform.processor(),
                  "date": datetime.date.today().isoformat(), "device": device,
                  "variants": ["initial values +1 ulp", "initial values -1 ulp",
                               "applied gradients +-1 ulp (seeded random sign)"]
                              + [f"{ref}: {', '.join(v)}" for ref, v in
                                 case.noise_variants.items() if ref in floors],
                  "worst_faithful_ratio": round(worst, 3), "worst_faithful_at": where,
                  "multiple_rule": f"smallest of {list(LADDER)} >= 2 x the worst faithful "
                                   f"ratio; 0 (not applied) when none is"}
    return Calibration(case.name, case.data_digest(), steps, multiple, floors, provenance)


# The multiples a calibration may choose from; a tolerance more than LOOSE (1000) times the
# floor is a finding in itself, so the ladder stops there.
LADDER = (10.0, 30.0, 100.0, 300.0, 1000.0)


def faithful_ratio(case, floors: Mapping[str, NoiseFloor], plains: Mapping[str, Trace],
                   steps: int, device: str, log=print) -> tuple[float, str]:
    """The worst |candidate - reference| / floor over every faithful pair whose reference was
    calibrated, and where it was."""
    from verify.core.tolerances import Tolerance, Tolerances
    from verify.judge.compare import compare_traces
    from verify.runners.run import run_implementation

    unlimited = Tolerances({q: Tolerance(float("inf"), 0.0)
                            for q in Tolerances.default().by_quantity})
    traces = dict(plains)
    worst, where = 0.0, "no faithful pair"
    for reference, candidate in case.all_pairs():
        implementation = case.implementation(candidate)
        if implementation.is_control or reference not in floors:
            continue
        if candidate not in traces:
            log(f"calibrating {case.name}: faithful {candidate}")
            traces[candidate] = run_implementation(case, implementation, steps=steps,
                                                   device=device)
        rows = compare_traces(traces[reference], traces[candidate], unlimited,
                              floor=floors[reference], multiple=1.0)
        rows = rows[rows["floor"].notna()]
        if rows.empty:
            continue
        top = rows.loc[rows["times_tolerance"].astype(float).idxmax()]
        if float(top["times_tolerance"]) > worst:
            worst = float(top["times_tolerance"])
            where = (f"{reference} -> {candidate} step {int(top['step'])} {top['quantity']} "
                     f"{top['tensor']}")
    return worst, where
