"""The parity pairs' scheduling groups under `pytest verify/ -n N` (verify/session/scheduling.py):
the pairs of one case and reference share a worker, the pairs of one destination environment
share a worker, and the controller reads the groups the workers wrote."""
from types import SimpleNamespace

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
