"""The examples in the public docstrings of the TensorFlow-free stages run and hold."""
import doctest
import importlib

import pytest

MODULES = ["verify.case", "verify.compare", "verify.names", "verify.preflight",
           "verify.tolerances", "verify.trace", "verify.verdict"]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0, f"{name} has no docstring example"
    assert result.failed == 0


def test_compare_and_report_stages_do_not_import_tensorflow():
    import subprocess
    import sys

    code = ("import sys; import verify.compare, verify.report, verify.verdict, verify.trace; "
            "print('tensorflow' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
