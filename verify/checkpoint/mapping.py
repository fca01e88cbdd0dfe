"""What a checkpoint conversion carries, in canonical names, and the check that both sides fit.

Each side of a conversion says what it holds as `Entry`s keyed by canonical name: every
variable under the case's name for it (`embedding/item`, `dense0/kernel`), every optimizer slot
as `<variable>/<slot>` with the slot named as the suite compares slots (`accumulator`, `m`, `v`,
`linear`), and the step count as `STEP`. `check_fit` lists every name that does not map on
either side and every shape that differs, in one `ConversionError`. Plain data, no TensorFlow.

>>> source = Side("tf1", {"w": Entry("w", "dense/kernel", (2, 1)),
...                       "w/m": Entry("w/m", "dense/kernel/Adam", (2, 1))}, slots=("m",))
>>> target = Side("tf2", {"w": Entry("w", "dense/kernel", (2, 1)),
...                       "w/accumulator": Entry("w/accumulator", "slot of dense/kernel", (2, 1))},
...               slots=("accumulator",))
>>> try:
...     check_fit(source, target)
... except ConversionError as e:
...     print(e)
cannot convert tf1 into tf2; nothing was written:
  in tf1, with no place in tf2 (1): w/m <- dense/kernel/Adam
  needed by tf2, not in tf1 (1): w/accumulator -> slot of dense/kernel
  optimizer slots differ: tf1 keeps [m], tf2 keeps [accumulator]; slots cannot be carried from one optimizer to another: convert between implementations that train with the same optimizer
"""
from __future__ import annotations

import dataclasses
from typing import Mapping

import numpy as np

STEP = "(step)"   # the number of updates applied: TF1's global_step, a Keras optimizer's iterations


@dataclasses.dataclass(frozen=True)
class Entry:
    """One value a side holds: its canonical name, the side's own name for it (a checkpoint
    key, a variable, a slot), and its shape in the canonical layout."""

    canonical: str
    native: str
    shape: tuple[int, ...]


@dataclasses.dataclass
class Side:
    """What one side of a conversion holds, by canonical name: `name` is the implementation,
    `detail` what it was read from; `slots` are its optimizer's slot names (canonical);
    `problems` what reading it found wrong on its own (checkpoint keys that map to nothing,
    keys its model needs that the checkpoint lacks)."""

    name: str
    entries: Mapping[str, Entry]
    slots: tuple[str, ...] = ()
    problems: list[str] = dataclasses.field(default_factory=list)
    detail: str = ""

    @property
    def title(self) -> str:
        return f"{self.name} ({self.detail})" if self.detail else self.name


@dataclasses.dataclass
class CanonicalState:
    """A training state in canonical names: variables and slots (canonical layouts) and the
    step count, read from one checkpoint."""

    values: dict[str, np.ndarray]
    step: int
    source: str = ""


class ConversionError(ValueError):
    """A checkpoint that cannot be converted; the message lists every reason. Nothing was
    written."""


def check_fit(source: Side, target: Side) -> None:
    """Raise a `ConversionError` listing every problem of either side, every name of one side
    that has no place on the other, every shape that differs and, when the optimizers keep
    different slots, that; return when everything maps."""
    problems = [f"{source.name}: {p}" for p in source.problems]
    problems += [f"{target.name}: {p}" for p in target.problems]
    only_source = sorted(set(source.entries) - set(target.entries))
    only_target = sorted(set(target.entries) - set(source.entries))
    if only_source:
        problems.append(f"in {source.name}, with no place in {target.name} "
                        f"({len(only_source)}): "
                        + ", ".join(f"{n} <- {source.entries[n].native}" for n in only_source))
    if only_target:
        problems.append(f"needed by {target.name}, not in {source.name} "
                        f"({len(only_target)}): "
                        + ", ".join(f"{n} -> {target.entries[n].native}" for n in only_target))
    shapes = [f"{n}: {source.entries[n].native} {tuple(source.entries[n].shape)}, "
              f"{target.entries[n].native} {tuple(target.entries[n].shape)}"
              for n in sorted(set(source.entries) & set(target.entries))
              if tuple(source.entries[n].shape) != tuple(target.entries[n].shape)]
    if shapes:
        problems.append(f"shapes that do not map ({len(shapes)}; canonical layout): "
                        + "; ".join(shapes))
    if sorted(source.slots) != sorted(target.slots):
        problems.append(
            f"optimizer slots differ: {source.name} keeps [{', '.join(source.slots)}], "
            f"{target.name} keeps [{', '.join(target.slots)}]; slots cannot be carried "
            f"from one optimizer to another: convert between implementations that train with "
            f"the same optimizer")
    if problems:
        raise ConversionError(f"cannot convert {source.title} into {target.title}; "
                              f"nothing was written:\n" + "\n".join(f"  {p}" for p in problems))
