"""The examples in the public docstrings of the TensorFlow-free stages run and hold."""
import doctest
import importlib

import pytest

MODULES = ["verify.calibration", "verify.sensitivity", "verify.runners.mutations",
           "verify.core.noise_floor", "verify.case_sources", "verify.core.case", "verify.core.files", "verify.core.meta",
           "verify.core.names", "verify.core.quantities", "verify.core.tolerances",
           "verify.core.trace", "verify.history", "verify.judge.attribution",
           "verify.judge.compare", "verify.judge.pair", "verify.judge.preflight",
           "verify.judge.verdict", "verify.kept_traces", "verify.oracle_math",
           "verify.render.html", "verify.render.markdown", "verify.render.text",
           "verify.report_dir", "verify.results", "verify.runners.protocol", "verify.runners.run",
           "verify.session", "verify.suite", "cases.recommender.oracle",
           "verify.checkpoint.mapping", "verify.core.scratch", "verify.runners.process_state",
           "verify.runners.loop_runner"]
# The stages that must run where TensorFlow is not installed (a laptop re-comparing TPU traces).
WITHOUT_TENSORFLOW = ["verify", "verify.calibration", "verify.sensitivity", "verify.case_sources", "verify.core.case", "verify.core.meta",
                      "verify.history", "verify.judge", "verify.kept_traces", "verify.render",
                      "verify.render.html", "verify.render.markdown", "verify.render.terminal",
                      "verify.report_dir", "verify.results", "verify.session", "verify.plugin",
                      "verify.__main__", "verify.suite", "verify.core.scratch"]


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
