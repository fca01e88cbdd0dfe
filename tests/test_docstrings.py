"""The examples in the public docstrings of the TensorFlow-free stages run and hold."""
import doctest
import importlib

import pytest

MODULES = ["verify.attribution", "verify.case", "verify.compare", "verify.history",
           "verify.html_report", "verify.kept_traces", "verify.names", "verify.oracle",
           "verify.preflight", "verify.report", "verify.tolerances", "verify.trace",
           "verify.verdict"]
# The stages that must run where TensorFlow is not installed (a laptop re-comparing TPU traces).
WITHOUT_TENSORFLOW = ["verify.attribution", "verify.compare", "verify.history",
                      "verify.html_report", "verify.kept_traces", "verify.preflight",
                      "verify.report", "verify.trace", "verify.verdict", "verify.__main__"]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0, f"{name} has no docstring example"
    assert result.failed == 0


def test_compare_and_report_stages_do_not_import_tensorflow():
    import subprocess
    import sys

    code = (f"import sys; import {', '.join(WITHOUT_TENSORFLOW)}; "
            "print('tensorflow' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
