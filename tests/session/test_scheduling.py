"""The parity pairs' scheduling groups under `pytest verify/ -n N` (verify/session/scheduling.py):
the pairs of one case and reference share a worker, the pairs of one destination environment
share a worker, and the controller reads the groups the workers wrote; end to end, a toy
project's pairs of one reference run in one xdist worker, and are split without the groups or
under xdist's worksteal mode."""
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from toy_training import write_toy_project

from verify.core.case import PairSpec
from verify.session.scheduling import GROUPS_FILE, make_scheduler, read_groups, write_groups


class FakeCase:
    """A case whose implementations run where `environments` says (else locally)."""

    def __init__(self, environments):
        self.environments = environments

    def implementation(self, name):
        if name == "missing":
            raise KeyError(name)
        return SimpleNamespace(environment=self.environments.get(name, "local"))


PAIRS = [PairSpec("c", "tf1", "tf2"), PairSpec("c", "tf1", "control-x"),
         PairSpec("c", "tf1", "tf2~drop_step"), PairSpec("c", "tf1", "tf2-tf221"),
         PairSpec("d", "tf1", "keras3-tf"), PairSpec("d", "ref-x2", "mirrored-x2"),
         PairSpec("c", "tf1", "tf2-tf221-b"), PairSpec("d", "tf1", "missing")]
CASES = {"c": FakeCase({"tf2-tf221": "tf221", "tf2-tf221-b": "tf221"}),
         "d": FakeCase({"keras3-tf": "keras3-tf"})}


def config(dist="load"):
    values = {"dist": dist, "tx": ["2*popen"]}
    return SimpleNamespace(getvalue=values.get, option=SimpleNamespace(loadscopereorder=True))


def test_pairs_of_one_reference_or_one_environment_share_a_group(tmp_path):
    write_groups(tmp_path, PAIRS, CASES)
    scheduler = make_scheduler(config(), None, tmp_path,
                               lambda nodeid: "module" if "grouped" in nodeid else None)
    scope = {spec.candidate: scheduler._split_scope(f"verify/test_parity.py::test_pair[{spec.id}]")
             for spec in PAIRS}
    assert scope["tf2"] == scope["control-x"] == scope["tf2~drop_step"] == "parity:c:tf1"
    assert scope["tf2-tf221"] == scope["tf2-tf221-b"] == "parity-environment:tf221"
    assert scope["keras3-tf"] == "parity-environment:keras3-tf"
    assert scope["mirrored-x2"] == "parity:d:ref-x2"
    assert scope["missing"] == "parity:d:tf1"   # an implementation it cannot look up
    # other tests: the project's own group, else alone
    assert scheduler._split_scope("tests/x/test_a.py::test_grouped") == "module"
    assert scheduler._split_scope("tests/x/test_a.py::test_b") == "tests/x/test_a.py::test_b"


def test_without_the_workers_groups_every_pair_is_alone(tmp_path):
    node = "verify/test_parity.py::test_pair[c:tf1-vs-tf2]"
    assert make_scheduler(config(), None, tmp_path)._split_scope(node) == node
    (tmp_path / GROUPS_FILE).write_text("{not json")   # damaged: read as none
    assert read_groups(tmp_path) == {}
    assert make_scheduler(config(), None, tmp_path)._split_scope(node) == node
    (tmp_path / GROUPS_FILE).write_text('{"c:tf1-vs-tf2": 3}')   # not a group name
    assert make_scheduler(config(), None, tmp_path)._split_scope(node) == node


def test_another_dist_mode_is_left_to_xdist(tmp_path):
    assert make_scheduler(config("loadfile"), None, tmp_path) is None


def test_groups_are_written_whole_and_leave_no_temporary_file(tmp_path):
    write_groups(tmp_path / "parts", PAIRS[:2], CASES)
    write_groups(tmp_path / "parts", PAIRS[:2], CASES)   # the second worker: same content
    assert [p.name for p in (tmp_path / "parts").iterdir()] == [GROUPS_FILE]
    assert read_groups(tmp_path / "parts") == {"c:tf1-vs-tf2": "parity:c:tf1",
                                               "c:tf1-vs-control-x": "parity:c:tf1"}


# Two references with four candidates each, collected r1, r1, r2, r2, r1, r1, r2, r2: handed
# out one by one (xdist's load) or in halves (worksteal), each reference's pairs are split.
TWO_REFERENCES = '''
import numpy as np

from verify.core.case import Case, Examples, Implementation
from verify.core.names import NameMap
from verify.core.trace import Trace

from toy_training import record_toy_steps


class NumpyRunner:
    uses_tensorflow = False

    def run(self, request):
        return record_toy_steps(Trace(request.implementation.name, {"replicas": 1}),
                                request.initial_values["w"], request.steps, 0.0)

    def describe(self):
        return {"runner": "numpy"}

    def declared_config(self, case, implementation):
        return {}


NAMES = ["r1", "r2", *(f"{r}-{c}" for half in ("ab", "cd") for r in ("r1", "r2") for c in half)]
CASE = Case(name="tiny", examples=Examples({"x": np.zeros((4, 1))}, labels=np.zeros(4)),
            batch_size=2, steps=2, initial_values={"w": np.ones(4, dtype=np.float32)},
            implementations=tuple(Implementation(n, NumpyRunner(), NameMap({"w": "w"}))
                                  for n in NAMES),
            reference="r1", pairs=tuple((n[:2], n) for n in NAMES[2:]), seed=3)
'''


def workers_of_each_reference(project, *args) -> dict[str, set[str]]:
    """Run the toy project's pairs under `-n 2` and say which workers ran each reference's."""
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "test_tiny.py", "-p", "verify.session.plugin", "-p",
         "no:cacheprovider", "-n", "2", "-v", *args], cwd=project, capture_output=True,
        text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": os.pathsep.join((str(root), str(root / "tests")))})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    found: dict[str, set[str]] = {}
    for worker, reference in re.findall(r"\[(gw\d)\].*test_pair\[tiny:(r\d)-vs-", done.stdout):
        found.setdefault(reference, set()).add(worker)
    assert sum(1 for _ in re.finditer(r"PASSED", done.stdout)) == 8, done.stdout[-3000:]
    return found


@pytest.mark.slow   # two pytest sessions with two xdist workers each
def test_under_xdist_each_references_pairs_run_in_one_worker(tmp_path):
    project = write_toy_project(tmp_path, TWO_REFERENCES)
    grouped = workers_of_each_reference(project)
    assert set(grouped) == {"r1", "r2"} and all(len(w) == 1 for w in grouped.values()), grouped
    # negative controls: without the workers' groups every pair is alone, and xdist's worksteal
    # mode (left to xdist): each splits a reference's pairs between the workers
    (project / "conftest.py").write_text(project.joinpath("conftest.py").read_text() + (
        "import verify.session.plugin\n"
        "verify.session.plugin.write_groups = lambda *args: None\n"))
    assert any(len(w) == 2 for w in workers_of_each_reference(project).values())
    spread = workers_of_each_reference(project, "--dist", "worksteal")
    assert any(len(w) == 2 for w in spread.values()), spread
