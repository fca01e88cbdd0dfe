"""Worker processes forked from a process that has imported TensorFlow and run nothing.

A multi-worker run needs fresh processes (a process joins one cluster in its life), and a
fresh process spends about 4.3 s of CPU importing TensorFlow before it does anything else. A
`ForkServer` is a process started once per process that starts workers: it imports TensorFlow
(which imports Keras) and the worker's module, and then only forks, one child per worker asked for. It never
builds a model, creates a strategy or runs an op, so each child starts from the state of a
fresh process that imported those modules: nothing any run did is in it. The child then does
what `subprocess.Popen(..., start_new_session=True)` would have set up (a session of its own,
its output to the worker's log, the given environment and working directory, Python's default
SIGINT handler, numpy's global random generator seeded from the operating system as a fresh
process seeds it) and calls the module's `main(args)`; `ForkedProcess` stands in for the
`Popen` object (`pid`, `poll`, `wait`, `returncode`).

What a fork cannot give a worker: settings TensorFlow reads from the environment while it is
imported come from the environment of the process's first multi-worker run (the server's),
not from a later change to it; every other environment variable is the worker's own.

If the server cannot be started, or dies, workers are started as fresh processes again
(`ForkServer.start` returns None). `PARITY_FORK_WORKERS=0` turns it off. The server ends when
the process that started it does (its standard input closes), and each worker then ends as
its parent is gone (`exit_with_parent`).

>>> server = ForkServer("verify.runners.loop.worker")
>>> server.start(["python", "-m", "another.module"], {}, Path("log")) is None   # not its own
True
"""
from __future__ import annotations

import importlib
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Mapping, Sequence

from verify.core.scratch import pid_alive
from verify.runners.worker_group import PARENT

SWITCH = "PARITY_FORK_WORKERS"        # "0": start every worker as a fresh process
PRELOADED = ("tensorflow",)           # imported by the server before its module
READY_SECONDS = 300.0                 # the server's imports on a busy machine, at most
POLL_SECONDS = 0.02


def enabled() -> bool:
    """Whether workers are forked (`PARITY_FORK_WORKERS` is not "0")."""
    return os.environ.get(SWITCH, "1") != "0"


