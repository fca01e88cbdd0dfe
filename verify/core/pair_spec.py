"""One (reference, candidate) pair of a case as plain data (`PairSpec`): what judging the pair
needs besides its two traces, kept beside them. `Case.pair_specs` (`verify.core.case`) makes
them."""
from __future__ import annotations

import dataclasses
import hashlib
from typing import Any, Mapping

from verify.core.expectations import Expectation
from verify.core.noise_floor import MULTIPLE


@dataclasses.dataclass(frozen=True)
class PairSpec:
    """One (reference, candidate) pair of a case, as plain data: with the two traces and the
    case's tolerances it is all that judging the pair needs, so it is kept beside traces.

    >>> spec = PairSpec("demo", "tf1", "tf2", expect=Expectation(1, "loss", why="x"))
    >>> PairSpec.from_json(spec.to_json()) == spec, spec.id
    (True, 'demo:tf1-vs-tf2')
    """

    case: str
    reference: str
    candidate: str
    replicas: int = 1
    control: bool = False
    expect: Expectation | None = None
    preflight_expect: tuple[str, ...] = ()
    oracle: str | None = None
    role: str = ""      # "faithful", "control" or "mutant" ("": from `control`)
    # The implementations whose calibrated floors (the largest) judge the pair (() for the
    # reference's), and the case's multiple of it (with its reason when not the suite's).
    floor_of: tuple[str, ...] = ()
    oracle_floor_of: tuple[str, ...] = ()   # the same for comparisons against the oracle
    multiple: float = MULTIPLE
    multiple_why: str = ""
    preflight_cause: str = ""   # `Implementation.preflight_cause`

    @property
    def floor_source(self) -> tuple[str, ...]:
        return self.floor_of or (self.reference,)

    @property
    def id(self) -> str:
        return f"{self.case}:{self.reference}-vs-{self.candidate}"

    def to_json(self) -> dict[str, Any]:
        doc = dataclasses.asdict(self)
        doc["preflight_expect"] = list(self.preflight_expect)
        doc["floor_of"], doc["oracle_floor_of"] = list(self.floor_of), list(self.oracle_floor_of)
        return doc

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> "PairSpec":
        doc = dict(doc)
        expect = doc.get("expect")
        doc["expect"] = Expectation(**expect) if expect else None
        doc["preflight_expect"] = tuple(doc.get("preflight_expect") or ())
        for field in ("floor_of", "oracle_floor_of"):
            value = doc.get(field) or ()
            doc[field] = (value,) if isinstance(value, str) else tuple(value)
        doc["replicas"] = int(doc.get("replicas", 1))
        return cls(**{f.name: doc[f.name] for f in dataclasses.fields(cls) if f.name in doc})


def shard_of(pair_id: str, shards: int) -> int:
    """The shard (1..`shards`) a pair belongs to: from a hash of its id, so the same pair
    falls in the same shard on every machine and in every run, whatever else is selected.

    >>> shard_of("tpu_embedding:tf1-vs-tf2", 3), shard_of("tpu_embedding:tf1-vs-tf2", 1)
    (3, 1)
    """
    digest = hashlib.sha256(pair_id.encode()).digest()
    return int.from_bytes(digest[:8], "big") % shards + 1
