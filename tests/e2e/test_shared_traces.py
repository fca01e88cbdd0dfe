"""A trace several pairs need runs once per session, whichever xdist worker needs it first: the
others wait for it and read it (verify.session.trace_supply.SharedTraces). A worker lost while running
one leaves it to the next that asks; a run's failure is shared as the run's result.

The end-to-end test runs a throwaway numpy case through pytest with two xdist workers in a
subprocess (as tests/e2e/test_faults_session.py does), each run appending its name to a log.
"""
import json
import multiprocessing
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from verify.core.trace import Trace
from verify.session.trace_supply import SharedTraces

from toy_training import write_toy_project

ROOT = Path(__file__).resolve().parents[2]

CASES = '''
"""Eight faithful pairs against one reference, each run logged to RUN_LOG (one line a run)."""
import os
import time

import numpy as np

from verify.core.case import Case, Examples, Implementation
from verify.core.names import NameMap

from toy_training import record_toy_steps


class LoggedRunner:
    uses_tensorflow = False   # numpy only: no TensorFlow state to start fresh

    def run(self, request):
        with open(os.environ["RUN_LOG"], "a") as log:
            log.write(request.implementation.name + "\\n")
        time.sleep(0.5)   # long enough for the other worker to ask for the same trace
        return record_toy_steps(request.trace, request.initial_values["w"], request.steps)

    def describe(self):
        return {"runner": "numpy"}

    def declared_config(self, case, implementation):
        return {}


CASE = Case(
    name="tiny", examples=Examples({"x": np.zeros((4, 1))}, labels=np.zeros(4)),
    batch_size=2, steps=4, initial_values={"w": np.linspace(1, 2, 4, dtype=np.float32)},
    implementations=tuple(Implementation(name, LoggedRunner(), NameMap({"w": "w"}))
                          for name in ["ref", *(f"good{n}" for n in range(1, 9))]),
    reference="ref", seed=11)
'''



def toy_trace(name="ref", error=None) -> Trace:
    trace = Trace(name, {"replicas": 1, "case": "tiny"}, error=error)
    trace.record(1, "loss", "loss", np.float32(0.25))
    trace.record(1, "weight", "w", np.linspace(0, 1, 5, dtype=np.float32))
    return trace


def test_a_shared_trace_runs_once_and_reads_back_equal(tmp_path):
    shared, runs = SharedTraces(tmp_path), []

    def run():
        runs.append(1)
        return toy_trace()

    first, waited_first = shared.trace("tiny", "ref", run)
    again, waited_again = SharedTraces(tmp_path).trace("tiny", "ref", run)   # another view
    assert runs == [1] and waited_first == waited_again == 0.0
    assert again.meta.to_dict() == first.meta.to_dict()
    for key in first.values:
        assert np.array_equal(again.values[key], first.values[key])
        assert again.values[key].dtype == first.values[key].dtype
    # another name, or the same name of another case, is another trace
    assert shared.path("tiny", "ref") != shared.path("tiny", "ref2") != shared.path("t", "ref")


def test_a_failed_run_is_shared_as_the_runs_result(tmp_path):
    shared = SharedTraces(tmp_path)
    shared.trace("tiny", "ref", lambda: toy_trace(error="ValueError: boom"))
    again, _ = shared.trace("tiny", "ref", lambda: pytest.fail("ran again"))
    assert again.error == "ValueError: boom"


def test_a_trace_another_process_is_running_is_busy_until_it_is_stored(tmp_path):
    shared, seen = SharedTraces(tmp_path), []

    def run():   # while it runs, another process (another open file) finds it busy
        seen.append(SharedTraces(tmp_path).busy("tiny", "ref"))
        return toy_trace()

    assert not shared.busy("tiny", "ref")   # never asked for
    shared.trace("tiny", "ref", run)
    assert seen == [True] and not shared.busy("tiny", "ref")


def _die_while_running(directory):
    SharedTraces(Path(directory)).trace("tiny", "ref", lambda: os._exit(3))


def test_a_process_lost_while_running_a_trace_leaves_it_to_the_next_one(tmp_path):
    child = multiprocessing.get_context("fork").Process(target=_die_while_running,
                                                        args=(str(tmp_path),))
    child.start()
    child.join(60)
    assert child.exitcode == 3
    trace, _ = SharedTraces(tmp_path).trace("tiny", "ref", lambda: toy_trace())
    assert trace.error is None and trace.get(1, "loss", "loss") == np.float32(0.25)


