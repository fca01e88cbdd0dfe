"""The layering of verify/ (pyproject.toml's [tool.importlinter] contracts) holds, and the
check is live: a back-import added to a copy of the package breaks it."""
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINT = Path(sys.executable).with_name("lint-imports")

pytestmark = pytest.mark.skipif(not LINT.exists(), reason="import-linter is not installed "
                                "(pip install -e . installs it)")


def lint(where: Path) -> subprocess.CompletedProcess:
    """lint-imports on the `verify` package found first from `where` (its own directory)."""
    return subprocess.run([str(LINT), "--config", str(where / "pyproject.toml"), "--no-cache"],
                          cwd=where, capture_output=True, text=True, timeout=300,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(where)})


def test_the_import_contracts_hold():
    result = lint(ROOT)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "0 broken" in result.stdout


@pytest.mark.parametrize("module, back_import, broken", [
    # a runner kind reaching into another kind
    ("verify/runners/loop/runner.py", "from verify.runners.keras import evaluation",
     "Runner kinds never import one another"),
    # the shared capture importing the run entry above it: a circle hidden in a function
    ("verify/runners/capture/taps.py", "def _late():\n    from verify.runners import run",
     "No import circle"),
    # the judge importing a runner
    ("verify/judge/verdict.py", "from verify.runners.capture import taps",
     "Everything after the trace never imports a runner"),
    # storage reaching up into a tool (no circle: only the top-level layering catches it)
    ("verify/store/tolerance_documents.py", "from verify.tools import name_proposals",
     "The top level: commands over tools"),
])
def test_a_back_import_breaks_a_contract(tmp_path, module, back_import, broken):
    shutil.copytree(ROOT / "verify", tmp_path / "verify",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    assert lint(tmp_path).returncode == 0           # the copy holds, as the checkout does
    target = tmp_path / module
    target.write_text(target.read_text() + f"\n\n{back_import}\n")
    result = lint(tmp_path)
    assert result.returncode != 0, result.stdout[-3000:]
    assert broken in result.stdout.split("Broken contracts")[-1], result.stdout[-3000:]
