"""A pytest plugin that logs each test's wall time and CPU: its process's own and that of the
child processes it started and waited for (a subprocess session, a `python -m verify` command).

Loaded by `benchmarks/suite_cpu_profile.py` (`-p cpu_per_test`, this folder on PYTHONPATH); each
process (an xdist worker) appends `nodeid, wall, own CPU, children's CPU` rows to
`$PARITY_CPU_LOG/<pid>.tsv`. A child that is still running when its test ends (an environment's
worker process, a background warm-up) is not counted for any test.
"""
from __future__ import annotations

import os
import resource
import time
from pathlib import Path

import pytest

LOG_VARIABLE = "PARITY_CPU_LOG"


def cpu_seconds() -> tuple[float, float]:
    """This process's CPU (user + system) and that of its children it has waited for."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    directory = os.environ.get(LOG_VARIABLE)
    if not directory:
        yield
        return
    started, (own, children) = time.monotonic(), cpu_seconds()
    yield
    wall, (own_after, children_after) = time.monotonic() - started, cpu_seconds()
    with open(Path(directory) / f"{os.getpid()}.tsv", "a") as log:
        log.write(f"{item.nodeid}\t{wall:.3f}\t{own_after - own:.3f}\t"
                  f"{children_after - children:.3f}\n")
