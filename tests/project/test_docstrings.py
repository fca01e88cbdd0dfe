"""The examples in the public docstrings of the TensorFlow-free stages run and hold."""
import doctest
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def modules_with_examples() -> list[str]:
    """Every module of verify/ and cases/ whose source holds a docstring example (collected,
    never listed by hand; the parity test module is pytest's, not an API)."""
    found = []
    for package in ("verify", "cases"):
        for path in sorted((ROOT / package).rglob("*.py")):
            if path.name == "test_parity.py" or ">>> " not in path.read_text():
                continue
            parts = path.relative_to(ROOT).with_suffix("").parts
            found.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return found


MODULES = modules_with_examples()
# The stages that must run where TensorFlow is not installed (a laptop re-comparing TPU traces).
WITHOUT_TENSORFLOW = ["verify", "verify.tools.calibration", "verify.core.sensitivity",
                      "verify.runners.case_sources", "verify.core.case", "verify.core.meta",
                      "verify.store.history", "verify.judge", "verify.store.kept_traces",
                      "verify.render", "verify.render.html", "verify.render.markdown",
                      "verify.render.terminal", "verify.store.report_dir", "verify.store.results",
                      "verify.session.parity_session", "verify.session.plugin",
                      "verify.__main__", "verify.session.suite", "verify.core.scratch"]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    """Examples marked +SKIP (they train) are not attempted; every other one must run and
    hold."""
    module = importlib.import_module(name)
    examples = [e for t in doctest.DocTestFinder().find(module) for e in t.examples]
    runnable = [e for e in examples if not e.options.get(doctest.SKIP)]
    assert examples, f"{name} has no docstring example"
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.attempted == len(runnable), (result, len(runnable))
    assert result.failed == 0


def test_compare_and_report_stages_do_not_import_tensorflow():
    import subprocess
    import sys

    code = (f"import sys; import {', '.join(WITHOUT_TENSORFLOW)}; "
            "print('tensorflow' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
