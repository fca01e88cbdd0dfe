"""Workers forked by the fork server (verify/runners/fork_server.py) start as a fresh process
started by `WorkerGroup` would: their own session, output in their log, the environment and
working directory they were given; their exit codes and deaths by signal are reported as
`subprocess.Popen` reports them; a server that is off, cannot start or dies leaves the
workers to fresh processes or reports them gone; the workers end when the server does.

A toy worker module stands in for the multi-worker loop's (no TensorFlow here: the server
preloads nothing); tests/runners/loop/test_multi_worker.py shows a forked multi-worker run
bitwise the run of fresh processes.
"""
import os
import signal
import subprocess
import sys
import time

import pytest
from processes import alive

from verify.runners.fork_server import SWITCH, ForkServer
from verify.runners.worker_group import WorkerGroup, WorkersFailed

TOY = '''
import os, sys, time

import numpy as np

LOADED_IN = os.getpid()   # the server's pid: imported there, before the fork


def main(args):
    from verify.runners.worker_group import exit_with_parent

    exit_with_parent(poll_seconds=0.1)
    print("args", args, "env", os.environ.get("TOY_VALUE"), "cwd", os.getcwd(), flush=True)
    print("session leader", os.getsid(0) == os.getpid(), "imported before",
          LOADED_IN != os.getpid(), flush=True)
    print("numpy draws", np.random.randint(1 << 62), flush=True)
    if args[0] == "sleep":
        time.sleep(600)
    if args[0] == "raise":
        raise ValueError("the toy worker's own error")
    return int(args[0])
'''


@pytest.fixture
def toy(tmp_path, monkeypatch):
    (tmp_path / "toy_worker.py").write_text(TOY)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(tmp_path), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))])}
    monkeypatch.delenv(SWITCH, raising=False)
    server = ForkServer("toy_worker", env, preload=())
    yield server, env
    server.close()


def argv(*args):
    return [sys.executable, "-m", "toy_worker", *map(str, args)]


def test_a_forked_worker_starts_as_a_fresh_one_would_and_its_exit_is_reported(toy, tmp_path):
    server, env = toy
    work = tmp_path / "work"
    work.mkdir()
    process = server.start(argv(5), {**env, "TOY_VALUE": "given"}, tmp_path / "five.log",
                           cwd=str(work))
    assert process is not None and process.wait(60) == 5 and process.poll() == 5
    log = (tmp_path / "five.log").read_text()
    assert f"args ['5'] env given cwd {work}" in log
    assert "session leader True imported before True" in log
    # numpy's global generator is seeded anew in each worker, as in a fresh process: two
    # workers forked from one server draw other numbers
    other = server.start(argv(0), env, tmp_path / "other.log")
    assert other.wait(60) == 0
    draws = [line for name in ("five.log", "other.log")
             for line in (tmp_path / name).read_text().splitlines() if "numpy draws" in line]
    assert len(draws) == 2 and draws[0] != draws[1], draws
    # a worker's own error goes to its log, with status 1, as `python -m` would exit
    raising = server.start(argv("raise"), env, tmp_path / "raise.log")
    assert raising.wait(60) == 1
    assert "ValueError: the toy worker's own error" in (tmp_path / "raise.log").read_text()
    # killed by a signal: a negative code, as Popen says it
    sleeping = server.start(argv("sleep"), env, tmp_path / "sleep.log")
    with pytest.raises(subprocess.TimeoutExpired):
        sleeping.wait(0.3)
    os.killpg(sleeping.pid, signal.SIGTERM)
    assert sleeping.wait(60) == -signal.SIGTERM


def test_worker_group_stops_a_forked_worker_and_leaves_no_process(toy, tmp_path):
    server, env = toy
    with WorkerGroup(tmp_path / "group", grace=1.0) as group:
        worker = group.start(0, argv("sleep"), env=env, fork_server=server)
        assert not isinstance(worker.process, subprocess.Popen)   # forked
        with pytest.raises(WorkersFailed, match="did not finish within 0.5 s"):
            group.wait(0.5)
    assert not alive(worker.process.pid)
    assert "stopped by the runner" in group.describe("done")


def test_off_or_unable_to_start_the_workers_start_fresh(toy, tmp_path, monkeypatch):
    server, env = toy
    monkeypatch.setenv(SWITCH, "0")
    with WorkerGroup(tmp_path / "off") as group:
        worker = group.start(0, argv(0), env=env, fork_server=server)
        group.wait(60)
    assert isinstance(worker.process, subprocess.Popen)
    monkeypatch.delenv(SWITCH)
    # another module than the server's: started fresh
    assert server.start([sys.executable, "-m", "other_module"], env, tmp_path / "x.log") is None
    # a server whose module does not import is not available; the worker starts fresh
    broken = ForkServer("no_such_module_here", env, preload=())
    try:
        assert broken.start([sys.executable, "-m", "no_such_module_here"], env,
                            tmp_path / "y.log") is None
        assert not broken.available
    finally:
        broken.close()


def test_workers_end_with_the_server_and_are_then_reported_gone(toy, tmp_path):
    server, env = toy
    sleeping = server.start(argv("sleep"), env, tmp_path / "sleep.log")
    assert sleeping.poll() is None
    server._process.kill()   # the server dies (as when the process that started it does)
    deadline = time.monotonic() + 30
    while alive(sleeping.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(sleeping.pid)                      # exit_with_parent: its parent is gone
    assert sleeping.wait(30) == -signal.SIGKILL         # its status went with the server
    assert server.start(argv(0), env, tmp_path / "after.log") is None   # fresh from now on
