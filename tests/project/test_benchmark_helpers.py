"""The benchmarks' shared helpers: how a target is judged and printed, the order of runs, and
the per-test CPU and training-run logs of the test command's profile."""
import doctest
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import baselines  # noqa: E402
import cpu_per_test  # noqa: E402
import default_run_profile  # noqa: E402
import suite_cpu_profile  # noqa: E402
import targets  # noqa: E402


@pytest.mark.parametrize("module", [baselines, cpu_per_test, targets, suite_cpu_profile],
                         ids=lambda m: m.__name__)
def test_doctests(module):
    result = doctest.testmod(module)
    assert result.attempted > 0 and result.failed == 0


def test_a_target_is_judged_on_the_median_of_every_run():
    assert "NOT met (median 1.2x" in targets.target_line("c", [1.0, 1.2, 1.3], 1.1, "x",
                                                          at_most=True)
    assert ": met (median 1.05x" in targets.target_line("c", [1.05, 1.0, 1.3], 1.1, "x",
                                                         at_most=True)
    # a floor: the median must reach it
    assert "NOT met" in targets.target_line("t", [9.0, 7.0, 7.5], 8, " GB/s", at_most=False)
    assert ": met" in targets.target_line("t", [9.0, 8.5, 7.5], 8, " GB/s", at_most=False)


def test_the_default_runs_floor_is_its_training_runs_over_the_cores(tmp_path):
    """The runs' own seconds (every kind, and the layer replays), not the waits for another
    worker nor the judging, over the cores; judged against the 240 s target either way."""
    log = tmp_path / "run.log"
    log.write_text(
        "parity   1 [ 200.0s] PASS c: ref -> cand (330.0s; ran ref 120.0s, cand 180.0s)\n"
        "parity   2 [ 400.0s] CAUGHT c: ref -> control-x (250.0s; ran control-x 150.0s; "
        "waited for ref 40.0s)\n")
    per_case, wall = default_run_profile.profile(log)
    assert wall == 400.0 and per_case["c"]["waits"] == 40.0 and per_case["c"]["judging"] == 90.0
    kinds = ["reference", "faithful", "control", "mutant", "destination env"]
    line = default_run_profile.runs_floor_line(per_case, {"c": 30.0}, kinds, 2)
    assert "480 s of the workers' time" in line and "at least 240 s" in line
    assert "below the 240 s target" in line
    above = default_run_profile.runs_floor_line(per_case, {"c": 32.0}, kinds, 2)
    assert "at least 241 s" in above and "above the 240 s target" in above
    assert "at least 120 s" in default_run_profile.runs_floor_line(per_case, {"c": 30.0},
                                                                   kinds, 4)


def test_every_kind_of_run_takes_every_place_in_turn():
    kinds = ["off", "touched", "whole"]
    rounds = [baselines.rotated(kinds, r) for r in range(3)]
    for place in range(3):
        assert sorted(r[place] for r in rounds) == sorted(kinds)
    assert all(sorted(r) == sorted(kinds) for r in rounds)


BUSY_TESTS = textwrap.dedent("""
    import subprocess, sys, time

    def spin(seconds):
        end = time.process_time() + seconds
        while time.process_time() < end:
            pass

    def test_busy_here():
        spin(0.6)

    def test_busy_in_a_child():
        subprocess.run([sys.executable, "-c",
                        "import time\\nend = time.process_time() + 0.6\\n"
                        "while time.process_time() < end: pass"], check=True)

    def test_idle():
        time.sleep(0.3)
""")


@pytest.mark.slow   # pytest in a subprocess
def test_each_tests_cpu_is_logged_where_it_was_spent(tmp_path):
    (tmp_path / "test_busy.py").write_text(BUSY_TESTS)
    logs = tmp_path / "logs"
    logs.mkdir()
    env = {**os.environ, "PARITY_CPU_LOG": str(logs),
           "PYTHONPATH": os.pathsep.join([str(BENCHMARKS), os.environ.get("PYTHONPATH", "")])}
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "cpu_per_test",
                    "-p", "no:cacheprovider", "test_busy.py"], cwd=tmp_path, env=env,
                   check=True, capture_output=True, timeout=120)
    rows = {nodeid.split("::")[1]: (wall, own, children)
            for nodeid, wall, own, children in suite_cpu_profile.read_logs(logs)}
    assert set(rows) == {"test_busy_here", "test_busy_in_a_child", "test_idle"}
    assert rows["test_busy_here"][1] >= 0.55 and rows["test_busy_here"][2] < 0.05
    assert rows["test_busy_in_a_child"][2] >= 0.55
    idle_wall, idle_own, idle_children = rows["test_idle"]
    assert idle_wall >= 0.3 and idle_own + idle_children < 0.1
    summary = "\n".join(suite_cpu_profile.report(list(suite_cpu_profile.read_logs(logs)),
                                                 wall=10.0, cpu=4.0))
    assert "3 tests" in summary and "not in any test" in summary


TWICE_RUN_TESTS = textwrap.dedent("""
    from verify.runners.run import run_implementation

    from toy_cases import CASE

    def test_the_same_run_twice():
        for _ in range(2):
            run_implementation(CASE, CASE.implementation("ref"))

    def test_other_runs():
        run_implementation(CASE, CASE.implementation("ref"), steps=2)
        run_implementation(CASE, CASE.implementation("a"))
""")


@pytest.mark.slow   # pytest in a subprocess
def test_a_run_made_twice_is_listed_as_a_repeat_and_other_runs_are_not(tmp_path):
    from toy_training import CASES, ROOT

    (tmp_path / "toy_cases.py").write_text(CASES)
    (tmp_path / "test_runs.py").write_text(TWICE_RUN_TESTS)
    logs = tmp_path / "logs"
    logs.mkdir()
    env = {**os.environ, "PARITY_CPU_LOG": str(logs), "PYTHONPATH": os.pathsep.join(
        [str(BENCHMARKS), str(ROOT), str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")])}
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "cpu_per_test",
                    "-p", "no:cacheprovider", "test_runs.py"], cwd=tmp_path, env=env,
                   check=True, capture_output=True, timeout=120)
    runs = suite_cpu_profile.read_runs(logs)
    assert sorted(test.split("::")[1] for test, *_ in runs) == \
        ["test_other_runs"] * 2 + ["test_the_same_run_twice"] * 2
    assert len(suite_cpu_profile.read_logs(logs)) == 2   # the runs log is not read as tests
    (identity, times, _, tests), = suite_cpu_profile.repeated_runs(runs)
    assert times == 2 and [t.split("::")[1] for t in tests] == ["test_the_same_run_twice"]
    assert json.loads(identity)[:3] == ["tiny", "ref", 3]
    summary = "\n".join(suite_cpu_profile.runs_report(runs, total_cpu=10.0))
    assert "4 training runs" in summary and "3 distinct; 1 repeats of 1 runs" in summary