@pytest.mark.slow
def test_two_workers_run_the_reference_of_eight_pairs_once(tmp_path):
    write_toy_project(tmp_path, CASES)
    log = tmp_path / "runs.log"
    env = {**os.environ, "RUN_LOG": str(log),
           "PYTHONPATH": os.pathsep.join((str(ROOT), str(ROOT / "tests")))}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "test_tiny.py", "-p", "verify.session.plugin", "-n", "2",
         "-p", "no:cacheprovider", "--report-dir", "reports"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    runs = log.read_text().split()
    assert sorted(runs) == sorted(["ref", *(f"good{n}" for n in range(1, 9))]), runs
    record = json.loads((tmp_path / "reports" / "run.json").read_text())
    assert record["counts"]["PASS"] == 8, record["counts"]
    # the shared traces went with the run's parts
    assert not list((tmp_path / "reports").glob("parts/*/shared-traces"))


def test_a_pair_runs_its_candidate_while_another_process_runs_its_reference(tmp_path,
                                                                             monkeypatch):
    import fcntl
    from types import SimpleNamespace

    from verify.core.case import PairSpec, SuiteOptions
    from verify.session.trace_supply import TraceSupply

    pairs = [PairSpec("tiny", "ref", "a"), PairSpec("tiny", "ref", "b")]
    cache = TraceSupply(SuiteOptions(), judged=lambda: pairs, notes=[], shared=tmp_path)
    case = SimpleNamespace(name="tiny", steps=4, implementation=lambda name: None)
    stem = cache.shared.path("tiny", "ref")
    tmp_path.mkdir(exist_ok=True)
    other = os.open(f"{stem}.lock", os.O_CREAT | os.O_RDWR)   # another process runs ref
    fcntl.flock(other, fcntl.LOCK_EX)
    ran, held = [], [other]

    def let_go():
        if held:
            os.close(held.pop())

    def run(case, name, implementation):
        ran.append(name)
        if name == "a":   # meanwhile the other process stores ref and lets go
            toy_trace("ref").save(stem, compress=False)
            let_go()
        return toy_trace(name)

    monkeypatch.setattr(cache, "_run", run)
    timer = threading.Timer(20, let_go)   # a cache that waits for ref first fails, not hangs
    timer.start()
    cache.prepare(case, ["ref", "a"])
    timer.cancel()
    assert ran == ["a"]   # the candidate first; the reference read, never run here
    assert cache.trace(case, "ref").get(1, "loss", "loss") == np.float32(0.25)


def test_a_wait_for_another_processs_run_is_listed_with_its_seconds(tmp_path):
    """The pair's progress line says what its seconds went to: a trace read after waiting for
    another process is listed in `waited`; one read when stored, or run here, is not."""
    import fcntl
    from types import SimpleNamespace

    from verify.core.case import PairSpec, SuiteOptions
    from verify.session.trace_supply import TraceSupply

    pairs = [PairSpec("tiny", "ref", "a"), PairSpec("tiny", "ref", "b")]
    cache = TraceSupply(SuiteOptions(), judged=lambda: pairs, notes=[], shared=tmp_path)
    case = SimpleNamespace(name="tiny", steps=4, implementation=lambda name: None)
    stem = cache.shared.path("tiny", "ref")
    other = os.open(f"{stem}.lock", os.O_CREAT | os.O_RDWR)   # another process runs ref
    fcntl.flock(other, fcntl.LOCK_EX)

    def store_and_let_go():
        toy_trace("ref").save(stem, compress=False)
        os.close(other)

    threading.Timer(0.5, store_and_let_go).start()
    cache._run = lambda case, name, implementation: pytest.fail(f"ran {name} here")
    cache.trace(case, "ref")
    assert [name for name, _ in cache.waited] == ["ref"]
    assert 0.4 <= cache.waited[0][1] < 30, cache.waited
    # negative control: a stored trace read without another process holding it is no wait
    again = TraceSupply(SuiteOptions(), judged=lambda: pairs, notes=[], shared=tmp_path)
    again._run = cache._run
    again.trace(case, "ref")
    assert again.waited == []
