"""`python -m verify names`: an implementation's variables against the case's canonical names,
and the name map that can be inferred, marking what could not be decided (TensorFlow-free).

A side's variables are read by its runner without training (`Runner.native_variables`). Each
is matched to a canonical name (the case's `initial_values`) by, in order:

1. the implementation's own name map, when it has an entry for it that fits;
2. its shape, when exactly one canonical name not yet matched has it;
3. shape and creation order, when several have it: the n-th such variable to the n-th such
   canonical name (a guess the output says is one: check it);
4. its shape transposed (a kernel stored the other way round): `Transpose()`.

What none of these decides is listed as undecided, with the canonical names still free.

>>> found = propose({"dense/kernel": ((7, 1), "float32"), "dense/bias": ((1,), "float32")},
...                 {"dense/kernel": (7, 1), "dense/bias": (1,)})
>>> [(p.native, p.canonical, p.how) for p in found.matches]
[('dense/kernel', 'dense/kernel', 'shape (the only one)'), ('dense/bias', 'dense/bias', 'shape (the only one)')]
"""
from __future__ import annotations

import dataclasses
from typing import Mapping

from verify.core.names import Identity, NameMap

GUESSES = ("shape and creation order", "transposed shape")


@dataclasses.dataclass(frozen=True)
class Match:
    native: str
    shape: tuple
    canonical: str          # "" when undecided
    how: str                # how it was decided, or why not
    transpose: bool = False
    entry: str = ""         # the name map's own entry (with its transform), as Python


@dataclasses.dataclass(frozen=True)
class Proposal:
    matches: tuple[Match, ...]
    unmatched_canonical: tuple[str, ...]   # canonical names no variable was matched to

    @property
    def decided(self) -> bool:
        return all(m.canonical for m in self.matches) and not self.unmatched_canonical

    def name_map_code(self) -> str:
        """The proposed `NameMap` as Python, a line per canonical name; guesses and what is
        undecided carry a comment."""
        lines = ["NameMap({"]
        for m in self.matches:
            if not m.canonical:
                continue
            target = m.entry or (f"Mapped({m.native!r}, Transpose())" if m.transpose
                                 else repr(m.native))
            note = f"  # {m.how}: check it" if m.how in GUESSES else ""
            lines.append(f"    {m.canonical!r}: {target},{note}")
        for m in self.matches:
            if not m.canonical:
                lines.append(f"    # ?: {m.native!r} {m.shape} ({m.how})")
        for name in self.unmatched_canonical:
            lines.append(f"    # {name!r}: no variable of this side matched it")
        lines.append("})")
        return "\n".join(lines)


def propose(native: Mapping[str, tuple], canonical_shapes: Mapping[str, tuple],
            current: NameMap | None = None) -> Proposal:
    """Match `native` (name -> (shape, dtype), in creation order) to `canonical_shapes`
    (canonical name -> shape, in the case's order); see the module's docstring."""
    shapes = {name: tuple(shape) for name, (shape, _) in native.items()}
    free = dict((name, tuple(shape)) for name, shape in canonical_shapes.items())
    decided: dict[str, Match] = {}
    for name, shape in shapes.items():   # 1. the implementation's own map, where it fits
        found = current.canonical_of(name) if current is not None else None
        if found is not None and found[0] in free:
            canonical = found[0]
            fits = free[canonical] == shape or not isinstance(found[1], Identity)
            if fits:
                entry = current.entries.get(canonical)
                decided[name] = Match(name, shape, canonical, "the implementation's name map",
                                      entry=repr(entry) if not isinstance(entry, str) else "")
                del free[canonical]
    for name, shape in shapes.items():   # 2. a shape only one free canonical name has
        if name in decided:
            continue
        same = [c for c, s in free.items() if s == shape]
        if len(same) == 1 and sum(1 for n, s in shapes.items()
                                  if s == shape and n not in decided) == 1:
            decided[name] = Match(name, shape, same[0], "shape (the only one)")
            del free[same[0]]
    by_shape: dict[tuple, list[str]] = {}
    for name, shape in shapes.items():   # 3. several of a shape: in creation order
        if name not in decided:
            by_shape.setdefault(shape, []).append(name)
    for shape, names in by_shape.items():
        same = [c for c, s in free.items() if s == shape]
        if len(same) == len(names) > 1:
            for name, canonical in zip(names, same):
                decided[name] = Match(name, shape, canonical, "shape and creation order")
                del free[canonical]
    for name, shape in shapes.items():   # 4. stored transposed
        if name in decided or len(shape) != 2:
            continue
        same = [c for c, s in free.items() if s == shape[::-1]]
        if len(same) == 1:
            decided[name] = Match(name, shape, same[0], "transposed shape", transpose=True)
            del free[same[0]]
    matches = []
    for name, shape in shapes.items():
        if name in decided:
            matches.append(decided[name])
            continue
        candidates = [c for c, s in free.items() if s == shape]
        why = (f"{len(candidates)} canonical names of this shape, {len(by_shape.get(shape, []))} "
               f"variables: not decided" if candidates else "no canonical name of this shape "
               f"(or its transpose) is free")
        matches.append(Match(name, shape, "", why))
    return Proposal(tuple(matches), tuple(free))
