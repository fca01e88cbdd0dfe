"""Tolerances from a case's own noise floor.

A tolerance is a measurement: how far may two faithful implementations drift apart? The
floor is how far a legitimately different float computation of the reference drifts from
the reference itself. `python -m verify calibrate CASE` runs each reference of the case again
from its initial values moved by one ulp up and one ulp down (and, where the case names them,
other legitimate computations of it such as another summation order), and records per
quantity, tensor and step the largest absolute difference from the plain run, as a running
maximum over steps (drift grows; it does not shrink back). The result is stored beside the
case (`calibration.json`) with its provenance: TF version, steps, date, machine, and the case's
data digest, so a calibration of other data is never applied.

In a pair whose reference is calibrated, every element may differ by
`min(atol + rtol*|reference|, MULTIPLE * floor)`: the case's own tolerance where it is
tighter, else `MULTIPLE` times the floor of that tensor at that step. A row whose own
tolerance is below the floor fails (such a tolerance cannot tell a mistake from noise), and
reports flag rows whose tolerance is more than `LOOSE` times the floor.

Nothing here imports TensorFlow except `calibrate_case`, which runs the implementations.

>>> floor = NoiseFloor({("weight", "w"): (1e-7, 3e-7, 2e-7)})
>>> floor.at("weight", "w", 2), floor.at("weight", "w", 5), floor.at("loss", "loss", 1)
(3e-07, None, None)
"""
from __future__ import annotations

import dataclasses
import datetime
import json
import platform
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np

from verify.core.files import write_atomic
from verify.core.quantities import NUMERIC
from verify.core.trace import Trace, as_dense

SCHEMA = "parity-calibration/1"
MULTIPLE = 10.0     # a calibrated tolerance is this many times the floor
LOOSE = 1000.0      # a tolerance more than this many times the floor is reported as loose


@dataclasses.dataclass(frozen=True)
class NoiseFloor:
    """Floors of one reference: (quantity, tensor) -> floor at step 0, 1, 2, ... (a running
    maximum over steps)."""

    floors: Mapping[tuple[str, str], tuple[float, ...]]

    def at(self, quantity: str, tensor: str, step: int) -> float | None:
        """The floor of `tensor` at `step`, or None where it was not measured."""
        series = self.floors.get((quantity, tensor))
        if series is None or step >= len(series):
            return None
        return series[step]


@dataclasses.dataclass(frozen=True)
class Calibration:
    """A case's measured noise floors, per reference implementation, with their provenance."""

    case: str
    data_digest: str
    steps: int
    multiple: float
    references: Mapping[str, NoiseFloor]
    provenance: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def floor_of(self, reference: str) -> NoiseFloor | None:
        return self.references.get(reference)

    def to_json(self) -> str:
        return json.dumps({
            "schema": SCHEMA, "case": self.case, "data_digest": self.data_digest,
            "steps": self.steps, "multiple": self.multiple, "provenance": dict(self.provenance),
            "references": {ref: {f"{q}|{t}": [float(f"{v:.4g}") for v in series]
                                 for (q, t), series in sorted(floor.floors.items())}
                           for ref, floor in sorted(self.references.items())}}, indent=1)

    @classmethod
    def from_json(cls, text: str, source: str = "calibration") -> "Calibration":
        try:
            doc = json.loads(text)
            if doc.get("schema") != SCHEMA:
                raise ValueError(f"schema {doc.get('schema')!r}, expected {SCHEMA!r}")
            references = {
                ref: NoiseFloor({tuple(key.split("|", 1)): tuple(float(v) for v in series)
                                 for key, series in entries.items()})
                for ref, entries in doc["references"].items()}
            return cls(doc["case"], doc["data_digest"], int(doc["steps"]),
                       float(doc["multiple"]), references, doc.get("provenance", {}))
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"{source}: not a calibration written by `python -m verify "
                             f"calibrate` ({e}); re-run the calibration") from None

    @classmethod
    def load(cls, path: str | Path) -> "Calibration | None":
        """The calibration at `path`, or None when there is none."""
        path = Path(path)
        return cls.from_json(path.read_text(), str(path)) if path.is_file() else None

    def save(self, path: str | Path) -> Path:
        write_atomic(Path(path), self.to_json() + "\n")
        return Path(path)


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
        for key, value in plain.values.items():
            if key.quantity not in NUMERIC or isinstance(value, str):
                continue
            other = variant.values.get(key)
            if other is None or isinstance(other, str):
                continue
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
    """Run each reference of `case` plainly and from initial values one ulp up and one ulp
    down, and measure its noise floor. `references` default to every implementation that is
    the reference of some pair (the case's `noise_variants` add other legitimate computations
    of a reference)."""
    from verify.runners.run import run_implementation

    steps = steps or case.steps
    names = list(references or dict.fromkeys(ref for ref, _ in case.all_pairs()))
    floors = {}
    for name in names:
        implementation = case.implementation(name)
        log(f"calibrating {case.name}: {name} (3 runs of {steps} steps)")
        plain = run_implementation(case, implementation, steps=steps, device=device)
        if plain.error is not None:
            raise RuntimeError(f"{name} raised: {plain.error}")
        variants = [run_implementation(dataclasses.replace(case, initial_values=nudged(
                        case.initial_values, direction)), implementation, steps=steps,
                        device=device)
                    for direction in (np.inf, -np.inf)]
        for other in case.noise_variants.get(name, ()):
            variants.append(run_implementation(case, case.implementation(other), steps=steps,
                                               device=device))
        floors[name] = measure_floor(plain, variants)
    import sys

    tensorflow = sys.modules.get("tensorflow")
    provenance = {"tensorflow": getattr(tensorflow, "__version__", ""),
                  "numpy": np.__version__, "python": platform.python_version(),
                  "machine": platform.machine(), "processor": platform.processor(),
                  "date": datetime.date.today().isoformat(), "device": device,
                  "variants": ["initial values +1 ulp", "initial values -1 ulp"]
                              + [f"{ref}: {', '.join(v)}" for ref, v in
                                 case.noise_variants.items() if ref in floors]}
    return Calibration(case.name, case.data_digest(), steps, MULTIPLE, floors, provenance)
