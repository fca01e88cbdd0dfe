"""One line per performance target: its median, every run's figure, and whether it is met.

    >>> print(target_line("TF2 capture", [1.18, 1.21, 1.2], 1.1, "x", at_most=True))
    target TF2 capture <= 1.1x: NOT met (median 1.2x; runs 1.18x, 1.21x, 1.2x)
"""
from __future__ import annotations

import statistics


def target_line(name: str, figures: list[float], target: float, unit: str,
                at_most: bool) -> str:
    """`figures` are every run's value of one measure; the median is judged against
    `target` (`at_most`: the median must not exceed it; else it must reach it)."""
    median = statistics.median(figures)
    met = median <= target if at_most else median >= target
    runs = ", ".join(f"{f:.3g}{unit}" for f in figures)
    return (f"target {name} {'<=' if at_most else '>='} {target:g}{unit}: "
            f"{'met' if met else 'NOT met'} (median {median:.3g}{unit}; runs {runs})")
