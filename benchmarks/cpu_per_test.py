"""A pytest plugin that logs each test's wall time and CPU: its process's own and that of the
child processes it started and waited for (a subprocess session, a `python -m verify` command).

Loaded by `benchmarks/suite_cpu_profile.py` (`-p cpu_per_test`, this folder on PYTHONPATH); each
process (an xdist worker) appends `nodeid, wall, own CPU, children's CPU` rows to
`$PARITY_CPU_LOG/<pid>.tsv`. A child that is still running when its test ends (an environment's
worker process, a background warm-up) is not counted for any test.

It also logs every training run made through `verify.runners.run.run_implementation` (the
parity pairs' and the tests' alike) to `$PARITY_CPU_LOG/<pid>.runs.tsv`: what was run (case,
implementation, steps, capture, data digest, runner), its wall time and CPU, and the test that
asked for it, so that the same run made twice in one test command can be found. Only the
runs of processes that load this plugin are logged: a run in a child process (a subprocess
session, an isolation script, a destination environment's worker) is not, and a multi-worker
run's CPU is its controller's only (its workers are child processes).
"""
from __future__ import annotations

import functools
import json
import os
import re
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


def run_identity(trace, kwargs) -> str:
    """What makes two runs the same run: the trace's case, implementation, steps, capture,
    device, replicas and data digest, the runner's settings (object addresses left out) and the
    options a caller passed.

    >>> import types
    >>> def trace(steps=4, address="0x7f3a"):
    ...     return types.SimpleNamespace(meta=types.SimpleNamespace(
    ...         case="c", implementation="i", steps=steps, capture="every step", device="cpu",
    ...         replicas=1, data_digest="d", runner={"build": f"<function f at {address}>"}))
    >>> run_identity(trace(), {"layers": None}) == run_identity(trace(address="0x51"), {})
    True
    >>> run_identity(trace(), {}) == run_identity(trace(steps=5), {})
    False
    """
    meta = trace.meta
    options = {k: repr(v) for k, v in sorted(kwargs.items()) if v is not None}
    return re.sub(r" at 0x[0-9a-f]+", "", json.dumps([
        meta.case, meta.implementation, meta.steps, meta.capture, meta.device, meta.replicas,
        str(meta.data_digest), repr(getattr(meta, "runner", None)), options]))


def logging_runs(run_implementation, directory: Path):
    """`run_implementation` that appends each run it makes to this process's runs log."""
    @functools.wraps(run_implementation)
    def run(case, implementation, **kwargs):
        started, (own, _) = time.monotonic(), cpu_seconds()
        trace = run_implementation(case, implementation, **kwargs)
        wall, (own_after, _) = time.monotonic() - started, cpu_seconds()
        test = os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" (", 1)[0]
        with open(directory / f"{os.getpid()}.runs.tsv", "a") as log:
            log.write(f"{test}\t{wall:.3f}\t{own_after - own:.3f}\t"
                      f"{run_identity(trace, kwargs)}\n")
        return trace
    return run


def pytest_configure(config):
    directory = os.environ.get(LOG_VARIABLE)
    if directory:
        from verify.runners import run

        config._parity_unlogged_run = run.run_implementation
        run.run_implementation = logging_runs(run.run_implementation, Path(directory))


def pytest_unconfigure(config):
    original = getattr(config, "_parity_unlogged_run", None)
    if original is not None:
        from verify.runners import run

        run.run_implementation = original


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
