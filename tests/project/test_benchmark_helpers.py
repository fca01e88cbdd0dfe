"""The benchmarks' shared helpers: how a target is judged and printed, and the order of runs."""
import doctest
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import baselines  # noqa: E402
import targets  # noqa: E402


@pytest.mark.parametrize("module", [baselines, targets], ids=lambda m: m.__name__)
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


def test_every_kind_of_run_takes_every_place_in_turn():
    kinds = ["off", "touched", "whole"]
    rounds = [baselines.rotated(kinds, r) for r in range(3)]
    for place in range(3):
        assert sorted(r[place] for r in rounds) == sorted(kinds)
    assert all(sorted(r) == sorted(kinds) for r in rounds)
