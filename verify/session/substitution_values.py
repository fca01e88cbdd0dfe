"""The values a substitution hands around (`verify.session.substitution`, its backward and
optimizer-update kin): a side as it needs it, what it found, and the reference's values put in
a side's own layout through its name map."""
from __future__ import annotations

import dataclasses

import numpy as np

from verify.core.layer_capture import LayerCapture, input_permutation
from verify.core.names import NameMap
from verify.core.trace import Trace, as_dense
from verify.explain.substitution import Substitution


@dataclasses.dataclass(frozen=True)
class Side:
    """One side of the pair as a substitution needs it."""

    name: str
    capture: LayerCapture
    names: NameMap
    environment: str


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What the substitution found: one sentence for the pair's row, the layers substituted
    (the first divergent one first) and the repro written ('' when none)."""

    sentence: str
    substituted: tuple[Substitution, ...] = ()
    repro: str = ""

    @property
    def conclusive(self) -> bool:
        """Whether a substituted unit was found local or alike (only then does the sentence
        go into the pair's likely cause)."""
        return any(s.verdict in ("local", "alike") for s in self.substituted[:1])


def native_input(value: np.ndarray, unit, names: NameMap) -> np.ndarray:
    """The reference's captured (canonical) input in the layout `unit`'s side feeds it."""
    from verify.runners.capture.substitution import unit_variables

    permutation = input_permutation(unit_variables(unit), names)
    if permutation is None:
        return np.asarray(value)
    return np.moveaxis(permutation.to_native(np.moveaxis(np.asarray(value), -1, 0)), 0, -1)


def weight_of(names: NameMap, trace: Trace, step: int):
    """native name -> the reference's weight before `step`, in that side's layout."""
    def weight(native: str):
        found = names.canonical_of(native)
        value = None if found is None else trace.get(step - 1, "weight", found[0])
        return None if value is None else np.asarray(found[1].to_native(as_dense(value)))
    return weight


def layer_classes(layer: str, reference: Side, candidate: Side) -> str:
    """The layer's class on both sides: "Dense", or "Dense | HalfGradientDense"."""
    found = [next((e.layer_class for e in side.capture.entries if e.layer == layer), "")
             for side in (reference, candidate)]
    return " | ".join(dict.fromkeys(c for c in found if c))
