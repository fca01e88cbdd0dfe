"""Worker processes never outlive their run: a failing worker stops the others, a deadline
stops them all, a time limit or an exception in the runner stops them, a worker that ignores
SIGTERM is killed, what a worker starts goes with it, and a worker whose parent dies ends
itself. Plain Python workers, no TensorFlow.
"""
import doctest
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from processes import alive

from verify.runners import worker_group
from verify.runners.loop import cluster
from verify.runners.run import RunTimeout, TimeLimit
from verify.runners.worker_group import WorkerGroup, WorkersFailed

SLEEP = "import time; time.sleep(600)"
ROOT = Path(__file__).resolve().parents[2]     # where `verify` is


def python(code: str) -> list[str]:
    return [sys.executable, "-c", textwrap.dedent(code)]


def test_docstring_examples():
    for module in (worker_group, cluster):
        result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
        assert result.attempted > 0 and result.failed == 0


def test_all_workers_exit_zero(tmp_path):
    with WorkerGroup(tmp_path) as group:
        for index in range(3):
            group.start(index, python(f"print('worker {index} done')"))
        group.wait(timeout=60)
    assert [group.log_tail(i) for i in range(3)] == [f"worker {i} done" for i in range(3)]


def test_a_failing_worker_stops_the_others_and_is_reported_with_its_log(tmp_path):
    with WorkerGroup(tmp_path, grace=1.0) as group:
        group.start(0, python(SLEEP))
        group.start(1, python("""
            import sys
            print("loading the data")
            print("ValueError: shapes (16, 10) and (32, 10) differ", file=sys.stderr)
            sys.exit(7)"""))
        started = time.monotonic()
        with pytest.raises(WorkersFailed) as raised:
            group.wait(timeout=120)
        assert time.monotonic() - started < 30          # not the deadline: the failure
    message = str(raised.value)
    assert raised.value.failed == (1,)
    assert message.startswith("worker 1 failed.")
    assert "worker 1 (pid" in message and "exited with status 7" in message
    assert "worker 0 (pid" in message and "stopped by the runner" in message
    assert "--- log of worker 1" in message and "shapes (16, 10) and (32, 10)" in message
    assert not any(alive(pid) for pid in group.pids.values())


def test_workers_past_the_deadline_are_stopped(tmp_path):
    with WorkerGroup(tmp_path, grace=1.0) as group:
        for index in range(2):
            group.start(index, python(f"print('worker {index} waits'); {SLEEP}"))
        with pytest.raises(WorkersFailed) as raised:
            group.wait(timeout=2)
    assert "did not finish within 2 s (still running: worker 0, worker 1)" in str(raised.value)
    assert "worker 0 waits" in str(raised.value)     # no worker failed: every log tail
    assert (raised.value.failed, raised.value.late) == ((), (0, 1))
    assert not any(alive(pid) for pid in group.pids.values())


def test_a_worker_that_ignores_sigterm_is_killed(tmp_path):
    with WorkerGroup(tmp_path, grace=0.5) as group:
        group.start(0, python(f"""
            import signal
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            print("ready", flush=True)
            {SLEEP}"""))
        while "ready" not in group.log_tail(0):
            time.sleep(0.05)
        with pytest.raises(WorkersFailed):
            group.wait(timeout=0.5)
    assert group.workers[0].process.returncode == -signal.SIGKILL
    assert not alive(group.pids[0])


def test_processes_a_worker_started_go_with_it(tmp_path):
    child_pid = tmp_path / "child.pid"
    with WorkerGroup(tmp_path, grace=0.5) as group:
        group.start(0, python(f"""
            import subprocess, sys
            child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
            open({str(child_pid)!r}, "w").write(str(child.pid))
            sys.exit(3)"""))
        with pytest.raises(WorkersFailed):
            group.wait(timeout=60)
    pid = int(child_pid.read_text())
    deadline = time.monotonic() + 5
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(pid)


def test_a_time_limit_in_the_runner_stops_the_workers(tmp_path):
    with pytest.raises(RunTimeout):
        with TimeLimit(1.0), WorkerGroup(tmp_path, grace=0.5) as group:
            group.start(0, python(SLEEP))
            group.start(1, python(SLEEP))
            group.wait(timeout=None)
    assert not any(alive(pid) for pid in group.pids.values())


def test_an_exception_in_the_runner_stops_the_workers(tmp_path):
    with pytest.raises(KeyboardInterrupt):
        with WorkerGroup(tmp_path, grace=0.5) as group:
            group.start(0, python(SLEEP))
            raise KeyboardInterrupt
    assert not alive(group.pids[0])


def test_a_worker_ends_itself_when_its_parent_dies(tmp_path):
    """The runner's process killed with SIGKILL cannot stop anything: the worker notices."""
    worker_pid = tmp_path / "worker.pid"
    parent = subprocess.Popen(python(f"""
        import sys, time
        from pathlib import Path
        from verify.runners.worker_group import WorkerGroup
        group = WorkerGroup(Path({str(tmp_path)!r}))
        worker = group.start(0, [sys.executable, "-c",
            "from verify.runners.worker_group import exit_with_parent; import time; "
            "exit_with_parent(0.1); time.sleep(600)"])
        open({str(worker_pid)!r}, "w").write(str(worker.process.pid))
        time.sleep(600)"""), env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        deadline = time.monotonic() + 30
        while not worker_pid.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        pid = int(worker_pid.read_text())
        time.sleep(0.5)          # the worker's watch is running
        assert alive(pid)
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 10
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(pid)
    finally:
        parent.kill()
        parent.wait()
