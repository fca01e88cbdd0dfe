"""`python -m verify calibrate --full` calibrates the case's long tier, as `pytest verify/ --full`
builds it (its own steps and calibration file), and the default its quick tier."""
import pytest

from verify import __main__ as cli

CASE_MODULE = '''
import numpy as np
from pathlib import Path

from verify.core.case import Case, Examples, Implementation
from verify.core.names import NameMap


def cases(options):
    tier = "full" if options.full else "quick"
    return [Case(name="tiers", examples=Examples({"x": np.zeros((4, 1))}, labels=np.zeros(4)),
                 batch_size=2, steps=40 if options.full else 4,
                 initial_values={"w": np.zeros(2, np.float32)},
                 implementations=(Implementation("ref", None, NameMap({"w": "w"})),),
                 reference="ref",
                 calibration_file=Path(__file__).with_name(f"calibration_{tier}.json"))]
'''


class Measured(Exception):
    """Raised by the stubbed calibration once it has seen the case it was given."""


@pytest.mark.parametrize("flags, steps, file", [([], 4, "calibration_quick.json"),
                                                (["--full"], 40, "calibration_full.json")])
def test_calibrate_builds_the_tier_it_is_asked_for(tmp_path, monkeypatch, flags, steps, file):
    package = tmp_path / "cases" / f"tiers_{steps}"     # one module name per test
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(CASE_MODULE)
    seen = {}

    def calibrate_case(case, references=None, steps=None, plains=None, device="cpu",
                       tpu_name=""):
        seen.update(steps=case.steps, file=case.calibration_file.name, device=device)
        raise Measured()

    monkeypatch.setattr("verify.tools.calibration.calibrate_case", calibrate_case)
    monkeypatch.setattr("verify.runners.capture.devices.configure_cpu_replicas", lambda *a: None)
    status = cli.main(["calibrate", "tiers", "--cases", str(tmp_path / "cases"), *flags])
    assert status != 0                    # the stub stops the command once it has looked
    assert seen == {"steps": steps, "file": file, "device": "cpu"}
