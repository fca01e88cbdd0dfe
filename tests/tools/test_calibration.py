"""Tolerances from the case's own noise floor: the cap, the below-floor failure, the report's
looseness figure, the calibration file, and that another data set's calibration is never
applied."""
import numpy as np
import pytest

from verify.tools.calibration import ReferenceRaised, measure_floor, nudged
from verify.core.case import PairSpec
from verify.core.noise_floor import Calibration, NoiseFloor
from verify.core.tolerances import Tolerance, Tolerances
from verify.core.trace import Trace
from verify.judge import judge_pair
from verify.judge.compare import compare_traces
from verify.judge.arrays import compare_arrays


def test_a_measured_floor_caps_a_loose_tolerance_and_a_mistake_far_below_it_is_caught():
    reference = np.array([1.0, 2.0], np.float32)
    candidate = reference + np.float32(5e-6)   # under atol 1e-4, over 10 x the floor
    loose = Tolerance(atol=1e-4, rtol=0.0)
    assert compare_arrays(candidate, reference, loose).passed
    capped = compare_arrays(candidate, reference, loose.with_floor(1e-7, 10.0))
    # the floor is never below one ulp of the largest reference element (2.4e-7 at 2.0)
    assert not capped.passed and capped.times_tolerance == pytest.approx(5e-6 / 2.384e-6,
                                                                         rel=1e-2)
    assert "capped at 10x the noise floor" in capped.reason
    assert capped.floor == pytest.approx(2.4e-7, rel=0.01)   # never below 1 ulp of max |ref|
    assert capped.looseness == pytest.approx(1e-4 / capped.floor, rel=1e-6)


def test_a_tolerance_below_the_floor_fails_even_where_the_numbers_agree():
    reference = np.array([1.0, 2.0], np.float32)
    drift = compare_arrays(reference.copy(), reference, Tolerance(atol=1e-9, rtol=0.0)
                           .with_floor(1e-6, 10.0))
    assert not drift.passed
    assert "below the noise floor" in drift.reason


def test_floors_are_running_maxima_of_the_worst_variant():
    plain, up, down = Trace("r"), Trace("r+"), Trace("r-")
    for step, (a, b, c) in enumerate([(1.0, 1.0, 1.0), (2.0, 2.1, 1.7), (3.0, 3.05, 3.0)]):
        for trace, value in ((plain, a), (up, b), (down, c)):
            trace.record(step, "weight", "w", np.float32(value))
            trace.record(step, "input", "x", "digest")
    floor = measure_floor(plain, [up, down])
    assert floor.floors[("weight", "w")] == pytest.approx((0.0, 0.3, 0.3), abs=1e-6)
    assert ("input", "x") not in floor.floors
    with pytest.raises(ReferenceRaised, match="raised"):   # the case's code: exit 2
        measure_floor(plain, [Trace("bad", error="ValueError: no")])


def test_nudged_initial_values_move_one_ulp_and_leave_integers_alone():
    values = nudged({"w": np.float32([1.0, -2.0]), "ids": np.array([3, 4])}, -np.inf)
    assert np.all(values["w"] == np.nextafter(np.float32([1.0, -2.0]), np.float32(-np.inf)))
    assert values["ids"].tolist() == [3, 4]


def calibration(digest: str) -> Calibration:
    return Calibration("demo", digest, 2,
                       {"tf1": NoiseFloor({("weight", "w"): (1e-8, 1e-8, 1e-8)})},
                       {"date": "2026-11-22", "tensorflow": "2.15.1"})


def traces(offset: float):
    ref, cand = Trace("tf1", {"data_digest": "abc"}), Trace("tf2", {"data_digest": "abc"})
    for step in range(3):
        ref.record(step, "weight", "w", np.float32([1.0, 2.0]))
        cand.record(step, "weight", "w", np.float32([1.0, 2.0 + offset]))
    return {"tf1": ref, "tf2": cand}


def test_judge_applies_a_calibration_only_to_the_data_it_was_measured_on():
    spec = PairSpec("demo", "tf1", "tf2")
    drifting = traces(5e-6)   # within the default 1e-6 + 1e-5*2, above 10 x 2.4e-7
    plain = judge_pair(spec, drifting.__getitem__, Tolerances.default())
    assert plain.verdict.ok and plain.record.calibration == "not calibrated"
    tight = judge_pair(spec, drifting.__getitem__, Tolerances.default(),
                       calibration=calibration("abc"))
    assert not tight.verdict.ok and tight.record.calibration.startswith("10x the floor")
    other = judge_pair(spec, drifting.__getitem__, Tolerances.default(),
                       calibration=calibration("other data"))
    assert other.verdict.ok and "other data" in other.record.calibration


