"""Which parity pairs share an xdist worker under `pytest verify/ -n N`.

pytest-xdist's default `load` scheduling hands tests to whichever worker is free, one by one.
For parity pairs that costs twice: the pairs of one reference land on both workers, so one
waits for the other to finish running that reference (`SharedTraces`), and the pairs of a
destination environment land on both, so each worker starts that environment's process (10 to
17 s on a 2-core machine). The plugin's scheduler (xdist's scope scheduler with these groups)
keeps them together:

- a pair whose candidate runs in another environment goes with every pair of that environment
  (one environment process per session instead of one per worker);
- any other pair goes with the pairs of its case and reference (the reference runs in that
  worker, its faithful candidates too, and their mutants beside them);
- every other test is a group of its own, unless the project's conftest.py groups it.

The largest groups go first. Another `--dist` mode is left to pytest-xdist. The groups come
from the cases, which only the workers load (the controlling process never imports a case
module): each worker writes them when it has collected (`write_groups`) and the controller
reads them when it schedules, after every worker has collected. Without that file every pair
is alone, as under xdist's own scheduling.

>>> group_of(PairSpec("recommender_sgd", "tf1", "control-lr"), "local")
'parity:recommender_sgd:tf1'
>>> group_of(PairSpec("recommender_sgd", "tf1", "tf2-tf221"), "tf221")
'parity-environment:tf221'
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Callable

from verify.core.case import PairSpec
from verify.core.meta import SUITE_ENVIRONMENT
from verify.session.parity_controller import PAIR_TEST

GROUPS_FILE = "scheduling-groups.json"   # in the run's parts directory


def group_of(spec: PairSpec, environment: str | None) -> str:
    """The scheduling group of a parity pair whose candidate runs in `environment`."""
    if environment and environment != SUITE_ENVIRONMENT:
        return f"parity-environment:{environment}"
    return f"parity:{spec.case}:{spec.reference}"


def write_groups(parts_dir: Path, pairs: list[PairSpec], cases: dict) -> None:
    """Write each pair's group (pair id -> group) for the controller; whole or not at all."""
    groups = {}
    for spec in pairs:
        case = cases.get(spec.case)
        try:
            environment = case.implementation(spec.candidate).environment if case else None
        except (KeyError, ValueError):   # a pair standing for a source that did not load
            environment = None
        groups[spec.id] = group_of(spec, environment)
    parts_dir.mkdir(parents=True, exist_ok=True)
    temporary = parts_dir / f".{GROUPS_FILE}.{os.getpid()}"
    temporary.write_text(json.dumps(groups, sort_keys=True), encoding="utf-8")
    os.replace(temporary, parts_dir / GROUPS_FILE)   # the workers write the same groups


def read_groups(parts_dir: Path) -> dict[str, str]:
    """The groups a worker wrote; {} when none did or the file is damaged."""
    try:
        groups = json.loads((parts_dir / GROUPS_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return groups if isinstance(groups, dict) else {}


def make_scheduler(config, log, parts_dir: Path,
                   other_group: Callable[[str], str | None] | None = None):
    """xdist's scope scheduler with the parity pairs' groups (`read_groups(parts_dir)`), and
    for any other test `other_group(nodeid)` (None: alone); None when `--dist` asks for another
    mode than `load`."""
    if config.getvalue("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ParityScheduling(LoadScopeScheduling):
        groups: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if PAIR_TEST in nodeid:
                if self.groups is None:   # first asked once every worker has collected
                    self.groups = read_groups(parts_dir)
                group = self.groups.get(nodeid.split(PAIR_TEST, 1)[1][:-1])
                if isinstance(group, str):
                    return group
            return (other_group(nodeid) if other_group else None) or nodeid

    return ParityScheduling(config, log)
