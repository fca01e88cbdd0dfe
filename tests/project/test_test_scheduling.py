"""The test command's scheduling under `-n` (`tests/conftest.py`): which tests share an xdist
worker. A module making a module-scoped fixture is one group, a folder whose conftest.py makes
a shared fixture is one group, the parity pairs of one case and reference are one group, and
every other test is alone."""
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _conftest():
    spec = importlib.util.spec_from_file_location("tests_conftest", ROOT / "tests" / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_modules_and_folders_that_share_a_fixture_are_grouped_and_others_are_not():
    conftest = _conftest()
    group = conftest.shared_fixture_group
    assert group(ROOT, "tests/judge/test_preflight.py") == "tests/judge/test_preflight.py"
    assert group(ROOT, "tests/session/test_plugin.py") == "tests/session"
    assert group(ROOT, "tests/judge/test_verdict.py") is None      # no shared fixture: alone
    assert group(ROOT, "tests/judge/test_missing.py") is None


def test_parity_pairs_are_grouped_by_case_and_reference():
    pair = _conftest().PARITY_PAIR
    ids = ["custom_loop:reference-x1-vs-mirrored-x1", "custom_loop:reference-x1-vs-control-x",
           "custom_loop:reference-x2-vs-mirrored-x2", "tpu_embedding:tf1-vs-tf2-mirrored~drop_step"]
    groups = [pair.fullmatch(f"verify/test_parity.py::test_pair[{i}]").group(1) for i in ids]
    assert groups[0] == groups[1] == "verify/test_parity.py::test_pair[custom_loop:reference-x1"
    assert len(set(groups)) == 3
    assert pair.fullmatch("tests/judge/test_verdict.py::test_x[a:b-vs-c]") is None