def test_calibration_files_round_trip_and_bad_ones_say_so(tmp_path):
    path = calibration("abc").save(tmp_path / "calibration.json")
    again = Calibration.load(path)
    assert again.floor_of("tf1").at("weight", "w", 2) == pytest.approx(1e-8)
    assert Calibration.load(tmp_path / "missing.json") is None
    (tmp_path / "bad.json").write_text('{"schema": "x"}')
    with pytest.raises(ValueError, match="bad.json: not a calibration"):
        Calibration.load(tmp_path / "bad.json")


def test_rows_carry_the_floor_they_were_judged_with():
    pair = traces(0.0)
    rows = compare_traces(pair["tf1"], pair["tf2"],
                          floor=calibration("abc").floor_of("tf1"))
    assert rows["floor"].notna().all() and rows["passed"].all()


def test_the_summary_names_loose_case_tolerances_but_not_floors_of_zero_tensors():
    import pandas as pd

    from verify.render.summary_sections import case_overview_lines, tolerance_lines

    pairs = pd.DataFrame([{"case": "demo", "reference": "tf1", "candidate": "tf2",
                           "role": "faithful", "calibration": "10x the floor of tf1 (...)"}])
    rows = pd.DataFrame([
        {"case": "demo", "candidate": "tf2", "quantity": "grad", "tensor": "dense/kernel",
         "step": 3, "times_tolerance": 0.2, "floor": 1e-8, "looseness": 5e4},
        {"case": "demo", "candidate": "tf2", "quantity": "weight", "tensor": "dense/bias",
         "step": 0, "times_tolerance": 0.0, "floor": 1.4e-45, "looseness": 7e42}])
    text = "\n".join(tolerance_lines(rows, pairs))
    assert "demo grad: the case's own tolerance is up to 5e+04x the noise floor" in text
    assert "weight:" not in text
    overview = case_overview_lines(rows, pairs.assign(verdict="PASS"))[-1]
    assert "10x the floor of tf1 (...); worst faithful drift uses 0.2 of it" in overview


def test_a_case_keeps_a_calibration_per_device_and_a_tpu_run_is_judged_with_the_tpus(tmp_path):
    """`calibrate --tpu` writes calibration_tpu.json beside the CPU's; a TPU run is judged
    with it, and without it the CPU's is not applied (the record says so)."""
    import dataclasses

    from verify.core.case import Case, Examples, Implementation
    from verify.core.names import NameMap

    side = lambda name: Implementation(name, None, NameMap({"w": "w"}))  # noqa: E731
    case = Case(name="demo", examples=Examples({"x": np.zeros((4, 2))}, np.zeros(4)),
                batch_size=2, steps=2, initial_values={"w": np.zeros(2)},
                implementations=(side("tf1"), side("tf2")), reference="tf1",
                calibration_file=tmp_path / "calibration.json")
    cpu = calibration("abc")
    cpu.save(tmp_path / "calibration.json")
    spec = PairSpec("demo", "tf1", "tf2")
    on_tpu = {name: dataclasses.replace(t, meta=dataclasses.replace(t.meta, device="tpu"))
              for name, t in traces(5e-6).items()}
    without = judge_pair(spec, on_tpu.__getitem__, Tolerances.default(),
                         calibration=case.calibration_on("tpu"))
    assert without.verdict.ok
    assert without.record.calibration == "calibrated on cpu: not applied to a tpu run"
    assert case.calibration_path("tpu") == tmp_path / "calibration_tpu.json"
    dataclasses.replace(cpu, provenance={**cpu.provenance, "device": "tpu"}).save(
        case.calibration_path("tpu"))
    judged = judge_pair(spec, on_tpu.__getitem__, Tolerances.default(),
                        calibration=case.calibration_on("tpu"))
    assert not judged.verdict.ok and judged.record.calibration.startswith("10x the floor")
    assert case.calibration_on("cpu").provenance.get("device", "cpu") == "cpu"


@pytest.mark.slow
def test_calibrate_tpu_without_a_tpu_fails_at_once_and_writes_nothing(tmp_path):
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "verify", "calibrate", "tpu_embedding",
                           "--tpu", "--out", str(tmp_path / "calibration_tpu.json")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "calibrate --tpu: --tpu was given but no TPU is reachable" in done.stderr
    assert not (tmp_path / "calibration_tpu.json").exists()
