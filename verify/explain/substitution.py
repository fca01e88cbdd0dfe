"""Local or carried in: what a layer substitution's outputs say about a divergent layer.

A layer whose output differs between two sides either computes differently (the difference is
local to it) or was given inputs or weights that already differed (it is carried in). A
substitution (`verify.session.substitution`) runs both sides' layers, rebuilt from their
configs, on the same values: the reference's input at the step and the reference's weights
before it. Its outputs are judged here, against the reference's own noise of that layer,
measured the way the calibration measures whole runs: the reference's layer run again on its
input and weights each moved one ulp (`floor`). The candidate's layer is local when its output
differs from the reference's by more than `FLOOR_MULTIPLE` x that floor, a multiple stated
here in advance and never derived from the pair's drift; within it the layer computes alike,
and what its captured outputs show was carried in.

The reference's own layer, rebuilt, must reproduce the output the replay captured for it
within the same bound; when it does not (the rebuilt layer is not the layer that ran: a
training-only branch, state the config does not hold), the substitution concludes nothing.

>>> out = np.array([[1.0, 2.0]], np.float32)
>>> s = judge_substitution("dense", "Dense", out, out + 1e-7, out * 1.5, out)
>>> s.verdict, round(s.drift, 3), s.sentence()
('local', 1.0, 'local to layer `dense` (Dense): with identical inputs and weights its outputs differ by 1 (beyond 10 x its one-ulp floor 1.19e-07 = 1.19e-06)')
>>> judge_substitution("dense", "Dense", out, out + 1e-7, out, out).verdict
'alike'
"""
from __future__ import annotations

import dataclasses

import numpy as np

from verify.core.noise_floor import MULTIPLE

# stated in advance: the multiple of a noise floor the suite's calibrated tolerances use
FLOOR_MULTIPLE = MULTIPLE


@dataclasses.dataclass(frozen=True)
class Substitution:
    """One layer substituted: `verdict` is 'local' (its output differs beyond the bound given
    identical inputs and weights), 'alike' (it computes as the reference's does: a difference
    in its captured output was carried in), or 'inconclusive' (`why`)."""

    layer: str
    layer_class: str
    verdict: str
    drift: float = np.nan          # max abs, candidate's rebuilt layer - reference's
    floor: float = np.nan          # max abs of the reference's layer moved one ulp
    reproduced: float = np.nan     # max abs, reference's rebuilt layer - its captured output
    why: str = ""

    @property
    def bound(self) -> float:
        return FLOOR_MULTIPLE * self.floor

    def sentence(self) -> str:
        name = f"layer `{self.layer}` ({self.layer_class})"
        bound = f"{FLOOR_MULTIPLE:g} x its one-ulp floor {self.floor:.3g} = {self.bound:.3g}"
        if self.verdict == "local":
            return (f"local to {name}: with identical inputs and weights its outputs differ "
                    f"by {self.drift:.3g} (beyond {bound})")
        if self.verdict == "alike":
            return (f"{name} computes alike: with identical inputs and weights its outputs "
                    f"differ by {self.drift:.3g} (within {bound})")
        return f"{name} not substituted: {self.why}"


def judge_substitution(layer: str, layer_class: str, reference: np.ndarray,
                       reference_nudged: np.ndarray, candidate: np.ndarray,
                       captured: np.ndarray) -> Substitution:
    """Judge one substituted layer (see the module's docstring): the reference's rebuilt
    layer's output, the same moved one ulp, the candidate's rebuilt layer's output (all on the
    same values) and the output the replay captured on the reference."""
    floor = _max_abs(reference_nudged, reference)
    made = dict(layer=layer, layer_class=layer_class, floor=floor)
    if np.shape(candidate) != np.shape(reference):
        return Substitution(**made, verdict="inconclusive", why=(
            f"the candidate's layer gives shape {np.shape(candidate)}, the reference's "
            f"{np.shape(reference)}"))
    reproduced = _max_abs(reference, captured) if np.size(reference) == np.size(captured) \
        else np.inf
    drift = _max_abs(candidate, reference)
    made.update(drift=drift, reproduced=reproduced)
    if not reproduced <= FLOOR_MULTIPLE * floor:
        return Substitution(**made, verdict="inconclusive", why=(
            f"the reference's layer rebuilt from its config does not reproduce the output "
            f"the replay captured (max abs {reproduced:.3g}, more than {FLOOR_MULTIPLE:g} x its "
            f"one-ulp floor {floor:.3g}): the rebuilt layer is not the one that ran"))
    verdict = "local" if drift > FLOOR_MULTIPLE * floor else "alike"
    return Substitution(**made, verdict=verdict)


def times_bound(substitution: Substitution) -> float:
    """How far a substituted tensor is from computing alike, to rank several (the first is the
    one a sentence names): inconclusive first (nothing can be concluded past it), then how many
    times its bound it differs (inf for any difference over a bound of 0).

    >>> [times_bound(s) for s in (Substitution("a", "Dense", "inconclusive"),
    ...                           Substitution("b", "Dense", "local", drift=3.0, floor=0.1))]
    [inf, 3.0]
    """
    if substitution.verdict == "inconclusive":
        return np.inf
    if substitution.bound > 0:
        return substitution.drift / substitution.bound
    return np.inf if substitution.drift > 0 else 0.0


def _max_abs(a, b) -> float:
    a = np.asarray(a, np.float64).reshape(-1)
    b = np.asarray(b, np.float64).reshape(-1)
    if a.size != b.size:
        return np.inf
    if a.size == 0:
        return 0.0
    difference = np.abs(a - b)
    return float(np.inf) if np.isnan(difference).any() else float(difference.max())


@dataclasses.dataclass(frozen=True)
class LookupSubstitution(Substitution):
    """An embedding lookup substituted (`verify.session.lookup_substitution`): `layer` is the
    replay's layer, `table` the table looked up, `feature` the ids' feature and `combiners`
    the reference's and the candidate's declared combiners.

    >>> LookupSubstitution("embedding", "DenseFeatures | TPUEmbedding", "local", 0.5, 1e-8,
    ...                    table="embedding/t", feature="ids", combiners=("mean", "sum")).sentence()
    "local to the embedding lookup `embedding/t` (feature `ids`): with identical ids and table, combiner 'mean' vs 'sum' outputs differ by 0.5 (beyond 10 x its one-ulp floor 1e-08 = 1e-07)"
    """

    table: str = ""
    feature: str = ""
    combiners: tuple[str, str] = ("", "")

    def sentence(self) -> str:
        name = f"the embedding lookup `{self.table}`" + (
            f" (feature `{self.feature}`)" if self.feature and self.feature != self.table.split(
                "/")[-1] else "")
        bound = f"{FLOOR_MULTIPLE:g} x its one-ulp floor {self.floor:.3g} = {self.bound:.3g}"
        given = (f"with identical ids and table, combiner {self.combiners[0]!r} vs "
                 f"{self.combiners[1]!r} outputs differ by {self.drift:.3g}")
        if self.verdict == "local":
            return f"local to {name}: {given} (beyond {bound})"
        if self.verdict == "alike":
            return f"{name} computes alike: {given} (within {bound})"
        return f"{name} not substituted: {self.why}"