class ForkedProcess:
    """A worker the server forked, as `WorkerGroup` uses a `subprocess.Popen`."""

    def __init__(self, server: "ForkServer", pid: int, argv: Sequence[str]):
        self.server, self.pid, self.args = server, pid, list(argv)
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.server.exit_code(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(self.args, timeout)
            time.sleep(POLL_SECONDS)
        return self.returncode


class ForkServer:
    """Forks workers running `module.main(args)` from a process that imported `module`."""

    def __init__(self, module: str, environment: Mapping[str, str] | None = None,
                 preload: Sequence[str] = PRELOADED):
        self.module, self.environment = module, dict(environment or os.environ)
        self.preload = tuple(preload)
        self._process: subprocess.Popen | None = None
        self._lock = threading.Lock()
        self._started: dict[int, int] = {}     # request id -> pid
        self._exited: dict[int, int] = {}      # pid -> exit code (negative: killed by signal)
        self._changed = threading.Condition(self._lock)
        self._requests = 0
        self._failed = not enabled()

    @property
    def available(self) -> bool:
        return not self._failed

    def start(self, argv: Sequence[str], env: Mapping[str, str], log: Path,
              cwd: str | None = None) -> ForkedProcess | None:
        """Fork a worker for `argv` (`[python, "-m", module, *args]`) with `env`, its output
        appended to `log`; None when the server is not available (start it fresh then)."""
        args = list(argv)[3:]
        if self._failed or not enabled() \
                or list(argv)[:3] != [sys.executable, "-m", self.module] or not self._running():
            return None
        request = {"args": args, "env": dict(env), "log": str(log), "cwd": cwd or os.getcwd()}
        with self._lock:
            self._requests += 1
            request["id"] = ident = self._requests
            try:
                self._process.stdin.write(json.dumps(request) + "\n")
                self._process.stdin.flush()
            except OSError:
                written = False
            else:
                written = True
        if not written:
            self._fail()
            return None
        with self._changed:
            while ident not in self._started and not self._failed:
                self._changed.wait(1.0)
            pid = self._started.get(ident)
        return None if pid is None else ForkedProcess(self, pid, argv)

    def exit_code(self, pid: int) -> int | None:
        """The exit code of worker `pid`, or None while it runs. With the server gone, a worker
        that has ended too (its exit code lost with the server) counts as killed (-9)."""
        with self._lock:
            if pid in self._exited:
                return self._exited[pid]
            failed = self._failed
        if failed and not _alive(pid):
            return -signal.SIGKILL
        return None

    def close(self) -> None:
        """Stop the server (workers still running end with it, `exit_with_parent`)."""
        process, self._process = self._process, None
        if process is not None:
            try:
                process.stdin.close()
                process.wait(10)
            except (OSError, subprocess.TimeoutExpired):
                process.kill()
                process.wait()

    def _running(self) -> bool:
        if self._process is not None:
            return self._process.poll() is None or self._fail()
        try:
            self._process = subprocess.Popen(
                [sys.executable, "-m", __name__, self.module, *self.preload],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=self.environment,
                text=True, bufsize=1)
        except OSError:
            return self._fail()
        ready = threading.Event()
        threading.Thread(target=self._read, args=(self._process, ready), daemon=True,
                         name="fork-server").start()
        if ready.wait(READY_SECONDS) and not self._failed:
            return True
        self.close()
        return self._fail()

    def _read(self, process: subprocess.Popen, ready: threading.Event) -> None:
        for line in process.stdout:
            if not line.split():
                continue
            word, *values = line.split()
            with self._changed:
                if word == "started":   # before its "exited"; a reused pid's old exit goes
                    self._started[int(values[0])] = int(values[1])
                    self._exited.pop(int(values[1]), None)
                elif word == "exited":
                    self._exited[int(values[0])] = int(values[1])
                self._changed.notify_all()
            if word == "ready":
                ready.set()
        self._fail()
        ready.set()

    def _fail(self) -> bool:
        with self._changed:
            self._failed = True
            self._changed.notify_all()
        return False


def _alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie no longer does: its parent, the server, is gone)."""
    if not pid_alive(pid):
        return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state != "Z"


# ---- the server process: python -m verify.runners.fork_server MODULE ----

def serve(module_name: str, preload: Sequence[str]) -> None:
    """Import `preload` and `module_name`, say "ready", then fork a worker for each request
    line on stdin and report "started ID PID" and "exited PID CODE" on stdout; end when stdin
    closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # the starting process handles ^C
    for name in (*preload, module_name):
        importlib.import_module(name)
    module = sys.modules[module_name]
    reply(f"ready {os.getpid()}")
    pending, stdin = b"", sys.stdin.fileno()
    while True:
        reap()
        readable, _, _ = select.select([stdin], [], [], 0.05)
        if not readable:
            continue
        chunk = os.read(stdin, 65536)
        if not chunk:
            return
        pending += chunk
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            request = json.loads(line)
            sys.stdout.flush()
            sys.stderr.flush()
            server, pid = os.getpid(), os.fork()
            if pid == 0:
                become_worker(module, request, server)
            reply(f"started {request['id']} {pid}")


def reply(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def reap() -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        reply(f"exited {pid} {os.waitstatus_to_exitcode(status)}")


def become_worker(module, request: dict, server: int) -> None:
    """In the child `server` forked: set up as a fresh worker process would be, run the
    module's `main(args)` and exit with its status. Never returns."""
    code = 1
    try:
        os.setsid()
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        os.close(devnull)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        os.environ[PARENT] = str(server)   # the worker ends when the server does (even now)
        sys.argv = [module.__file__, *request["args"]]
        if hasattr(module, "STARTED"):   # the worker's log clock starts now, not at import
            module.STARTED = time.monotonic()
        if "numpy" in sys.modules:   # seeded from the OS, as in a fresh process (`random`
            sys.modules["numpy"].random.seed()   # reseeds itself in a forked child)
        code = module.main(request["args"])
    except BaseException:  # noqa: BLE001 - reported in the worker's log, as a fresh one would
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code if isinstance(code, int) else 1)


if __name__ == "__main__":
    serve(sys.argv[1], sys.argv[2:])
