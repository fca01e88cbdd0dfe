"""The test command's scheduling under `-n` (`tests/conftest.py`): which tests share an xdist
worker. A module making a module-scoped fixture is one group, a folder whose conftest.py makes
a shared fixture is one group, and every other test is alone (the parity pairs' groups are
the plugin's: tests/session/test_scheduling.py)."""
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
