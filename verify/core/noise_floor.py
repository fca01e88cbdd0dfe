"""Measured noise floors of a case: how far a legitimately different float computation of a
reference drifts from it, per quantity, tensor and step (see `verify.tools.calibration`, which
measures them). Plain data, no TensorFlow.

>>> floor = NoiseFloor({("weight", "w"): (1e-7, 3e-7, 2e-7)})
>>> floor.at("weight", "w", 2), floor.at("weight", "w", 5), floor.at("loss", "loss", 1)
(2e-07, None, None)
"""
from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any, Mapping

from verify.core.files import write_atomic

SCHEMA = "parity-calibration/2"
# A calibrated tolerance is this many times the floor, stated before anything is measured; a
# case may set another with a written reason (`Case.tolerance_multiple`), never a measurement.
MULTIPLE = 10.0
LOOSE = 1000.0      # a tolerance more than this many times the floor is reported as loose


@dataclasses.dataclass(frozen=True)
class NoiseFloor:
    """Floors of one reference: (quantity, tensor) -> floor at step 0, 1, 2, ... (a running
    maximum over steps)."""

    floors: Mapping[tuple[str, str], tuple[float, ...]]

    @classmethod
    def largest(cls, floors: "list[NoiseFloor]") -> "NoiseFloor":
        """The largest of several floors, per tensor and step (a pair whose floor comes from
        more than one implementation's noise).

        >>> a = NoiseFloor({("loss", "loss"): (1.0, 2.0)})
        >>> b = NoiseFloor({("loss", "loss"): (3.0, 1.0), ("grad", "w"): (5.0,)})
        >>> NoiseFloor.largest([a, b]).floors[("loss", "loss")], len(NoiseFloor.largest([a, b]).floors)
        ((3.0, 2.0), 2)
        """
        out: dict[tuple[str, str], tuple[float, ...]] = {}
        for floor in floors:
            for key, series in floor.floors.items():
                have = out.get(key, ())
                length = max(len(have), len(series))
                out[key] = tuple(max(have[i] if i < len(have) else 0.0,
                                     series[i] if i < len(series) else 0.0)
                                 for i in range(length))
        return cls(out)

    def at(self, quantity: str, tensor: str, step: int) -> float | None:
        """The floor of `tensor` at `step`, or None where it was not measured."""
        series = self.floors.get((quantity, tensor))
        if series is None or step >= len(series):
            return None
        return series[step]


@dataclasses.dataclass(frozen=True)
class Calibration:
    """A case's measured noise floors, per reference implementation, with their provenance.

    Each floor is measured from its own implementation's runs only, so a calibration holds
    nothing of the candidates it will judge.
    """

    case: str
    data_digest: str
    steps: int
    references: Mapping[str, NoiseFloor]
    provenance: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def floor_of(self, reference: str) -> NoiseFloor | None:
        return self.references.get(reference)

    def floor_of_sources(self, names: tuple[str, ...]) -> tuple[NoiseFloor | None, list[str]]:
        """The largest floor of those of `names` that were measured, and which those were."""
        measured = [n for n in names if n in self.references]
        if not measured:
            return None, []
        return NoiseFloor.largest([self.references[n] for n in measured]), measured

    def to_json(self) -> str:
        return json.dumps({
            "schema": SCHEMA, "case": self.case, "data_digest": self.data_digest,
            "steps": self.steps, "provenance": dict(self.provenance),
            "references": {ref: {f"{q}|{t}": [float(f"{v:.4g}") for v in series]
                                 for (q, t), series in sorted(floor.floors.items())}
                           for ref, floor in sorted(self.references.items())}}, indent=1)

    @classmethod
    def from_json(cls, text: str, source: str = "calibration") -> "Calibration":
        try:
            doc = json.loads(text)
            if doc.get("schema") == "parity-calibration/1":
                raise ValueError("written by an earlier version that chose its multiple from "
                                 "the drift of the pairs it then judged")
            if doc.get("schema") != SCHEMA:
                raise ValueError(f"schema {doc.get('schema')!r}, expected {SCHEMA!r}")
            references = {ref: NoiseFloor({tuple(key.split("|", 1)): _floor_series(
                                 ref, key, series) for key, series in entries.items()})
                          for ref, entries in doc["references"].items()}
            return cls(doc["case"], doc["data_digest"], int(doc["steps"]), references,
                       doc.get("provenance", {}))
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


def _floor_series(reference: str, key: str, series: Any) -> tuple[float, ...]:
    """One tensor's floors as read from a calibration file: a number >= 0 per step, else a
    ValueError naming the reference and the tensor (a file edited by hand).

    >>> _floor_series("tf1", "loss|loss", [0.0, -1e-7])
    Traceback (most recent call last):
    ...
    ValueError: reference tf1, loss|loss: a negative floor (-1e-07 at step 1)
    """
    if not isinstance(series, list) or not series:
        raise ValueError(f"reference {reference}, {key}: no floor (an empty or missing series)")
    for step, value in enumerate(series):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"reference {reference}, {key}: no floor at step {step} "
                             f"({value!r})")
        if math.isnan(value):
            raise ValueError(f"reference {reference}, {key}: a NaN floor at step {step}")
        if math.isinf(value):   # an infinite floor would pass any drift
            raise ValueError(f"reference {reference}, {key}: an infinite floor at step {step}")
        if value < 0:
            raise ValueError(f"reference {reference}, {key}: a negative floor ({value:g} at "
                             f"step {step})")
    return tuple(float(v) for v in series)
