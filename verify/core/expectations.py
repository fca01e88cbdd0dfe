"""What a deliberately wrong implementation declares: where the suite must catch it
(`Expectation`), and the deliberate changes of its training a runner applies (`Mutation`).
Both are part of the case API (`verify.core.case`)."""
from __future__ import annotations

import dataclasses

from verify.core.quantities import NAMES as QUANTITIES


@dataclasses.dataclass(frozen=True)
class Expectation:
    """Where a negative control must be caught: its first divergence.

    >>> Expectation(step=1, quantity="slot|weight", why="epsilon 1e-7 instead of 0").quantity
    'slot|weight'
    """

    step: int
    """The step of the first divergence (0: the initial values as loaded)."""
    quantity: str
    """Its quantity: input, loss, grad, slot, weight, metric or run; alternatives are
    written `"slot|weight"`."""
    why: str
    """The mistake, in words: the report shows it."""
    tensor: str | None = None
    """A shell pattern the first failing tensor must match (None: any tensor)."""
    min_ratio: float = 10.0
    """How far beyond the tolerance the worst failing row of that step must be
    (`times_tolerance`), so a control that only scrapes past the tolerance does not count as
    caught; digests (input) have no ratio."""
    cause: str = ""
    """The hypothesis of `verify.explain` that must explain it, with its value where it has
    one ('learning_rate x1.01', 'clip_global_norm 0.5', 'drop_step 2'); empty: none declared."""

    def __post_init__(self):
        for quantity in self.quantity.split("|"):
            if quantity not in QUANTITIES:
                raise ValueError(f"Expectation quantity {quantity!r} is not one of {QUANTITIES} "
                                 f"(alternatives are written 'slot|weight')")


MUTATIONS = ("learning_rate", "epsilon", "clip_global_norm", "drop_step", "nudge_gradients")


@dataclasses.dataclass(frozen=True)
class Mutation:
    """A deliberate change of how an implementation trains, applied by its runner:

    - `learning_rate`: the optimizer's learning rate times `value`;
    - `epsilon`: the optimizer's epsilon times `value`;
    - `clip_global_norm`: the applied gradients clipped to global norm `value`;
    - `drop_step`: the gradients of step `step` replaced by zeros (that step's update lost);
    - `nudge_gradients`: every applied gradient element moved by one ulp up or down (a seeded
      random sign per element and step): float noise of the size rounding makes, used by
      calibration as "another float computation" of the same training.

    >>> Mutation("learning_rate", 1.01).describe()
    'learning rate x1.01'
    """

    kind: str
    value: float = 1.0
    step: int = 0

    def __post_init__(self):
        if self.kind not in MUTATIONS:
            raise ValueError(f"mutation kind must be one of {MUTATIONS}, got {self.kind!r}")

    def describe(self) -> str:
        return {"learning_rate": f"learning rate x{self.value:g}",
                "epsilon": f"epsilon x{self.value:g}",
                "clip_global_norm": f"gradients clipped to global norm {self.value:.3g}",
                "drop_step": f"the gradients of step {self.step} dropped",
                "nudge_gradients": "gradients nudged by one ulp"}[self.kind]
